"""Tagged JSON, the format of builtin values and the scalars numpy and pandas add: written so that reading them
back gives an equal value of the same type, and reading runs no code. A JSON file's value is a tagged value or a
definition (themisto.runtime.agent.formats.definitions, whose two tags are declared there).

Plain JSON where it is exact (None, bools, ints, finite floats, strings, lists, dicts with string keys); every other
value is an object `{"$": tag, ...}` written and read by its entry of `TABLE`, one entry per tag
(themisto.runtime.agent.formats.tags.Tag): the standard library's values (`builtin_tags`), numpy's and pandas'
(`library_tags`), and `ref`: a value stored on its own (a frame, an array, a function) named by its content hash.
Adding a tag is one entry there; the tags `check` knows, those any host reads back (`plain_tags()`) and the modules
the format claims are derived from the table. What `encode` cannot write exactly raises `Unencodable` with the reason.

Runs inside the kernel: standard library only (numpy and pandas are looked up in sys.modules when a value is theirs,
and imported by `decode` only when a tag needs them).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable

from themisto.runtime.agent.addresses import stored_int, stored_text
from themisto.runtime.agent.formats import builtin_tags, definitions, library_tags
from themisto.runtime.agent.formats.base import (DOCUMENT_KEY, DOCUMENT_VERSION, Format, Malformed, Resolve,
                                                 Unencodable, Unstorable, ValueFormatError, Writing, document,
                                                 read_document)
from themisto.runtime.agent.formats.tags import REF, Decoding, Encoding, Tag
from themisto.runtime.agent.namespace import qualname

TAG = definitions.TAG
# Every tag `encode` writes and `decode` reads, in the order a value of a library's type is offered to them (a value
# no tag takes is stored on its own: `REF`). A tuple, so that a change is a new table (the index follows it).
TABLE: tuple[Tag, ...] = (*builtin_tags.TAGS, *library_tags.TAGS, REF)
MAX_DEPTH = 64
NODES = 1_000_000  # the most values one document encodes
# Ints longer than this many bits go as hex: str() of a huge int is refused past 4,300 digits.
_INT_BITS = 12_000


@dataclass(frozen=True)
class _Index:
    """The table's lookups: a tag by its value's exact type and by its name, the tags a value is matched to, the
    built-in tags and the modules whose values the format claims."""

    table: tuple[Tag, ...]
    by_kind: dict[type, Tag]
    by_name: dict[str, Tag]
    matching: tuple[Tag, ...]
    builtin: frozenset[str]
    modules: tuple[str, ...]

    @classmethod
    def of(cls, table: tuple[Tag, ...]) -> "_Index":
        names, kinds = [tag.name for tag in table], [kind for tag in table for kind in tag.kinds]
        if len(set(names)) != len(names) or len(set(kinds)) != len(kinds):
            raise ValueError(f"tagged JSON's table names a tag or a type twice: {names}")
        return cls(table, {kind: tag for tag in table for kind in tag.kinds}, dict(zip(names, table)),
                   tuple(tag for tag in table if tag.matches is not None),
                   frozenset(tag.name for tag in table if not tag.needs),
                   tuple(sorted(set().union(*(tag.modules for tag in table)))))


_INDEX: _Index | None = None


def _index() -> _Index:
    """The lookups of `TABLE` as it is now (made at first use, and again when the table is replaced)."""
    global _INDEX
    if _INDEX is None or _INDEX.table is not TABLE:
        _INDEX = _Index.of(TABLE)
    return _INDEX


def plain_tags() -> frozenset[str]:
    """The tags whose values read back with the standard library alone (a value of these rehashes anywhere)."""
    return _index().builtin


def encode(value: Any, ref: Callable[[Any], str], nodes: list[int], depth: int = 0) -> Any:
    """The tagged-JSON form of `value`; `ref(value)` stores a non-builtin value on its own and gives its content
    hash (or raises Unencodable); `nodes` is a one-item budget of values visited, shared by the whole call."""
    return _Encoder(ref, nodes, _index()).value(value, depth)


class _Encoder:
    """One `encode` call: plain JSON written here, every other value by its tag, given the `Encoding` of its depth
    (one per depth, made once: a list of a million tuples makes one)."""

    def __init__(self, ref: Callable[[Any], str], nodes: list[int], index: _Index) -> None:
        self.ref, self.nodes, self.index, self.levels = ref, nodes, index, {}

    def value(self, value: Any, depth: int) -> Any:
        self.nodes[0] -= 1
        if self.nodes[0] < 0:
            raise Unencodable("too many items for JSON")
        if depth > MAX_DEPTH:
            raise Unencodable(f"nested deeper than {MAX_DEPTH} levels")
        kind = type(value)
        if value is None or kind is bool or (kind is float and math.isfinite(value)):
            return value
        if kind is str:  # an address in it is the making process's own (`addresses`): every build stores one
            return stored_text(value)
        if kind is int and value.bit_length() <= _INT_BITS:
            return stored_int(value)
        if kind is list:
            return [self.value(item, depth + 1) for item in value]
        if kind is dict and all(type(key) is str for key in value) and TAG not in value:
            return {key: self.value(item, depth + 1) for key, item in value.items()}
        tag = self.index.by_kind.get(kind) or next((tag for tag in self.index.matching if tag.matches(value)), REF)
        encoding = self.levels.get(depth)
        if encoding is None:
            encoding = self.levels[depth] = Encoding(lambda item: self.value(item, depth + 1), self.ref)
        return tag.encode(value, encoding)


def tagged(encoded: Any) -> list[dict]:
    """Every tagged object (`{"$": ...}`) in an encoded value, at any depth."""
    found, stack = [], [encoded]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if TAG in item:
                found.append(item)
            stack.extend(item.values())
    return found


def refs(encoded: Any) -> list[str]:
    """The content hashes of the values an encoded value holds that are stored on their own."""
    return [str(item.get("hash")) for item in tagged(encoded) if item.get(TAG) == REF.name]


# ---------------------------------------------------------------------------------------------------------------
# Reading back


def decode(data: Any, resolve: Callable[[str], Any], depth: int = 0) -> Any:
    """The value `encode` wrote; `resolve(hash)` gives a value stored on its own. Raises Malformed on anything
    `encode` does not write."""
    return _Decoder(resolve, _index()).value(data, depth)


class _Decoder:
    """One `decode` call: plain JSON read here, every tagged object by its tag, given the `Decoding` of its depth."""

    def __init__(self, resolve: Callable[[str], Any], index: _Index) -> None:
        self.resolve, self.index, self.levels = resolve, index, {}

    def value(self, data: Any, depth: int) -> Any:
        if depth > MAX_DEPTH + 1:
            raise Malformed("nested too deep")
        if data is None or isinstance(data, (bool, str, int, float)):
            return data
        if isinstance(data, list):
            stamps = library_tags.timestamps(data)
            return stamps if stamps is not None else [self.value(item, depth + 1) for item in data]
        if not isinstance(data, dict):
            raise Malformed(f"a {type(data).__name__} in a value document")
        if TAG not in data:
            return {key: self.value(item, depth + 1) for key, item in data.items()}
        name = data[TAG]
        tag = self.index.by_name.get(name) if isinstance(name, str) else None
        if tag is None:
            raise Malformed(f"an unknown tag {name!r}")
        decoding = self.levels.get(depth)
        if decoding is None:
            decoding = self.levels[depth] = Decoding(lambda item: self.value(item, depth + 1), self.resolve)
        try:
            return tag.decode(data, decoding)
        except (KeyError, TypeError, ValueError, struct.error, re.error) as error:
            if isinstance(error, Malformed):
                raise
            raise Malformed(f"a malformed {name!r} value ({type(error).__name__}: {error})") from None


# ---------------------------------------------------------------------------------------------------------------
# The JSON format: a value document of a tagged value or a definition


def no_ref(value: Any) -> str:
    """A `ref` for an encoding that stores nothing on its own (a Parquet column's cells, a series' name)."""
    raise Unencodable(f"a name of type {qualname(value)}")


def holds(value: Any) -> bool:
    module, claimed = type(value).__module__ or "", _index().modules  # and the values their containers hold
    return definitions.holds(value) or module in claimed or module.startswith(claimed)


def write(value: Any, writing: Writing) -> tuple[bytes, None]:
    if definitions.holds(value):
        return document(qualname(value), definitions.encode(value, writing.cell_text)), None
    try:
        encoded = encode(value, writing.ref, [NODES])
    except Unencodable as error:
        raise Unstorable(str(error)) from None
    except RecursionError:
        raise Unstorable("nested too deep for JSON") from None
    return document(qualname(value), encoded), None


def read(data: bytes, resolve: Resolve) -> Any:
    encoded = read_document(data)
    if definitions.is_definition(encoded):
        return definitions.Definition(encoded)  # themisto.runtime.agent.restore defines it; reading does not
    return decode(encoded, resolve)


def refs_of(data: bytes) -> list[str]:
    """The content hashes of the values a JSON value document refers to (stored on their own)."""
    return refs(json.loads(data)["value"])


def plain(data: bytes) -> tuple[bool, Any]:
    """(True, value) for a document of builtins only (no numpy or pandas type, no definition, no value stored on its
    own), read back with the standard library alone; else (False, None)."""
    encoded = json.loads(data)["value"]
    if any(item.get(TAG) not in plain_tags() for item in tagged(encoded)):
        return False, None
    return True, decode(encoded, lambda digest: None)


def checked_document(data: bytes, bound: int) -> dict:
    """A JSON value document read within `bound` bytes and the depth tagged JSON writes (ValueFormatError when it is
    not one)."""
    from themisto.bounded import BoundError, Bounds, loads_json

    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueFormatError("not an ASCII JSON document") from None
    try:
        # A developer's str may hold a lone surrogate ('\ud800' is a Python string): kept, as the value was.
        found = loads_json(text, Bounds(file_bytes=bound, depth=MAX_DEPTH + 8), path="value", keep_surrogates=True)
    except BoundError as error:
        raise ValueFormatError(f"not a JSON value document ({error.problem})") from None
    if not isinstance(found, dict) or found.get(DOCUMENT_KEY) != DOCUMENT_VERSION or \
            not isinstance(found.get("type"), str) or "value" not in found:
        raise ValueFormatError("not a JSON value document (no themisto_value header)")
    return found


_HASH = re.compile(r"[0-9a-f]{32}\Z")


def check(data: bytes, bound: int) -> None:
    for item in tagged(checked_document(data, bound)["value"]):
        tag = item.get(TAG)
        if tag not in _index().by_name and tag not in definitions.TAGS:
            raise ValueFormatError(f"a JSON value with an unknown tag {str(tag)[:40]!r}")
        if tag == REF.name and not _HASH.match(str(item.get("hash"))):
            raise ValueFormatError("a JSON value that refers to something other than a content hash")


FORMAT = Format("json", holds, write, read, check, refs=refs_of, cap=lambda caps: caps.json_bytes, plain=plain)
