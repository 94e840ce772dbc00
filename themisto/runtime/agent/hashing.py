"""Exact content hashes of user values (builtins, frames, arrays, code) and the state hash over them.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
import types
from typing import Any, Callable, Mapping

from themisto.runtime.agent.addresses import hex_text, is_address
from themisto.runtime.agent.leaves import fast_pickle, hash_timestamps, holds_set_or_object, pickle_leaves
from themisto.runtime.agent.namespace import HASH_CHARS, UNHASHABLE, qualname, safe_repr

# Which way of hashing a release's `state_hash` and variable hashes were made with; a release records it (its
# `rebuild` records' `state_hashes`) and a scorer of another scheme refuses to check states against it. A new name
# whenever the hashes change: before any was recorded (releases of 2026-12-07), memory addresses were marked;
# "2026-12-08" sorts the sets inside objects and takes addresses from wider ranges.
HASH_SCHEME = "2026-12-08"

# Builtin containers up to this many nodes are hashed canonically; larger ones by their memo-free pickle.
_CANON_NODES = 100_000


# ----- content hashes ----------------------------------------------------------------------------------------------


class _NotCanonical(Exception):
    """The value is not a builtin structure the canonical encoder knows, or it is too large for it."""


def _canonical(h: Any, value: Any, budget: list[int], path: set[int]) -> None:
    """Feed a type-tagged encoding of a builtin structure into `h`: equal values, equal bytes, in any process."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotCanonical("too large")
    kind = type(value)
    if value is None or value is Ellipsis:
        h.update(b"N" if value is None else b"E")
    elif kind is bool:
        h.update(b"T" if value else b"F")
    elif kind is int:  # hex: no digit limit, unlike str() of a huge int; an address is run-specific (`addresses`)
        h.update(b"i@;" if is_address(value) else b"i" + hex(value).encode() + b";")
    elif kind is float:
        h.update(b"f" + struct.pack("<d", value))
    elif kind is complex:
        h.update(b"c" + struct.pack("<dd", value.real, value.imag))
    elif kind is str:
        data = hex_text(value.encode("utf-8", "surrogatepass"))
        h.update(b"s%d:" % len(data) + data)
    elif kind in (bytes, bytearray):
        h.update(b"b%d:" % len(value) + bytes(value))
    elif kind in (list, tuple, dict, set, frozenset):
        if id(value) in path:
            raise _NotCanonical("cycle")
        path.add(id(value))
        h.update(b"%s%d[" % (kind.__name__[:2].encode(), len(value)))
        if kind is dict:
            for key, item in value.items():
                _canonical(h, key, budget, path)
                _canonical(h, item, budget, path)
        elif kind in (set, frozenset):  # set order depends on the hash seed: sort the members' digests
            digests = []
            for item in value:
                sub = hashlib.sha256()
                _canonical(sub, item, budget, path)
                digests.append(sub.digest())
            for digest in sorted(digests):
                h.update(digest)
        else:
            for item in value:
                _canonical(h, item, budget, path)
        path.discard(id(value))
        h.update(b"]")
    elif kind is range:
        h.update(b"r" + repr(value).encode())
    else:
        digest = content_hash(value)
        if digest.startswith(UNHASHABLE):
            raise _NotCanonical(digest)
        h.update(b"h" + digest.encode())


_CANONICAL_TYPES = frozenset({type(None), type(Ellipsis), bool, int, float, complex, str, bytes, bytearray, list, tuple,
                              dict, set, frozenset, range})
def _hash_builtin(h: Any, value: Any, kinds: set | None = None) -> None:
    """Without sets or unknown objects inside, the memo-free pickle of a builtin structure is canonical (and C-fast);
    otherwise the type-tagged encoder sorts set members, falling back to the pickle past its budget. `kinds`: the
    types of a list's or tuple's items where the caller has them already."""
    if type(value) in (list, tuple):
        kinds = set(map(type, value)) if kinds is None else kinds
        if hash_timestamps(h, value, kinds):
            return
        if kinds <= pickle_leaves():
            h.update(b"p" + fast_pickle(value))
            return
    try:
        canonical_needed = holds_set_or_object(value)
    except RecursionError:
        canonical_needed = True
    if canonical_needed:
        try:
            _canonical(h, value, [_CANON_NODES], set())
            return
        except _NotCanonical:
            pass
    h.update(b"p" + fast_pickle(value))


