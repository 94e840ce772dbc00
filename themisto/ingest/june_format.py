"""The line formats of the JuNE logging extension's local `<kernel_id>.log` files, as its two shells wrote them.

The extension appended each event with a shell `echo` of `JSON.stringify(JSON.stringify(event))`, after replacing
every `'` of that string by an *unescaped* `"`. What the shell then did differs, so a file is read by its writer:

- `cmd` (cmd.exe, Windows): `'"<string body>"[EVENT_SEPARATOR]' ` — single quotes and the trailing space kept,
  backslashes as they were. Inside the body every real `"` is escaped, so a bare `"` is a replaced `'`. cmd.exe also
  treated `>`, `<`, `|`, `&` and `^` outside its own quotes as operators: lines cut short, text lost
  (`themisto.ingest.cmd_shell` models it).
- `sh` (macOS, Linux, WSL): `"<string body>"[EVENT_SEPARATOR]` — and `echo` halved every `\\\\`. Before a `"`, a
  run of k backslashes reads: k = 0, a replaced `'`; k ≥ 1, k − 1 backslashes then a `"` (for even k that reading
  is one of two; checked against the participants' final notebooks, it is the one that holds). Elsewhere the
  halved text is exactly the inner JSON.

A line that starts like its writer's but lost its end (cut short) is read as far as it goes: `read_log_line` gives
the fields before the cut, and the prefix of the one the cut fell in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal, get_args

from themisto.errors import InputError
from themisto.bounded import Bounds, check_json_text
from themisto.ingest.limits import LOG, parse_json

Writer = Literal["cmd", "sh"]
WRITERS: tuple[str, ...] = get_args(Writer)

SEPARATOR = "[EVENT_SEPARATOR]"
PREFIX: dict[str, str] = {"cmd": "'\"", "sh": '"'}
SUFFIX: dict[str, str] = {"cmd": "\"[EVENT_SEPARATOR]' ", "sh": '"[EVENT_SEPARATOR]'}

_CMD_TOKEN = re.compile(r'\\.|"', re.DOTALL)
_SH_QUOTE = re.compile(r'(\\*)"')
_ESCAPE = re.compile(r'\\(?:u[0-9a-fA-F]{4}|["\\/bfnrt])')


class LogLineError(InputError):
    """A log line that does not follow its writer's format; `reason` says what was expected."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class LineRead:
    """One line read: its fields, whole, or those before the cut and the prefix of `cut_field` (a cut line)."""

    event: dict
    # None when the line is whole; else the member the cut fell in ("" when it fell between members)
    cut_field: str | None = None


def detect_writer(line: str) -> Writer:
    """Which shell wrote a log line, from how it starts.

    >>> detect_writer(encode_log_line({"event": "create"}, "sh")), detect_writer(encode_log_line({"event": "x"}))
    ('sh', 'cmd')
    """
    text = line.rstrip("\r\n")
    if text.startswith(PREFIX["cmd"]):
        return "cmd"
    if text.startswith(PREFIX["sh"]):
        return "sh"
    raise LogLineError(f"expected a JuNE log line, starting with {PREFIX['cmd']!r} (cmd.exe) or "
                       f"{PREFIX['sh']!r} (sh)")


def _cmd_outer(body: str) -> str:
    # Every legitimate `"` of the string body is escaped, so a bare one is a replaced `'`.
    return _CMD_TOKEN.sub(lambda m: "'" if m.group() == '"' else m.group(), body)


def _sh_inner(body: str) -> str:
    # Only a run of backslashes before a `"` needs reading (module docstring); the rest is the inner JSON as it is.
    return _SH_QUOTE.sub(lambda m: m.group(1)[:-1] + '"' if m.group(1) else "'", body)


def _partial_string(text: str) -> str:
    """Decode the body of a JSON string that may have lost its end (a trailing broken escape is dropped)."""
    out: list[str] = []
    pos = 0
    for match in _ESCAPE.finditer(text):
        out.append(text[pos:match.start()])
        out.append(json.loads('"' + match.group() + '"'))
        pos = match.end()
    rest = text[pos:]
    broken = rest.find("\\")
    out.append(rest if broken < 0 else rest[:broken])
    return "".join(out)


