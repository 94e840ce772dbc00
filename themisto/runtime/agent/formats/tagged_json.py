"""Tagged JSON, the format of builtin values and the scalars numpy and pandas add: written so that reading them
back gives an equal value of the same type, and reading runs no code. Its tag table (`TAGS`) is declared here once;
a JSON file's value is a tagged value or a definition (themisto.runtime.agent.formats.definitions), whose two tags
are declared there.

Plain JSON where it is exact (None, bools, ints, finite floats, strings, lists, dicts with string keys); every other
value is an object `{"$": tag, ...}`: tuple, set, frozenset, dict (other keys), bytes, bytearray, float (non-finite,
by its bits), int (too long for a JSON number), complex, range, the datetime types, `collections`' Counter,
OrderedDict and defaultdict (of a builtin factory), `re.Pattern`, `re.Match`, numpy scalars, pandas' Timestamp,
Timedelta and NaT, object arrays, groupbys, and `ref`: a value stored on its own (a frame, an array, a function)
named by its content hash. What `encode` cannot write exactly raises `Unencodable` with the reason.

Runs inside the kernel: standard library only (numpy and pandas are looked up in sys.modules when a value is theirs,
and imported by `decode` only when a tag needs them).
"""

from __future__ import annotations

import base64
import collections
import datetime
import json
import math
import re
import struct
from typing import Any, Callable

from themisto.runtime.agent.formats import definitions
from themisto.runtime.agent.formats.base import (DOCUMENT_KEY, DOCUMENT_VERSION, Format, Malformed, Resolve,
                                                 Unencodable, Unstorable, ValueFormatError, Writing, document,
                                                 read_document)
from themisto.runtime.agent.hashing import GROUPBY_TYPES, groupby_options, grouping_keys, grouping_name, groupings
from themisto.runtime.agent.namespace import qualname

TAG = definitions.TAG
# Every tag `encode` writes and `decode` reads -> what reading it back needs beyond the standard library ("": nothing).
TAGS = {**{tag: "" for tag in ("tuple", "set", "frozenset", "dict", "OrderedDict", "Counter", "defaultdict", "bytes",
                               "bytearray", "float", "int", "complex", "range", "datetime", "time", "date",
                               "timedelta", "re.Pattern", "re.Match")},
        "ref": "another stored value", "numpy": "numpy", "ndarray": "numpy", "Timestamp": "pandas",
        "Timedelta": "pandas", "NaT": "pandas", "groupby": "pandas"}
BUILTIN_TAGS = frozenset(tag for tag, needs in TAGS.items() if not needs)  # a value of these rehashes anywhere
MAX_DEPTH = 64
NODES = 1_000_000  # the most values one document encodes
# Ints longer than this many bits go as hex: str() of a huge int is refused past 4,300 digits.
_INT_BITS = 12_000
_DICT_KINDS = {collections.OrderedDict: "OrderedDict", collections.Counter: "Counter",
               collections.defaultdict: "defaultdict"}
_FACTORIES = {kind.__name__: kind for kind in (list, dict, set, int, float, str, tuple, frozenset, bytes)}


def qualified(kind: type) -> str:
    return f"{getattr(kind, '__module__', None) or 'builtins'}.{kind.__qualname__}"


def _float(value: float) -> Any:
    if math.isfinite(value):
        return value
    return {TAG: "float", "bits": struct.pack("<d", value).hex()}  # NaN payloads and signs kept


def _text(value: str | bytes) -> Any:
    return value if type(value) is str else {TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}


