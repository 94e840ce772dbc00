"""Read the JuNE extension's local `.log` files, damage and all: every line by its file's writer, every damaged
line named by file and line, a damaged code restored only where proven (`themisto.ingest.repair`).

A file's writer (`june_format.WRITERS`) is read from its first line. Damage, per line:

- "cut_line": the line lost its end (cmd.exe's redirection ate it, or the file was copied while being written);
  what survived is read: the fields before the cut and the prefix of the one it fell in.
- "lost_fields": the line parsed but lacks the last fields every other line of its kind in the file has: the
  last field it kept swallowed them (cmd.exe stopped eating inside one of them).
- "lost_text": a cmd.exe line that parsed, but a full text of its cell explains it as that text less what
  cmd.exe ate (proven by `repair.prove`).

An `execute` with no `finished_execute` is named by the pairing (`themisto.ingest.june`, rule 6). No line is
dropped silently: a line that does not follow its writer's format at all is an error naming the file and line,
or, with `skip_bad_lines`, skipped and counted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from themisto.bounded import BoundError, Bounds
from themisto.ingest.limits import LOG, parse_json
from themisto.ingest.june import JuneEvent, JuneFormatError, event_from_record, group_by_kernel, trajectory_from_events
from themisto.ingest.june_format import LineRead, LogLineError, detect_writer, read_log_line
from themisto.ingest.personal import mask_personal
from themisto.ingest.repair import Candidate, Evidence, prove
from themisto.ingest.trajectory import Damage, SourceFile, Trajectory, task_of

# Events whose `cell_source` is a code cell's text, the ones a damaged code matters for.
_CODE_EVENTS = frozenset({"execute", "finished_execute"})
_CELL_TEXT_EVENTS = frozenset({"execute", "finished_execute", "delete"})


@dataclass(frozen=True)
class DamagedLine:
    """One damaged line of a file, as the ingest report names it: what it lost (`vocabulary.DAMAGE_KINDS`), in
    which fields, and where its code was restored from when it was."""

    line: int
    kinds: tuple[str, ...]
    event: str | None
    fields: tuple[str, ...] = ()
    repaired_from: str | None = None


@dataclass
class LogFile:
    """One `.log` file read: its events in file order and the figures the ingest report prints for it."""

    name: str  # as the report and the trajectories name it (relative to the folder given)
    path: Path  # as given, for messages
    sha256: str
    writer: str
    lines: int
    events: list[JuneEvent] = field(default_factory=list)
    damaged: list[DamagedLine] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # lines skipped with skip_bad_lines
    bad_lines: dict[str, int] = field(default_factory=dict)  # kernel id -> skipped lines attributed to it

    def source(self, kernel_id: str) -> SourceFile:
        # `name` is masked already: a path given whole may hold its owner's name
        return SourceFile(file=self.name, sha256=self.sha256, kernel_id=kernel_id, writer=self.writer)

    def report(self) -> dict:
        """What `themisto ingest` prints for the file (executions, repaired and unrepaired come from the pairing)."""
        damaged = [{**asdict(d), "kinds": list(d.kinds), "fields": list(d.fields)} for d in self.damaged]
        return {"sha256": self.sha256, "writer": self.writer, "lines": self.lines, "events": len(self.events),
                "damaged": damaged, "skipped": list(self.skipped)}


@dataclass
class _Line:
    number: int
    text: str
    read: LineRead
    damage: list[Damage] = field(default_factory=list)
    how: str | None = None  # how its code may be damaged: "whole", "cut", "swallowed" (see repair.prove)
    repaired_from: str | None = None


def _decode_line(raw: bytes) -> str:
    """Decode as UTF-8, raising ValueError that says where the bad bytes are."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"expected UTF-8 text, got byte 0x{raw[exc.start]:02x} at column {exc.start + 1}") from None


