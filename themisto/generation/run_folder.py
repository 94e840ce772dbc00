"""The run folder on disk, owned here: its file names, the generation record's schema, and the one reader that
generation (resuming), scoring (`themisto score RUN/`) and the leaderboard (a submission is a run folder) share.

    RUN/
      run.json            the run's settings (written whole, by rename, at the start and again at the end)
      generations.jsonl   one `Generation` per (example, context, sample), appended and flushed line by line

A run folder may be someone else's (a submission), so both files are read within bounds (`themisto.bounded`):
past a bound, or not well-formed, is a refusal naming the file, the line and the bound. Resuming cuts a torn last
line (the process died mid-write) and redoes it; a corrupt or repeated line anywhere else is refused with its line
number, and the file is left as it is.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Collection

from themisto.bounded import Bounds, iter_json_lines, read_json
from themisto.errors import InputError
from themisto.generation.budget import Kept
from themisto.generation.probe_protocol import Transcript
from themisto.resume import LineWriter
from themisto.vocabulary import CONTEXT_MODES, GENERATION_STATUSES, TASKS, GenerationStatus

RUN_FILE = "run.json"
GENERATIONS_FILE = "generations.jsonl"
RUN_FORMAT = 1
# run.json: settings, each context's template text, package versions: a few KB. A run of many megabytes is not one.
RUN_BOUNDS = Bounds(file_bytes=1 << 20, lines=50_000, depth=16, items=100_000)
# generations.jsonl: one prediction per line; a run of a few thousand examples x contexts x samples, each line a
# few KB. A longer line is a flood, not a prediction.
GENERATIONS_BOUNDS = Bounds(file_bytes=1 << 30, line_bytes=1 << 20, lines=1_000_000, depth=16, items=20_000_000)
# The settings a resumed run must share with the one that started the folder, as (label, path in run.json).
SAME_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("task", ("task",)), ("contexts", ("contexts",)), ("backend", ("backend",)), ("model", ("model",)),
    ("sampling", ("sampling",)), ("limit", ("limit",)), ("max_prompt_tokens", ("max_prompt_tokens",)),
    ("split", ("split",)), ("templates", ("templates",)), ("backend_options", ("backend_options",)),
    ("probe", ("probe",)), ("delta", ("delta",)),
)


class RunFolderError(InputError):
    """A run folder that cannot be read, resumed or scored; the message names the file and line, or the example."""


# ---------------------------------------------------------------------------------------------------------------
# The generation record: one line of generations.jsonl


def _optional(kind: type):
    return lambda value: value is None or (isinstance(value, kind) and not isinstance(value, bool))


@dataclass(frozen=True)
class Generation:
    """One sample's generation: what the backend gave (raw text, a closed status, why it is not ok, token counts),
    and where it belongs (example, task, context, sample) with the answer taken from it, filled in by the run.

    The one schema of a generations.jsonl line: a field added here is written, read back, checked and resumed."""

    raw: str | None = ""
    status: GenerationStatus = "ok"
    reason: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    id: str = ""
    task: str = ""
    context: str = ""
    sample: int = 0
    prediction: str = ""
    # What the prompt showed of its row (`themisto.generation.budget.Kept` as a dict); None where it was skipped or
    # the run predates the field.
    kept: dict | None = None
    # A probe-mode line's transcript (`themisto.generation.probe_protocol.Transcript` as a dict); null in the others.
    probes: dict | None = None
    # The native tool calls a backend parsed from the reply (each {"id", "name", "arguments"}): read by a probe
    # conversation as it runs, never written (the transcript records the probes they asked for).
    tool_calls: tuple[dict, ...] = field(default=(), repr=False, compare=False, metadata={"line": False})

    def to_dict(self) -> dict:
        """The line's JSON object: where it belongs first, then the rest in field order."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("line", True)}
        return {**{key: data.pop(key) for key in _PLACE}, **data}

    @property
    def key(self) -> tuple[str, str, int]:
        return self.id, self.context, self.sample

    @classmethod
    def from_line(cls, value: Any, where: str, run: dict, ids: Collection[str] | None = None) -> Generation:
        """A line's record, checked against the run's settings (and the release's `ids`, where given); a bad one
        is a RunFolderError naming `where` and the example."""
        if not isinstance(value, dict):
            raise RunFolderError(f"{where}: expected a JSON object")
        example = value.get("id")
        if not isinstance(example, str) or not example:
            raise RunFolderError(f"{where}: `id` must be a non-empty string")
        if ids is not None and example not in ids:
            raise RunFolderError(f"{where}: id {example!r} is not a {run['task']} test id of the release (ids from "
                                 "another release?)")
        checks = [
            (value.get("task") == run["task"], f"task {value.get('task')!r}, the run's task is {run['task']!r}"),
            (value.get("context") in run["contexts"],
             f"context {value.get('context')!r} is not one of the run's {', '.join(run['contexts'])}"),
            (_is_int(value.get("sample")) and 0 <= value["sample"] < run["sampling"]["n"],
             f"sample {value.get('sample')!r}, expected 0..{run['sampling']['n'] - 1}"),
            (isinstance(value.get("prediction"), str),
             f"`prediction` must be a string, got {type(value.get('prediction')).__name__}"),
            (value.get("status") in GENERATION_STATUSES,
             f"status {value.get('status')!r}, expected one of {', '.join(GENERATION_STATUSES)}"),
            *[(check(value.get(name)), f"`{name}` must be {what} or null") for name, check, what in _OPTIONAL],
            (Transcript.problem(value.get("probes")) is None, str(Transcript.problem(value.get("probes")))),
        ]
        for ok, problem in checks:
            if not ok:
                raise RunFolderError(f"{where}: example {example}: {problem}")
        return cls(**{f.name: value.get(f.name, f.default) for f in fields(cls) if f.metadata.get("line", True)})


