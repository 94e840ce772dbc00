"""Read an IPython history database (`history.sqlite`) from a stranger's repository as data, not as a program.

IPython, and so every ipykernel, writes each input it runs into `history(session, line, source, source_raw)`
(`source_raw` as typed, `source` after its transforms), one `sessions(session, start, end, num_cmds, remark)` row
per kernel start, and `output_history(session, line, output)` where output logging was on. A session's inputs, in
line order, are one trajectory of executions; an input whose code is blank is dropped, and a session left with no
input is not returned.

The file is opened read-only and immutable (a journal or WAL beside it is ignored, nothing is ever written), with
`PRAGMA trusted_schema=OFF` (a schema's functions cannot run with side effects), SQLite's length limit at the text
bound (a longer value fails as it is read, before Python holds it) and a progress handler as a time limit (the
integrity check and the row counts are single steps of SQLite's machine, bounded by the file's size instead). Its
schema is read from sqlite_master before any query names a table: a view or trigger anywhere, a virtual table or a
generated column in a table it reads, or a missing table or column, and the file is refused. Python 3.11's sqlite3
has no `Connection.setconfig`, so SQLITE_DBCONFIG_DEFENSIVE is set only where Python has it (3.12 and later); the
writes it guards against cannot happen on a read-only, immutable connection anyway. A file that is not SQLite
(random bytes, an encrypted database), corrupt or truncated (`PRAGMA quick_check`), not a history database, or past
a bound (`limits.HISTORY_DATABASE`) raises `HistoryRefused`, one line naming the file and the reason, and costs
only itself.

IPython stores `start` and `end` as the kernel machine's local clock without a zone ('2019-03-04 10:11:12.123456');
they are kept as that clock reading, written ISO-8601 with a `Z`: treated as UTC, though the zone is unknown.
Every code, output and remark passes `secrets.scrub` (credentials redacted and counted, personal data masked)
before it leaves; `read_history` returns the counts beside the sessions, `read_history_database` the sessions only.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from themisto.bounded import BoundError
from themisto.ingest.limits import HISTORY_DATABASE, DatabaseBounds
from themisto.ingest.secrets import scrub

_SQLITE_HEADER = b"SQLite format 3\x00"
# The tables read and the columns each must have (IPython's schema since 0.11); output_history is optional.
_TABLES = {"sessions": ("session", "start", "end", "remark"), "history": ("session", "line", "source", "source_raw")}
_OUTPUTS = ("session", "line", "output")
_PLAIN_TABLE = re.compile(r"\s*CREATE\s+TABLE\b", re.IGNORECASE)
# Only these names are ever queried, in the main schema, once the schema check has passed.
_SESSIONS_SQL = 'SELECT session, start, "end", remark FROM main.sessions ORDER BY session'
_HISTORY_SQL = "SELECT session, line, source, source_raw FROM main.history ORDER BY session, line"
_OUTPUT_SQL = "SELECT session, line, output FROM main.output_history ORDER BY session, line"
_PROGRESS_STEPS = 10_000  # SQLite virtual-machine steps between two looks at the clock


class HistoryRefused(BoundError):
    """An IPython history database or `%logstart` log refused whole: not what it claims, damaged, hostile, or past a
    bound (`bound` names it). The message is one line naming the file (and the line, where one applies)."""


@dataclass(frozen=True)
class HistoryInput:
    """One executed input, as IPython recorded it."""

    line: int  # IPython's line number in the session (1-based); a log's input ordinal in its session
    code: str  # source_raw as typed (magics kept as typed); `source` where source_raw is NULL
    time: str | None  # ISO-8601 UTC where known (logs with -t), else None
    output: str | None  # the recorded output (output_history, or a log's #[Out]# lines), else None


@dataclass(frozen=True)
class HistorySession:
    """One kernel session: its inputs in the order they ran."""

    session: int  # the database's session number, or the log's session ordinal (1-based)
    start: str | None  # ISO-8601 UTC
    end: str | None
    inputs: tuple[HistoryInput, ...]
    remark: str | None = None


@dataclass(frozen=True)
class HistoryRead:
    """What one database or log gave: its sessions, and the credentials redacted from them, counted by kind."""

    sessions: list[HistorySession]
    redactions: dict[str, int] = field(default_factory=dict)


def read_history_database(path: Path) -> list[HistorySession]:
    """The sessions of an IPython history database, scrubbed; raises `HistoryRefused`."""
    return read_history(path).sessions


def read_history(path: str | os.PathLike, bounds: DatabaseBounds = HISTORY_DATABASE) -> HistoryRead:
    """The sessions of an IPython history database, scrubbed, with the redactions counted; raises
    `HistoryRefused`."""
    path = Path(path)
    _check_file(path, bounds)
    with _connect(path, bounds) as (db, refusal):
        try:
            has_outputs = _check_schema(db, path, bounds)
            _check_integrity(db, path)
            sessions = _fetch(db, path, "sessions", _SESSIONS_SQL, bounds.sessions, "sessions")
            rows = _fetch(db, path, "history", _HISTORY_SQL, bounds.rows, "rows")
            outputs = _fetch(db, path, "output_history", _OUTPUT_SQL, bounds.rows, "rows") if has_outputs else []
        except sqlite3.Error as exc:
            raise refusal(exc) from None
    return _assemble(path, sessions, rows, outputs)


def _refuse(path: Path, problem: str, bound: str | None = None) -> HistoryRefused:
    return HistoryRefused(path, None, problem, bound)


def _check_file(path: Path, bounds: DatabaseBounds) -> None:
    """Refuse what is no regular file within the size bound, or has no SQLite header (another format, or an
    encrypted database: SQLCipher encrypts the header too), before SQLite opens it."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, "not a regular file")
        if info.st_size > bounds.file_bytes:
            raise _refuse(path, f"{info.st_size:,} bytes, more than {bounds.file_bytes:,}", "file_bytes")
        with open(path, "rb") as fh:
            header = fh.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc.strerror})") from None
    if header != _SQLITE_HEADER:
        raise _refuse(path, "not an SQLite database (no SQLite header: another format, or encrypted)")