def encode(value: Any, ref: Callable[[Any], str], nodes: list[int], depth: int = 0) -> Any:
    """The tagged-JSON form of `value`; `ref(value)` stores a non-builtin value on its own and gives its content
    hash (or raises Unencodable); `nodes` is a one-item budget of values visited, shared by the whole call."""
    nodes[0] -= 1
    if nodes[0] < 0:
        raise Unencodable("too many items for JSON")
    if depth > MAX_DEPTH:
        raise Unencodable(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() <= _INT_BITS else {TAG: "int", "hex": hex(value)}
    if kind is float:
        return _float(value)
    if kind is list:
        return [encode(item, ref, nodes, depth + 1) for item in value]
    if kind is dict:
        if all(type(key) is str for key in value) and TAG not in value:
            return {key: encode(item, ref, nodes, depth + 1) for key, item in value.items()}
        return {TAG: "dict", "items": _items(value, ref, nodes, depth)}
    if kind in (tuple, set, frozenset):
        return {TAG: kind.__name__, "items": [encode(item, ref, nodes, depth + 1) for item in value]}
    if kind in _DICT_KINDS:
        data: dict[str, Any] = {TAG: _DICT_KINDS[kind], "items": _items(value, ref, nodes, depth)}
        if kind is collections.defaultdict:
            factory = value.default_factory
            if factory is not None and _FACTORIES.get(getattr(factory, "__name__", None)) is not factory:
                raise Unencodable(f"a defaultdict whose factory is {factory!r}, not a builtin type")
            data["factory"] = None if factory is None else factory.__name__
        return data
    if kind in (bytes, bytearray):
        return {TAG: kind.__name__, "b64": base64.b64encode(value).decode("ascii")}
    if kind is complex:
        return {TAG: "complex", "real": _float(value.real), "imag": _float(value.imag)}
    if kind is range:
        return {TAG: "range", "start": value.start, "stop": value.stop, "step": value.step}
    if kind in (datetime.datetime, datetime.time):
        if value.tzinfo is not None and type(value.tzinfo) is not datetime.timezone:
            raise Unencodable(f"a {kind.__name__} with a {qualified(type(value.tzinfo))} timezone")
        return {TAG: kind.__name__, "iso": value.isoformat(), "fold": value.fold}
    if kind is datetime.date:
        return {TAG: "date", "iso": value.isoformat()}
    if kind is datetime.timedelta:
        return {TAG: "timedelta", "days": value.days, "seconds": value.seconds, "microseconds": value.microseconds}
    if kind is re.Pattern:
        return {TAG: "re.Pattern", "pattern": _text(value.pattern), "flags": value.flags}
    if kind is re.Match:
        return {TAG: "re.Match", "pattern": _text(value.re.pattern), "flags": value.re.flags,
                "string": _text(value.string), "pos": value.pos, "endpos": value.endpos,
                "regs": [list(span) for span in value.regs]}
    module = getattr(kind, "__module__", "") or ""
    if module == "numpy" and hasattr(value, "dtype") and hasattr(value, "tobytes") and kind.__name__ != "ndarray":
        if value.dtype.hasobject:
            raise Unencodable("a numpy object scalar")
        return {TAG: "numpy", "dtype": value.dtype.str, "hex": value.tobytes().hex()}
    if module.startswith("pandas"):
        scalar = _pandas_scalar(value, kind)
        if scalar is not None:
            return scalar
    if module.startswith("pandas.core.groupby") and kind.__name__ in GROUPBY_TYPES:
        return _groupby(value, ref, nodes, depth)
    if module == "numpy" and kind.__name__ == "ndarray" and value.dtype.hasobject:
        return {TAG: "ndarray", "shape": list(value.shape),
                "items": [encode(item, ref, nodes, depth + 1) for item in value.ravel(order="C").tolist()]}
    return {TAG: "ref", "hash": ref(value)}


def _groupby(value: Any, ref: Callable[[Any], str], nodes: list[int], depth: int) -> dict:
    """A groupby as what it groups (stored on its own), its keys (names and values, or the frame's column names)
    and its options: what `hashing` hashes of it, and what `decode` rebuilds it from."""
    parts = groupings(value)
    if value.axis != 0 or value.level is not None or any(g.level is not None for g in parts):
        raise Unencodable("a grouping by index level or along the columns")
    options = groupby_options(value)
    if not all(type(option) is bool for option in options.values()):
        raise Unencodable("a groupby with options that are not plain flags")
    frame = type(value).__name__ == "DataFrameGroupBy"
    columns = frame and all(g.in_axis and grouping_name(g) in value.obj.columns for g in parts)
    keys = []
    for grouping in parts:
        key = {"name": encode(grouping_name(grouping), ref, nodes, depth + 1)}
        if not columns:
            key["vector"] = encode(grouping_keys(grouping), ref, nodes, depth + 1)
        keys.append(key)
    return {TAG: "groupby", "frame": frame, "obj": {TAG: "ref", "hash": ref(value.obj)}, "by_columns": columns,
            "keys": keys, "key_list": isinstance(value.keys, list), "options": options,
            "selection": encode(value._selection, ref, nodes, depth + 1) if frame else None}


def _items(value: dict, ref: Callable[[Any], str], nodes: list[int], depth: int) -> list:
    return [[encode(key, ref, nodes, depth + 1), encode(item, ref, nodes, depth + 1)] for key, item in value.items()]


def _pandas_scalar(value: Any, kind: type) -> dict | None:
    name = kind.__name__
    if name == "NaTType":
        return {TAG: "NaT"}
    if name in ("Timestamp", "Timedelta"):
        tz = getattr(value, "tz", None)
        if tz is not None and type(tz) is not datetime.timezone:
            raise Unencodable(f"a Timestamp with a {qualified(type(tz))} timezone")
        # its integer in its own unit: a microsecond Timestamp far from 1970 has no nanosecond value
        data = {TAG: name, "value": int(value.asm8.view("i8")), "unit": getattr(value, "unit", "ns")}
        if tz is not None:
            data["utcoffset_s"] = tz.utcoffset(None).total_seconds()
        return data
    return None


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
    return [str(item.get("hash")) for item in tagged(encoded) if item.get(TAG) == "ref"]


# ---------------------------------------------------------------------------------------------------------------
# Reading back


def _unfloat(data: Any) -> float:
    if isinstance(data, dict):
        return struct.unpack("<d", bytes.fromhex(data["bits"]))[0]
    return float(data)


def _untext(data: Any) -> str | bytes:
    return data if isinstance(data, str) else base64.b64decode(data["b64"])


def decode(data: Any, resolve: Callable[[str], Any], depth: int = 0) -> Any:
    """The value `encode` wrote; `resolve(hash)` gives a value stored on its own. Raises Malformed on anything
    `encode` does not write."""
    if depth > MAX_DEPTH + 1:
        raise Malformed("nested too deep")
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        stamps = _timestamps(data)
        return stamps if stamps is not None else [decode(item, resolve, depth + 1) for item in data]
    if not isinstance(data, dict):
        raise Malformed(f"a {type(data).__name__} in a value document")
    if TAG not in data:
        return {key: decode(item, resolve, depth + 1) for key, item in data.items()}
    try:
        return _decode_tagged(data, resolve, depth)
    except (KeyError, TypeError, ValueError, struct.error, re.error) as error:
        if isinstance(error, Malformed):
            raise
        raise Malformed(f"a malformed {data.get(TAG)!r} value ({type(error).__name__}: {error})") from None


def _decode_tagged(data: dict, resolve: Callable[[str], Any], depth: int) -> Any:
    tag = data[TAG]

    def items() -> list:
        return [decode(item, resolve, depth + 1) for item in data["items"]]

    def pairs() -> list:
        return [(decode(k, resolve, depth + 1), decode(v, resolve, depth + 1)) for k, v in data["items"]]

    if tag == "ref":
        return resolve(str(data["hash"]))
    if tag in ("tuple", "set", "frozenset"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](items())
    if tag == "dict":
        return dict(pairs())
    if tag in ("OrderedDict", "Counter"):
        made = collections.OrderedDict() if tag == "OrderedDict" else collections.Counter()
        for key, value in pairs():
            made[key] = value
        return made
    if tag == "defaultdict":
        factory = data["factory"]
        if factory is not None and factory not in _FACTORIES:
            raise Malformed(f"a defaultdict factory {factory!r} that is not a builtin type")
        made = collections.defaultdict(None if factory is None else _FACTORIES[factory])
        made.update(pairs())
        return made
    if tag in ("bytes", "bytearray"):
        raw = base64.b64decode(data["b64"], validate=True)
        return raw if tag == "bytes" else bytearray(raw)
    if tag == "float":
        return _unfloat(data)
    if tag == "int":
        return int(data["hex"], 16)
    if tag == "complex":
        return complex(_unfloat(data["real"]), _unfloat(data["imag"]))
    if tag == "range":
        return range(int(data["start"]), int(data["stop"]), int(data["step"]))
    if tag in ("datetime", "time"):
        kind = datetime.datetime if tag == "datetime" else datetime.time
        return kind.fromisoformat(data["iso"]).replace(fold=int(data["fold"]))
    if tag == "date":
        return datetime.date.fromisoformat(data["iso"])
    if tag == "timedelta":
        return datetime.timedelta(days=data["days"], seconds=data["seconds"], microseconds=data["microseconds"])
    if tag == "re.Pattern":
        return re.compile(_untext(data["pattern"]), int(data["flags"]))
    if tag == "re.Match":
        return _match(data)
    if tag == "numpy":
        import numpy as np

        dtype = np.dtype(str(data["dtype"]))
        if dtype.hasobject:
            raise Malformed("a numpy object scalar")
        return np.frombuffer(bytes.fromhex(data["hex"]), dtype=dtype)[0]
    if tag == "ndarray":
        import numpy as np

        flat = items()
        made = np.empty(len(flat), dtype=object)
        for i, item in enumerate(flat):
            made[i] = item
        return made.reshape([int(n) for n in data["shape"]])
    if tag in ("Timestamp", "Timedelta", "NaT"):
        import pandas as pd

        if tag == "NaT":
            return pd.NaT
        import numpy as np

        unit = str(data["unit"])
        if unit not in ("s", "ms", "us", "ns"):
            raise Malformed(f"a {tag} in the unit {unit[:8]!r}")
        if tag == "Timedelta":
            return pd.Timedelta(np.timedelta64(int(data["value"]), unit))
        made = pd.Timestamp(np.datetime64(int(data["value"]), unit))
        if "utcoffset_s" in data:
            made = made.tz_localize("UTC").tz_convert(datetime.timezone(datetime.timedelta(
                seconds=float(data["utcoffset_s"]))))
        return made
    if tag == "groupby":
        return _regroup(data, resolve, depth)
    raise Malformed(f"an unknown tag {tag!r}")


def _regroup(data: dict, resolve: Callable[[str], Any], depth: int) -> Any:
    import pandas as pd

    obj = decode(data["obj"], resolve, depth + 1)
    names = [decode(key["name"], resolve, depth + 1) for key in data["keys"]]
    if data["by_columns"]:
        by: Any = names
    else:
        vectors = [decode(key["vector"], resolve, depth + 1) for key in data["keys"]]
        by = [pd.Series(vector.array if isinstance(vector, pd.Series) else vector, index=obj.index, name=name)
              for vector, name in zip(vectors, names)]
    if not data["key_list"]:
        by = by[0]
    options = {name: bool(data["options"][name]) for name in ("as_index", "sort", "group_keys", "observed",
                                                              "dropna")}
    made = obj.groupby(by, **options)
    selection = decode(data["selection"], resolve, depth + 1) if data.get("frame") else None
    return made if selection is None else made[selection]


# Lists of this many naive Timestamps of one unit are read back as one vector (one by one costs ~20 µs apiece).
_TIMESTAMP_VECTOR = 64


def _timestamps(data: list) -> list | None:
    """A list of naive Timestamps of one unit, read back at once; None where the list is not one."""
    if len(data) < _TIMESTAMP_VECTOR or not all(type(item) is dict and item.get(TAG) == "Timestamp"
                                                 and "utcoffset_s" not in item for item in data):
        return None
    units = {item.get("unit") for item in data}
    if len(units) != 1 or next(iter(units)) not in ("s", "ms", "us", "ns"):
        return None
    import numpy as np
    import pandas as pd

    try:
        ticks = np.array([int(item["value"]) for item in data], dtype="int64")
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise Malformed(f"a malformed Timestamp ({type(error).__name__}: {error})") from None
    return list(pd.DatetimeIndex(ticks.view(f"M8[{next(iter(units))}]")))


def _match(data: dict) -> re.Match:
    """The match `encode` saw, found again: the pattern run over the same string and span as the original."""
    pattern = re.compile(_untext(data["pattern"]), int(data["flags"]))
    string, pos, endpos = _untext(data["string"]), int(data["pos"]), int(data["endpos"])
    regs = tuple(tuple(int(n) for n in span) for span in data["regs"])
    candidates = [pattern.match(string, pos, endpos), pattern.fullmatch(string, pos, endpos)]
    for found in candidates + list(pattern.finditer(string, pos, endpos)):
        if found is not None and found.regs == regs:
            return found
    raise Malformed("the match cannot be found again in its string")


# ---------------------------------------------------------------------------------------------------------------
# The JSON format: a value document of a tagged value or a definition

# The modules whose values (and the values their containers hold) tagged JSON writes.
_MODULES = ("builtins", "datetime", "collections", "re", "numpy", "pandas._libs", "pandas.core.groupby")


def no_ref(value: Any) -> str:
    """A `ref` for an encoding that stores nothing on its own (a Parquet column's cells, a series' name)."""
    raise Unencodable(f"a name of type {qualname(value)}")


def holds(value: Any) -> bool:
    module = type(value).__module__ or ""
    return definitions.holds(value) or module in _MODULES or module.startswith(_MODULES)


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
    if any(item.get(TAG) not in BUILTIN_TAGS for item in tagged(encoded)):
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
        if tag not in TAGS and tag not in definitions.TAGS:
            raise ValueFormatError(f"a JSON value with an unknown tag {str(tag)[:40]!r}")
        if tag == "ref" and not _HASH.match(str(item.get("hash"))):
            raise ValueFormatError("a JSON value that refers to something other than a content hash")


FORMAT = Format("json", holds, write, read, check, refs=refs_of, cap=lambda caps: caps.json_bytes, plain=plain)
