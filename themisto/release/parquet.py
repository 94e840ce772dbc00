"""Write a Themisto release: Parquet per config and split, a README.md card (`card`), a build report.

The schema comes from `themisto_dataset.py` and the card from `dataset_card.md` (both at the repository root); the
folder's layout, hashes and build report are `themisto.release.folder`'s. `check` checks a release folder and
`push` uploads it. A release folder loads with
`datasets.load_dataset(folder, config)` offline, because the card's YAML lists each config's data files. Same rows
and settings give byte-identical Parquet files (no timestamps are written).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from themisto.release.card import CARD_TEMPLATE, render_card
from themisto.release.eval_yaml import write_eval_yaml
from themisto.release.folder import (CARD_FILE, TRAJECTORIES, BuildReport, ReleaseError, content_hash, parquet_name,
                                     schema_module, sha256_file, shipped)
from themisto.release.tasks import NO_ROWS, TaskSettings, build_tasks
from themisto.release.sources import per_source
from themisto.release.text_track import PromptRenderer, prompt_rows
from themisto.release.values import VALUES, ValueCaps, release_values, values_note
from themisto.release.run_specific import mark_run_specific, run_specific_note
from themisto.release.workspaces import with_rebuild_records
from themisto.resume import folder_written_whole
from themisto.vocabulary import TASKS

SAMPLE_DIR = shipped("data/sample")
ROW_GROUP_ROWS = 1000
VALUES_ROW_GROUP_ROWS = 64  # a values row holds a whole file: small row groups keep a reader's memory small
PARQUET_COMPRESSION = "zstd"
# The text track's prompts repeat the history of the rows before them: zstd at level 9 keeps 21-37 % less of them
# than pyarrow's default level (docs/measurements.md, the text track's size), for a few seconds more at build time.
TEXT_TRACK_ZSTD_LEVEL = 9
# Replay raised FileNotFoundError for this path: the workspace lacks an input the developer had.
_MISSING_PATH = re.compile(r"No such file or directory: '([^']*)'")


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


def _write_parquet(rows: list[dict], features, path: Path, what: str, level: int | None = None) -> int:
    """Write rows with the declared schema (zstd at `level`, None: pyarrow's default); return the in-memory Arrow
    size. Keys must match the Features."""
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
                   compression_level=level, write_statistics=True)
    return int(table.nbytes)


def _write_values(rows: list[dict], features, path: Path) -> int:
    """Write `values` rows a few at a time (their data can be large); return the in-memory Arrow size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with pq.ParquetWriter(path, features.arrow_schema, compression=PARQUET_COMPRESSION) as writer:
        for start in range(0, len(rows), VALUES_ROW_GROUP_ROWS):
            table = pa.Table.from_pylist(rows[start:start + VALUES_ROW_GROUP_ROWS], schema=features.arrow_schema)
            writer.write_table(table)
            size += int(table.nbytes)
    return size


def _write_split(config: str, split: str, rows: list[dict], schema, path: Path) -> int:
    """Write one config's split: `values` a few rows at a time, the text track's prompts at TEXT_TRACK_ZSTD_LEVEL;
    return the in-memory Arrow size."""
    features = schema.features_for(config)
    if config == VALUES:
        return _write_values(rows, features, path)
    level = TEXT_TRACK_ZSTD_LEVEL if config in schema.PROMPTS_CONFIGS else None
    return _write_parquet(rows, features, path, f"{config}/{split}", level)


def build_release(rows: Sequence[dict], out: str | Path, settings: TaskSettings = TaskSettings(), *,
                  source: dict | None = None, extra_settings: dict | None = None, overwrite: bool = False,
                  allow_missing_files: bool = False, fidelity: dict | None = None, values: Path | None = None,
                  value_caps: ValueCaps = ValueCaps(), prompts: PromptRenderer | None = None) -> BuildReport:
    """Build tasks from `trajectories` rows and write the release folder `out` whole, or nothing on error; with
    `values` (a replay's values folder, themisto.replay.values), the `values` config too; with `prompts` (the
    renderer, `themisto.generation.prompts.text_track_renderer`), the text track's `<task>_prompts` configs and the
    eval.yaml that declares them for the Hub."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ReleaseError(f"{out}: exists and is not an empty folder (pass overwrite to replace it)")
    rows, notes = _prepared(rows, source, values is not None)
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
    stored = None
    if any(row.get("stored_values") is not None for row in rows):
        stored = release_values(taskset.rows[TRAJECTORIES], values, value_caps)
        taskset.rows[VALUES] = {split: stored.rows.get(split, []) for split in taskset.rows[TRAJECTORIES]}
        notes.append(values_note(stored))
    if prompts is not None:
        text_rows, text_notes = prompt_rows(taskset.rows, prompts)
        taskset.rows.update(text_rows)
        notes += text_notes
    sources = per_source([row for rows in taskset.rows[TRAJECTORIES].values() for row in rows], taskset.split_of,
                         {task: taskset.rows[task] for task in TASKS}, (source or {}).get("corpora", ()))
    schema = schema_module()
    with folder_written_whole(out) as tmp:
        files: dict[str, str] = {}
        num_bytes: dict[str, dict[str, int]] = {}
        for config in [c for c in (*schema.CONFIGS, *schema.OPTIONAL_CONFIGS) if c in taskset.rows]:
            for split in schema.SPLITS:
                split_rows = taskset.rows[config].get(split)
                if split_rows is None:  # a config of one split only (the text track's: `test`)
                    continue
                if not split_rows:
                    notes.append(f"{config}: the `{split}` split is empty and is not written "
                                 f"(datasets cannot load an empty Parquet split)")
                    continue
                rel = parquet_name(config, split)
                size = _write_split(config, split, split_rows, schema, tmp / rel)
                num_bytes.setdefault(config, {})[split] = size
                files[rel] = sha256_file(tmp / rel)
        all_settings = {**asdict(settings), **(extra_settings or {}), **_library_versions()}
        if stored is not None:
            all_settings["value_caps"] = asdict(value_caps)
        if prompts is not None:
            all_settings["text_track"] = prompts.record()
        report = BuildReport(
            sizes=taskset.sizes(), files=files, content_sha256=content_hash(files), settings=all_settings,
            source=source or {}, tasks={name: asdict(r) for name, r in taskset.reports.items()}, notes=notes,
            split=taskset.split.to_dict(), fidelity=fidelity or {}, sources=sources)
        card = render_card(CARD_TEMPLATE.read_text(encoding="utf-8"), report, num_bytes, tmp)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
        report.write_to(tmp)
        if prompts is not None:
            write_eval_yaml(tmp, [config for config, splits in report.sizes.items() if splits.get("test")],
                            prompts.system)
    return report


def _prepared(rows: Sequence[dict], source: dict | None, values: bool) -> tuple[list[dict], list[str]]:
    """The rows as the release holds them, and the notes on it: each trajectory's rebuild record, its run-specific
    variables marked (`themisto.release.run_specific`), and without values what a replay noted about them dropped."""
    rows, marked = mark_run_specific(with_rebuild_records(list(rows), (source or {}).get("workspace")))
    if not values:  # a release without values: what a replay noted about them goes too
        rows = [dict(row, stored_values=None) if row.get("stored_values") is not None else row for row in rows]
    return rows, [run_specific_note(marked)] if marked["variables"] else []


def _library_versions() -> dict[str, str]:
    """The writer's libraries and the replay kernel's environment (its versions shape every output)."""
    import datasets
    import pyarrow

    from themisto.runtime.sandbox import kernel_environment

    kernel = {f"kernel_{name}": version for name, version in kernel_environment().items() if name != "interpreter"}
    return {"datasets_version": datasets.__version__, "pyarrow_version": pyarrow.__version__, **kernel}


@dataclass(frozen=True)
class BuildInputs:
    """Where a build's trajectory rows come from. With no paths, steps or paper: the shipped sample."""

    paths: tuple[Path, ...] = ()  # .log / .csv / .ipynb files or folders (`themisto.ingest.inputs.read_inputs`)
    participants: Path | None = None  # a kernel -> participant mapping (JSON) for the logs
    steps: Path | None = None  # an existing replay (steps JSONL): no replay runs
    paper: Path | None = None  # a local copy of the paper's published rows
    workspace: Path | None = None  # input files for replay; default: look-alike inputs from workspace_seed
    workspace_seed: int = 0
    workspace_size: str = "small"
    steps_out: Path | None = None  # where replay writes its steps (and resumes from)
    # A fixed limit for every cell (the logged-time rule off); None: the replay's rule (themisto.replay.cell_limits)
    cell_timeout_s: float | None = None
    values: bool = True  # store the variables' values (replay) and build the `values` config from them
    corpus: Any = None  # the `CorpusSettings` corpus folders among `paths` are read under (None: the defaults)


def _described(paths: Iterable[Path]) -> list[dict]:
    return [{"name": p.name, "sha256": sha256_file(p)} for p in sorted(paths, key=lambda p: p.name)]


def _read_trajectories(inputs: BuildInputs):
    """The kind of inputs, the files read ({name, sha256}), their trajectories (the shipped sample's when no input
    is named) and the final notebooks beside their logs, through ingest's one door; and what ingest read besides
    (`Ingested`: the corpora's reports, the workspace folders their trajectories name)."""
    from themisto.ingest.inputs import expand_inputs, read_inputs, read_participants

    paths = list(inputs.paths)
    if not (paths or inputs.steps):
        if not sorted(SAMPLE_DIR.glob("*.log")):
            raise ReleaseError(f"{SAMPLE_DIR}: no .log file (generate the sample with `python data/make_sample.py`)")
        paths = [SAMPLE_DIR]
    if not paths:
        return "replayed-steps", [], [], {}, None
    from themisto.ingest.ipython_corpus import is_corpus

    mapping = read_participants(inputs.participants) if inputs.participants else None
    ingested = read_inputs(paths, participants=mapping, corpus=inputs.corpus)
    files = [item.path for item in expand_inputs([p for p in paths if not is_corpus(Path(p))])]
    # Logs named explicitly are still the shipped sample when they all lie in data/sample (authored, MIT).
    sample = bool(files) and len(files) == len(paths) and all(
        p.suffix.lower() == ".log" and p.resolve().parent == SAMPLE_DIR.resolve() for p in files)
    kinds = {t.source for t in ingested.trajectories}
    june = ("june-logs" if "june-log" in kinds else "june-table" if "june-table" in kinds else
            "notebooks" if "notebook" in kinds else None)
    wild = "ipython-histories" if kinds & {"ipython-history", "ipython-log"} else None
    kind = "shipped-sample" if sample else "+".join(k for k in (june, wild) if k) or "notebooks"
    read = sorted(({"name": f.file, "sha256": f.sha256} for f in ingested.read), key=lambda d: d["name"])
    return kind, read, ingested.trajectories, ingested.final_notebooks, ingested


def release_rows(inputs: BuildInputs, steps_default: Path, progress=None, runner=None,
                 trajectories_out: list | None = None) -> tuple[list[dict], dict, dict, dict]:
    """Read, and replay where needed (with `runner`, see `replay_to_file`), the inputs into `trajectories` rows;
    returns (rows, source, settings, fidelity per trajectory). `trajectories_out` receives the trajectories read (a
    content release and its pointers need them, `themisto.release.content_release`)."""
    from themisto.release.tasks import trajectory_rows

    if inputs.paper is not None:
        from themisto.release.paper_rows import read_paper_release

        return (read_paper_release(inputs.paper), {"kind": "paper-release", "inputs": _described([inputs.paper])},
                {}, {})
    from themisto.release.sources import apply_health, why_nothing

    kind, read, trajectories, finals, ingested = _read_trajectories(inputs)
    if trajectories_out is not None:
        trajectories_out.extend(trajectories)
    seen = {t.id for t in trajectories}
    source: dict[str, Any] = {"kind": kind, "inputs": read}
    if ingested is not None and ingested.corpora:
        source["corpora"] = ingested.corpora
    if not trajectories and inputs.steps is None:
        raise ReleaseError(f"{NO_ROWS}: {why_nothing(source)}")
    settings: dict[str, Any] = {}
    from themisto.replay.replay import ReplaySettings, relogged
    from themisto.replay.steps_file import read_steps, read_steps_header, replay_to_file

    if inputs.steps is not None:
        try:
            steps = relogged(read_steps(inputs.steps), trajectories, str(inputs.steps))
        except ValueError as exc:
            raise ReleaseError(str(exc)) from None
        source["steps"] = _described([inputs.steps])[0]
        header = read_steps_header(inputs.steps)  # {} for a steps file made before steps files recorded it
        if header:
            source["workspace"], settings["replay"] = header["workspace"], header.get("replay") or {}
        unknown = sorted({s.kernel_id for s in steps} - seen) if trajectories else []
        if unknown:
            raise ReleaseError(f"{inputs.steps}: trajectories {unknown[:3]} are not in the given logs/table/notebooks")
    else:
        replay = ReplaySettings(values=inputs.values)
        if inputs.cell_timeout_s is not None:
            replay = replace(replay, cell_timeout_s=inputs.cell_timeout_s, logged_time_factor=None)
        settings["replay"] = asdict(replay)
        out = inputs.steps_out or steps_default
        from themisto.release.sources import replay_workspace

        with tempfile.TemporaryDirectory(prefix="themisto-ws-") as tmp:
            try:
                workspace, source["workspace"], trajectories = replay_workspace(
                    trajectories, ingested.workspace_folders if ingested else {}, Path(tmp), given=inputs.workspace,
                    seed=inputs.workspace_seed, size=inputs.workspace_size, out=out)
            except ValueError as exc:
                raise ReleaseError(str(exc)) from None
            replay_to_file(trajectories, out, workspace, replay, progress=progress, runner=runner,
                           recipe=source["workspace"])
        steps = read_steps(out)
    rule = _cell_limit_rule(settings.get("replay") or {})
    if rule:
        settings["cell_limit_rule"] = rule
    from themisto.release.workspaces import rebuild_record

    participants = {t.id: t.participant for t in trajectories}
    rebuild = {t.id: rebuild_record(t, source.get("workspace")) for t in trajectories}
    rows, source["health"] = apply_health(trajectory_rows(steps, participants, {t.id: t for t in trajectories},
                                                          rebuild))
    if not rows:
        raise ReleaseError(f"{NO_ROWS}: {why_nothing(source, trajectories)}")
    return rows, source, settings, fidelity_of(steps, trajectories, finals)


def _cell_limit_rule(replay: dict) -> str:
    """The replay's cell limits in words (`themisto.replay.cell_limits.describe`), from its recorded settings; "" for
    a steps file that recorded none."""
    from themisto.replay.cell_limits import describe

    if "cell_timeout_s" not in replay:
        return ""
    if "logged_time_factor" not in replay:  # replayed before the rule existed: one limit for every cell
        return describe(replay["cell_timeout_s"], None, replay["cell_timeout_s"])
    return describe(replay["cell_timeout_s"], replay["logged_time_factor"], replay["cell_timeout_ceiling_s"],
                    replay.get("cell_clock", "wall"), interrupted_s=replay.get("interrupted_timeout_s"),
                    interrupted_lines=replay.get("interrupted_lines"))


def fidelity_of(steps: Sequence, trajectories: Sequence, finals: dict[str, Path]) -> dict[str, dict]:
    """Per trajectory: the replay's fidelity to the log (`themisto.replay.fidelity`), its participant, task and
    number of kernels, and its fidelity to the outputs of the participant's final notebook where there is one
    (`themisto.replay.final_notebook`)."""
    from themisto.replay.fidelity import fidelity_report
    from themisto.replay.final_notebook import compare_final_notebook

    known = {t.id: t for t in trajectories}
    by_kernel: dict[str, list] = {}
    for step in steps:
        by_kernel.setdefault(step.kernel_id, []).append(step)
    out = {}
    for report in fidelity_report(steps):
        trajectory = known.get(report.kernel_id)
        final = finals.get(report.kernel_id)
        out[report.kernel_id] = {
            **report.to_dict(), "participant": trajectory.participant if trajectory else None,
            "task": trajectory.task if trajectory else None,
            "kernels": len({s.kernel_id for s in trajectory.sources if s.kernel_id}) if trajectory else None,
            "final_notebook": None if final is None or trajectory is None else
            compare_final_notebook(trajectory, by_kernel[report.kernel_id], final).to_dict()}
    return out




def replay_values(inputs: BuildInputs, steps_default: Path) -> Path | None:
    """The values folder of the replay a build reads (themisto.replay.values), or None: none was stored, the
    inputs ask for none, or the rows are the paper's."""
    from themisto.replay.values import values_folder

    if inputs.paper is not None or not inputs.values:
        return None
    folder = values_folder(inputs.steps or inputs.steps_out or steps_default)
    return folder if folder.is_dir() else None
