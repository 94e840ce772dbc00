"""Read JuNE event data (the extension's local `.log` files and the JuNE table CSV) into trajectories.

Both readers turn lines into `JuneEvent`s and hand them, grouped by kernel and in time order, to one function,
`trajectory_from_events`, which pairs events into executions with these rules:

1. `execute` opens a pending execution of its cell (`cell_index`), code = its `cell_source`, placed at that point.
2. `finished_execute` of a cell with a pending execution closes it: outputs from `cell_output`; status "error"
   when the outputs hold an error output, with ename/evalue from the `error` event that immediately follows
   (same cell), else "ok".
3. `finished_execute` without a pending execution, immediately followed by its `error` event: an errored
   execution of its own (`started_at` None, code = the finished event's `cell_source`). The logs hold many:
   a run that raised was logged with no `execute` event at all.
4. Any other `finished_execute` without a pending execution is not a run when it repeats the previous finished
   event of that cell (same source and outputs): ignored as "duplicate_finished_execute". Otherwise, if its
   outputs hold an error (its `error` event was not logged), it is an errored execution with ename None;
   if not (mostly bursts of `[]` outputs: queued cells aborted after an error), ignored as
   "finished_without_execute".
5. An `error` event that does not follow a finished event of its cell (that `finished_execute` line is missing
   from the log) closes the cell's pending execution as an error, or else is an errored execution whose code
   was not logged: code "". Code is also "" where the finished event logged an emptied cell. Downstream
   (replay, tasks) must treat code "" as unknown code, not as an empty cell.
6. A pending execution that never finishes (a later `execute` of the same cell, or the end of the log, comes
   first) stays an execution: status "interrupted" if a kernel interrupt or restart came while it was pending,
   else "unknown".
7. `kernel_restarting` / `kernel_interrupting` become `KernelEvent("restart"/"interrupt", before=<executions so
   far>)`. Other known events (create, delete, rendered, to_code, to_markdown, save_notebook, notebook_renamed)
   are counted in `Trajectory.ignored` by name, unknown ones as "unknown:<event>", never silently dropped.

Hence executions = `execute` events + errored runs logged without one (rules 3-5); `Trajectory.logged_events`
keeps the raw counts. Errors by ename equal the counter of enames over the `error` events, plus "<unknown>" for
rule 4's error outputs whose `error` event is missing. On the two real logs: 544 = 398 + 146 (task 1, one of
them "<unknown>") and 220 = 180 + 40 (task 2, one with code "").
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from themisto.errors import InputError
from themisto.ingest.june_format import LogLineError, decode_log_line
from themisto.ingest.trajectory import Execution, KernelEvent, OutputSummary, Trajectory, anonymize, task_of

KERNEL_EVENTS: dict[str, str] = {"kernel_restarting": "restart", "kernel_interrupting": "interrupt"}
# Events the extension logs that never are executions; counted under their own name.
NON_EXECUTION_EVENTS: frozenset[str] = frozenset(
    {"create", "delete", "rendered", "to_code", "to_markdown", "save_notebook", "notebook_renamed"}
)
BAD_LINE = "bad_line"


class JuneFormatError(InputError):
    """JuNE data that cannot be read; the message starts with `file:line:`."""


@dataclass
class JuneEvent:
    """One logged event, normalised; `origin` is `file:line` for messages."""

    time: str
    kernel_id: str
    event: str
    notebook_name: str = ""
    cell_index: str = ""
    cell_num: int | None = None
    cell_type: str = ""
    cell_source: str = ""
    outputs: list[OutputSummary] | None = None  # parsed `cell_output` of finished_execute events
    error: tuple[str | None, str | None] | None = None  # (ename, evalue) of `error` events
    session_id: str | None = None
    user_id: str | None = None
    origin: str = ""


def _text(value: object) -> str:
    return "" if value is None else str(value)


def event_from_record(record: dict) -> JuneEvent:
    """Validate one raw record (log line or table row); raise ValueError saying what was expected."""
    for key in ("time", "kernel_id", "event"):
        if not _text(record.get(key)):
            raise ValueError(f"expected a non-empty {key!r} field")
    kind = _text(record["event"])
    num = record.get("cell_num")
    cell_num: int | None
    if num is None or (isinstance(num, str) and num.strip().lower() in ("", "nan", "none", "null")):
        cell_num = None  # pandas writes a missing number as "" or "nan"
    else:
        try:
            cell_num = int(float(num))  # the table may hold "3.0"
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer cell_num, got {num!r}") from None
    outputs = None
    if kind == "finished_execute":
        outputs = _parse_outputs(record.get("cell_output"))
    error = None
    if kind == "error":
        error = _parse_error(_text(record.get("cell_source")))
    return JuneEvent(
        time=_text(record["time"]),
        kernel_id=_text(record["kernel_id"]),
        event=kind,
        notebook_name=_text(record.get("notebook_name")),
        cell_index=_text(record.get("cell_index")),
        cell_num=cell_num,
        cell_type=_text(record.get("cell_type")),
        cell_source=_text(record.get("cell_source")),
        outputs=outputs,
        error=error,
        session_id=_text(record.get("session_id")) or None,
        user_id=_text(record.get("user_id")) or None,
    )


def _parse_outputs(raw: object) -> list[OutputSummary]:
    if raw is None or raw == "":
        return []
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected cell_output to be a JSON list of {{output_type, size}} ({exc.msg})") from None
    if not isinstance(items, list) or not all(isinstance(o, dict) and "output_type" in o for o in items):
        raise ValueError("expected cell_output to be a JSON list of {output_type, size}")
    try:
        return [OutputSummary(str(o["output_type"]), int(o.get("size") or 0)) for o in items]
    except (TypeError, ValueError):
        raise ValueError("expected integer sizes in cell_output") from None


def _parse_error(source: str) -> tuple[str | None, str | None]:
    try:
        payload = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected the error event's cell_source to be JSON {{ename, evalue}} ({exc.msg})") from None
    if not isinstance(payload, dict) or "ename" not in payload:
        raise ValueError("expected the error event's cell_source to be a JSON object with 'ename'")
    evalue = payload.get("evalue")
    return str(payload["ename"]), None if evalue is None else str(evalue)


def _decode_line(raw: bytes) -> str:
    """Decode as UTF-8, raising ValueError that says where the bad bytes are."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"expected UTF-8 text, got byte 0x{raw[exc.start]:02x} at column {exc.start + 1}") from None