_PLACE = ("id", "task", "context", "sample", "prediction")
_OPTIONAL = (("raw", _optional(str), "a string"), ("reason", _optional(str), "a string"),
             ("tokens_in", _optional(int), "an integer"), ("tokens_out", _optional(int), "an integer"),
             ("kept", Kept.valid, "an object of counts"))
RECORD_KEYS: tuple[str, ...] = tuple(Generation().to_dict())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------------------------------
# run.json


def check_run_json(run: Any, path: Path) -> dict:
    """run.json's shape, as every reader needs it: format, task, context modes, samples per example and the
    release it was made against; RunFolderError names the field."""
    if not isinstance(run, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    if run.get("format") != RUN_FORMAT:
        raise RunFolderError(f"{path}: format {run.get('format')!r}, expected {RUN_FORMAT}")
    if run.get("task") not in TASKS:
        raise RunFolderError(f"{path}: task {run.get('task')!r}, expected one of {', '.join(TASKS)}")
    contexts = run.get("contexts")
    if (not isinstance(contexts, list) or not contexts or len(set(map(str, contexts))) != len(contexts)
            or any(c not in CONTEXT_MODES for c in contexts)):
        raise RunFolderError(f"{path}: contexts {contexts!r}, expected distinct names from "
                             f"{', '.join(CONTEXT_MODES)}")
    samples = run.get("sampling").get("n") if isinstance(run.get("sampling"), dict) else None
    if not _is_int(samples) or samples < 1:
        raise RunFolderError(f"{path}: sampling.n {samples!r}, expected a positive integer")
    release = run.get("release")
    if not isinstance(release, dict) or not isinstance(release.get("content_hash"), str):
        raise RunFolderError(f"{path}: release.content_hash missing (which release was this run made against?)")
    return run


def read_run_json(folder: Path, *, missing_ok: bool = False) -> dict | None:
    """The folder's run.json, read within RUN_BOUNDS and checked (`check_run_json`); None when it is missing and
    `missing_ok`."""
    path = Path(folder) / RUN_FILE
    if not path.exists() and not path.is_symlink():
        if missing_ok:
            return None
        raise RunFolderError(f"{path}: missing (a run folder is written by `themisto generate -o RUN/`)")
    return check_run_json(read_json(path, RUN_BOUNDS), path)


def _get(data: dict, path: tuple[str, ...]):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def check_same_run(existing: dict, new: dict, folder: Path) -> None:
    """Refuse to add generations to a folder written against another release or with other settings."""
    old_hash, new_hash = _get(existing, ("release", "content_hash")), _get(new, ("release", "content_hash"))
    if old_hash != new_hash:
        raise RunFolderError(f"{folder}: written against another release (content hash {old_hash} there, "
                             f"{new_hash} here); use another output folder")
    for label, path in SAME_SETTINGS:
        old, now = _get(existing, path), _get(new, path)
        if old != now:
            raise RunFolderError(f"{folder}: written with {label} = {json.dumps(old)}, this run has "
                                 f"{json.dumps(now)}; refusing to mix (use another output folder)")


# ---------------------------------------------------------------------------------------------------------------
# generations.jsonl


@dataclass
class Generations:
    """The records of generations.jsonl by (id, context, sample), each one's line, the keys outside the schema
    (counted), and whether a torn last line was found."""

    records: dict[tuple[str, str, int], Generation] = field(default_factory=dict)
    lines: dict[tuple[str, str, int], int] = field(default_factory=dict)
    extra_keys: Counter = field(default_factory=Counter)
    torn_line: bool = False

    def ids(self) -> list[str]:
        """The example ids in the order the file first gives them."""
        return list(dict.fromkeys(key[0] for key in self.records))

    def missing(self, ids: Collection[str], run: dict) -> list[tuple[str, str, int]]:
        """Each (id, context, sample) of `ids` that the run's settings call for and the file lacks."""
        return [(i, c, s) for i in ids for c in run["contexts"] for s in range(run["sampling"]["n"])
                if (i, c, s) not in self.records]


def read_generations(folder: Path, run: dict, *, ids: Collection[str] | None = None, repair: bool = False,
                     bounds: Bounds = GENERATIONS_BOUNDS) -> Generations:
    """Every line of the folder's generations.jsonl, checked against `run` (and `ids`, where given), within
    `bounds`; a repeated (id, context, sample) is refused naming both lines. With `repair` (a resume of one's own
    folder) a torn last line is cut off; otherwise a last line without its newline must still parse."""
    path = Path(folder) / GENERATIONS_FILE
    found = Generations()
    if repair and not path.exists():
        return found
    for line in iter_json_lines(path, bounds, skip_blank=not repair, torn_tail="report" if repair else "parse"):
        if not line.ended and repair:
            found.torn_line = True
            with path.open("r+b") as fh:
                fh.truncate(line.offset)
            break
        where = f"{path}:{line.number}"
        record = Generation.from_line(line.value, where, run, ids)
        if record.key in found.records:
            raise RunFolderError(f"{where}: example {record.id} (context {record.context}, sample {record.sample}) "
                                 f"was already given on line {found.lines[record.key]}")
        found.records[record.key] = record
        found.lines[record.key] = line.number
        found.extra_keys.update(key for key in line.value if key not in RECORD_KEYS)
    return found


class GenerationWriter(LineWriter):
    """Appends one record per line and flushes it, so a killed run loses at most the line being written."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / GENERATIONS_FILE)

    def write(self, value: Generation | dict) -> None:
        super().write(value.to_dict() if isinstance(value, Generation) else value)


# ---------------------------------------------------------------------------------------------------------------
# A whole run, as scoring reads it


@dataclass
class RunFolder:
    """A checked run folder: its settings, its example ids in first-seen order, and every generation by key."""

    folder: Path
    meta: dict
    generations: dict[tuple[str, str, int], Generation] = field(repr=False)
    ids: list[str] = field(default_factory=list)

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def contexts(self) -> list[str]:
        return list(self.meta["contexts"])

    @property
    def samples(self) -> int:
        return self.meta["sampling"]["n"]

    def samples_of(self, example_id: str, context: str) -> list[Generation]:
        return [self.generations[(example_id, context, s)] for s in range(self.samples)]


def read_run(folder: str | Path) -> RunFolder:
    """A finished run folder: run.json and every line checked; each example has one line per context and sample."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder")
    meta = read_run_json(folder)
    path = folder / GENERATIONS_FILE
    found = read_generations(folder, meta)
    if not found.records:
        raise RunFolderError(f"{path}: no generations")
    missing = found.missing(found.ids(), meta)
    if missing:
        example, context, sample = missing[0]
        raise RunFolderError(f"{path}: example {example} has no line for context {context} sample {sample} (the run "
                             "is incomplete: rerun the same `themisto generate` command)")
    return RunFolder(folder, meta, found.records, found.ids())


def find_release(run: RunFolder, release=None):
    """The release of a run: `release` (an opened `ReleaseInfo`), or else the folder run.json names, opened here
    (the run folder is where that path comes from); either way its content hash must be the run's."""
    from themisto.release.folder import open_release

    recorded = run.meta["release"]
    if release is None:
        named = recorded.get("path")
        if not isinstance(named, str) or not named:
            raise RunFolderError(f"{run.folder / RUN_FILE}: release.path missing; pass the release folder explicitly")
        path = Path(named)
        if not path.is_absolute() and (run.folder / path).is_dir():
            path = run.folder / path  # a run folder moved together with its release
        if not path.is_dir():
            raise RunFolderError(f"{path}: no such release folder (the run was made against {named!r})")
        release = open_release(path)
    if release.content_hash != recorded["content_hash"]:
        raise RunFolderError(f"{release.path}: content hash {release.content_hash[:12]}… differs from the run's "
                             f"{recorded['content_hash'][:12]}… ({run.folder / RUN_FILE}): the run was generated "
                             "against another release; refusing to mix")
    return release