def feed_code(h: Any, code: types.CodeType) -> None:
    """Feed what a code object does into `h`: file names and line numbers differ between processes for one cell."""
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_argcount)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            feed_code(h, const)
        else:
            h.update(repr(const).encode())


def code_digest(code: types.CodeType) -> str:
    """The hash of what a code object does (see `feed_code`): a function compiled again from its source has it."""
    h = hashlib.sha256()
    feed_code(h, code)
    return h.hexdigest()


def _hash_frame(value: Any, h: Any) -> bool:
    """Exact content of a DataFrame, Series or Index: labels, dtypes, index and every column's values. True when
    all of it is plain (numbers, strings, naive values): then the repr and the size follow from the hash."""
    import pandas as pd

    h.update(qualname(value).encode())
    if isinstance(value, pd.Index):
        return _hash_index(value, h)
    if isinstance(value, pd.DataFrame):
        # the columns' names show in the repr, so they are content too (each column's dtype goes with its values)
        h.update(repr(([repr(c) for c in value.columns], list(value.columns.names))).encode())
    else:
        h.update(repr((value.name, _dtype_text(value.dtype))).encode())
    plain = _hash_index(value.index, h)
    if isinstance(value, pd.Series):
        return _hash_values(value._values, h) and plain
    column = getattr(value, "_get_column_array", None)
    for i in range(value.shape[1]):
        plain = _hash_values(column(i) if column is not None else value.iloc[:, i]._values, h) and plain
    return plain


def _dtype_text(dtype: Any) -> str:
    """A dtype's exact text: numpy's `str` ('<i8', '<M8[ns]') where it says everything, else the repr (which numpy
    builds slowly, in Python)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(dtype, np.dtype) and dtype.fields is None and dtype.subdtype is None:
        return dtype.str
    return repr(dtype)


def _hash_index(index: Any, h: Any) -> bool:
    import pandas as pd

    h.update(repr((type(index).__name__, list(index.names), _dtype_text(index.dtype), len(index),
                   repr(getattr(index, "freq", None)))).encode())
    if isinstance(index, pd.RangeIndex):
        h.update(b"range" + repr((index.start, index.stop, index.step)).encode())  # never materialised
        return True
    if isinstance(index, pd.MultiIndex):
        plain = True
        for level, codes in zip(index.levels, index.codes):
            plain = _hash_index(level, h) and plain
            plain = _hash_values(codes, h) and plain
        return plain
    return _hash_values(index._values, h)


def _feed_raw(h: Any, values: Any) -> None:
    raw = getattr(h, "raw", None)  # a Footprint (themisto.runtime.agent.delta); a plain sha256 takes the bytes
    if raw is not None:
        raw(values)
    else:
        h.update(raw_bytes(values))


def raw_bytes(values: Any) -> memoryview:
    """The array's bytes without a copy where it is contiguous; as uint8, since datetimes refuse the buffer protocol."""
    import numpy as np

    return memoryview(np.ascontiguousarray(values).reshape(-1).view(np.uint8))


def _hash_values(values: Any, h: Any) -> bool:
    """Exact bytes for one column's (or index's) values: raw buffers, pickled Python objects, or pandas' hashes
    only for extension arrays it alone knows. True when the values are plain (see _hash_frame)."""
    import numpy as np

    if isinstance(values, np.ndarray):
        h.update(repr((values.dtype.str, values.shape)).encode())
        if values.dtype.hasobject:
            items = values.tolist()
            kinds = set(map(type, items))
            _hash_builtin(h, items, kinds)  # tells None from NaN and 1 from "1", unlike pandas' hashes
            return values.ndim == 1 and kinds <= pickle_leaves()
        _feed_raw(h, values)
        return True
    h.update(qualname(values).encode() + _dtype_text(values.dtype).encode())
    parts = None
    if hasattr(values, "codes") and hasattr(values, "categories"):  # Categorical: codes and categories
        parts = (np.asarray(values.codes), values.categories)
    elif isinstance(getattr(values, "_data", None), np.ndarray) and isinstance(getattr(values, "_mask", None),
                                                                                np.ndarray):
        parts = (values._data, values._mask)  # nullable integers, floats, booleans
    elif isinstance(getattr(values, "_ndarray", None), np.ndarray):
        parts = (values._ndarray,)  # datetimes with a timezone, periods, numpy-backed strings
    if parts is not None:
        plain = True
        for part in parts:
            plain = (_hash_values(part, h) if isinstance(part, np.ndarray) else _hash_index(part, h)) and plain
        return plain
    import pandas as pd

    try:
        h.update(memoryview(pd.util.hash_pandas_object(pd.Series(values, copy=False), index=False).to_numpy()))
    except TypeError:
        _hash_builtin(h, list(values))
    return False  # pandas' 64-bit hashes, or objects: the record is described anew each time


