"""The development trajectory: the cells a developer executed, in order, and what the log said about each.

Every reader (JuNE logs, the JuNE table, notebooks) produces these records, so replay, tasks, the metric and
evaluation never care where the data came from. JSONL holds one trajectory per line and round-trips exactly.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator, Literal, Sequence

from themisto.errors import InputError
from themisto.jsonrecords import from_dict
from themisto.vocabulary import CODE_STATES, DAMAGE_KINDS, LOGGED_STATUSES, CodeState, DamageKind, LoggedStatus

# Kernel events that change the state between executions, kept in the order they happened.
KernelEventKind = Literal["restart", "interrupt"]
KERNEL_EVENT_KINDS: tuple[str, ...] = ("restart", "interrupt")

_TASK_NAME = re.compile(r"(?<![a-z0-9])task([12])(?![0-9])")


class TrajectoryFormatError(InputError):
    """A trajectory file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class OutputSummary:
    """One output of a cell as the log recorded it: its type and its serialized size, never its text."""

    output_type: str
    size: int


@dataclass(frozen=True)
class Damage:
    """What one log line lost, named by `line` (`file:line`); `field` is the event's field it fell in."""

    kind: DamageKind
    line: str
    field: str | None = None
    note: str = ""


@dataclass
class Execution:
    """One cell execution, with the code exactly as the developer ran it (or as far as the log kept it: see
    `code_state`)."""

    cell_id: str
    code: str
    status: LoggedStatus = "unknown"
    ename: str | None = None
    evalue: str | None = None
    outputs: list[OutputSummary] = field(default_factory=list)
    started_at: str | None = None  # ISO-8601 UTC of the `execute` event; None where it was not logged
    finished_at: str | None = None
    cell_num: int | None = None  # position of the selected cell in the notebook, as logged
    execution_count: int | None = None  # from notebooks
    origin: str | None = None  # `file:line` of the event that opened it
    code_state: CodeState = "as_logged"
    repaired_from: str | None = None  # where a repaired code's text came from (`file:line`, or a notebook's cell)
    damage: list[Damage] = field(default_factory=list)

    @property
    def output_types(self) -> list[str]:
        return [o.output_type for o in self.outputs]


@dataclass
class KernelEvent:
    """A restart or interrupt; `before` is the index of the first execution that came after it."""

    kind: KernelEventKind
    before: int
    time: str | None = None
    kernel_id: str | None = None  # set on the restart where another kernel of the same notebook took over


@dataclass(frozen=True)
class SourceFile:
    """A file a trajectory was read from: its name (relative to the folder given), sha256 and the kernel in it."""

    file: str
    sha256: str
    kernel_id: str | None = None
    writer: str | None = None  # the shell that wrote a JuNE log (`themisto.ingest.june_format.WRITERS`)