def _inner_text(text: str, writer: Writer, whole: bool) -> str:
    """The inner JSON text of a line (the event object); for a cut line, the prefix of it that survived."""
    body = text[len(PREFIX[writer]):len(text) - len(SUFFIX[writer])] if whole else text[len(PREFIX[writer]):]
    if writer == "sh":
        return _sh_inner(body) if whole else _sh_inner(body).rstrip("\\")
    outer = _cmd_outer(body)
    if not whole:
        return _partial_string(outer)
    try:
        return json.loads('"' + outer + '"')
    except json.JSONDecodeError as exc:
        raise LogLineError(f"expected a twice-encoded JSON object ({exc.msg} at column {exc.colno})") from None


def partial_object(inner: str) -> tuple[dict, str]:
    """The members of a JSON object text cut short: every whole one, and the prefix of a cut string value; with
    the name of the member the cut fell in ("" when it fell between members)."""
    decoder = json.JSONDecoder()
    fields: dict = {}
    i = inner.find("{") + 1
    if i == 0:
        return fields, ""
    while True:
        while i < len(inner) and inner[i] in " ,\t\r\n":
            i += 1
        try:
            key, i = decoder.raw_decode(inner, i)
        except json.JSONDecodeError:
            return fields, ""
        while i < len(inner) and inner[i] in " :\t\r\n":
            i += 1
        try:
            value, end = decoder.raw_decode(inner, i)
        except json.JSONDecodeError:
            value, end = None, len(inner)
        if end >= len(inner):  # a value that runs to the cut may have lost its end, a number too
            if inner.startswith('"', i):
                fields[str(key)] = _partial_string(inner[i + 1:])
            return fields, str(key)
        fields[str(key)] = value
        i = end


def read_log_line(line: str, writer: Writer, *, bounds: Bounds = LOG, path: str = "", number: int | None = None) -> LineRead:
    """Read one line written by `writer`: the whole event, or what survived of a line cut short.

    >>> read_log_line(encode_log_line({"event": "execute", "cell_source": "print('hi')"}, "sh"), "sh").event
    {'event': 'execute', 'cell_source': "print('hi')"}
    >>> line = encode_log_line({"event": "execute", "cell_source": "if x > 1: y", "cell_type": "code"})
    >>> read_log_line(line[:line.index(">")], "cmd")  # cmd.exe took `>` for a redirection and ate the rest
    LineRead(event={'event': 'execute', 'cell_source': 'if x '}, cut_field='cell_source')
    """
    text = line.rstrip("\r\n")
    if not text.startswith(PREFIX[writer]):
        raise LogLineError(f"expected the line to start with {PREFIX[writer]!r} (a {writer} log)")
    # cmd.exe lines end with a space; a trimmed one is harmless.
    whole = text.rstrip(" ").endswith(SUFFIX[writer].rstrip())
    if whole:
        text = text.rstrip(" ") + SUFFIX[writer][len(SUFFIX[writer].rstrip()):]
    inner = _inner_text(text, writer, whole)
    if whole:
        try:
            event = parse_json(inner, bounds, path=path, line=number)
        except json.JSONDecodeError as exc:
            raise LogLineError(f"expected a twice-encoded JSON object ({exc.msg} at column {exc.colno})") from None
        if not isinstance(event, dict):
            raise LogLineError(f"expected a JSON object, got {type(event).__name__}")
        return LineRead(event)
    check_json_text(inner, bounds, path=path, line=number)
    fields, cut_field = partial_object(inner)
    if not fields:
        raise LogLineError(f"expected the line to end with {SUFFIX[writer]!r}, and no field of it is readable")
    return LineRead(fields, cut_field)


def decode_log_line(line: str, writer: Writer = "cmd") -> dict:
    """Parse one whole log line into its event dict; a line cut short is an error here (see `read_log_line`).

    >>> decode_log_line(encode_log_line({"event": "execute", "cell_source": "print('hi')"}))
    {'event': 'execute', 'cell_source': "print('hi')"}
    """
    read = read_log_line(line, writer)
    if read.cut_field is not None:
        raise LogLineError(f"expected the line to end with {SUFFIX[writer]!r} (truncated line?)")
    return read.event


def encode_log_line(event: dict, writer: Writer = "cmd") -> str:
    """Write an event the way the extension and its shell did, quote quirk included (one line, no newline)."""
    inner = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    body = json.dumps(inner, ensure_ascii=False)[1:-1].replace("'", '"')
    if writer == "sh":
        # echo halves every pair of backslashes; an escaped quote keeps its last backslash.
        body = re.sub(r"(\\+)", lambda m: "\\" * ((len(m.group(1)) + 1) // 2), body)
    return PREFIX[writer] + body + SUFFIX[writer]
