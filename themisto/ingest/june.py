"""JuNE events into trajectories: one event record (a log line or a table row) validated and masked, and the
pairing of one kernel's events into its executions. The readers are `june_log` (the extension's `.log` files) and
`june_table` (the JuNE table CSV); both hand their events, grouped by kernel and in time order, to
`trajectory_from_events`, which pairs them with these rules:

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
   else "unknown"; it carries a "no_finish" damage naming its `execute` line.
7. `kernel_restarting` / `kernel_interrupting` become `KernelEvent("restart"/"interrupt", before=<executions so
   far>)`. Other known events (create, delete, rendered, to_code, to_markdown, save_notebook, notebook_renamed)
   are counted in `Trajectory.ignored` by name, unknown ones as "unknown:<event>", never silently dropped.
8. Damage a reader found on a line (`themisto.ingest.june_log`) travels onto the execution it belongs to. An
   execution whose code is damaged and was not repaired keeps its place (`code_state` "damaged") but its outcome
   is unknown: status "unknown", no ename or evalue (the damage note says what the log recorded). A finished
   event whose outputs were lost gives status "unknown" too; an `error` event cut inside its message keeps its
   ename and no evalue.
9. An execution the log says finished ok whose logged code does not compile as an IPython cell
   (`themisto.ingest.compiles`) is damaged the same way ("uncompilable", named by its `execute` line): what ran
   compiled, so the log lost some of its text (cmd.exe ate an operator no other text of the cell shows).

Hence executions = `execute` events + errored runs logged without one (rules 3-5); `Trajectory.logged_events`
keeps the raw counts. Errors by ename equal the counter of enames over the `error` events, plus "<unknown>" for
rule 4's error outputs whose `error` event is missing. On the two real logs: 544 = 398 + 146 (task 1, one of
them "<unknown>") and 220 = 180 + 40 (task 2, one with code "").
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable

from themisto.errors import InputError
from themisto.bounded import Bounds
from themisto.ingest.compiles import compile_error
from themisto.ingest.limits import LOG, parse_json
from themisto.ingest.june_format import partial_object
from themisto.ingest.personal import mask_personal
from themisto.ingest.trajectory import (
    Damage, Execution, KernelEvent, OutputSummary, SourceFile, Trajectory, anonymize, task_of,
)

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
    """One logged event, normalised and masked; `origin` is `file:line` for messages."""

    time: str
    kernel_id: str
    event: str
    notebook_name: str = ""
    cell_index: str = ""
    cell_num: int | None = None
    cell_type: str = ""
    cell_source: str = ""
    outputs: list[OutputSummary] | None = None  # parsed `cell_output` of finished_execute events; None: lost
    error: tuple[str | None, str | None] | None = None  # (ename, evalue) of `error` events
    session_id: str | None = None
    user_id: str | None = None
    origin: str = ""
    damage: list[Damage] = field(default_factory=list)  # what its line lost (themisto.ingest.june_log)
    repaired_from: str | None = None  # where its damaged `cell_source` was restored from
    source_damaged: bool = False  # its `cell_source` lost text and was not restored


def _text(value: object) -> str:
    return "" if value is None else mask_personal(str(value))


def event_from_record(record: dict, *, path: str = "", line: int | None = None, bounds: Bounds = LOG,
                      cut_field: str | None = None) -> JuneEvent:
    """Validate one raw record (log line or table row) and mask its personal data; raise ValueError saying what
    was expected (a JSON field past `bounds`: BoundError naming `path` and `line`). `cut_field` names the member a
    cut line lost its end in (its text is a prefix)."""
    for key in ("time", "kernel_id", "event"):
        if not _text(record.get(key)) or key == cut_field:
            raise ValueError(f"expected a non-empty {key!r} field")
    kind = _text(record["event"])
    num = None if cut_field == "cell_num" else record.get("cell_num")
    cell_num: int | None
    if num is None or (isinstance(num, str) and num.strip().lower() in ("", "nan", "none", "null")):
        cell_num = None  # pandas writes a missing number as "" or "nan"
    else:
        try:
            cell_num = int(float(num))  # the table may hold "3.0"
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer cell_num, got {num!r}") from None
    outputs = None
    if kind == "finished_execute" and "cell_output" in record and cut_field != "cell_output":
        outputs = _parse_outputs(record.get("cell_output"), path, line, bounds)
    error = None
    if kind == "error":
        error = _parse_error(str(record.get("cell_source") or ""), path, line, bounds,
                             cut=cut_field in ("cell_source", ""))
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


def _parse_outputs(raw: object, path: str, line: int | None, bounds: Bounds) -> list[OutputSummary]:
    if raw is None or raw == "":
        return []
    try:
        items = parse_json(raw, bounds, path=path, line=line) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected cell_output to be a JSON list of {{output_type, size}} ({exc.msg})") from None
    if not isinstance(items, list) or not all(isinstance(o, dict) and "output_type" in o for o in items):
        raise ValueError("expected cell_output to be a JSON list of {output_type, size}")
    try:
        return [OutputSummary(_text(o["output_type"]), int(o.get("size") or 0)) for o in items]
    except (TypeError, ValueError):
        raise ValueError("expected integer sizes in cell_output") from None


def _parse_error(source: str, path: str, line: int | None, bounds: Bounds, *,
                 cut: bool = False) -> tuple[str | None, str | None]:
    if cut:  # a line cut inside the error: its ename survives when the cut came after it
        fields, cut_field = partial_object(source)
        ename = fields.get("ename") if cut_field != "ename" else None
        return (None if ename is None else _text(ename)), None
    try:
        payload = parse_json(source, bounds, path=path, line=line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected the error event's cell_source to be JSON {{ename, evalue}} ({exc.msg})") from None
    if not isinstance(payload, dict) or "ename" not in payload:
        raise ValueError("expected the error event's cell_source to be a JSON object with 'ename'")
    evalue = payload.get("evalue")
    return _text(payload["ename"]), None if evalue is None else _text(evalue)


# ---------------------------------------------------------------------------------------------------------------
# Pairing: events of one kernel → one trajectory


@dataclass
class _Pending:
    index: int  # position of the execution in the trajectory
    kernel_event_seen: bool = False


def _opened(ev: JuneEvent, **fields) -> Execution:
    """The execution an event opens, its code as the event logged it (rules 1, 3-5) and the event's damage."""
    state = "damaged" if ev.source_damaged else "repaired" if ev.repaired_from else "as_logged"
    return Execution(cell_id=ev.cell_index, code=ev.cell_source, cell_num=ev.cell_num, origin=ev.origin or None,
                     code_state=state, repaired_from=ev.repaired_from, damage=list(ev.damage), **fields)


