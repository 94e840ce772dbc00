"""The line format of the JuNE logging extension's local `<kernel_id>.log` files.

Each event is JSON, JSON-encoded a second time as a string, written by a shell `echo` as
`'"<string body>"[EVENT_SEPARATOR]' ` (literal single quotes, trailing space). Before writing, the extension
replaced every `'` of the payload by an *unescaped* `"`, so many lines are not valid JSON as written.
"""

from __future__ import annotations

import json

from themisto.errors import InputError

LINE_PREFIX = "'\""
LINE_SUFFIX = "\"[EVENT_SEPARATOR]' "


class LogLineError(InputError):
    """A log line that does not follow the format; `reason` says what was expected."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def decode_log_line(line: str) -> dict:
    """Parse one log line into its event dict.

    Inside the string body every legitimate `"` is escaped (`\\"`), so a bare `"` can only be a `'` the
    extension replaced; backslash escapes are copied as they are.

    >>> decode_log_line(encode_log_line({"event": "execute", "cell_source": "print('hi')"}))
    {'event': 'execute', 'cell_source': "print('hi')"}
    """
    text = line.rstrip("\r\n")
    if not text.startswith(LINE_PREFIX):
        raise LogLineError(f"expected the line to start with {LINE_PREFIX!r}")
    if not text.endswith(LINE_SUFFIX):
        if text.rstrip().endswith(LINE_SUFFIX.rstrip()):
            pass  # a trimmed trailing space is harmless
        else:
            raise LogLineError(f"expected the line to end with {LINE_SUFFIX!r} (truncated line?)")
    body = text[len(LINE_PREFIX):text.rindex("\"[EVENT_SEPARATOR]'")]
    out: list[str] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            if i + 1 >= len(body):
                raise LogLineError("expected an escaped character after a trailing backslash")
            out.append(body[i:i + 2])
            i += 2
            continue
        out.append("'" if ch == '"' else ch)
        i += 1
    try:
        inner = json.loads('"' + "".join(out) + '"')
        event = json.loads(inner)
    except json.JSONDecodeError as exc:
        raise LogLineError(f"expected a twice-encoded JSON object ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(event, dict):
        raise LogLineError(f"expected a JSON object, got {type(event).__name__}")
    return event


def encode_log_line(event: dict) -> str:
    """Write an event the way the extension did, quote quirk included (one line, no newline)."""
    inner = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    body = json.dumps(inner, ensure_ascii=False)[1:-1]
    return LINE_PREFIX + body.replace("'", '"') + LINE_SUFFIX