def _read_lines(path: Path, data: bytes, name: str, skip_bad_lines: bool,
                bounds: Bounds) -> tuple[str, list[_Line | int], int]:
    """The file's writer and each non-empty line read (or its number, when skipped as bad)."""
    raws = data.split(b"\n")
    if raws and raws[-1] == b"":
        raws.pop()
    if len(raws) > bounds.lines:
        raise BoundError(path, bounds.lines + 1, f"{len(raws):,} lines, more than {bounds.lines:,}", "lines")
    writer = None
    out: list[_Line | int] = []
    for number, raw in enumerate(raws, start=1):
        if not raw.strip():
            continue
        try:
            if len(raw) > bounds.line_bytes:
                raise BoundError(path, number, f"longer than {bounds.line_bytes:,} bytes", "line_bytes")
            text = _decode_line(raw).rstrip("\r\n")
            if writer is None:
                writer = detect_writer(text)
            out.append(_Line(number, text, read_log_line(text, writer, bounds=bounds, path=str(path), number=number)))
        except BoundError:
            raise
        except (LogLineError, ValueError) as exc:
            if not skip_bad_lines:
                raise JuneFormatError(f"{path}:{number}: {exc}") from exc
            out.append(number)
    if writer is None:
        raise JuneFormatError(f"{path}:1: no readable JuNE event in {len(raws)} line(s)")
    return writer, out, len(raws)


def _templates(lines: Iterable[_Line]) -> dict[str | None, tuple[str, ...] | Counter]:
    """Per event kind, the fields (in order) its whole lines carry most often; under None, how often each field
    list occurs over all kinds (for a kind whose only whole line is the one in question)."""
    seen: dict[str, Counter] = {}
    every: Counter = Counter()
    for line in lines:
        if line.read.cut_field is None:
            seen.setdefault(str(line.read.event.get("event")), Counter())[tuple(line.read.event)] += 1
            every[tuple(line.read.event)] += 1
    return {None: every, **{kind: counts.most_common(1)[0][0] for kind, counts in seen.items()}}


def _expected_fields(keys: tuple[str, ...], kind: str, templates: dict) -> tuple[str, ...]:
    """The fields a line of `kind` should carry: its kind's usual ones; else the usual ones of any kind that
    starts with the same fields (the extension writes every cell event with one field order)."""
    own = templates.get(kind, keys)
    if len(own) > len(keys):
        return own
    longer = [(count, fields) for fields, count in templates[None].items()
              if len(fields) > len(keys) and fields[:len(keys)] == keys]
    return max(longer)[1] if longer else own


def _name_damage(line: _Line, name: str, templates: dict) -> None:
    """What this line lost (cut short, or fields swallowed), and how its code may be damaged."""
    where = f"{name}:{line.number}"
    record, cut = line.read.event, line.read.cut_field
    keys = tuple(record)
    if cut is not None:
        line.damage.append(Damage("cut_line", where, cut or None, "the line ends early"))
        if cut == "cell_source":
            line.how = "cut"
        elif "cell_source" not in record:
            line.damage.append(Damage("cut_line", where, "cell_source", "the cut came before the code"))
        return
    template = _expected_fields(keys, str(record.get("event")), templates)
    if len(keys) < len(template) and template[:len(keys)] == keys:
        lost = template[len(keys):]
        line.damage.append(Damage("lost_fields", where, keys[-1], "lost " + ", ".join(lost)))
        if keys[-1] == "cell_source":
            line.how = "swallowed"
        elif "cell_source" in lost:
            line.damage.append(Damage("lost_fields", where, "cell_source", "the code was lost"))
        return
    line.how = "whole"