def _hash_array(value: Any, h: Any) -> bool:
    h.update(repr((value.dtype.str, value.shape)).encode())
    if value.dtype.hasobject:
        items = value.tolist()
        _canonical(h, items, [_CANON_NODES], set())
        return value.ndim == 1 and set(map(type, items)) <= pickle_leaves()
    _feed_raw(h, value)
    return True


def _hash_match(value: Any, h: Any) -> None:
    # A match's repr shows only its span and matched text; its content is the pattern, the subject and every group.
    pattern = value.re
    h.update(b"re.Match")
    _canonical(h, (pattern.pattern, pattern.flags, value.string, value.pos, value.endpos, value.regs),
               [_CANON_NODES], set())


GROUPBY_TYPES = frozenset({"SeriesGroupBy", "DataFrameGroupBy"})


def groupby_options(value: Any) -> dict:
    """The options a pandas groupby was made with (those `groupby()` takes back)."""
    return {"as_index": value.as_index, "sort": value.sort, "group_keys": value.group_keys,
            "observed": value.observed, "dropna": value.dropna}


def groupings(value: Any) -> list:
    """A groupby's groupings (pandas 2.2 renamed its `grouper` `_grouper` and warns on the old name)."""
    own = vars(value)
    return (own["_grouper"] if "_grouper" in own else own["grouper"]).groupings


def grouping_name(grouping: Any) -> Any:
    """A grouping's name, read without leaving it in the grouping's cache (`name` is cached on first read): a
    snapshot must not change what it describes, nor the size it measures next time."""
    own = vars(grouping)
    had_cache = "_cache" in own
    cached = had_cache and "name" in own["_cache"]
    name = grouping.name
    if not cached:
        own["_cache"].pop("name", None)
        if not had_cache and not own["_cache"]:
            del own["_cache"]
    return name


def grouping_keys(grouping: Any) -> Any:
    """One grouping's key values: an array, or a Series where they are more (a Categorical keeps its categories)."""
    import numpy as np

    vector = grouping.grouping_vector
    if isinstance(vector, np.ndarray):
        return vector
    import pandas as pd

    return pd.Series(vector.array if isinstance(vector, pd.Index) else vector, copy=False)


def _hash_groupby(value: Any, h: Any) -> None:
    """A groupby's content, not its pickle: what is grouped, by which keys (names and values), with which options.
    Its caches (which `.mean()` or `len()` fill) and the frame its keys were taken from do not count: they change
    no result. `themisto.runtime.agent.formats.library_tags` stores and rebuilds a groupby from these same parts."""
    h.update(qualname(value).encode())
    h.update(content_hash(value.obj).encode())
    frame = type(value).__name__ == "DataFrameGroupBy"
    for grouping in groupings(value):
        h.update(repr((grouping_name(grouping), grouping.level, bool(grouping.in_axis) if frame else None)).encode())
        h.update(content_hash(grouping_keys(grouping)).encode())
    h.update(repr((value.axis, value.level, sorted(groupby_options(value).items()),
                   value._selection if frame else None, sorted(map(repr, value.exclusions)) if frame else None,
                   isinstance(value.keys, list))).encode())


_FRAME_TYPES = frozenset({"DataFrame", "Series", "Index", "RangeIndex", "MultiIndex", "DatetimeIndex",
                          "CategoricalIndex"})


# During one pass over a namespace (`hash_each`): id -> (value, digest) of the frames and arrays hashed so far, so a
# frame bound to two names, or held in a dict as well, is hashed once. The value is held, so its id stays its own.
_MEMO: dict[int, tuple[Any, str]] | None = None


