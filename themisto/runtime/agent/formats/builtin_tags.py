"""Tagged JSON's tags of the standard library's values that plain JSON does not write exactly: tuple, set, frozenset,
dict (other keys), `collections`' OrderedDict, Counter and defaultdict (of a builtin factory), bytes, bytearray, float
(non-finite, by its bits), int (too long for a JSON number), complex, range, the datetime types, `re.Pattern` and
`re.Match`. Each reads back with the standard library alone (themisto.runtime.agent.formats.tagged_json holds the
table).

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import base64
import collections
import datetime
import math
import re
import struct
from typing import Any

from themisto.runtime.agent.formats.base import Malformed, Unencodable
from themisto.runtime.agent.formats.definitions import TAG
from themisto.runtime.agent.formats.tags import Decoding, Encoding, Tag, qualified

_FACTORIES = {kind.__name__: kind for kind in (list, dict, set, int, float, str, tuple, frozenset, bytes)}


def _collection(kind: type) -> Tag:
    """tuple, set, frozenset: their items in order."""
    return Tag(kind.__name__, kinds=(kind,),
               encode=lambda value, encoding: {TAG: kind.__name__, "items": [encoding.item(item) for item in value]},
               decode=lambda data, decoding: kind([decoding.item(item) for item in data["items"]]))


def _items(value: dict, encoding: Encoding) -> list:
    return [[encoding.item(key), encoding.item(item)] for key, item in value.items()]


def _pairs(data: dict, decoding: Decoding) -> list:
    return [(decoding.item(key), decoding.item(item)) for key, item in data["items"]]


def _mapping(kind: type) -> Tag:
    """dict (keys other than strings), OrderedDict, Counter: their items as [key, value] pairs, in order."""

    def decode(data: dict, decoding: Decoding) -> Any:
        if kind is dict:
            return dict(_pairs(data, decoding))
        made = kind()
        for key, value in _pairs(data, decoding):
            made[key] = value
        return made

    return Tag(kind.__name__, kinds=(kind,), decode=decode,
               encode=lambda value, encoding: {TAG: kind.__name__, "items": _items(value, encoding)})


def _defaultdict(value: collections.defaultdict, encoding: Encoding) -> dict:
    data: dict[str, Any] = {TAG: "defaultdict", "items": _items(value, encoding)}
    factory = value.default_factory
    if factory is not None and _FACTORIES.get(getattr(factory, "__name__", None)) is not factory:
        raise Unencodable(f"a defaultdict whose factory is {factory!r}, not a builtin type")
    data["factory"] = None if factory is None else factory.__name__
    return data


def _undefaultdict(data: dict, decoding: Decoding) -> collections.defaultdict:
    factory = data["factory"]
    if factory is not None and factory not in _FACTORIES:
        raise Malformed(f"a defaultdict factory {factory!r} that is not a builtin type")
    made = collections.defaultdict(None if factory is None else _FACTORIES[factory])
    made.update(_pairs(data, decoding))
    return made


def _binary(kind: type) -> Tag:
    """bytes, bytearray: as base64."""
    return Tag(kind.__name__, kinds=(kind,),
               encode=lambda value, encoding: {TAG: kind.__name__, "b64": base64.b64encode(value).decode("ascii")},
               decode=lambda data, decoding: kind(base64.b64decode(data["b64"], validate=True)))


def _bits(value: float) -> dict:
    return {TAG: "float", "bits": struct.pack("<d", value).hex()}  # NaN payloads and signs kept


def _float(value: float) -> Any:
    return value if math.isfinite(value) else _bits(value)


def _unfloat(data: Any) -> float:
    if isinstance(data, dict):
        return struct.unpack("<d", bytes.fromhex(data["bits"]))[0]
    return float(data)


def _text(value: str | bytes) -> Any:
    return value if type(value) is str else {TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}


def _untext(data: Any) -> str | bytes:
    return data if isinstance(data, str) else base64.b64decode(data["b64"])


def _clock(kind: type) -> Tag:
    """datetime, time: ISO text and fold, with a fixed-offset timezone only."""

    def encode(value: Any, encoding: Encoding) -> dict:
        if value.tzinfo is not None and type(value.tzinfo) is not datetime.timezone:
            raise Unencodable(f"a {kind.__name__} with a {qualified(type(value.tzinfo))} timezone")
        return {TAG: kind.__name__, "iso": value.isoformat(), "fold": value.fold}

    return Tag(kind.__name__, kinds=(kind,), encode=encode,
               decode=lambda data, decoding: kind.fromisoformat(data["iso"]).replace(fold=int(data["fold"])))


def _match(value: re.Match, encoding: Encoding) -> dict:
    return {TAG: "re.Match", "pattern": _text(value.re.pattern), "flags": value.re.flags,
            "string": _text(value.string), "pos": value.pos, "endpos": value.endpos,
            "regs": [list(span) for span in value.regs]}


def _rematch(data: dict, decoding: Decoding) -> re.Match:
    """The match `encode` saw, found again: the pattern run over the same string and span as the original."""
    pattern = re.compile(_untext(data["pattern"]), int(data["flags"]))
    string, pos, endpos = _untext(data["string"]), int(data["pos"]), int(data["endpos"])
    regs = tuple(tuple(int(n) for n in span) for span in data["regs"])
    candidates = [pattern.match(string, pos, endpos), pattern.fullmatch(string, pos, endpos)]
    for found in candidates + list(pattern.finditer(string, pos, endpos)):
        if found is not None and found.regs == regs:
            return found
    raise Malformed("the match cannot be found again in its string")


TAGS = [
    *(_collection(kind) for kind in (tuple, set, frozenset)),
    *(_mapping(kind) for kind in (dict, collections.OrderedDict, collections.Counter)),
    Tag("defaultdict", kinds=(collections.defaultdict,), encode=_defaultdict, decode=_undefaultdict),
    *(_binary(kind) for kind in (bytes, bytearray)),
    Tag("float", kinds=(float,), encode=lambda value, encoding: _bits(value),
        decode=lambda data, decoding: _unfloat(data)),
    Tag("int", kinds=(int,), encode=lambda value, encoding: {TAG: "int", "hex": hex(value)},
        decode=lambda data, decoding: int(data["hex"], 16)),
    Tag("complex", kinds=(complex,),
        encode=lambda value, encoding: {TAG: "complex", "real": _float(value.real), "imag": _float(value.imag)},
        decode=lambda data, decoding: complex(_unfloat(data["real"]), _unfloat(data["imag"]))),
    Tag("range", kinds=(range,),
        encode=lambda value, encoding: {TAG: "range", "start": value.start, "stop": value.stop, "step": value.step},
        decode=lambda data, decoding: range(int(data["start"]), int(data["stop"]), int(data["step"]))),
    *(_clock(kind) for kind in (datetime.datetime, datetime.time)),
    Tag("date", kinds=(datetime.date,), encode=lambda value, encoding: {TAG: "date", "iso": value.isoformat()},
        decode=lambda data, decoding: datetime.date.fromisoformat(data["iso"])),
    Tag("timedelta", kinds=(datetime.timedelta,),
        encode=lambda value, encoding: {TAG: "timedelta", "days": value.days, "seconds": value.seconds,
                                        "microseconds": value.microseconds},
        decode=lambda data, decoding: datetime.timedelta(days=data["days"], seconds=data["seconds"],
                                                         microseconds=data["microseconds"])),
    Tag("re.Pattern", kinds=(re.Pattern,),
        encode=lambda value, encoding: {TAG: "re.Pattern", "pattern": _text(value.pattern), "flags": value.flags},
        decode=lambda data, decoding: re.compile(_untext(data["pattern"]), int(data["flags"]))),
    Tag("re.Match", kinds=(re.Match,), encode=_match, decode=_rematch),
]
