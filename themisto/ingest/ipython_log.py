"""Read an IPython `%logstart` log: the Python text IPython's logger appends each input to, as sessions of inputs.

What IPython's logger writes (`IPython/core/logger.py`, `IPython/core/magics/logging.py`): a header
(`# IPython log file` and a blank line) unless appending; with `-t`, a comment `# Mon, 01 Jan 2024 10:00:00` (the
local clock) before each input; each input as logged (with `-r` as typed, `%magic` and `!cmd`; without, as IPython
turned it into Python, `get_ipython().run_line_magic('matplotlib', 'inline')`), kept as logged; with `-o`, each
result's lines as `#[Out]# ...` after its input. A notebook's input has no final newline, so the next timestamp or
`#[Out]#` line is glued to its last line (`sns.set()# Wed, 17 Nov 2021 05:21:15`); `%logstart` itself first writes
the session's history so far, without timestamps. A course platform's logs are appended to by every notebook
(`%logstop` then `%logstart -rtq ~/.logs/x.py append`), so one file holds many kernel sessions without headers.

How it is read: a header starts a new session, and so does a `%logstart` line, but for the first since the session
began (at the file's start, a header or a `%logstop`: that one ends the history it dumped, the same kernel's);
`%logstop` ends one. These lines are the logger's own and are not inputs, but in a timestamped input, which holds
them as typed: there a `%logstop` glued to the input's end, or after its `%logstart` line, starts the history that
`%logstart` writes again, the same kernel's (skipped to the next timestamp: its inputs were read with their times);
a glued `%logstop` after another input starts a new kernel's. Where timestamps exist an input is
the text between two of them (or a timestamp and an output). Text without a timestamp before it (a log without
`-t`, the history `%logstart` writes) is split into top-level statements with `ast`, an approximation: a cell of
several statements becomes several inputs, and a `%%cell` magic takes the rest of its block. Where `ast` cannot
parse the text (Python 2, shell lines it cannot blank), a new input starts at each line at column 0 that does not
continue the one before. An output belongs to the input just before it. A session's start and end are its first and
last timestamps (the local clock, zone unknown, written ISO-8601 with a `Z` like the database's dates), its number
its ordinal in the file, and an input's `line` its ordinal in the session.

The file is read within `limits.IPYTHON_LOG` (size, lines, line length); one that is not UTF-8 text or holds control
characters (binary) raises `HistoryRefused`, one line naming the file and line. Every code and output passes
`secrets.scrub`.
"""

from __future__ import annotations

import ast
import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from themisto.bounded import BoundError, Bounds, read_text
from themisto.ingest.ipython_history import HistoryInput, HistoryRead, HistoryRefused, HistorySession
from themisto.ingest.limits import IPYTHON_LOG
from themisto.ingest.secrets import scrub

_HEADER = "# IPython log file"
_OUT = "#[Out]#"
# `time.strftime('# %a, %d %b %Y %H:%M:%S')`: English names in the C locale; another locale's names still mark an
# input's start, but their time is not read.
_NAME = r"[^\W\d_]{2,9}\.?"
_STAMP = re.compile(rf"# ({_NAME}), (\d{{1,2}}) ({_NAME}) (\d{{4}}) (\d{{2}}):(\d{{2}}):(\d{{2}})$")
_MONTHS = {name: number for number, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}
_DAYS = frozenset({"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"})
_MAGIC_CALL = r"""get_ipython\(\)\.(?:run_line_magic\(\s*u?['"]{0}['"]|magic\(\s*u?['"]%?{0}\b)"""
_LOGSTART = re.compile(r"\s*(?:%logstart\b|" + _MAGIC_CALL.format("logstart") + ")")
# `%logstop` glued to the input before it (`sns.set()%logstop`), or on a line of its own.
_LOGSTOP = re.compile(r"(.*?)(?:%logstop|" + _MAGIC_CALL.format("logstop") + r"[^\n]*)\s*$")
# Control characters text does not hold (\t \n \v \f \r and ESC, for colours, it does): a file with a NUL, or
# with more than one such character in a hundred, is binary. A stray Ctrl-Z (U+001A) in a Windows log is not.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f]")
# What ast cannot parse but IPython can: a line magic, a shell escape, `x = !ls`, `obj?`; blanked to `pass`.
_IPYTHON_LINE = re.compile(r"(\s*)(?:[%!].*|\w+\s*=\s*[%!].*|[\w.]+\?\??)$")
_CONTINUES = re.compile(r"(?:else|elif|except|finally)\b|[)\]}]")