# ---------------------------------------------------------------------------------------------------------------
# Pairing: events of one kernel → one trajectory


@dataclass
class _Pending:
    index: int  # position of the execution in the trajectory
    kernel_event_seen: bool = False


def _close_unfinished(execution: Execution, pending: _Pending) -> None:
    execution.status = "interrupted" if pending.kernel_event_seen else "unknown"


class _Pairing:
    """The pairing rules of the module docstring, applied event by event to one kernel's trajectory."""

    def __init__(self, traj: Trajectory, ignored: Counter):
        self.traj, self.ignored = traj, ignored
        self.executions = traj.executions
        self.pending: dict[str, _Pending] = {}
        self.last_finished: dict[str, tuple[str, list[OutputSummary]]] = {}

    def execute(self, ev: JuneEvent) -> None:  # rule 1
        if ev.cell_index in self.pending:
            old = self.pending.pop(ev.cell_index)
            _close_unfinished(self.executions[old.index], old)
        self.pending[ev.cell_index] = _Pending(len(self.executions))
        self.executions.append(Execution(cell_id=ev.cell_index, code=ev.cell_source, status="unknown",
                                         started_at=ev.time, cell_num=ev.cell_num))

    def finished(self, ev: JuneEvent, nxt: JuneEvent | None) -> bool:
        """Rules 2-4; True when the next event (this run's `error` event) was consumed too."""
        outputs = ev.outputs or []
        errored = any(o.output_type == "error" for o in outputs)
        error = nxt.error if nxt is not None and nxt.event == "error" and nxt.cell_index == ev.cell_index else None
        previous = self.last_finished.get(ev.cell_index)
        self.last_finished[ev.cell_index] = (ev.cell_source, outputs)
        ename, evalue = error if error else (None, None)
        if ev.cell_index in self.pending:
            execution = self.executions[self.pending.pop(ev.cell_index).index]
            execution.status = "error" if (errored or error) else "ok"
            execution.ename, execution.evalue = ename, evalue
            execution.outputs = outputs
            execution.finished_at = ev.time
        elif error is None and previous == (ev.cell_source, outputs):
            self.ignored["duplicate_finished_execute"] += 1
        elif error is not None or errored:
            self.executions.append(Execution(cell_id=ev.cell_index, code=ev.cell_source, status="error",
                                             ename=ename, evalue=evalue, outputs=outputs, finished_at=ev.time,
                                             cell_num=ev.cell_num))
        else:
            self.ignored["finished_without_execute"] += 1
        return error is not None

    def error(self, ev: JuneEvent) -> None:
        # Rule 5: its finished_execute line is missing, so the code that raised is unknown.
        ename, evalue = ev.error or (None, None)
        if ev.cell_index in self.pending:
            execution = self.executions[self.pending.pop(ev.cell_index).index]
            execution.status, execution.ename, execution.evalue = "error", ename, evalue
            execution.finished_at = ev.time
        else:
            self.executions.append(Execution(cell_id=ev.cell_index, code="", status="error", ename=ename,
                                             evalue=evalue, finished_at=ev.time, cell_num=ev.cell_num))

    def kernel_event(self, ev: JuneEvent) -> None:  # rule 7
        self.traj.events.append(KernelEvent(kind=KERNEL_EVENTS[ev.event], before=len(self.executions),
                                            time=ev.time))
        for item in self.pending.values():
            item.kernel_event_seen = True

    def close(self) -> None:  # rule 6
        for item in self.pending.values():
            _close_unfinished(self.executions[item.index], item)