def _evidence(lines: Iterable[_Line], name: str, final_cells: Iterable, bounds: Bounds) -> Evidence:
    """Every full text of a cell the file holds on undamaged lines, and the final notebook's code cells."""
    evidence = Evidence(final=list(final_cells))
    for line in lines:
        record = line.read.event
        if line.damage or line.read.cut_field is not None:
            continue
        kind = record.get("event")
        where = f"{name}:{line.number} ({kind})"
        if kind in _CELL_TEXT_EVENTS and record.get("cell_type", "code") == "code":
            evidence.add(str(record.get("cell_index") or ""), str(record.get("cell_source") or ""), where)
        elif kind == "save_notebook":
            try:
                cells = parse_json(str(record.get("cell_source") or "[]"), bounds, path=name, line=line.number)
            except json.JSONDecodeError:
                continue  # a save_notebook that is not JSON proves nothing; its line is read as it is
            for cell in cells if isinstance(cells, list) else ():
                if isinstance(cell, dict) and cell.get("cell_type") == "code":
                    source = cell.get("source")
                    text = "".join(map(str, source)) if isinstance(source, list) else str(source or "")
                    evidence.add(str(cell.get("id") or ""), text, where)
    return evidence


def _repair(line: _Line, name: str, evidence: Evidence) -> None:
    """Prove or name the loss of a cmd.exe line's code (module docstring); restore it when one text proves it."""
    record = line.read.event
    if line.how is None or record.get("event") not in _CODE_EVENTS or record.get("cell_type", "code") != "code":
        return
    proof = prove(line.text, record, line.how, evidence.candidates(str(record.get("cell_index") or "")))
    where = f"{name}:{line.number}"
    if line.how == "whole":
        if proof.agreeing == 0 and proof.around is None:
            return
        note = ("cmd.exe ate part of the code" if proof.agreeing else
                f"cmd.exe ate part of the code ({proof.around.where} agrees around it, not in full)")
        line.damage.append(Damage("lost_text", where, "cell_source", note))
    if proof.candidate is not None:
        line.repaired_from = proof.candidate.where
        record["cell_source"] = proof.candidate.text
    elif proof.agreeing > 1:
        line.damage.append(Damage(line.damage[-1].kind, where, "cell_source",
                                  f"{proof.agreeing} different texts agree with what survived: none is proven"))


def read_log_file(path: str | Path, *, name: str | None = None, skip_bad_lines: bool = False,
                  final_cells: Mapping[str | None, list[Candidate]] | None = None,
                  bounds: Bounds = LOG) -> LogFile:
    """Read one `.log` file: its events (damage named, proven repairs made, personal data masked) and report.

    `final_cells` maps a task to the code cells of the participant's final notebook of it (`repair.Candidate`s);
    the file's notebook name says which task is its."""
    path = Path(path)
    name = mask_personal(name or path.name)
    data = path.read_bytes()
    if len(data) > bounds.file_bytes:
        raise BoundError(path, None, f"{len(data):,} bytes, more than {bounds.file_bytes:,}", "file_bytes")
    if not data.strip():
        raise JuneFormatError(f"{path}:1: empty file, expected one JuNE event per line")
    writer, read, count = _read_lines(path, data, name, skip_bad_lines, bounds)
    lines = [line for line in read if isinstance(line, _Line)]
    templates = _templates(lines)
    for line in lines:
        _name_damage(line, name, templates)
    if writer == "cmd":  # only cmd.exe loses text; an sh line is read as it is
        notebook = next((str(ln.read.event.get("notebook_name") or "") for ln in lines), "")
        evidence = _evidence(lines, name, (final_cells or {}).get(task_of(notebook), ()), bounds)
        for line in lines:
            _repair(line, name, evidence)
    log = LogFile(name=name, path=path, sha256=hashlib.sha256(data).hexdigest(), writer=writer, lines=count)
    orphans = 0  # bad lines before the first good one: attributed to the kernel of that first good line
    for item in read:
        if isinstance(item, int):
            log.skipped.append(item)
            last = log.events[-1].kernel_id if log.events else None
            if last is None:
                orphans += 1
            else:
                log.bad_lines[last] = log.bad_lines.get(last, 0) + 1
            continue
        _add_event(log, item, path, skip_bad_lines)
        if orphans and log.events:
            log.bad_lines[log.events[-1].kernel_id] = log.bad_lines.get(log.events[-1].kernel_id, 0) + orphans
            orphans = 0
    if not log.events:
        raise JuneFormatError(f"{path}:1: no readable JuNE event in {count} line(s)")
    return log


