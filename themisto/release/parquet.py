"""Write, check and push a Themisto release: Parquet per config and split, a README.md card, a build report.

The schema comes from `themisto_dataset.py` and the card from `dataset_card.md` (both at the repository root).
A release folder loads with `datasets.load_dataset(folder, config)` offline, because the card's YAML lists
each config's data files. Same rows and settings give byte-identical Parquet files (no timestamps are written).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Sequence

from themisto.errors import InputError
from themisto.release.tasks import RULES, TaskSettings, build_tasks

REPO_ROOT = Path(__file__).resolve().parents[2]
CARD_TEMPLATE = REPO_ROOT / "dataset_card.md"
SAMPLE_DIR = REPO_ROOT / "data" / "sample"
BUILD_FILE = "themisto_build.json"
README = "README.md"
ROW_GROUP_ROWS = 1000
PARQUET_COMPRESSION = "zstd"
# Replay raised FileNotFoundError for this path: the workspace lacks an input the developer had.
_MISSING_PATH = re.compile(r"No such file or directory: '([^']*)'")
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)


class ReleaseError(InputError):
    """A release cannot be built, read or pushed; the message names the file, trajectory or step."""


def schema_module() -> ModuleType:
    """`themisto_dataset`, imported by name or, where the repository root is not on sys.path, by its path."""
    try:
        return importlib.import_module("themisto_dataset")
    except ModuleNotFoundError:
        path = REPO_ROOT / "themisto_dataset.py"
        if not path.exists():
            raise ReleaseError(f"{path}: the dataset schema module is missing") from None
        spec = importlib.util.spec_from_file_location("themisto_dataset", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["themisto_dataset"] = module
        spec.loader.exec_module(module)
        return module


def parquet_name(config: str, split: str) -> str:
    """The release-relative path of one config's split."""
    return f"{config}/{split}-00000-of-00001.parquet"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(files: dict[str, str]) -> str:
    """One sha256 over the release's Parquet files (their relative paths and sha256s, sorted)."""
    lines = "".join(f"{rel} {digest}\n" for rel, digest in sorted(files.items()) if rel.endswith(".parquet"))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Bad input: replay could not find a file the developer had


@dataclass(frozen=True)
class MissingFile:
    """A step that raised FileNotFoundError in replay where the original run did not."""

    kernel_id: str
    step: int
    path: str
    logged_status: str

    def __str__(self) -> str:
        return (f"trajectory {self.kernel_id} step {self.step}: replay raised FileNotFoundError for "
                f"{self.path!r} where the log recorded {self.logged_status}")


def missing_input_files(rows: Iterable[dict]) -> list[MissingFile]:
    """Steps whose replay failed for a file the workspace lacks (the log said ok, or another error)."""
    found = []
    for row in rows:
        if row.get("ename") != "FileNotFoundError":
            continue
        logged = row.get("logged_status")
        if logged == "ok" or (logged == "error" and row.get("logged_ename") != "FileNotFoundError"):
            match = _MISSING_PATH.search(row.get("evalue") or "")
            found.append(MissingFile(row["kernel_id"], row["step"], match.group(1) if match else "<unknown path>",
                                     logged if logged == "ok" else f"error {row.get('logged_ename')}"))
    return found


# ---------------------------------------------------------------------------------------------------------------
# Build