def trajectory_from_events(
    events: list[JuneEvent], *, source: str, bad_lines: int = 0
) -> Trajectory:
    """Pair one kernel's events (in time order) into a trajectory, following the rules in the module docstring."""
    if not events:
        raise ValueError("expected at least one event")
    first = events[0]
    user_ids = sorted({ev.user_id for ev in events if ev.user_id})
    if len(user_ids) > 1:
        raise JuneFormatError(f"{first.origin}: kernel {first.kernel_id} has several user ids ({len(user_ids)})")
    traj = Trajectory(
        id=first.kernel_id,
        notebook=first.notebook_name,
        source=source,
        participant=anonymize(user_ids[0]) if user_ids else None,
        task=task_of(first.notebook_name),
    )
    ignored: Counter[str] = Counter({BAD_LINE: bad_lines} if bad_lines else {})
    pairing = _Pairing(traj, ignored)
    i = 0
    while i < len(events):
        ev = events[i]
        i += 1
        if ev.event == "execute":
            pairing.execute(ev)
        elif ev.event == "finished_execute":
            i += pairing.finished(ev, events[i] if i < len(events) else None)
        elif ev.event == "error":
            pairing.error(ev)
        elif ev.event in KERNEL_EVENTS:
            pairing.kernel_event(ev)
        elif ev.event in NON_EXECUTION_EVENTS:
            ignored[ev.event] += 1
        else:
            ignored[f"unknown:{ev.event}"] += 1
    pairing.close()
    traj.ignored = dict(sorted(ignored.items()))
    traj.logged_events = dict(sorted(Counter(ev.event for ev in events).items()))
    return traj