@dataclass
class _Block:
    """An input's lines as the log holds them, before an untimed block is split into statements."""

    time: str | None
    timed: bool
    lines: list[str] = field(default_factory=list)
    output: list[str] | None = None
    starts_logging: bool = False  # a timed cell that holds a `%logstart` line: its own kernel's history follows


def read_logstart_log(path: Path) -> list[HistorySession]:
    """The sessions of an IPython `%logstart` log, scrubbed; raises `HistoryRefused`."""
    return read_logstart(path).sessions


def read_logstart(path: str | os.PathLike, bounds: Bounds = IPYTHON_LOG) -> HistoryRead:
    """The sessions of an IPython `%logstart` log, scrubbed, with the redactions counted; raises
    `HistoryRefused`."""
    path = Path(path)
    try:
        text = read_text(path, bounds)
    except BoundError as exc:
        raise HistoryRefused(exc.path, exc.line, exc.problem, exc.bound) from None
    lines = _checked_lines(path, text.removeprefix("\ufeff"), bounds)
    counts: Counter = Counter()
    sessions = []
    for blocks in _sessions(lines):
        inputs = _inputs(blocks, counts)
        if inputs:
            times = [i.time for i in inputs if i.time]
            sessions.append(HistorySession(session=len(sessions) + 1, start=times[0] if times else None,
                                           end=times[-1] if times else None, inputs=tuple(inputs)))
    return HistoryRead(sessions, dict(counts))


def _checked_lines(path: Path, text: str, bounds: Bounds) -> list[str]:
    """The log's lines, refused past the line bounds or holding a control character (a binary file)."""
    lines = text.split("\n")
    if len(lines) > bounds.lines:
        raise HistoryRefused(path, bounds.lines + 1, f"{len(lines):,} lines, more than {bounds.lines:,}", "lines")
    control = _CONTROL.search(text)
    if control and ("\x00" in text or len(_CONTROL.findall(text)) * 100 > len(text)):
        first = text.find("\x00") if "\x00" in text else control.start()
        line = text.count("\n", 0, first) + 1
        raise HistoryRefused(path, line, f"binary, not a log (control character U+{ord(text[first]):04X})")
    for number, line in enumerate(lines, 1):
        if len(line) > bounds.line_bytes // 4 and len(line.encode("utf-8")) > bounds.line_bytes:
            raise HistoryRefused(path, number, f"longer than {bounds.line_bytes:,} bytes", "line_bytes")
    return [line.removesuffix("\r") for line in lines]


def _stamp_time(match: re.Match) -> str | None:
    """A timestamp comment's clock reading as ISO-8601 with a `Z` (zone unknown); None in another language."""
    day, date, month, year, hour, minute, second = match.groups()
    if day not in _DAYS or month not in _MONTHS:
        return None
    try:
        moment = datetime(int(year), _MONTHS[month], int(date), int(hour), int(minute), int(second))
    except ValueError:
        return None
    return moment.isoformat() + "Z"


def _sessions(lines: list[str]) -> list[list[_Block]]:
    """The log's lines as sessions of blocks (one block per timed input, or per untimed run of text)."""
    reader = _Sessions()
    for line in lines:
        reader.read(line)
    return reader.sessions