@dataclass
class BuildReport:
    """What a build wrote: rows per config and split, file hashes, settings, sources, task rules and notes."""

    sizes: dict[str, dict[str, int]]
    files: dict[str, str]  # release-relative path -> sha256
    content_sha256: str
    settings: dict[str, Any]
    source: dict[str, Any]
    tasks: dict[str, dict]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _write_parquet(rows: list[dict], features, path: Path, what: str) -> int:
    """Write rows with the declared schema; return the in-memory Arrow size. Keys must match the Features."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = set(features)
    for row in rows:
        if set(row) != expected:
            extra, missing = sorted(set(row) - expected), sorted(expected - set(row))
            raise ReleaseError(f"{what}: row {row.get('id', row.get('kernel_id'))} does not match the declared "
                               f"Features (extra {extra}, missing {missing})")
    try:
        table = pa.Table.from_pylist(rows, schema=features.arrow_schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ReleaseError(f"{what}: a row does not fit the declared Features: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    # No timestamps go into Parquet; the writer's version string does, so byte identity holds per pyarrow version.
    pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS, compression=PARQUET_COMPRESSION,
                   write_statistics=True)
    return int(table.nbytes)


def build_release(rows: Sequence[dict], out: str | Path, settings: TaskSettings = TaskSettings(), *,
                  source: dict | None = None, extra_settings: dict | None = None, overwrite: bool = False,
                  allow_missing_files: bool = False) -> BuildReport:
    """Build tasks from `trajectories` rows and write the release folder `out` whole, or nothing on error."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ReleaseError(f"{out}: exists and is not an empty folder (pass overwrite to replace it)")
    rows = list(rows)
    notes: list[str] = []
    missing = missing_input_files(rows)
    if missing:
        listed = "; ".join(str(m) for m in missing[:5]) + ("; ..." if len(missing) > 5 else "")
        if not allow_missing_files:
            raise ReleaseError(f"{len(missing)} step(s) failed because the workspace lacks a file: {listed} "
                               f"(give a workspace that has it, or allow missing files to build anyway)")
        notes.append(f"{len(missing)} step(s) failed in replay for a file the workspace lacks: {listed}")
    taskset = build_tasks(rows, settings)
    notes += taskset.notes
    for report in taskset.reports.values():
        notes += report.notes
    schema = schema_module()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the release is meant to be read by others
    try:
        files: dict[str, str] = {}
        num_bytes: dict[str, dict[str, int]] = {}
        for config in schema.CONFIGS:
            for split in schema.SPLITS:
                split_rows = taskset.rows[config][split]
                if not split_rows:
                    notes.append(f"{config}: the `{split}` split is empty and is not written "
                                 f"(datasets cannot load an empty Parquet split)")
                    continue
                rel = parquet_name(config, split)
                size = _write_parquet(split_rows, schema.features_for(config), tmp / rel, f"{config}/{split}")
                num_bytes.setdefault(config, {})[split] = size
                files[rel] = sha256_file(tmp / rel)
        all_settings = {**asdict(settings), **(extra_settings or {}), **_library_versions()}
        report = BuildReport(
            sizes=taskset.sizes(), files=files, content_sha256=content_hash(files), settings=all_settings,
            source=source or {}, tasks={name: asdict(r) for name, r in taskset.reports.items()}, notes=notes)
        card = render_card(CARD_TEMPLATE.read_text(encoding="utf-8"), report, num_bytes, tmp)
        (tmp / README).write_text(card, encoding="utf-8")
        (tmp / BUILD_FILE).write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n",
                                      encoding="utf-8")
        from themisto.release.eval_yaml import write_eval_yaml

        write_eval_yaml(tmp, [config for config, splits in report.sizes.items() if splits.get("test")])
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _library_versions() -> dict[str, str]:
    """The writer's libraries and the replay kernel's environment (its versions shape every output)."""
    import datasets
    import pyarrow

    from themisto.runtime.sandbox import kernel_environment

    kernel = {f"kernel_{name}": version for name, version in kernel_environment().items() if name != "interpreter"}
    return {"datasets_version": datasets.__version__, "pyarrow_version": pyarrow.__version__, **kernel}


@dataclass(frozen=True)
class BuildInputs:
    """Where a build's trajectory rows come from. With none of logs/table/notebooks/steps/paper: the sample."""

    logs: tuple[Path, ...] = ()
    table: Path | None = None
    notebooks: tuple[Path, ...] = ()
    steps: Path | None = None  # an existing replay (steps JSONL): no replay runs
    paper: Path | None = None  # a local copy of the paper's published rows
    workspace: Path | None = None  # input files for replay; default: look-alike inputs from workspace_seed
    workspace_seed: int = 0
    workspace_size: str = "small"
    steps_out: Path | None = None  # where replay writes its steps (and resumes from)
    cell_timeout_s: float = 60.0


def _described(paths: Iterable[Path]) -> list[dict]:
    return [{"name": p.name, "sha256": sha256_file(p)} for p in sorted(paths, key=lambda p: p.name)]