def _add_event(log: LogFile, line: _Line, path: Path, skip_bad_lines: bool) -> None:
    kind = line.read.event.get("event")
    if line.damage:
        kinds = tuple(dict.fromkeys(d.kind for d in line.damage))
        fields = tuple(dict.fromkeys(d.field for d in line.damage if d.field))
        log.damaged.append(DamagedLine(line.number, kinds, None if kind is None else str(kind), fields,
                                       line.repaired_from))
    try:
        event = event_from_record(line.read.event, path=str(path), line=line.number, cut_field=line.read.cut_field)
    except BoundError:
        raise
    except ValueError as exc:
        if line.damage:
            return  # a damaged line without its time, kernel or event: named above, nothing more to read
        if not skip_bad_lines:
            raise JuneFormatError(f"{path}:{line.number}: {exc}") from exc
        log.skipped.append(line.number)
        return
    event.origin = f"{log.name}:{line.number}"
    event.damage = list(line.damage)
    event.repaired_from = line.repaired_from
    event.source_damaged = line.repaired_from is None and any(d.field == "cell_source" for d in line.damage)
    log.events.append(event)


def trajectories_of(logs: Iterable[LogFile]) -> list[Trajectory]:
    """One trajectory per kernel over the files read, events in time order; a kernel in two files is an error
    (the extension writes one file per kernel, so it is a copy, and merging would run every event twice)."""
    events: list[JuneEvent] = []
    bad: Counter[str] = Counter()
    first_seen: dict[str, tuple[LogFile, str]] = {}
    sources: dict[str, list[SourceFile]] = {}
    for log in logs:
        for ev in log.events:
            line = ev.origin.rsplit(":", 1)[-1]
            if ev.kernel_id not in first_seen:
                first_seen[ev.kernel_id] = (log, line)
                sources[ev.kernel_id] = [log.source(ev.kernel_id)]
            elif first_seen[ev.kernel_id][0] is not log:
                other, other_line = first_seen[ev.kernel_id]
                raise JuneFormatError(f"{log.path}:{line}: kernel {ev.kernel_id} was already read from "
                                      f"{other.path}:{other_line} (expected each kernel in one file)")
        events.extend(log.events)
        bad.update(log.bad_lines)
    # A stable sort keeps the file order of events logged in the same millisecond (finished, then its error).
    events.sort(key=lambda ev: ev.time)
    return group_by_kernel(events, dict(bad), source="june-log", sources=sources)


def read_june_logs(paths: Iterable[str | Path], *, skip_bad_lines: bool = False) -> list[Trajectory]:
    """Read several `.log` files; a file may hold several kernels, events are grouped by kernel id in time order."""
    return trajectories_of(read_log_file(p, skip_bad_lines=skip_bad_lines) for p in paths)


def read_june_log(path: str | Path, *, skip_bad_lines: bool = False) -> Trajectory:
    """Read one extension `.log` file (one kernel) into its trajectory.

    Raises JuneFormatError naming file and line for a bad line (unless `skip_bad_lines`, which counts skipped
    lines in `ignored["bad_line"]`) and for a file that holds several kernels (use `read_june_logs`).
    """
    log = read_log_file(path, skip_bad_lines=skip_bad_lines)
    first = log.events[0]
    for ev in log.events:
        if ev.kernel_id != first.kernel_id:
            raise JuneFormatError(
                f"{log.path}:{ev.origin.rsplit(':', 1)[-1]}: kernel {ev.kernel_id} in a log of kernel {first.kernel_id} "
                "(expected one kernel per file; read_june_logs groups several)"
            )
    return trajectory_from_events(log.events, source="june-log", bad_lines=log.bad_lines.get(first.kernel_id, 0),
                                  sources=[log.source(first.kernel_id)])
