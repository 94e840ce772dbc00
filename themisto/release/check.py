"""Checks of a release folder before anyone trains on it: configs, splits and files, the schema against the declared
Features, eval.yaml, and trajectories that leak between splits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from themisto.errors import InputError
from themisto.release.eval_yaml import EvalYamlError, read_eval_yaml
from themisto.release.folder import (BUILD_FILE, CARD_FILE, EVAL_FILE, read_build, read_card, read_parquet,
                                     schema_module, sha256_file)
from themisto.release.values import VALUES, pointer_problems, value_problems


@dataclass
class CheckReport:
    """Problems found in a release folder (empty when it is sound) and the rows per config and split."""

    folder: Path
    problems: list[str] = field(default_factory=list)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"folder": str(self.folder), "ok": self.ok, "problems": self.problems, "sizes": self.sizes}


def _schema_diff(actual, expected) -> list[str]:
    diffs = []
    names_a, names_e = actual.names, expected.names
    for name in names_e:
        if name not in names_a:
            diffs.append(f"column {name!r} is missing")
        elif not actual.field(name).type.equals(expected.field(name).type):
            diffs.append(f"column {name!r} is {actual.field(name).type}, declared {expected.field(name).type}")
    diffs += [f"column {name!r} is not declared" for name in names_a if name not in names_e]
    if not diffs and names_a != names_e:
        diffs.append(f"columns are in another order than declared ({names_a})")
    return diffs


def check_release(folder: str | Path) -> CheckReport:
    """Report a missing config or split, a missing file, a schema or size mismatch, or a changed file."""
    import datasets

    folder = Path(folder)
    report = CheckReport(folder)
    problems = report.problems
    readme = folder / CARD_FILE
    if not readme.is_file():
        problems.append(f"{readme}: missing (the card declares the configs)")
        return report
    try:
        data, _ = read_card(folder)
    except InputError as exc:
        problems.append(str(exc))
        return report
    schema = schema_module()
    declared = {c.get("config_name"): c for c in data.get("configs") or []}
    infos = {i.get("config_name"): i for i in data.get("dataset_info") or []}
    recorded = {}
    kernels: dict[str, dict[str, set[str]]] = {}
    if (folder / BUILD_FILE).is_file():
        try:
            recorded = read_build(folder).files
        except InputError as exc:
            problems.append(str(exc))
    optional = [c for c in schema.OPTIONAL_CONFIGS if c in declared]
    for config in (*schema.CONFIGS, *optional):
        if config not in declared:
            problems.append(f"{readme}: config {config!r} is missing from `configs:`")
            continue
        expected = schema.features_for(config)
        info = infos.get(config)
        if info is None:
            problems.append(f"{readme}: config {config!r} has no `dataset_info` entry")
        elif datasets.Features._from_yaml_list(info.get("features") or []) != expected:
            problems.append(f"{readme}: the `dataset_info` features of {config!r} differ from themisto_dataset.py")
        expected_rows = {s["name"]: s.get("num_examples") for s in (info or {}).get("splits") or []}
        files = {f.get("split"): f.get("path") for f in declared[config].get("data_files") or []}
        if "test" not in files:
            problems.append(f"{readme}: config {config!r} declares no `test` split")
        for split, pattern in files.items():
            matches = sorted(folder.glob(pattern)) if pattern else []
            if not matches:
                problems.append(f"{config}/{split}: no file matches {pattern!r}")
                continue
            rows = sum(_check_file(folder, path, expected, recorded, problems) for path in matches)
            report.sizes.setdefault(config, {})[split] = rows
            if split in expected_rows and expected_rows[split] != rows:
                problems.append(f"{config}/{split}: {rows} rows, the card says {expected_rows[split]}")
            if config == VALUES:
                problems += value_problems(matches, split)
                continue
            kernels.setdefault(config, {})[split] = _kernel_ids(matches)
    problems += _split_problems(kernels)
    problems += _eval_yaml_problems(folder, report.sizes)
    if VALUES in optional:
        problems += pointer_problems(folder, declared[VALUES], declared.get("trajectories") or {})
    problems += _stray_files(folder, recorded)
    return report


def _stray_files(folder: Path, recorded: dict[str, str]) -> list[str]:
    """Files the build did not write (a planted pickle, say): a loader or a reader might take them."""
    known = {CARD_FILE, BUILD_FILE, EVAL_FILE, ".gitattributes", *recorded}
    return [f"{path.relative_to(folder).as_posix()}: a file the build did not write"
            for path in sorted(folder.rglob("*")) if path.is_file() and path.relative_to(folder).as_posix() not in known
            and not path.relative_to(folder).as_posix().startswith(".cache/")]


def _check_file(folder: Path, path: Path, expected, recorded: dict[str, str], problems: list[str]) -> int:
    """Check one Parquet file against the declared schema and the build's recorded hash; return its row count."""
    import pyarrow.parquet as pq

    rel = path.relative_to(folder).as_posix()
    try:
        meta = pq.ParquetFile(path)
    except (OSError, ValueError) as exc:
        problems.append(f"{rel}: not a readable Parquet file ({exc})")
        return 0
    for diff in _schema_diff(meta.schema_arrow, expected.arrow_schema):
        problems.append(f"{rel}: schema mismatch: {diff}")
    if rel in recorded and recorded[rel] != sha256_file(path):
        problems.append(f"{rel}: sha256 differs from {BUILD_FILE} (changed after the build)")
    return meta.metadata.num_rows