def release_rows(inputs: BuildInputs, steps_default: Path,
                 progress=None, runner=None) -> tuple[list[dict], dict, dict]:
    """Read, and replay where needed (with `runner`, see `replay_to_file`), the inputs into `trajectories` rows;
    returns (rows, source, settings)."""
    from themisto.release.tasks import trajectory_rows

    if inputs.paper is not None:
        from themisto.release.paper_rows import read_paper_release

        return read_paper_release(inputs.paper), {"kind": "paper-release", "inputs": _described([inputs.paper])}, {}
    trajectories = []
    logs = list(inputs.logs)
    sample = not (logs or inputs.table or inputs.notebooks or inputs.steps)
    if sample:
        logs = sorted(SAMPLE_DIR.glob("*.log"))
        if not logs:
            raise ReleaseError(f"{SAMPLE_DIR}: no .log file (generate the sample with `python data/make_sample.py`)")
    if logs:
        from themisto.ingest.june import read_june_logs

        trajectories += read_june_logs(logs)
    if inputs.table is not None:
        from themisto.ingest.june import read_june_table

        trajectories += read_june_table(inputs.table)
    if inputs.notebooks:
        from themisto.ingest.notebook import read_notebook

        trajectories += [read_notebook(p) for p in inputs.notebooks]
    seen: set[str] = set()
    for traj in trajectories:
        if traj.id in seen:
            raise ReleaseError(f"trajectory {traj.id} is read twice from the inputs")
        seen.add(traj.id)
    read = [*logs, *([inputs.table] if inputs.table else []), *inputs.notebooks]
    # Logs named explicitly are still the shipped sample when they all lie in data/sample (authored, MIT).
    sample = sample or (bool(logs) and not inputs.table and not inputs.notebooks
                        and all(p.resolve().parent == SAMPLE_DIR.resolve() for p in logs))
    kind = "shipped-sample" if sample else ("june-logs" if logs else "june-table" if inputs.table
                                             else "notebooks" if inputs.notebooks else "replayed-steps")
    source: dict[str, Any] = {"kind": kind, "inputs": _described(read)}
    settings: dict[str, Any] = {}
    from themisto.replay.replay import ReplaySettings, read_steps, replay_to_file

    if inputs.steps is not None:
        steps = read_steps(inputs.steps)
        source["steps"] = _described([inputs.steps])[0]
        unknown = sorted({s.kernel_id for s in steps} - seen) if trajectories else []
        if unknown:
            raise ReleaseError(f"{inputs.steps}: trajectories {unknown[:3]} are not in the given logs/table/notebooks")
    else:
        replay = ReplaySettings(cell_timeout_s=inputs.cell_timeout_s)
        settings["replay"] = asdict(replay)
        out = inputs.steps_out or steps_default
        with tempfile.TemporaryDirectory(prefix="themisto-ws-") as tmp:
            workspace = inputs.workspace
            if workspace is None:
                from themisto.ingest.workspace import write_workspace

                tasks = sorted({t.task for t in trajectories if t.task in ("task1", "task2")}) or ["task1", "task2"]
                workspace = write_workspace(Path(tmp) / "ws", tasks, seed=inputs.workspace_seed,
                                            size=inputs.workspace_size).root
                source["workspace"] = {"look_alike_seed": inputs.workspace_seed, "size": inputs.workspace_size,
                                       "tasks": tasks}
            else:
                source["workspace"] = {"given": Path(workspace).name}
            replay_to_file(trajectories, out, workspace, replay, progress=progress, runner=runner)
        steps = read_steps(out)
    participants = {t.id: t.participant for t in trajectories}
    return trajectory_rows(steps, participants), source, settings


# ---------------------------------------------------------------------------------------------------------------
# Card


def split_card(text: str) -> tuple[dict, str]:
    """The card's YAML header (as a dict) and its body; a card without a header is an error."""
    import yaml

    match = _FRONT_MATTER.match(text)
    if not match:
        raise ReleaseError("the card has no YAML header between '---' lines")
    data = yaml.safe_load(match.group(1)) or {}
    if not isinstance(data, dict):
        raise ReleaseError("the card's YAML header is not a mapping")
    return data, text[match.end():]


def card_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def _sizes_table(report: BuildReport) -> str:
    lines = ["| config | test | train |", "| --- | ---: | ---: |"]
    for config, splits in report.sizes.items():
        lines.append(f"| `{config}` | {splits.get('test', 0):,} | {splits.get('train', 0):,} |")
    return "\n".join(lines)


def _rules_table(report: BuildReport) -> str:
    lines = ["| rule | next_cell removed | output_prediction removed |", "| --- | ---: | ---: |"]
    for rule, sentence in RULES.items():
        counts = [report.tasks.get(t, {}).get("removed", {}).get(rule, 0) for t in ("next_cell", "output_prediction")]
        lines.append(f"| {sentence} | {counts[0]:,} | {counts[1]:,} |")
    cands = [report.tasks.get(t, {}).get("candidates", 0) for t in ("next_cell", "output_prediction")]
    lines.append(f"| (candidate targets before the rules) | {cands[0]:,} | {cands[1]:,} |")
    return "\n".join(lines)


