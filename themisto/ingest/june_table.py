"""Read the JuNE table (`dataset.csv`: one event per row, with `user_id`) into trajectories, within bounds (file
size, rows; the JSON in its fields: `themisto.ingest.limits.LOG`), through the same event pairing as the
`.log` reader (`themisto.ingest.june.trajectory_from_events`).
"""

from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

from themisto.bounded import BoundError, Bounds
from themisto.ingest.limits import LOG
from themisto.ingest.personal import mask_personal
from themisto.ingest.june import JuneEvent, JuneFormatError, event_from_record, group_by_kernel
from themisto.ingest.trajectory import SourceFile, Trajectory



TABLE_COLUMNS: tuple[str, ...] = (
    "action_id", "time", "session_id", "kernel_id", "notebook_name", "event", "cell_index", "cell_num",
    "cell_type", "cell_source", "cell_output", "user_id",
)


def _iter_table_rows(path: Path, data: bytes, bounds: Bounds) -> Iterator[tuple[int, dict | Exception]]:
    """Yield (line, row dict) or (line, error) for each CSV record; the header is checked here."""
    if len(data) > bounds.file_bytes:
        raise BoundError(path, None, f"{len(data):,} bytes, more than {bounds.file_bytes:,}", "file_bytes")
    if not data.strip():
        raise JuneFormatError(f"{path}:1: empty file, expected a CSV header with {', '.join(TABLE_COLUMNS)}")
    # surrogateescape keeps bad bytes visible per record, so one bad row does not condemn the whole file.
    text = data.decode("utf-8", errors="surrogateescape")
    # save_notebook rows hold whole notebooks: far beyond csv's default 128 KiB field limit.
    csv.field_size_limit(min(sys.maxsize, bounds.line_bytes))
    reader = csv.reader(text.splitlines(keepends=True))
    try:
        header = next(reader)
    except csv.Error as exc:
        raise JuneFormatError(f"{path}:1: expected a CSV header ({exc})") from exc
    missing = [c for c in TABLE_COLUMNS if c not in header and c != "user_id"]
    if missing:
        raise JuneFormatError(f"{path}:1: expected the columns {', '.join(missing)} in the CSV header")
    start = reader.line_num + 1
    rows = 0
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield start, ValueError(f"expected a CSV record ({exc})")
            start = reader.line_num + 1
            continue
        line, start = start, reader.line_num + 1
        rows += 1
        if rows > bounds.lines:
            raise BoundError(path, line, f"more than {bounds.lines:,} rows", "lines")
        if not row or all(not cell for cell in row):
            continue
        if len(row) != len(header):
            yield line, ValueError(f"expected {len(header)} fields, got {len(row)}")
            continue
        bad = next((cell for cell in row if any("\udc80" <= ch <= "\udcff" for ch in cell)), None)
        if bad is not None:
            yield line, ValueError("expected UTF-8 text, found undecodable bytes")
            continue
        yield line, dict(zip(header, row))


def _action_number(value: str | None) -> float:
    if value is None or value == "":
        return float("inf")  # rows without an id sort after those with one at the same time
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"expected a numeric action_id, got {value!r}") from None


def read_june_table(path: str | Path, *, skip_bad_lines: bool = False, name: str | None = None,
                    bounds: Bounds = LOG) -> list[Trajectory]:
    """Read the JuNE table CSV: one trajectory per kernel id, events ordered by time then action_id.

    Bad records raise JuneFormatError naming file and line, or with `skip_bad_lines` are counted in
    `ignored["bad_line"]` of the trajectory of the previous good record.
    """
    import hashlib

    path = Path(path)
    name = mask_personal(name or path.name)
    data = path.read_bytes()
    keyed: list[tuple[str, float, JuneEvent]] = []
    bad: Counter[str] = Counter()
    orphans = 0
    for line, row in _iter_table_rows(path, data, bounds):
        try:
            if isinstance(row, Exception):
                raise row
            event = event_from_record(row, path=str(path), line=line, bounds=bounds)
            action = _action_number(row.get("action_id"))
        except BoundError:
            raise
        except ValueError as exc:
            if not skip_bad_lines:
                raise JuneFormatError(f"{path}:{line}: {exc}") from exc
            if keyed:
                bad[keyed[-1][2].kernel_id] += 1
            else:
                orphans += 1
            continue
        event.origin = f"{name}:{line}"
        if orphans:
            bad[event.kernel_id] += orphans
            orphans = 0
        keyed.append((event.time, action, event))
    if not keyed:
        raise JuneFormatError(f"{path}:2: no readable JuNE event in the table")
    keyed.sort(key=lambda item: (item[0], item[1]))
    digest = hashlib.sha256(data).hexdigest()
    kernels = {ev.kernel_id for _, _, ev in keyed}
    sources = {k: [SourceFile(file=name, sha256=digest, kernel_id=k)] for k in kernels}
    return group_by_kernel((ev for _, _, ev in keyed), dict(bad), source="june-table", sources=sources)