def _eval_yaml_problems(folder: Path, sizes: dict[str, dict[str, int]]) -> list[str]:
    """eval.yaml (when present) follows the Hub's schema, declares only configs with a `test` split, and its field
    specs name columns those configs have. Inspect's own schema is checked at the command line
    (`themisto.harness.hub_schema`: only the harness imports inspect_ai)."""
    if not (folder / EVAL_FILE).is_file():
        return []  # releases built before eval.yaml existed, or without the text track
    try:
        tasks = read_eval_yaml(folder)["tasks"]
    except EvalYamlError as exc:
        return [str(exc)]
    problems = []
    for task in tasks:
        if not sizes.get(task["config"], {}).get(task["split"]):
            problems.append(f"{EVAL_FILE}: task {task['id']!r} names {task['config']}/{task['split']}, which the "
                            f"release does not have")
            continue
        problems += _field_spec_problems(task)
    return problems


def _field_spec_problems(task: dict) -> list[str]:
    """The columns a task's field_spec names (input, target unless `literal:`, metadata) that its config lacks."""
    spec = task.get("field_spec") if isinstance(task.get("field_spec"), dict) else {}
    columns = set(schema_module().features_for(task["config"]))
    named = [(key, name) for key in ("input", "target", "metadata") if key in spec
             for name in (spec[key] if isinstance(spec[key], list) else [spec[key]])]
    problems = []
    for key, name in named:
        if key == "target" and isinstance(name, str) and name.startswith("literal:"):
            continue  # a literal target names no column
        if not isinstance(name, str) or name not in columns:
            problems.append(f"{EVAL_FILE}: task {task['id']!r} field_spec.{key} names column {name!r}, which "
                            f"{task['config']} does not have")
    return problems


def _kernel_ids(paths: list[Path]) -> set[str]:
    ids: set[str] = set()
    for path in paths:
        try:
            ids.update(row["kernel_id"] for row in read_parquet(path, None, columns=["kernel_id"]))
        except InputError:
            pass  # an unreadable file or a missing column is reported by the schema check
    return ids


def _split_problems(kernels: dict[str, dict[str, set[str]]]) -> list[str]:
    """A trajectory in both splits, or a task row whose trajectory is not in the same split of `trajectories`."""
    problems = []
    steps = kernels.get("trajectories", {})
    both = sorted(steps.get("test", set()) & steps.get("train", set()))
    if both:
        problems.append(f"trajectories {both[:3]} are in both `test` and `train`")
    for config, splits in kernels.items():
        if config == "trajectories" or not steps:
            continue
        for split, ids in splits.items():
            orphans = sorted(ids - steps.get(split, set()))
            if orphans:
                problems.append(f"{config}/{split}: trajectories {orphans[:3]} are not in trajectories/{split}")
    return problems