def _settings_list(report: BuildReport) -> str:
    return "\n".join(f"- `{key}`: `{json.dumps(value)}`" for key, value in sorted(report.settings.items()))


def _source_text(source: dict) -> str:
    lines = [f"- kind: `{source.get('kind', 'unknown')}`"]
    for item in source.get("inputs", []):
        lines.append(f"- input `{item.get('name')}` (sha256 `{item.get('sha256', '?')}`)")
    for key, value in sorted(source.items()):
        if key not in ("kind", "inputs"):
            lines.append(f"- {key}: `{json.dumps(value, sort_keys=True)}`")
    return "\n".join(lines)


def size_category(rows: int) -> str:
    """The Hub's size bucket for a number of rows (`n<1K`, `1K<n<10K`, ...).

    >>> [size_category(n) for n in (999, 1000, 54_321, 2_000_000)]
    ['n<1K', '1K<n<10K', '10K<n<100K', '1M<n<10M']
    """
    for name, upper in _SIZE_BUCKETS:
        if rows < upper:
            return name
    return "n>1B"


_SIZE_BUCKETS = (("n<1K", 10**3), ("1K<n<10K", 10**4), ("10K<n<100K", 10**5), ("100K<n<1M", 10**6),
                 ("1M<n<10M", 10**7), ("10M<n<100M", 10**8), ("100M<n<1B", 10**9))


def render_card(template: str, report: BuildReport, num_bytes: dict[str, dict[str, int]], folder: Path) -> str:
    """The release README: the template's YAML with this build's configs and sizes, the body's {{…}} filled."""
    schema = schema_module()
    data, body = split_card(template)
    configs, infos = [], []
    for config in schema.CONFIGS:
        splits = [s for s in schema.SPLITS if report.sizes[config].get(s)]
        configs.append({"config_name": config,
                        "data_files": [{"split": s, "path": parquet_name(config, s)} for s in splits]})
        if config == schema.DEFAULT_CONFIG:
            configs[-1]["default"] = True
        download = sum((folder / parquet_name(config, s)).stat().st_size for s in splits)
        infos.append({
            "config_name": config,
            "features": schema.features_yaml(config),
            "splits": [{"name": s, "num_bytes": num_bytes[config][s], "num_examples": report.sizes[config][s]}
                       for s in splits],
            "download_size": download,
            "dataset_size": sum(num_bytes[config][s] for s in splits),
        })
    data["configs"] = configs
    data["dataset_info"] = infos
    data["size_categories"] = [size_category(max(sum(splits.values()) for splits in report.sizes.values()))]
    if report.source.get("kind") != "shipped-sample":
        # The sample is authored by the project (MIT); the JuNE logs' redistribution terms are not stated.
        data["license"] = "other"
        data["license_name"] = "unclear-june-logs"
    values = {
        "sizes_table": _sizes_table(report),
        "rules_table": _rules_table(report),
        "build_settings": _settings_list(report),
        "source": _source_text(report.source),
        "content_sha256": report.content_sha256,
        "notes": "\n".join(f"- {n}" for n in report.notes) or "- none",
    }
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(body)} - set(values))
    if unknown:
        raise ReleaseError(f"{CARD_TEMPLATE}: unknown placeholder(s) {unknown} (known: {sorted(values)})")
    body = _PLACEHOLDER.sub(lambda m: values[m.group(1)], body)
    return f"---\n{card_yaml(data)}---\n{body}"