class _Pairing:
    """The pairing rules of the module docstring, applied event by event to one kernel's trajectory."""

    def __init__(self, traj: Trajectory, ignored: Counter):
        self.traj, self.ignored = traj, ignored
        self.executions = traj.executions
        self.pending: dict[str, _Pending] = {}
        self.last_finished: dict[str, tuple[str, list[OutputSummary] | None]] = {}

    def _close_unfinished(self, pending: _Pending, why: str) -> None:  # rule 6
        execution = self.executions[pending.index]
        execution.status = "interrupted" if pending.kernel_event_seen else "unknown"
        execution.damage.append(Damage("no_finish", execution.origin or "", None, why))

    def execute(self, ev: JuneEvent) -> None:  # rule 1
        if ev.cell_index in self.pending:
            self._close_unfinished(self.pending.pop(ev.cell_index), "a later execute of the cell came first")
        self.pending[ev.cell_index] = _Pending(len(self.executions))
        self.executions.append(_opened(ev, status="unknown", started_at=ev.time))

    def finished(self, ev: JuneEvent, nxt: JuneEvent | None) -> bool:
        """Rules 2-4; True when the next event (this run's `error` event) was consumed too."""
        outputs = ev.outputs
        errored = any(o.output_type == "error" for o in outputs or [])
        error_event = nxt if nxt is not None and nxt.event == "error" and nxt.cell_index == ev.cell_index else None
        error = error_event.error if error_event is not None else None
        previous = self.last_finished.get(ev.cell_index)
        self.last_finished[ev.cell_index] = (ev.cell_source, outputs)
        ename, evalue = error if error else (None, None)
        execution = None
        if ev.cell_index in self.pending:
            execution = self.executions[self.pending.pop(ev.cell_index).index]
            lost = outputs is None and error is None  # the line lost its outputs: how the run ended is unknown
            execution.status = "unknown" if lost else "error" if (errored or error) else "ok"
            execution.ename, execution.evalue = ename, evalue
            execution.outputs = outputs or []
            execution.finished_at = ev.time
            execution.damage += ev.damage
        elif error is None and previous == (ev.cell_source, outputs):
            self.ignored["duplicate_finished_execute"] += 1
        elif error is not None or errored:
            execution = _opened(ev, status="error", ename=ename, evalue=evalue, outputs=outputs or [],
                                finished_at=ev.time)
            self.executions.append(execution)
        else:
            self.ignored["finished_without_execute"] += 1
        if error_event is not None and execution is not None:
            execution.damage += error_event.damage
        return error is not None

    def error(self, ev: JuneEvent) -> None:
        # Rule 5: its finished_execute line is missing, so the code that raised is unknown.
        ename, evalue = ev.error or (None, None)
        if ev.cell_index in self.pending:
            execution = self.executions[self.pending.pop(ev.cell_index).index]
            execution.status, execution.ename, execution.evalue = "error", ename, evalue
            execution.finished_at = ev.time
            execution.damage += ev.damage
        else:
            self.executions.append(Execution(cell_id=ev.cell_index, code="", status="error", ename=ename,
                                             evalue=evalue, finished_at=ev.time, cell_num=ev.cell_num,
                                             origin=ev.origin or None, damage=list(ev.damage)))

    def kernel_event(self, ev: JuneEvent) -> None:  # rule 7
        self.traj.events.append(KernelEvent(kind=KERNEL_EVENTS[ev.event], before=len(self.executions),
                                            time=ev.time))
        for item in self.pending.values():
            item.kernel_event_seen = True

    def close(self) -> None:  # rules 6, 8 and 9
        for item in self.pending.values():
            self._close_unfinished(item, "the log ends first")
        for execution in self.executions:
            if execution.status == "ok" and execution.code_state != "damaged" and execution.code:
                why = compile_error(execution.code)
                if why is not None:  # rule 9: what ran compiled, so this text is not what ran
                    execution.damage.append(Damage("uncompilable", execution.origin or "", "cell_source",
                                                   f"the logged code does not compile ({why})"))
                    execution.code_state = "damaged"
            if execution.code_state == "damaged" and execution.status != "unknown":
                # Its outcome is unknown: the log's word was about code we do not have. Keep that word in the note.
                said = execution.status + (f" ({execution.ename})" if execution.ename else "")
                at = next(i for i, d in enumerate(execution.damage) if d.field == "cell_source")
                hurt = execution.damage[at]
                execution.damage[at] = replace(hurt, note=f"{hurt.note}; the log recorded {said}".lstrip("; "))
                execution.status, execution.ename, execution.evalue = "unknown", None, None


def trajectory_from_events(
    events: list[JuneEvent], *, source: str, bad_lines: int = 0, sources: Iterable[SourceFile] = ()
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
        sources=list(sources),
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
    events: Iterable[JuneEvent], bad_lines: dict[str, int], *, source: str,
    sources: dict[str, list[SourceFile]] | None = None,
) -> list[Trajectory]:
    """One trajectory per kernel id, in the order kernels first appear; `sources` lists each kernel's files."""
    groups: dict[str, list[JuneEvent]] = {}
    for ev in events:
        groups.setdefault(ev.kernel_id, []).append(ev)
    sources = sources or {}
    return [
        trajectory_from_events(evs, source=source, bad_lines=bad_lines.get(kernel, 0),
                               sources=sources.get(kernel, ()))
        for kernel, evs in groups.items()
    ]