def group_by_kernel(
    events: Iterable[JuneEvent], bad_lines: dict[str, int], *, source: str
) -> list[Trajectory]:
    groups: dict[str, list[JuneEvent]] = {}
    for ev in events:
        groups.setdefault(ev.kernel_id, []).append(ev)
    return [
        trajectory_from_events(evs, source=source, bad_lines=bad_lines.get(kernel, 0))
        for kernel, evs in groups.items()
    ]


# ---------------------------------------------------------------------------------------------------------------
# The extension's local `.log` files


@dataclass
class _FileEvents:
    events: list[JuneEvent] = field(default_factory=list)
    bad_lines: dict[str, int] = field(default_factory=dict)  # kernel id → skipped lines attributed to it


def _read_log_events(path: Path, *, skip_bad_lines: bool) -> _FileEvents:
    result = _FileEvents()
    orphans = 0  # bad lines before the first good one: attributed to the kernel of that first good line
    with path.open("rb") as fh:
        data = fh.read()
    if not data.strip():
        raise JuneFormatError(f"{path}:1: empty file, expected one JuNE event per line")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            event = event_from_record(decode_log_line(_decode_line(raw)))
        except (LogLineError, ValueError) as exc:
            if not skip_bad_lines:
                raise JuneFormatError(f"{path}:{lineno}: {exc}") from exc
            last = result.events[-1].kernel_id if result.events else None
            if last is None:
                orphans += 1
            else:
                result.bad_lines[last] = result.bad_lines.get(last, 0) + 1
            continue
        event.origin = f"{path}:{lineno}"
        if orphans:
            result.bad_lines[event.kernel_id] = result.bad_lines.get(event.kernel_id, 0) + orphans
            orphans = 0
        result.events.append(event)
    if not result.events:
        raise JuneFormatError(f"{path}:1: no readable JuNE event in {len(lines)} line(s)")
    return result


def read_june_logs(paths: Iterable[str | Path], *, skip_bad_lines: bool = False) -> list[Trajectory]:
    """Read several `.log` files; a file may hold several kernels, events are grouped by kernel id in time order.

    A kernel found in two files is an error (the extension writes one file per kernel, so it is a copy, and
    merging would run every event twice).
    """
    events: list[JuneEvent] = []
    bad: Counter[str] = Counter()
    first_seen: dict[str, str] = {}
    for path in map(Path, paths):
        read = _read_log_events(path, skip_bad_lines=skip_bad_lines)
        for ev in read.events:
            if ev.kernel_id not in first_seen:
                first_seen[ev.kernel_id] = ev.origin
            elif not first_seen[ev.kernel_id].startswith(f"{path}:"):
                raise JuneFormatError(
                    f"{ev.origin}: kernel {ev.kernel_id} was already read from {first_seen[ev.kernel_id]} "
                    "(expected each kernel in one file)"
                )
        events.extend(read.events)
        bad.update(read.bad_lines)
    # A stable sort keeps the file order of events logged in the same millisecond (finished, then its error).
    events.sort(key=lambda ev: ev.time)
    return group_by_kernel(events, dict(bad), source="june-log")


def read_june_log(path: str | Path, *, skip_bad_lines: bool = False) -> Trajectory:
    """Read one extension `.log` file (one kernel) into its trajectory.

    Raises JuneFormatError naming file and line for a bad line (unless `skip_bad_lines`, which counts skipped
    lines in `ignored["bad_line"]`) and for a file that holds several kernels (use `read_june_logs`).
    """
    path = Path(path)
    read = _read_log_events(path, skip_bad_lines=skip_bad_lines)
    first = read.events[0]
    for ev in read.events:
        if ev.kernel_id != first.kernel_id:
            raise JuneFormatError(
                f"{ev.origin}: kernel {ev.kernel_id} in a log of kernel {first.kernel_id} "
                "(expected one kernel per file; read_june_logs groups several)"
            )
    return trajectory_from_events(read.events, source="june-log", bad_lines=read.bad_lines.get(first.kernel_id, 0))