@contextmanager
def _connect(path: Path, bounds: DatabaseBounds) -> Iterator[tuple[sqlite3.Connection, Any]]:
    """A read-only, immutable connection that distrusts the schema, within the length and time bounds, and the
    function that turns an sqlite3 error on it into the file's refusal."""
    uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
    db = sqlite3.connect(uri, uri=True, isolation_level=None)
    deadline, timed_out = time.monotonic() + bounds.seconds, []

    def past_deadline() -> bool:
        if time.monotonic() > deadline:
            timed_out.append(True)
        return bool(timed_out)

    def refusal(exc: sqlite3.Error) -> HistoryRefused:
        if timed_out:
            return _refuse(path, f"took more than {bounds.seconds:g} s to read", "seconds")
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_TOOBIG":
            return _refuse(path, f"a value longer than {bounds.text_bytes:,} bytes", "text_bytes")
        message = " ".join(str(exc).split())[:200]
        return _refuse(path, f"unreadable as SQLite ({message}): corrupt, truncated or encrypted")

    try:
        setconfig = getattr(db, "setconfig", None)  # Python 3.12+
        if setconfig is not None:
            setconfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE, True)
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, bounds.text_bytes)
        db.set_progress_handler(past_deadline, _PROGRESS_STEPS)
        db.text_factory = bytes  # decoded here, so a value that is not UTF-8 is named, not a crash
        for pragma in ("trusted_schema=OFF", "cell_size_check=ON", "mmap_size=0"):
            db.execute(f"PRAGMA {pragma}")
        yield db, refusal
    except sqlite3.Error as exc:
        raise refusal(exc) from None
    finally:
        db.close()


def _check_schema(db: sqlite3.Connection, path: Path, bounds: DatabaseBounds) -> bool:
    """Refuse a schema that is not IPython's before any of its tables is named; whether it has output_history."""
    entries = db.execute("SELECT type, name, sql FROM main.sqlite_master LIMIT ?",
                         (bounds.schema_entries + 1,)).fetchall()
    if len(entries) > bounds.schema_entries:
        raise _refuse(path, f"more than {bounds.schema_entries:,} schema entries", "schema_entries")
    tables: dict[str, str] = {}
    for kind, name, sql in entries:
        kind, name = _text(kind), _text(name)
        if kind in ("view", "trigger"):
            raise _refuse(path, f"holds a {kind} (IPython's schema has none): not read")
        if kind == "table" and name is not None:
            tables[name.casefold()] = _text(sql) or ""
    for table, columns in _TABLES.items():
        if table not in tables:
            raise _refuse(path, f"not an IPython history database (no table {table})")
        _check_table(db, path, table, tables[table], columns)
    if "output_history" in tables:
        _check_table(db, path, "output_history", tables["output_history"], _OUTPUTS)
        return True
    return False