@dataclass
class Trajectory:
    """A development trajectory: one kernel's executions in the order they ran."""

    id: str  # the kernel id for JuNE data; a stable name otherwise
    notebook: str
    source: str  # "june-log", "june-table", "notebook", ...
    executions: list[Execution] = field(default_factory=list)
    events: list[KernelEvent] = field(default_factory=list)
    participant: str | None = None  # anonymized
    task: str | None = None
    # Events the reader did not turn into executions, counted by kind (e.g. "duplicate_finished_execute",
    # "unknown:<name>"), so nothing the log held disappears silently.
    ignored: dict[str, int] = field(default_factory=dict)
    # Every raw event the reader saw, counted by kind (e.g. {"execute": 398, ...}); empty for notebooks.
    logged_events: dict[str, int] = field(default_factory=dict)
    sources: list[SourceFile] = field(default_factory=list)
    # Where its kernel runs, for sources replayed in their own files (IPython histories in their repository): the
    # subfolder of the replay's workspace that the kernel gets a copy of (None: all of it) and the folder inside
    # that copy it starts in (None: its top). `themisto.replay.workspace_recipe.compose` lays the workspace out.
    workspace: str | None = None
    start_dir: str | None = None
    # Where a trajectory from the wild came from, without naming anyone (`themisto.ingest.ipython_corpus`):
    # repository (a hashed id), commit, path, session, date, licence, and how its notebook was matched.
    provenance: dict | None = None
    # How long a cell the log did not time may run in replay (seconds of `ReplaySettings.cell_clock`); None: the
    # replay's `cell_timeout_s`. A source without any timing sets its own (`CorpusSettings.cell_timeout_s`).
    cell_timeout_s: float | None = None

    def digest(self) -> str:
        """The sha256 of everything the trajectory holds: equal digests, the same replay. An unset `cell_timeout_s`
        is left out, so trajectories that do not set it keep the digest they had before the field existed (a stopped
        replay of them still resumes)."""
        held = asdict(self)
        if held["cell_timeout_s"] is None:
            del held["cell_timeout_s"]
        return hashlib.sha256(json.dumps(held, sort_keys=True, default=str).encode("utf-8")).hexdigest()

    def errors_by_ename(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ex in self.executions:
            if ex.status == "error":
                key = ex.ename or "<unknown>"
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def count_events(self, kind: KernelEventKind) -> int:
        return sum(1 for ev in self.events if ev.kind == kind)

    def count_statuses(self) -> dict[str, int]:
        """Executions per logged status, every status listed (zero where none)."""
        counts = dict.fromkeys(LOGGED_STATUSES, 0)
        for ex in self.executions:
            counts[ex.status] = counts.get(ex.status, 0) + 1
        return counts

    def summary(self) -> dict:
        """The figures `themisto ingest` prints for this trajectory."""
        return {
            "notebook": self.notebook,
            "task": self.task,
            "source": self.source,
            "participant": self.participant,
            "executions": len(self.executions),
            # Raw `execute` events: fewer than executions, because runs that raised were logged without one.
            "logged_execute_events": self.logged_events.get("execute") if self.logged_events else None,
            "statuses": self.count_statuses(),
            "errors": sum(self.errors_by_ename().values()),
            "errors_by_ename": self.errors_by_ename(),
            "executions_without_code": sum(1 for ex in self.executions if ex.code == ""),
            "restarts": self.count_events("restart"),
            "interrupts": self.count_events("interrupt"),
            "ignored": dict(sorted(self.ignored.items())),
            "code_states": self.count_code_states(),
            "kernels": [s.kernel_id for s in self.sources if s.kernel_id],
        }

    def logged_seconds(self) -> list[float | None]:
        """Per execution, the seconds it ran for the developer: from its `execute` event, or from the end of the
        execution before it when it was queued behind that one (a kernel runs one cell at a time, so the cells of a
        "run all" are logged as started together), to its finish; None where the log lacks either end."""
        out: list[float | None] = []
        busy_until: datetime | None = None  # the latest finish logged so far
        for execution in self.executions:
            started, finished = _instant(execution.started_at), _instant(execution.finished_at)
            seconds = None
            if started is not None and finished is not None and finished >= started:
                if busy_until is not None and started < busy_until <= finished:
                    started = busy_until
                seconds = round((finished - started).total_seconds(), 3)
            out.append(seconds)
            if finished is not None and (busy_until is None or finished > busy_until):
                busy_until = finished
        return out

    def count_code_states(self) -> dict[str, int]:
        """Executions per code state, every state listed (zero where none)."""
        counts = dict.fromkeys(CODE_STATES, 0)
        for ex in self.executions:
            counts[ex.code_state] += 1
        return counts

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Trajectory":
        executions = []
        for raw in data.get("executions", []):
            if raw.get("status", "unknown") not in LOGGED_STATUSES:
                raise ValueError(f"unknown status {raw['status']!r} (expected one of {LOGGED_STATUSES})")
            if raw.get("code_state", "as_logged") not in CODE_STATES:
                raise ValueError(f"unknown code state {raw['code_state']!r} (expected one of {CODE_STATES})")
            if any(d.get("kind") not in DAMAGE_KINDS for d in raw.get("damage", [])):
                raise ValueError(f"unknown damage kind (expected one of {DAMAGE_KINDS})")
            outputs = [from_dict(OutputSummary, o) for o in raw.get("outputs", [])]
            damage = [from_dict(Damage, d) for d in raw.get("damage", [])]
            executions.append(from_dict(Execution, raw, outputs=outputs, damage=damage))
        events = []
        for raw in data.get("events", []):
            if raw.get("kind") not in KERNEL_EVENT_KINDS:
                raise ValueError(f"unknown kernel event {raw.get('kind')!r} (expected one of {KERNEL_EVENT_KINDS})")
            events.append(from_dict(KernelEvent, raw))
        sources = [from_dict(SourceFile, raw) for raw in data.get("sources", [])]
        return from_dict(cls, data, executions=executions, events=events, sources=sources)


def _instant(text: str | None) -> datetime | None:
    """An event's ISO-8601 time (the logs write UTC with a trailing Z), or None where it is missing or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def inputs_sha256(codes: Sequence[str]) -> str:
    """The hash of a trajectory's inputs, in order (a session's whole, before any cut): what a rebuild from pointers
    checks it read the same session with (`themisto.ingest.pointers`)."""
    return hashlib.sha256(json.dumps(list(codes), ensure_ascii=False).encode("utf-8")).hexdigest()


def anonymize(participant: str | None) -> str | None:
    """A stable pseudonym, so a participant can be kept on one side of a split without being named."""
    if participant is None or participant == "":
        return None
    return "p-" + hashlib.sha256(participant.encode("utf-8")).hexdigest()[:10]


def task_of(notebook_name: str) -> str | None:
    """The JuNE task a notebook belongs to (`task1.ipynb`, `participant-final-task1.ipynb` → `task1`), or None.

    >>> [task_of(n) for n in ("task1.ipynb", "Task2 (copy).ipynb", "final-task1.ipynb", "subtask1.ipynb", "x.ipynb")]
    ['task1', 'task2', 'task1', None, None]
    """
    stem = Path(notebook_name).stem.lower()
    # "task1" as a word of its own, so "subtask1" or "task12" do not match.
    match = _TASK_NAME.search(stem)
    return f"task{match.group(1)}" if match else None


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    """Write one trajectory per line; the file appears whole or not at all."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            for traj in trajectories:
                fh.write(json.dumps(traj.to_dict(), ensure_ascii=False, sort_keys=True) + "\n")
                n += 1
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def iter_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Each trajectory of a JSONL file, read within bounds (`themisto.ingest.limits.TRAJECTORIES`)."""
    from themisto.bounded import iter_json_lines
    from themisto.ingest.limits import TRAJECTORIES

    path = Path(path)
    for line in iter_json_lines(path, TRAJECTORIES, skip_blank=True):
        try:
            yield Trajectory.from_dict(line.value)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TrajectoryFormatError(f"{path}:{line.number}: not a trajectory record ({exc})") from exc


def read_jsonl(path: str | Path) -> list[Trajectory]:
    return list(iter_jsonl(path))