def hash_each(values: Mapping[str, Any], known: Callable[[str, Any], str | None]) -> dict[str, str]:
    """Each value's content hash in one pass, where a frame or array held under two names, or in a dict too, is
    hashed once. `known(name, value)` gives a digest found another way (the snapshot cache, a footprint, the page
    check) or None; those are asked first, so a dict holding such a frame does not hash it again."""
    global _MEMO
    _MEMO = {}
    try:
        hashes = {name: known(name, value) for name, value in values.items()}
        for name, value in values.items():
            if hashes[name] is not None and is_frame_or_array(value):
                _MEMO[id(value)] = (value, hashes[name])
        for name, value in values.items():
            if hashes[name] is None:
                hashes[name] = content_hash(value)
        return hashes
    finally:
        _MEMO = None


def is_frame_or_array(value: Any) -> bool:
    """A pandas frame, series or index, or a numpy array: the values hashed by their buffers."""
    module = type(value).__module__ or ""
    return ((module.startswith("pandas") and type(value).__name__ in _FRAME_TYPES)
            or (module == "numpy" and type(value).__name__ == "ndarray"))


def content_hash(value: Any) -> str:
    """A hash of the value's content that is stable across processes, or "unhashable:<reason>"."""
    memo = _MEMO
    if memo is None or not is_frame_or_array(value):
        return content_digest(value)[0]
    kept = memo.get(id(value))
    if kept is None:
        kept = memo[id(value)] = (value, content_digest(value)[0])
    return kept[1]


def content_digest(value: Any, sink: Any = None) -> tuple[str, bool]:
    """The content hash (outside any `hash_each` pass), and whether the value is a frame or array of plain values
    (whose record the hash fixes). `sink`: a Footprint (themisto.runtime.agent.delta) to feed instead of a sha256."""
    h = hashlib.sha256() if sink is None else sink
    module = type(value).__module__ or ""
    plain = False
    try:
        if module.startswith("pandas") and type(value).__name__ in _FRAME_TYPES:
            plain = _hash_frame(value, h)
        elif module == "numpy" and type(value).__name__ == "ndarray":
            plain = _hash_array(value, h)
        elif module == "numpy" and hasattr(value, "dtype") and hasattr(value, "tobytes") and not value.dtype.hasobject:
            h.update(value.dtype.str.encode() + value.tobytes())  # numpy scalar
        elif isinstance(value, types.FunctionType):
            h.update(f"function {value.__module__}.{value.__qualname__}".encode())
            feed_code(h, value.__code__)
            h.update(repr(value.__defaults__).encode())
        elif isinstance(value, type):
            h.update(f"class {value.__module__}.{value.__qualname__}".encode())
            for key, member in sorted(vars(value).items()):
                if key == "__slotnames__":  # copyreg's cache, set on the class the first time an instance pickles
                    continue
                h.update(key.encode())
                if isinstance(member, types.FunctionType):
                    feed_code(h, member.__code__)
        elif type(value) in _CANONICAL_TYPES:
            _hash_builtin(h, value)
        elif type(value) is re.Match:
            _hash_match(value, h)
        elif module.startswith("pandas.core.groupby") and type(value).__name__ in GROUPBY_TYPES:
            _hash_groupby(value, h)
        else:
            h.update(qualname(value).encode())
            h.update(fast_pickle(value))
    except RecursionError:
        return f"{UNHASHABLE}:RecursionError", False
    except Exception as error:  # noqa: BLE001 - any failure of user code in pickle/repr is recorded, not raised
        text = safe_repr(value)[0]
        # A repr stands for the content only where it is complete: never for arrays and frames (display-truncated).
        if " at 0x" in text or text.startswith("<repr failed") or module.startswith(("pandas", "numpy")):
            return f"{UNHASHABLE}:{type(error).__name__}", False
        h = hashlib.sha256(b"repr:" + qualname(value).encode() + text.encode("utf-8", "replace"))
        return "repr:" + h.hexdigest()[:HASH_CHARS], False
    return h.hexdigest()[:HASH_CHARS], plain


def state_hash(hashes: dict[str, str]) -> str:
    """The hash of a whole namespace: over its sorted (name, content hash) pairs."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(f"{name}\0{hashes[name]}\n".encode())
    return h.hexdigest()[:HASH_CHARS]