class _Sessions:
    """The line-by-line state of a log's reading: its sessions so far, whether the current session's own
    `%logstart` was seen, and whether the text read now is a history `%logstart` dumped again (skipped)."""

    def __init__(self) -> None:
        self.sessions: list[list[_Block]] = [[]]
        self.logging = False
        self.skipping = False

    @property
    def timed_block(self) -> _Block | None:
        blocks = self.sessions[-1]
        return blocks[-1] if blocks and blocks[-1].timed and blocks[-1].output is None else None

    def read(self, line: str) -> None:
        out = line.find(_OUT)
        stamp = _STAMP.search(line) if out < 0 and line[-3:-2] == ":" else None  # `:SS` ends a timestamp
        if stamp:
            self.text(line[:stamp.start()], glued=True)
            self.skipping = False
            self.sessions[-1].append(_Block(_stamp_time(stamp), True))
        elif self.skipping:
            return
        elif out >= 0:
            self.text(line[:out], glued=True)
            if not self.sessions[-1]:
                self.sessions[-1].append(_Block(None, False))
            body, block = line[out + len(_OUT):], self.sessions[-1][-1]
            block.output = (block.output or []) + [body[1:] if body.startswith(" ") else body]
        elif line == _HEADER:
            self.new_session()
        elif _LOGSTART.match(line):
            self.logstart(line)
        elif "logstop" in line and (stop := _LOGSTOP.match(line)):
            self.logstop(line, stop.group(1))
        else:
            self.text(line)

    def text(self, line: str, glued: bool = False) -> None:
        """A line of an input; the text before a marker on its line only where there is some."""
        if glued and not line.strip():
            return
        blocks = self.sessions[-1]
        if not blocks or blocks[-1].output is not None:
            blocks.append(_Block(None, False))
        blocks[-1].lines.append(line)

    def new_session(self) -> None:
        if any(b.lines for b in self.sessions[-1]):
            self.sessions.append([])
        self.logging = False

    def logstart(self, line: str) -> None:
        block = self.timed_block
        if block is not None:  # a cell typed with `%logstart` in it, logged as typed
            block.lines.append(line)
            block.starts_logging = True
            return
        if self.logging:
            self.new_session()
        self.logging = True

    def logstop(self, line: str, before: str) -> None:
        block = self.timed_block
        if block is not None and not before.strip() and not block.starts_logging:
            block.lines.append(line)  # a line of a typed cell, such as the course platform's first one
            return
        self.text(before, glued=True)
        if block is not None and block.starts_logging:
            self.skipping = True  # this kernel's history again, up to the next timestamp: read already
        else:
            self.new_session()


def _inputs(blocks: list[_Block], counts: Counter) -> list[HistoryInput]:
    """A session's blocks as inputs: a timed block is one input, an untimed one its statements; blank ones
    dropped, every text scrubbed."""
    inputs: list[HistoryInput] = []
    for block in blocks:
        code = _trimmed(block.lines)
        pieces = [code] if block.timed else _statements(code)
        pieces = [piece for piece in pieces if piece.strip()]
        for index, piece in enumerate(pieces):
            output = "\n".join(block.output) if block.output is not None and index == len(pieces) - 1 else None
            inputs.append(HistoryInput(line=len(inputs) + 1, code=scrub(piece, counts), time=block.time,
                                       output=None if output is None else scrub(output, counts)))
    return inputs


def _trimmed(lines: list[str]) -> str:
    """Lines joined, less the blank lines before and after them and the trailing spaces of the last."""
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[start:end]).rstrip()


def _statements(code: str) -> list[str]:
    """Untimed text split into top-level statements (an approximation, see the module's docstring)."""
    if not code:
        return []
    lines = code.split("\n")
    cell = next((i for i, line in enumerate(lines) if line.startswith("%%")), len(lines))
    head = lines[:cell]
    starts = _ast_starts(head) if head else []
    if starts is None:
        starts = _column_starts(head)
    starts = [s for s in starts if s < cell] + ([cell] if cell < len(lines) else [])
    bounds = list(zip(starts, starts[1:] + [len(lines)]))
    return [_trimmed(lines[a:b]) for a, b in bounds]


def _ast_starts(lines: list[str]) -> list[int] | None:
    """The first line of each top-level statement (comments before it go with it), or None where `ast` cannot
    parse the text with IPython's own lines blanked."""
    blanked = []
    for line in lines:
        match = _IPYTHON_LINE.match(line)
        blanked.append(match.group(1) + "pass" if match else line)
    try:
        with warnings.catch_warnings():  # a stranger's `"\d"` is no concern of the reader's
            warnings.simplefilter("ignore")
            tree = ast.parse("\n".join(blanked))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    starts, previous_end = [0], None
    for node in tree.body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        if previous_end is not None and first >= previous_end:
            starts.append(previous_end)
        previous_end = max(previous_end or 0, node.end_lineno or node.lineno)
    return starts


def _column_starts(lines: list[str]) -> list[int]:
    """A new statement at each line at column 0 that does not continue the one before (a closing bracket, `else`,
    a line after a backslash, a comma, an open bracket, a colon or a decorator); comment lines go with what follows."""
    starts, pending, previous = [0], None, lines[0]
    for index, line in enumerate(lines[1:], 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            pending = index if pending is None else pending
            continue
        begins = (line[0] not in " \t" and not _CONTINUES.match(line)
                  and not previous.rstrip().endswith(("\\", ",", "(", "[", "{", ":")) and not previous.startswith("@"))
        if begins:
            starts.append(pending if pending is not None else index)
        pending, previous = None, line
    return starts
