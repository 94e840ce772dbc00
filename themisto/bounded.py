"""The one reader of files someone else wrote: JSON, JSON lines and YAML, parsed within bounds.

Every file a submission, a downloaded release or an input log brings is read here. Its size, its line count, each
line's length, its nesting depth and its number of items are bounded (`Bounds`), and anything past a bound — or not
well-formed — is refused with one `BoundError` whose message names the file, the line and the bound:

    run.json:1: nested deeper than 64 levels (bound: depth)

Depth is measured before `json.loads` runs, because Python's decoder recurses and a 200 KB array nested 100,000 deep
raises RecursionError, not a decoding error. The measure works on the text at C speed (escapes and strings taken out
with `str.replace` and `str.split`, brackets kept with `bytes.translate`, innermost pairs peeled with
`bytes.replace`), and only for a text with more opening brackets than the depth bound; `python bench/bounded_reader.py`
prints what it costs against `json.loads`. YAML goes through a safe loader that refuses every anchor and alias (the
"billion laughs": a few aliases that expand exponentially, which `yaml.safe_load` happily expands) and bounds the
depth and the number of nodes as it composes them. A string UTF-8 cannot encode (a lone surrogate such as
`"\\ud800"`, which `json.loads` accepts) is refused too, naming the file, the line and the key: whatever reads it
would fail later, writing it back.

>>> loads_json('{"a": [1, 2]}', path="x.json")
{'a': [1, 2]}
>>> loads_json("[" * 100 + "]" * 100, path="x.json", line=3)
Traceback (most recent call last):
...
themisto.bounded.BoundError: x.json:3: nested deeper than 64 levels (bound: depth)
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from themisto.errors import InputError

_FOLD = bytes.maketrans(b"{}", b"[]")  # both kinds of bracket folded into one: only nesting matters
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_CHUNK = 1 << 20
# Below this many brackets and commas a text's items are counted on its raw text (strings included: a few too
# many); above it, outside its strings, so long code in a prediction does not eat the file's item budget.
_ROUGH_ITEMS = 256


@dataclass(frozen=True)
class Bounds:
    """How much of a file the reader takes before it refuses it; each field is one bound a BoundError can name."""

    file_bytes: int = 64 << 20  # the whole file
    line_bytes: int = 1 << 20  # one line of JSON lines, without its newline
    lines: int = 1_000_000  # lines of a JSON-lines or YAML file
    depth: int = 64  # arrays/objects (YAML: collections) inside one another
    items: int = 5_000_000  # values and keys in the whole file (JSON: counted as containers and separators)


class BoundError(InputError):
    """A file refused by the bounded reader: past a bound (`bound` names the `Bounds` field) or not well-formed
    (`bound` is None). The message names the file and, where one applies, the line."""

    def __init__(self, path: str | os.PathLike, line: int | None, problem: str, bound: str | None = None) -> None:
        self.path, self.line, self.problem, self.bound = str(path), line, problem, bound
        where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + problem + (f" (bound: {bound})" if bound else ""))

    def __reduce__(self):  # crosses process boundaries (Ray, multiprocessing) whole
        return type(self), (self.path, self.line, self.problem, self.bound)


# ---------------------------------------------------------------------------------------------------------------
# The structure of a JSON text, measured before it is parsed


def _outside_strings(text: str) -> str:
    """The JSON text with its strings taken out: escaped backslashes first, then escaped quotes, so every quote
    left opens or closes a string and every other piece of a split on quotes lies outside one."""
    return "".join(text.replace("\\\\", "").replace('\\"', "").split('"')[0::2])


def _deeper_than(brackets: bytes, limit: int) -> bool:
    """Whether a sequence of folded brackets nests deeper than `limit`: a run of limit + 1 openers is, else each
    pass peels the innermost pairs; limit passes leave an opener only where it was deeper. A sequence that stops
    shrinking is not well-formed and is left for the decoder to refuse."""
    run = b"[" * (limit + 1)
    for _ in range(limit):
        if run in brackets:
            return True
        peeled = brackets.replace(b"[]", b"")
        if len(peeled) == len(brackets):
            return False
        brackets = peeled
    return b"[" in brackets


def _structure(text: str) -> tuple[int, int]:
    """(openers, items) of a JSON text counted on the raw text: upper bounds, since strings may hold brackets."""
    openers = text.count("[") + text.count("{")
    return openers, openers + text.count(",") + 1


def check_json_text(text: str, bounds: Bounds, *, path: str | os.PathLike, line: int | None = None,
                    items_left: int | None = None) -> int:
    """Refuse a JSON text nested deeper than `bounds.depth` or with more items than `items_left` (default
    `bounds.items`) before it is parsed; returns its item count (an upper bound: one too many per empty container).
    A short text costs three `str.count`s."""
    budget = bounds.items if items_left is None else items_left
    openers, items = _structure(text)
    if openers <= bounds.depth and items <= min(budget, _ROUGH_ITEMS):
        return items
    outside = _outside_strings(text)
    openers, items = _structure(outside)
    if openers > bounds.depth:
        brackets = outside.encode("utf-8", "surrogatepass").translate(_FOLD, _NOT_BRACKETS)
        if _deeper_than(brackets, bounds.depth):
            if line is None:  # a whole document: name the line where it first gets too deep
                line = text.count("\n", 0, _deep_offset(text, bounds.depth)) + 1
            raise BoundError(path, line, f"nested deeper than {bounds.depth} levels", "depth")
    if items > budget:
        raise BoundError(path, line, f"more than {bounds.items:,} items in the file", "items")
    return items


def _deep_offset(text: str, limit: int) -> int:
    """Where the nesting first passes `limit` (only asked once a text is refused, to name its line)."""
    depth, in_string, escaped = 0, False, False
    for offset, char in enumerate(text):
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = char == "\\", char != '"'
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return offset
        elif char in "]}":
            depth -= 1
    return 0


def loads_json(text: str, bounds: Bounds = Bounds(), *, path: str | os.PathLike, line: int | None = None,
               keep_surrogates: bool = False) -> Any:
    """One JSON text parsed within `bounds` (depth, items); BoundError names `path` and `line`. A lone surrogate is
    refused unless `keep_surrogates` (a stored Python value, which may hold one and is never written as UTF-8)."""
    check_json_text(text, bounds, path=path, line=line)
    return _decode(text, path, line, keep_surrogates)


def _decode(text: str, path: str | os.PathLike, line: int | None, keep_surrogates: bool = False) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        where = line if line is not None else exc.lineno
        raise BoundError(path, where, f"not JSON ({exc.msg}, column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits; recursion cannot pass depth
        raise BoundError(path, line, f"not JSON ({exc})") from None
    if not keep_surrogates and _may_hold_surrogates(text):
        _refuse_not_unicode(value, text, path, line)
    return value


# ---------------------------------------------------------------------------------------------------------------
# Text that UTF-8 cannot encode
#
# JSON's \uXXXX escapes can name half of a surrogate pair alone ("\ud800"): `json.loads` accepts it and gives a
# string that no UTF-8 file can hold, so whoever writes it back (a run's records, a board's copy, a results file)
# fails with UnicodeEncodeError. Such a string is refused where it is read, naming the file, the line and the key.

_SURROGATE_START = re.compile(r"\\u[dD][89a-fA-F]")


def _may_hold_surrogates(text: str) -> bool:
    """Whether parsing `text` can give a lone surrogate: only a \\uD800-\\uDFFF escape makes one, or such a character
    in a text not decoded from UTF-8. Both checks run at C speed (a few µs a line, against tens for json.loads); the
    value is walked only where one holds (a pair, an emoji written with escapes, is walked and passes)."""
    if "\\u" in text and _SURROGATE_START.search(text):
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SURROGATE_ESCAPE = re.compile(r"(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                               r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}|[\ud800-\udfff]")


def not_unicode(value: Any) -> str | None:
    """Where the first string of a JSON-like value (keys included) that UTF-8 cannot encode lies, and what it holds
    there, as a phrase; None when every string encodes.

    >>> not_unicode({"id": "k/1", "prediction": "x = 1  # \\ud800"})
    'a lone surrogate U+D800 in prediction, character 10'
    >>> not_unicode(["ok", "\\ud83d\\ude00", "\\U0001F600"])
    'a lone surrogate U+D83D in [1], character 1'
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (f"a lone surrogate U+{ord(item[exc.start]):04X} in {where or 'the value'}, "
                        f"character {exc.start + 1}")
        elif isinstance(item, dict):
            for key, inner in reversed(list(item.items())):
                named = f"{where}.{key}" if where else str(key)
                stack.append((inner, named))
                if isinstance(key, str):
                    stack.append((key, f"a key of {where or 'the object'}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, f"{where}[{i}]") for i, inner in reversed(list(enumerate(item))))
    return None


def escaped_surrogates(value: Any) -> Any:
    """The value with every lone surrogate in its strings written as a visible `\\udXXX` escape (text UTF-8 can
    hold), so what cannot be kept as it is is kept as a record of what it was."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {escaped_surrogates(k): escaped_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escaped_surrogates(v) for v in value)
    return value


def _refuse_not_unicode(value: Any, text: str, path: str | os.PathLike, line: int | None,
                        first_line: int = 1) -> None:
    problem = not_unicode(value)
    if problem is None:
        return
    if line is None:  # a whole document: the line of the first lone surrogate (a pair is one character)
        lone = next((m for m in _SURROGATE_ESCAPE.finditer(text) if m.group(1) is None), None)
        line = first_line + text.count("\n", 0, lone.start()) if lone is not None else None
    raise BoundError(path, line, f"text that is not Unicode: {problem} (UTF-8 cannot encode it)")


# ---------------------------------------------------------------------------------------------------------------
# Files


def _open(path: Path, bounds: Bounds):
    """The file opened for reading if it is a regular file within `bounds.file_bytes` (a FIFO would block the
    reader, a device never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BoundError(path, None, "no such file") from None
    except OSError as exc:
        raise BoundError(path, None, f"cannot be read ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BoundError(path, None, "not a regular file")
    if info.st_size > bounds.file_bytes:
        os.close(fd)
        raise BoundError(path, None, f"{info.st_size:,} bytes, more than {bounds.file_bytes:,}", "file_bytes")
    return os.fdopen(fd, "rb")


def read_text(path: str | os.PathLike, bounds: Bounds = Bounds()) -> str:
    """A whole UTF-8 file within `bounds.file_bytes` (checked again as it is read: a file can grow)."""
    path = Path(path)
    with _open(path, bounds) as fh:
        data = fh.read(bounds.file_bytes + 1)
    if len(data) > bounds.file_bytes:
        raise BoundError(path, None, f"more than {bounds.file_bytes:,} bytes", "file_bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BoundError(path, data.count(b"\n", 0, exc.start) + 1, "not UTF-8") from None


def read_json(path: str | os.PathLike, bounds: Bounds = Bounds()) -> Any:
    """One JSON document file, parsed within `bounds` (file_bytes, depth, items)."""
    return loads_json(read_text(path, bounds), bounds, path=path)


@dataclass(frozen=True)
class JsonLine:
    """One line of a JSON-lines file: its number, its value, whether a newline ended it, and the byte offset it
    starts at (where a resume cuts a torn line off)."""

    number: int
    value: Any
    ended: bool = True
    offset: int = 0


def _count_lines(fh, path: Path, bounds: Bounds) -> None:
    """Refuse a file of more than `bounds.lines` lines before any is parsed (a million short lines parse slowly
    and fill memory; counting them is a memchr)."""
    count, last = 0, b"\n"
    while chunk := fh.read(_CHUNK):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    count += last != b"\n"
    fh.seek(0)
    if count > bounds.lines:
        raise BoundError(path, bounds.lines + 1, f"{count:,} lines, more than {bounds.lines:,}", "lines")


def iter_json_lines(path: str | os.PathLike, bounds: Bounds = Bounds(), *, skip_blank: bool = False,
                    torn_tail: Literal["parse", "report"] = "parse") -> Iterator[JsonLine]:
    """Each line of a JSON-lines file parsed within `bounds` (every field applies; `items` to the whole file).

    A blank line is refused unless `skip_blank`. The last line, when no newline ends it, is parsed like the others
    with `torn_tail="parse"` (a failure then says the file looks cut); with `"report"` it is yielded unparsed
    (value None, ended False), so a resume can cut what a killed writer left."""
    path = Path(path)
    with _open(path, bounds) as fh:
        _count_lines(fh, path, bounds)
        items_left, number, size = bounds.items, 0, 0
        while raw := fh.readline(bounds.line_bytes + 1):
            number += 1
            offset, size = size, size + len(raw)
            ended = raw.endswith(b"\n")
            if size > bounds.file_bytes:
                raise BoundError(path, number, f"more than {bounds.file_bytes:,} bytes", "file_bytes")
            if not ended and len(raw) > bounds.line_bytes:
                raise BoundError(path, number, f"longer than {bounds.line_bytes:,} bytes", "line_bytes")
            if number > bounds.lines:  # the file grew since it was counted
                raise BoundError(path, number, f"more than {bounds.lines:,} lines", "lines")
            if not ended and torn_tail == "report":
                yield JsonLine(number, None, ended=False, offset=offset)
                return
            try:
                text = (raw[:-1] if ended else raw).decode("utf-8")
            except UnicodeDecodeError:
                raise BoundError(path, number, "not UTF-8") from None
            if not text.strip():
                if skip_blank:
                    continue
                raise BoundError(path, number, "blank line (one JSON value per line)")
            items_left -= check_json_text(text, bounds, path=path, line=number, items_left=items_left)
            try:
                value = _decode(text, path, number)
            except BoundError as exc:
                if ended:
                    raise
                raise BoundError(path, number, exc.problem + "; no newline ends it: the file is cut") from None
            yield JsonLine(number, value, ended, offset)


# ---------------------------------------------------------------------------------------------------------------
# YAML


def loads_yaml(text: str, bounds: Bounds = Bounds(), *, path: str | os.PathLike, first_line: int = 1) -> Any:
    """One YAML document parsed with the safe loader, refusing anchors and aliases, within `bounds` (lines, depth,
    items); `first_line` is the file's line the text starts on (a card's front matter starts on line 2)."""
    import yaml

    lines = text.count("\n") + 1
    if lines > bounds.lines:
        raise BoundError(path, first_line + bounds.lines, f"{lines:,} lines, more than {bounds.lines:,}", "lines")
    loader = _bounded_loader(yaml)(text)
    loader.bounded = (bounds, path, first_line)
    try:
        value = loader.get_single_data()
        if "\\" in text:  # a double-quoted scalar's \u escape can name a lone surrogate, as in JSON
            _refuse_not_unicode(value, text, path, None, first_line)
        return value
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = first_line + mark.line if mark is not None else None
        raise BoundError(path, line, f"not YAML ({exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise BoundError(path, None, f"not YAML ({exc})") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, bounds: Bounds = Bounds()) -> Any:
    """One YAML document file, parsed within `bounds` (file_bytes, lines, depth, items); anchors refused."""
    return loads_yaml(read_text(path, bounds), bounds, path=path)


_LOADER = None


def _bounded_loader(yaml):
    """yaml.SafeLoader whose composer refuses anchors and aliases and counts depth and nodes as it goes (made once,
    on first use: `import themisto.bounded` does not import yaml)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER

    class BoundedLoader(yaml.SafeLoader):
        bounded: tuple[Bounds, Any, int]
        _depth = 0
        _nodes = 0

        def compose_node(self, parent, index):
            bounds, path, first_line = self.bounded
            event = self.peek_event()
            line = first_line + event.start_mark.line
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise BoundError(path, line, "an anchor or alias (& or *): refused, since aliases can expand "
                                             "exponentially (\"billion laughs\")")
            self._nodes += 1
            if self._nodes > bounds.items:
                raise BoundError(path, line, f"more than {bounds.items:,} items in the file", "items")
            if not isinstance(event, yaml.CollectionStartEvent):  # a scalar: depth counts collections, as in JSON
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > bounds.depth:
                raise BoundError(path, line, f"nested deeper than {bounds.depth} levels", "depth")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    _LOADER = BoundedLoader
    return _LOADER