# ---------------------------------------------------------------------------------------------------------------
# Check


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
    import pyarrow.parquet as pq

    folder = Path(folder)
    report = CheckReport(folder)
    problems = report.problems
    readme = folder / README
    if not readme.is_file():
        problems.append(f"{readme}: missing (the card declares the configs)")
        return report
    try:
        data, _ = split_card(readme.read_text(encoding="utf-8"))
    except (ReleaseError, ValueError) as exc:
        problems.append(f"{readme}: {exc}")
        return report
    schema = schema_module()
    declared = {c.get("config_name"): c for c in data.get("configs") or []}
    infos = {i.get("config_name"): i for i in data.get("dataset_info") or []}
    recorded = {}
    kernels: dict[str, dict[str, set[str]]] = {}
    if (folder / BUILD_FILE).is_file():
        recorded = json.loads((folder / BUILD_FILE).read_text(encoding="utf-8")).get("files", {})
    for config in schema.CONFIGS:
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
            rows = 0
            for path in matches:
                rel = path.relative_to(folder).as_posix()
                try:
                    meta = pq.ParquetFile(path)
                except (OSError, ValueError) as exc:
                    problems.append(f"{rel}: not a readable Parquet file ({exc})")
                    continue
                rows += meta.metadata.num_rows
                for diff in _schema_diff(meta.schema_arrow, expected.arrow_schema):
                    problems.append(f"{rel}: schema mismatch: {diff}")
                if rel in recorded and recorded[rel] != sha256_file(path):
                    problems.append(f"{rel}: sha256 differs from {BUILD_FILE} (changed after the build)")
            report.sizes.setdefault(config, {})[split] = rows
            if split in expected_rows and expected_rows[split] != rows:
                problems.append(f"{config}/{split}: {rows} rows, the card says {expected_rows[split]}")
            kernels.setdefault(config, {})[split] = _kernel_ids(matches)
    problems += _split_problems(kernels)
    problems += _eval_yaml_problems(folder, report.sizes)
    return report


def _eval_yaml_problems(folder: Path, sizes: dict[str, dict[str, int]]) -> list[str]:
    """eval.yaml (when present) follows the Hub's schema and declares only configs with a `test` split."""
    from themisto.release.eval_yaml import EVAL_FILE, EvalYamlError, read_eval_yaml

    if not (folder / EVAL_FILE).is_file():
        return []  # releases built before eval.yaml existed
    try:
        tasks = read_eval_yaml(folder)["tasks"]
    except EvalYamlError as exc:
        return [str(exc)]
    return [f"{EVAL_FILE}: task {t['id']!r} names {t['config']}/{t['split']}, which the release does not have"
            for t in tasks if not sizes.get(t["config"], {}).get(t["split"])]


def _kernel_ids(paths: list[Path]) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for path in paths:
        try:
            ids.update(pq.read_table(path, columns=["kernel_id"]).column("kernel_id").to_pylist())
        except (OSError, ValueError, KeyError):
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


# ---------------------------------------------------------------------------------------------------------------
# Push


@dataclass
class UploadPlan:
    """What a push sends: the repository, and the release-relative files with their sizes."""

    repo_id: str
    folder: Path
    files: dict[str, int]
    private: bool
    revision: str | None
    commit_message: str


def upload_plan(folder: str | Path, repo_id: str, *, private: bool = False, revision: str | None = None,
                commit_message: str | None = None) -> UploadPlan:
    """The files a push would upload (card, build report, Parquet), after `check_release` found no problem."""
    folder = Path(folder)
    if "/" not in repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ReleaseError(f"repo id {repo_id!r} must look like 'owner/name'")
    checked = check_release(folder)
    if not checked.ok:
        raise ReleaseError(f"{folder}: not pushed, the release has problems: " + "; ".join(checked.problems))
    files = {README: (folder / README).stat().st_size}
    if (folder / BUILD_FILE).is_file():
        files[BUILD_FILE] = (folder / BUILD_FILE).stat().st_size
    from themisto.release.eval_yaml import EVAL_FILE

    if (folder / EVAL_FILE).is_file():
        files[EVAL_FILE] = (folder / EVAL_FILE).stat().st_size
    for path in sorted(folder.rglob("*.parquet")):
        files[path.relative_to(folder).as_posix()] = path.stat().st_size
    report = json.loads((folder / BUILD_FILE).read_text(encoding="utf-8")) if BUILD_FILE in files else {}
    message = commit_message or f"Themisto release {report.get('content_sha256', '')[:12]}".strip()
    return UploadPlan(repo_id, folder, files, private, revision, message)


def push_release(plan: UploadPlan, api=None, *, token: str | None = None):
    """Create the dataset repository if needed and upload the planned files; returns the Hub's commit info.

    With the real Hub (no `api` given) the card is first validated by the Hub's own YAML check (online).
    """
    if api is None:
        from huggingface_hub import DatasetCard, HfApi

        DatasetCard.load(plan.folder / README).validate(repo_type="dataset")
        api = HfApi(token=token)
    api.create_repo(repo_id=plan.repo_id, repo_type="dataset", private=plan.private, exist_ok=True)
    return api.upload_folder(repo_id=plan.repo_id, repo_type="dataset", folder_path=str(plan.folder),
                             allow_patterns=sorted(plan.files), revision=plan.revision,
                             commit_message=plan.commit_message)