def _check_table(db: sqlite3.Connection, path: Path, table: str, sql: str, columns: tuple[str, ...]) -> None:
    if not _PLAIN_TABLE.match(sql):
        raise _refuse(path, f"table {table} is not a plain table (a virtual table?): not read")
    info = db.execute(f"PRAGMA main.table_xinfo({table})").fetchall()  # `table` is one of ours, never the file's
    if any(row[6] for row in info):
        raise _refuse(path, f"table {table} has a generated or hidden column: not read")
    names = {(_text(row[1]) or "").casefold() for row in info}
    missing = [column for column in columns if column not in names]
    if missing:
        raise _refuse(path, f"not an IPython history database (table {table} has no column {missing[0]})")


def _check_integrity(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged file (a truncated copy, a torn page) rather than read part of it as if it were whole."""
    result = db.execute("PRAGMA quick_check(1)").fetchone()
    if result is None or _text(result[0]) != "ok":
        detail = " ".join((_text(result[0]) or "").split())[:200] if result else "no answer"
        raise _refuse(path, f"corrupt (quick_check: {detail})")


def _fetch(db: sqlite3.Connection, path: Path, table: str, sql: str, bound: int, name: str) -> list[tuple]:
    count = db.execute(f"SELECT count(*) FROM main.{table}").fetchone()[0]  # one of ours, never the file's
    if count > bound:
        raise _refuse(path, f"{count:,} rows in {table}, more than {bound:,}", name)
    return db.execute(sql).fetchall()


def _text(value: Any) -> str | None:
    """A stored value as text (text_factory gives bytes); None stays None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _field(path: Path, value: Any, where: str) -> str | None:
    try:
        return _text(value)
    except UnicodeDecodeError:
        raise _refuse(path, f"{where} is not UTF-8 text") from None


def _number(path: Path, value: Any, where: str) -> int:
    if type(value) is not int:
        raise _refuse(path, f"{where} is not an integer")
    return value


def iso_utc(value: str | None) -> str | None:
    """A stored date as ISO-8601 with a `Z` (a zone-less one kept as its clock reading); None if none or no date."""
    try:
        moment = datetime.fromisoformat(value) if value else None
    except ValueError:
        return None
    if moment is None:
        return None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment.isoformat() + "Z"


def _assemble(path: Path, session_rows: list[tuple], rows: list[tuple], output_rows: list[tuple]) -> HistoryRead:
    """The sessions, in session order, each with its non-blank inputs in line order, every text scrubbed."""
    counts: Counter = Counter()
    dates: dict[int, tuple[str | None, str | None, str | None]] = {}
    for session, start, end, remark in session_rows:
        number = _number(path, session, "a session number")
        where = f"session {number}"
        dates[number] = (iso_utc(_field(path, start, f"{where}'s start")),
                         iso_utc(_field(path, end, f"{where}'s end")), _field(path, remark, f"{where}'s remark"))
    outputs = {}
    for session, line, output in output_rows:
        key = (_number(path, session, "an output's session"), _number(path, line, "an output's line"))
        outputs[key] = _field(path, output, f"the output of session {key[0]} line {key[1]}")
    inputs: dict[int, list[HistoryInput]] = {}
    for session, line, source, source_raw in rows:
        number, line = _number(path, session, "an input's session"), _number(path, line, "an input's line")
        where = f"session {number} line {line}"
        code = _field(path, source_raw, where)
        code = _field(path, source, where) if code is None else code
        if code is None or not code.strip():
            continue
        output = outputs.get((number, line))
        inputs.setdefault(number, []).append(HistoryInput(
            line=line, code=scrub(code, counts), time=None,
            output=None if output is None else scrub(output, counts)))
    sessions = []
    for number in sorted(inputs):
        start, end, remark = dates.get(number, (None, None, None))
        sessions.append(HistorySession(session=number, start=start, end=end, inputs=tuple(inputs[number]),
                                       remark=None if remark is None else scrub(remark, counts)))
    return HistoryRead(sessions, dict(counts))
