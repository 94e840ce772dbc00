"""Read a run folder written by `themisto generate` (RUN/run.json, RUN/generations.jsonl) and find its release.

Everything read here is checked before anything is scored: a corrupt or incomplete line is an error naming the
file and line, an example id the release lacks is an error naming the id, and a release whose Parquet files no
longer hash to the run's recorded content hash is refused (the run was made against another release).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from themisto.errors import InputError
from themisto.release.folder import open_release
from themisto.vocabulary import CONTEXT_MODES, GENERATION_STATUSES, TASKS

RUN_FILE = "run.json"
GENERATIONS_FILE = "generations.jsonl"
RUN_FORMAT = 1


class RunError(InputError):
    """A run folder that cannot be scored; the message names the file and line, or the example id."""


@dataclass(frozen=True)
class Generation:
    """One (example, context, sample) line of generations.jsonl, with the line it came from."""

    id: str
    context: str
    sample: int
    prediction: str
    status: str
    reason: str | None
    line: int


@dataclass
class RunFolder:
    """A checked run folder: its settings, its example ids in first-seen order, and every generation by key."""

    folder: Path
    meta: dict
    task: str
    contexts: list[str]
    samples: int
    ids: list[str]
    generations: dict[tuple[str, str, int], Generation] = field(repr=False)

    def samples_of(self, example_id: str, context: str) -> list[Generation]:
        return [self.generations[(example_id, context, s)] for s in range(self.samples)]


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        raise RunError(f"{path}: missing (a run folder is written by `themisto generate -o RUN/`)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(meta, dict):
        raise RunError(f"{path}: expected a JSON object")
    if meta.get("format") != RUN_FORMAT:
        raise RunError(f"{path}: format {meta.get('format')!r}, expected {RUN_FORMAT}")
    if meta.get("task") not in TASKS:
        raise RunError(f"{path}: task {meta.get('task')!r}, expected one of {', '.join(TASKS)}")
    contexts = meta.get("contexts")
    if (not isinstance(contexts, list) or not contexts or len(set(contexts)) != len(contexts)
            or any(c not in CONTEXT_MODES for c in contexts)):
        raise RunError(f"{path}: contexts {contexts!r}, expected distinct names from {', '.join(CONTEXT_MODES)}")
    samples = (meta.get("sampling") or {}).get("n")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise RunError(f"{path}: sampling.n {samples!r}, expected a positive integer")
    release = meta.get("release")
    if not isinstance(release, dict) or not isinstance(release.get("content_hash"), str):
        raise RunError(f"{path}: release.content_hash missing (which release was this run made against?)")
    return meta


def _generation(record: object, where: str, lineno: int, meta: dict) -> Generation:
    if not isinstance(record, dict):
        raise RunError(f"{where}: expected a JSON object")
    example_id, context, sample = record.get("id"), record.get("context"), record.get("sample")
    if not isinstance(example_id, str) or not example_id:
        raise RunError(f"{where}: `id` must be a non-empty string")
    if record.get("task") != meta["task"]:
        raise RunError(f"{where}: example {example_id}: task {record.get('task')!r}, but the run's task is "
                       f"{meta['task']!r}")
    if context not in meta["contexts"]:
        raise RunError(f"{where}: example {example_id}: context {context!r} is not one of the run's "
                       f"{', '.join(meta['contexts'])}")
    if not isinstance(sample, int) or isinstance(sample, bool) or not 0 <= sample < meta["sampling"]["n"]:
        raise RunError(f"{where}: example {example_id}: sample {sample!r}, expected 0..{meta['sampling']['n'] - 1}")
    status, prediction, reason = record.get("status"), record.get("prediction"), record.get("reason")
    if status not in GENERATION_STATUSES:
        raise RunError(f"{where}: example {example_id}: status {status!r}, expected one of "
                       f"{', '.join(GENERATION_STATUSES)}")
    if not isinstance(prediction, str):
        raise RunError(f"{where}: example {example_id}: `prediction` is {type(prediction).__name__}, expected str")
    if reason is not None and not isinstance(reason, str):
        raise RunError(f"{where}: example {example_id}: `reason` must be a string or null")
    return Generation(example_id, context, sample, prediction, status, reason, lineno)


def read_run(folder: str | Path) -> RunFolder:
    """Read and check a run folder; every example must have one line per context and sample."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunError(f"{folder}: no such run folder")
    meta = _read_meta(folder / RUN_FILE)
    path = folder / GENERATIONS_FILE
    if not path.is_file():
        raise RunError(f"{path}: missing")
    generations: dict[tuple[str, str, int], Generation] = {}
    ids: dict[str, None] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunError(f"{where}: not JSON ({exc.msg}); a cut last line means the run stopped mid-write: "
                               "rerun the same `themisto generate` command to finish it") from None
            item = _generation(record, where, lineno, meta)
            key = (item.id, item.context, item.sample)
            if key in generations:
                raise RunError(f"{where}: example {item.id} context {item.context} sample {item.sample} was already "
                               f"given on line {generations[key].line}")
            generations[key] = item
            ids.setdefault(item.id)
    if not generations:
        raise RunError(f"{path}: no generations")
    samples = meta["sampling"]["n"]
    for example_id in ids:
        for context in meta["contexts"]:
            for sample in range(samples):
                if (example_id, context, sample) not in generations:
                    raise RunError(f"{path}: example {example_id} has no line for context {context} sample {sample} "
                                   "(the run is incomplete: rerun the same `themisto generate` command)")
    return RunFolder(folder, meta, meta["task"], list(meta["contexts"]), samples, list(ids), generations)


def find_release(run: RunFolder, release: str | Path | None = None) -> tuple[Path, str]:
    """The release folder (given, or the one run.json names) and its content hash, which must be the run's."""
    recorded = run.meta["release"]
    if release is None:
        named = recorded.get("path")
        if not isinstance(named, str) or not named:
            raise RunError(f"{run.folder / RUN_FILE}: release.path missing; pass the release folder explicitly")
        release = Path(named)
        if not release.is_absolute() and (run.folder / release).is_dir():
            release = run.folder / release  # a run folder moved together with its release
    release = Path(release)
    if not release.is_dir():
        raise RunError(f"{release}: no such release folder (the run was made against {recorded.get('path')!r})")
    actual = open_release(release).content_hash
    if actual != recorded["content_hash"]:
        raise RunError(f"{release}: content hash {actual[:12]}… differs from the run's "
                       f"{recorded['content_hash'][:12]}… ({run.folder / RUN_FILE}): the run was generated against "
                       "another release; refusing to mix")
    return release, actual

