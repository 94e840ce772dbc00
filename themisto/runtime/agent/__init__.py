"""Code that runs inside the kernel: runtime snapshots of the user namespace and branch execution of candidate cells.

The host reaches it through silent user expressions (`themisto.runtime.snapshot`, `themisto.runtime.branch`), so reading it never
touches In/Out or the execution count. Module level imports only the standard library; importing it changes no
user variable. Branches run each candidate in a forked grandchild of the kernel that shares the kernel's memory
copy-on-write, captures its own output, and reports on a pipe; the kernel itself only waits, kills and reaps.
"""

from __future__ import annotations

import array
import builtins
import ctypes
import datetime
import gc
import hashlib
import io
import itertools
import json
import operator
import os
import pickle
import random
import re
import reprlib
import select
import shutil
import signal
import stat
import struct
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any

REPR_CHARS = 500
HASH_CHARS = 32  # hex digits of sha256 kept: 128 bits
UNHASHABLE = "unhashable"
# Names IPython puts in the namespace even when user_ns_hidden no longer lists them.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
# Builtin containers up to this many nodes are hashed canonically; larger ones by their memo-free pickle.
_CANON_NODES = 100_000
# Deep sizes walk at most this many objects, then extrapolate from what they saw.
_SIZE_NODES = 20_000
# Flat containers of leaves up to this length are sized exactly at C speed (the walk above is Python-level).
_FLAT_SIZE_MAX = 1_000_000
# DataFrames longer than this get their object columns' deep size estimated from a sample.
_EXACT_DEEP_ROWS = 200_000
# Above this estimated size an object kept by identity in a branch is trusted, not rehashed (delta="identity").
_REHASH_BYTES = 1 << 20
_GRACE_S = 2.0  # after the candidate's own timer: time to hash the delta and report before SIGKILL
_MONITOR_REAP_S = 2.0
_MSG_HEADER = struct.Struct(">cQ")
_MAX_MESSAGE = 512 * 2**20
_PR_SET_CHILD_SUBREAPER = 36
# One marker for a cut cell, whether it ran in the kernel (themisto.runtime.kernel) or in a branch child.
OUTPUT_CAP_MARKER = "\n[themisto: output truncated: the cell wrote {total:,} bytes, over its {cap:,}-byte limit]\n"


def _shell(shell: Any = None) -> Any:
    if shell is not None:
        return shell
    from IPython import get_ipython

    found = get_ipython()
    if found is None:
        raise RuntimeError("themisto.runtime.agent runs inside an IPython kernel; no shell is active")
    return found


def _qualname(value: Any) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", None) or "builtins"
    return f"{module}.{kind.__qualname__}"


def user_variables(shell: Any = None) -> dict[str, Any]:
    """The user's variables: not modules, not IPython's own names, not names that start with `_`."""
    shell = _shell(shell)
    hidden = getattr(shell, "user_ns_hidden", {})
    found = {}
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or name in IPYTHON_NAMES or isinstance(value, types.ModuleType):
            continue
        if name in hidden and hidden[name] is value:
            continue
        found[name] = value
    return found


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
    elif kind is int:
        h.update(b"i" + hex(value).encode() + b";")  # hex: no digit limit, unlike str() of a huge int
    elif kind is float:
        h.update(b"f" + struct.pack("<d", value))
    elif kind is complex:
        h.update(b"c" + struct.pack("<dd", value.real, value.imag))
    elif kind is str:
        data = value.encode("utf-8", "surrogatepass")
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
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
# Leaves whose memo-free pickle is canonical (equal content, equal bytes) and the same in every kernel of one stack.
_BUILTIN_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, datetime.date, datetime.datetime,
                             datetime.time, datetime.timedelta})
# Lists of this many Timestamps or more are hashed as one int64 vector (pickling each one costs ~2 µs).
_TIMESTAMP_VECTOR = 64


def _pickle_leaves() -> frozenset:
    """_BUILTIN_LEAVES plus pandas' Timestamp and Timedelta once pandas is loaded (it is never imported for this)."""
    pd = sys.modules.get("pandas")
    timestamp, timedelta = getattr(pd, "Timestamp", None), getattr(pd, "Timedelta", None)
    if timestamp is None or timedelta is None:
        return _BUILTIN_LEAVES
    key = (timestamp, timedelta)
    found = _LEAVES_MEMO.get(key)
    if found is None:
        found = _LEAVES_MEMO[key] = _BUILTIN_LEAVES | {timestamp, timedelta}
    return found


_LEAVES_MEMO: dict[tuple, frozenset] = {}
_TZ_ATTRIBUTE = operator.attrgetter("tzinfo")


def _member_groups(value: Any) -> tuple:
    return (value.keys(), value.values()) if type(value) is dict else (value,)


def _holds_set_or_object(value: Any) -> bool:
    """True when a builtin structure holds a set or an object whose pickle is not known to be canonical.

    Visits containers only; the leaves of each container are checked at C speed through the set of their types.
    """
    leaves = _pickle_leaves()
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue  # shared or cyclic: one visit is enough
        seen.add(id(item))
        kind = type(item)
        if kind is set or kind is frozenset:
            return True
        if kind not in _CONTAINERS:
            continue
        for members in _member_groups(item):
            kinds = set(map(type, members))
            if kinds <= leaves:
                continue
            if not kinds <= leaves | _CONTAINERS:
                return True
            stack.extend(member for member in members if type(member) in _CONTAINERS)
    return False


def _hash_timestamps(h: Any, value: Any, kinds: set) -> bool:
    """Hash a list or tuple of leaves holding many naive Timestamps without pickling each (~2 µs apiece): which
    items are Timestamps, their units and nanoseconds as vectors, and the memo-free pickle of the other items.
    False where it does not apply (few Timestamps, a timezone, other members, an older pandas)."""
    pd = sys.modules.get("pandas")
    timestamp = getattr(pd, "Timestamp", None)
    if len(value) < _TIMESTAMP_VECTOR or timestamp not in kinds or not kinds <= _pickle_leaves():
        return False
    flags = bytes(map(operator.is_, map(type, value), itertools.repeat(timestamp)))
    stamps = list(itertools.compress(value, flags)) if len(kinds) > 1 else value
    if len(stamps) < _TIMESTAMP_VECTOR:
        return False
    try:
        if set(map(_TZ_ATTRIBUTE, stamps)) != {None}:
            return False
        units = list(map(operator.attrgetter("unit"), stamps))
        nanoseconds = array.array("q", map(operator.attrgetter("value"), stamps))
    except (AttributeError, OverflowError):  # no `unit` before pandas 2; a date past int64 nanoseconds
        return False
    if sys.byteorder != "little":
        nanoseconds.byteswap()
    others = list(itertools.compress(value, map(operator.not_, flags))) if len(kinds) > 1 else []
    h.update(b"@ts%s%d[" % (type(value).__name__[:2].encode(), len(value)))
    h.update(flags)  # an item is a Timestamp (1) or not (0): this fixes how the parts below interleave
    h.update(_fast_pickle(units))
    h.update(nanoseconds.tobytes())
    h.update(_fast_pickle(others))
    return True


def _hash_builtin(h: Any, value: Any, kinds: set | None = None) -> None:
    """Without sets or unknown objects inside, the memo-free pickle of a builtin structure is canonical (and C-fast);
    otherwise the type-tagged encoder sorts set members, falling back to the pickle past its budget. `kinds`: the
    types of a list's or tuple's items where the caller has them already."""
    if type(value) in (list, tuple):
        kinds = set(map(type, value)) if kinds is None else kinds
        if _hash_timestamps(h, value, kinds):
            return
        if kinds <= _pickle_leaves():
            h.update(b"p" + _fast_pickle(value))
            return
    try:
        canonical_needed = _holds_set_or_object(value)
    except RecursionError:
        canonical_needed = True
    if canonical_needed:
        try:
            _canonical(h, value, [_CANON_NODES], set())
            return
        except _NotCanonical:
            pass
    h.update(b"p" + _fast_pickle(value))


def _fast_pickle(value: Any) -> bytes:
    """Pickle without the memo, so equal content gives equal bytes whatever the objects' identities."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    pickler.fast = True  # deprecated but exactly what is wanted: no memo, no identity in the bytes
    pickler.dump(value)
    return buffer.getvalue()


def _code_digest(h: Any, code: types.CodeType) -> None:
    # Only what the code does: file names and line numbers differ between processes for the same cell.
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_argcount)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(h, const)
        else:
            h.update(repr(const).encode())


def _hash_frame(value: Any, h: Any) -> bool:
    """Exact content of a DataFrame, Series or Index: labels, dtypes, index and every column's values. True when
    all of it is plain (numbers, strings, naive values): then the repr and the size follow from the hash."""
    import pandas as pd

    h.update(_qualname(value).encode())
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


def _raw_bytes(values: Any) -> memoryview:
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
            return values.ndim == 1 and kinds <= _pickle_leaves()
        h.update(_raw_bytes(values))
        return True
    h.update(_qualname(values).encode() + _dtype_text(values.dtype).encode())
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
        return value.ndim == 1 and set(map(type, items)) <= _pickle_leaves()
    h.update(_raw_bytes(value))
    return True


def _hash_match(value: Any, h: Any) -> None:
    # A match's repr shows only its span and matched text; its content is the pattern, the subject and every group.
    pattern = value.re
    h.update(b"re.Match")
    _canonical(h, (pattern.pattern, pattern.flags, value.string, value.pos, value.endpos, value.regs),
               [_CANON_NODES], set())


_FRAME_TYPES = frozenset({"DataFrame", "Series", "Index", "RangeIndex", "MultiIndex", "DatetimeIndex",
                          "CategoricalIndex"})


def content_hash(value: Any) -> str:
    """A hash of the value's content that is stable across processes, or "unhashable:<reason>"."""
    return _content_hash(value)[0]


def _content_hash(value: Any) -> tuple[str, bool]:
    """The content hash, and whether the value is a frame or array of plain values (whose record the hash fixes)."""
    h = hashlib.sha256()
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
            _code_digest(h, value.__code__)
            h.update(repr(value.__defaults__).encode())
        elif isinstance(value, type):
            h.update(f"class {value.__module__}.{value.__qualname__}".encode())
            for key, member in sorted(vars(value).items()):
                h.update(key.encode())
                if isinstance(member, types.FunctionType):
                    _code_digest(h, member.__code__)
        elif type(value) in _CANONICAL_TYPES:
            _hash_builtin(h, value)
        elif type(value) is re.Match:
            _hash_match(value, h)
        else:
            h.update(_qualname(value).encode())
            h.update(_fast_pickle(value))
    except RecursionError:
        return f"{UNHASHABLE}:RecursionError", False
    except Exception as error:  # noqa: BLE001 - any failure of user code in pickle/repr is recorded, not raised
        text = _safe_repr(value)[0]
        # A repr stands for the content only where it is complete: never for arrays and frames (display-truncated).
        if " at 0x" in text or text.startswith("<repr failed") or module.startswith(("pandas", "numpy")):
            return f"{UNHASHABLE}:{type(error).__name__}", False
        h = hashlib.sha256(b"repr:" + _qualname(value).encode() + text.encode("utf-8", "replace"))
        return "repr:" + h.hexdigest()[:HASH_CHARS], False
    return h.hexdigest()[:HASH_CHARS], plain


def state_hash(hashes: dict[str, str]) -> str:
    """The hash of a whole namespace: over its sorted (name, content hash) pairs."""
    h = hashlib.sha256()
    for name in sorted(hashes):
        h.update(f"{name}\0{hashes[name]}\n".encode())
    return h.hexdigest()[:HASH_CHARS]


# ----- sizes, reprs, shapes -------------------------------------------------------------------------------------


def _flat_size(value: Any) -> int | None:
    """The deep size of a list, tuple or dict whose members are all leaves, at C speed (None where it does not
    apply): the container plus each distinct member once, as the walk below counts them."""
    kind = type(value)
    if kind is dict:
        members: Any = list(value) + list(value.values())
    elif kind is list or kind is tuple:
        members = value
    else:
        return None
    if len(members) > _FLAT_SIZE_MAX or not set(map(type, members)) <= _pickle_leaves():
        return None
    distinct = dict(zip(map(id, members), members))
    return sys.getsizeof(value) + sum(map(sys.getsizeof, distinct.values()))


def _deep_getsizeof(value: Any) -> int:
    """sys.getsizeof over builtin containers and instance dicts, walking at most _SIZE_NODES objects."""
    flat = _flat_size(value)
    if flat is not None:
        return flat
    seen: set[int] = set()
    stack = [value]
    total = 0
    walked = 0
    while stack and walked < _SIZE_NODES:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        walked += 1
        if (type(item).__module__ or "").startswith("pandas") and hasattr(item, "memory_usage"):
            # already deep (and bounded for long frames); walking its attributes would count its data twice
            total += _frame_size(item)
            continue
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, (type, types.FunctionType, types.ModuleType)):
            stack.append(vars(item))
    if stack and walked:  # stopped early: extrapolate the average size of what was walked
        total += int(total / walked * len(stack))
    return total


def _frame_size(value: Any) -> int:
    import pandas as pd

    if len(value) <= _EXACT_DEEP_ROWS:
        usage = value.memory_usage(deep=True)
        return int(usage.sum() if isinstance(usage, pd.Series) else usage)
    usage = value.memory_usage(deep=False)
    total = int(usage.sum() if isinstance(usage, pd.Series) else usage)
    columns = [value] if isinstance(value, pd.Series) else [value.iloc[:, i] for i in range(value.shape[1])]
    for column in columns:  # shallow counts only the pointers of object columns; add their objects from a sample
        if column.dtype == object:
            # a fixed pseudo-random sample: a stride could fall in step with a repeating pattern
            sample = column.iloc[sorted(random.Random(0).sample(range(len(column)), 2000))]
            total += int(sum(sys.getsizeof(v) for v in sample) / max(1, len(sample)) * len(column))
    return total


def size_of(value: Any) -> int:
    """Bytes held by the value, deep-ish with bounded effort: pandas memory_usage, numpy nbytes, sys.getsizeof."""
    module = type(value).__module__ or ""
    if module.startswith("pandas") and hasattr(value, "memory_usage"):
        return _frame_size(value)
    if module == "numpy" and hasattr(value, "nbytes"):
        return int(value.nbytes)
    return _deep_getsizeof(value)


_REPR = reprlib.Repr()
_REPR.maxstring = REPR_CHARS
_REPR.maxother = REPR_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 50
_REPR.maxdict = 30
_REPR.maxlevel = 4


def _safe_repr(value: Any) -> tuple[str, str | None]:
    """A repr of at most REPR_CHARS characters, and the error if __repr__ failed."""
    try:
        module = type(value).__module__ or ""
        if type(value) in (list, tuple, dict, set, frozenset, str, bytes):
            text = _REPR.repr(value)  # bounded effort on huge builtin containers
        elif module.startswith("pandas"):
            import pandas as pd

            # Fewer rows and narrower cells than the notebook shows: the repr is cut at REPR_CHARS anyway.
            with pd.option_context("display.max_rows", 6, "display.min_rows", 6, "display.max_columns", 8,
                                   "display.max_colwidth", 30):
                text = builtins.repr(value)
        else:
            text = builtins.repr(value)
    except Exception as error:  # noqa: BLE001 - a broken __repr__ is data, not a failure of the snapshot
        reason = f"{type(error).__name__}: {error}"[:200]
        return f"<repr failed: {reason}>", reason
    if len(text) > REPR_CHARS:
        text = text[: REPR_CHARS - 3] + "..."
    return text, None


_LAZY_PANDAS_MODULES = ("pandas.core.groupby", "pandas.core.window", "pandas.core.resample")


def describe(name: str, value: Any) -> tuple[dict, str | None]:
    """One variable's record (name, type, size, repr, hash, shape/dtype/len/columns) and the failure if any."""
    return _describe(name, value, None)


def _describe(name: str, value: Any, digest: str | None) -> tuple[dict, str | None]:
    record: dict[str, Any] = {"name": name, "type": _qualname(value)}
    failure = None
    try:
        record["size"] = size_of(value)
    except Exception as error:  # noqa: BLE001
        record["size"] = sys.getsizeof(value)
        failure = f"size: {type(error).__name__}: {error}"[:300]
    record["repr"], repr_error = _safe_repr(value)
    if repr_error is not None:
        record["repr_error"] = repr_error
    record["hash"] = content_hash(value) if digest is None else digest
    if isinstance(value, (type, types.FunctionType)):
        return record, failure  # a class's `shape` attribute is not the variable's shape
    try:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
            record["shape"] = list(shape)
        # A groupby's (or rolling window's) `dtype` runs the grouping and answers with a Series, not a dtype; its
        # results are cached in the object, so the next snapshot's hash would see a change the user never made.
        lazy = (type(value).__module__ or "").startswith(_LAZY_PANDAS_MODULES)
        dtype = None if lazy else getattr(value, "dtype", None)
        if dtype is not None and not callable(dtype) and "dtype" in type(dtype).__name__.lower():
            record["dtype"] = str(dtype)
        if hasattr(type(value), "__len__") and not lazy:  # a groupby's len computes and caches its groups
            record["len"] = len(value)
        columns = getattr(value, "columns", None)
        if columns is not None and type(value).__name__ == "DataFrame":
            record["columns"] = [str(c) for c in list(columns)[:200]]
    except Exception as error:  # noqa: BLE001 - attributes of user objects may raise anything
        failure = f"attributes: {type(error).__name__}: {error}"[:300]
    return record, failure


def memory_usage() -> dict[str, int]:
    """The kernel process's resident and unique memory in bytes, read from /proc (0 where unreadable)."""
    rss = uss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:", "Private_Hugetlb:")):
                    uss += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"rss": rss, "uss": uss}


# ----- records kept between snapshots ---------------------------------------------------------------------------
#
# Most variables do not change from one step to the next. Two kinds of record are kept and reused, both exactly:
# - by identity, for values that cannot change while they live (str, numbers, naive Timestamps, tuples of them…)
#   and for lists and dicts of such leaves, whose members are kept and compared by identity. The kept reference
#   stops the id from being reused; values too large are not kept, so that a deleted variable is not held long.
# - by content hash, for frames and arrays of plain values: their size, repr and shape follow from the exact hash
#   (and the display options), so only the hash is recomputed. No reference to them is held.

_KEEP_ENTRY_BYTES = 8 << 20  # a larger value is described anew at every snapshot rather than held
_KEEP_BYTES = 32 << 20  # at most this much held between snapshots in all


def _tz_is_immutable(tz: Any) -> bool:
    module = type(tz).__module__.split(".")[0]
    return tz is None or type(tz) is datetime.timezone or module in ("zoneinfo", "pytz")


def _immutable_leaves() -> frozenset:
    leaves = _pickle_leaves()
    found = _IMMUTABLE_MEMO.get(leaves)
    if found is None:
        found = _IMMUTABLE_MEMO[leaves] = leaves | {range, re.Pattern}
    return found


_IMMUTABLE_MEMO: dict[frozenset, frozenset] = {}


def _members_are_immutable(members: Any) -> bool:
    kinds = set(map(type, members))
    if not kinds <= _immutable_leaves():
        return False
    with_tz = [kind for kind in kinds if issubclass(kind, (datetime.datetime, datetime.time))]
    if with_tz:
        timed = [m for m in members if type(m) in with_tz] if len(kinds) > 1 else members
        return all(map(_tz_is_immutable, set(map(_TZ_ATTRIBUTE, timed))))
    return True


def _identity_proof(value: Any) -> tuple | None:
    """What shows later that `value` is unchanged when it is the same object: () for an immutable value, its
    members for a list or dict of immutable leaves; None when identity proves nothing."""
    kind = type(value)
    if kind is re.Match:
        return () if type(value.string) in (str, bytes) else None  # a bytearray subject can change under it
    if kind in _immutable_leaves():
        return () if _tz_is_immutable(getattr(value, "tzinfo", None)) else None
    if kind is tuple or kind is frozenset:
        return () if _members_are_immutable(value) else None
    if kind is list:
        return tuple(value) if _members_are_immutable(value) else None
    if kind is dict:
        keys, values = tuple(value), tuple(value.values())
        return (keys, values) if _members_are_immutable(keys) and _members_are_immutable(values) else None
    return None


def _display_options() -> str | None:
    """Everything besides content that a frame's or array's repr depends on; None when it cannot be read."""
    parts = []
    try:
        if "pandas" in sys.modules:
            from pandas._config import config

            parts.append(repr(config._global_config["display"]))
        if "numpy" in sys.modules:
            parts.append(repr(sys.modules["numpy"].get_printoptions()))
    except (ImportError, AttributeError, KeyError, TypeError):
        return None
    return "\n".join(parts)


@dataclass
class _Kept:
    """A variable's record (without its name) kept between snapshots, and what proves it still holds."""

    record: dict
    failure: str | None
    value: Any = None  # kept by identity: held, so that its id cannot be given to another object
    members: tuple = ()  # a list's members or a dict's (keys, values), held and compared by identity
    outer_size: int = 0  # sys.getsizeof of a kept list or dict: its allocation changes with appends and pops

    def still_describes(self, value: Any) -> bool:
        if self.value is not value:
            return False
        kind = type(value)
        if kind is list:
            return (len(value) == len(self.members) and sys.getsizeof(value) == self.outer_size
                    and all(map(operator.is_, value, self.members)))
        if kind is dict:
            keys, values = self.members
            return (len(value) == len(keys) and sys.getsizeof(value) == self.outer_size
                    and all(map(operator.is_, value, keys)) and all(map(operator.is_, value.values(), values)))
        return True


def _named(name: str, kept: _Kept) -> tuple[dict, str | None]:
    return {"name": name, **kept.record}, kept.failure


def _unnamed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "name"}


@dataclass
class _SnapshotCache:
    """The records of the previous snapshot and those being kept for the next one; see the section comment."""

    by_id: dict[int, _Kept] = field(default_factory=dict)
    by_content: dict[tuple, _Kept] = field(default_factory=dict)
    next_by_id: dict[int, _Kept] = field(default_factory=dict)
    next_by_content: dict[tuple, _Kept] = field(default_factory=dict)
    kept_bytes: int = 0
    display: str | None = None

    def begin(self) -> None:
        self.next_by_id, self.next_by_content, self.kept_bytes = {}, {}, 0
        self.display = _display_options()

    def end(self) -> None:
        self.by_id, self.by_content = self.next_by_id, self.next_by_content
        self.next_by_id, self.next_by_content = {}, {}

    def kept_hash(self, value: Any) -> str | None:
        """The hash the last snapshot recorded for `value` where identity proves it unchanged, else None."""
        kept = self.by_id.get(id(value))
        return kept.record["hash"] if kept is not None and kept.still_describes(value) else None

    def describe(self, name: str, value: Any) -> tuple[dict, str | None]:
        kept = self.by_id.get(id(value))
        if kept is not None and kept.still_describes(value):
            self._keep(kept)
            return _named(name, kept)
        if _by_content(value):
            digest, plain = _content_hash(value)
            key = (_qualname(value), digest, self.display, _engines_built(value))
            kept = self.by_content.get(key) or self.next_by_content.get(key)
            if kept is None:
                record, failure = _describe(name, value, digest)
                kept = _Kept(_unnamed(record), failure)
            if plain and self.display is not None and not digest.startswith(UNHASHABLE):
                self.next_by_content[key] = kept
            return _named(name, kept)
        record, failure = _describe(name, value, None)
        proof = _identity_proof(value) if record.get("size", 0) <= _KEEP_ENTRY_BYTES else None
        if proof is not None:
            self._keep(_Kept(_unnamed(record), failure, value, proof,
                             sys.getsizeof(value) if type(value) in (list, dict) else 0))
        return record, failure

    def _keep(self, kept: _Kept) -> None:
        size = kept.record.get("size", 0)
        key = id(kept.value)
        if key in self.next_by_id or size > _KEEP_ENTRY_BYTES or self.kept_bytes + size > _KEEP_BYTES:
            return
        self.next_by_id[key] = kept
        self.kept_bytes += size


def _engines_built(value: Any) -> tuple:
    """Which of the value's indexes built their lookup table: pandas counts it in memory_usage, the hash does not."""
    index = value if hasattr(value, "levels") or type(value).__name__.endswith("Index") else getattr(value, "index",
                                                                                                     None)
    if index is None:
        return ()
    return tuple("_engine" in getattr(part, "_cache", {}) for part in [index, *getattr(index, "levels", [])])


def _by_content(value: Any) -> bool:
    module = type(value).__module__ or ""
    return ((module.startswith("pandas") and type(value).__name__ in _FRAME_TYPES)
            or (module == "numpy" and type(value).__name__ == "ndarray"))


_CACHE = _SnapshotCache()


def _snapshot_dict(shell: Any) -> dict:
    started = time.perf_counter()
    variables, failures, hashes = [], {}, {}
    # Reading smaps_rollup walks the page tables (milliseconds) without the GIL: it runs beside the descriptions,
    # and so measures the state the step left rather than the snapshot's own allocations.
    memory: dict[str, int] = {}

    def read_memory() -> None:
        try:
            memory.update(memory_usage())
        except Exception:  # noqa: BLE001 - a thread's traceback would reach the user's output; read it again below
            pass

    reader = threading.Thread(target=read_memory, name="themisto-memory", daemon=True)
    try:
        reader.start()
    except RuntimeError:  # no thread to spare (a process-count limit): read it here, after the descriptions
        reader = None
    cache = _CACHE
    cache.begin()
    try:
        for name, value in user_variables(shell).items():
            try:
                record, failure = cache.describe(name, value)
            except Exception as error:  # noqa: BLE001 - one bad variable never loses the others
                record = {"name": name, "type": _qualname(value), "size": 0, "repr": "",
                          "hash": f"{UNHASHABLE}:error"}
                failure = f"{type(error).__name__}: {error}"[:300]
            variables.append(record)
            hashes[name] = record["hash"]
            if failure is not None:
                failures[name] = failure
    finally:
        cache.end()  # what the previous snapshot held and no variable holds now is let go
        if reader is not None:
            reader.join()
    if reader is None or not memory:
        memory = memory_usage()
    return {"variables": variables, "memory_bytes": memory["rss"], "uss_bytes": memory["uss"],
            "state_hash": state_hash(hashes), "failures": failures,
            "elapsed_s": round(time.perf_counter() - started, 6)}


def snapshot(shell: Any = None) -> str:
    """The runtime snapshot of the user namespace as JSON: variables, memory_bytes, state_hash, failures."""
    return json.dumps(_snapshot_dict(_shell(shell)), default=str)


class _FileHandleError(pickle.PicklingError):
    pass


def dump_values(names: list[str], dest_dir: str, shell: Any = None) -> str:
    """Write each named variable to `dest_dir/<name>.dill` with dill; JSON of written paths and failures by name.

    File handles are never pickled (restoring a write-mode handle truncates the real file), at any depth.
    """
    import dill

    class NoFilesPickler(dill.Pickler):
        def persistent_id(self, obj: Any) -> None:
            if isinstance(obj, io.IOBase):
                raise _FileHandleError(f"holds a file handle ({_qualname(obj)}); file handles are never pickled")
            return None

    shell = _shell(shell)
    os.makedirs(dest_dir, exist_ok=True)
    written: dict[str, dict] = {}
    failures: dict[str, str] = {}
    for name in names:
        if name not in shell.user_ns:
            failures[name] = "NameError: not defined in the kernel"
            continue
        value = shell.user_ns[name]
        if isinstance(value, io.IOBase):
            failures[name] = f"skipped: file handle ({_qualname(value)}); file handles are never pickled"
            continue
        path = os.path.join(dest_dir, f"{name}.dill")
        partial = path + ".partial"
        try:
            with open(partial, "wb") as f:
                NoFilesPickler(f, protocol=4).dump(value)
            os.replace(partial, path)  # nothing half-written under the final name
            written[name] = {"path": path, "bytes": os.path.getsize(path)}
        except Exception as error:  # noqa: BLE001 - generators and the like fail by name
            failures[name] = f"{type(error).__name__}: {error}"[:300]
            if os.path.exists(partial):
                os.unlink(partial)
    return json.dumps({"written": written, "failures": failures})


class Reply:
    """Wraps JSON text so that a user expression's text/plain is the text itself, not its escaped repr."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text)


def reply(text: str) -> Reply:
    """The value a host-side user expression returns: `reply(snapshot())`."""
    return Reply(text)


# ----- the workdir guard ----------------------------------------------------------------------------------------


@dataclass
class WorkdirGuard:
    """Records a folder's files and keeps copies, so that what a branch deleted, changed or added can be undone.

    A forked child shares the filesystem with the kernel; this is how its file changes stay out of the parent's world.
    """

    root: str
    backup_limit_bytes: int = 2**30
    max_entries: int = 20_000
    listing: dict[str, tuple] = field(default_factory=dict)
    backup_dir: str | None = None
    unbacked: set[str] = field(default_factory=set)

    def _scan(self) -> dict[str, tuple]:
        found: dict[str, tuple] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                rel = os.path.relpath(full, self.root)
                if stat.S_ISDIR(st.st_mode):
                    found[rel] = ("d", stat.S_IMODE(st.st_mode))
                elif stat.S_ISLNK(st.st_mode):
                    found[rel] = ("l", os.readlink(full))
                else:  # ctime cannot be set by the user: any write or rename changes it
                    found[rel] = ("f", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, stat.S_IMODE(st.st_mode),
                                  st.st_uid, st.st_gid)
                if len(found) > self.max_entries:
                    raise RuntimeError(f"{self.root} holds more than {self.max_entries} entries; not guarded")
        return found

    def refresh(self) -> None:
        """Take the folder's current state as the state to restore; back up files that are new or changed."""
        if self.backup_dir is None:
            self.backup_dir = tempfile.mkdtemp(prefix="themisto-workdir-backup-")
        current = self._scan()
        used = sum(entry[1] for rel, entry in self.listing.items() if entry[0] == "f" and rel not in self.unbacked)
        for rel, entry in current.items():
            if entry[0] != "f" or self.listing.get(rel) == entry and rel not in self.unbacked:
                continue
            self.unbacked.discard(rel)
            if used + entry[1] > self.backup_limit_bytes:
                self.unbacked.add(rel)
                continue
            target = os.path.join(self.backup_dir, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(self.root, rel), target)
            used += entry[1]
        self.unbacked &= set(current)
        self.listing = current

    def check_and_restore(self) -> dict:
        """Compare with the recorded state, undo the differences, and say what they were and whether all were undone."""
        current = self._scan()
        added = sorted(set(current) - set(self.listing))
        deleted = sorted(set(self.listing) - set(current))
        modified = sorted(rel for rel in set(current) & set(self.listing) if current[rel] != self.listing[rel]
                          and not (current[rel][0] == "d" == self.listing[rel][0]))
        unrestored: list[str] = []
        for rel in sorted(added, key=lambda r: -r.count(os.sep)):  # deepest first, so folders are empty when removed
            full = os.path.join(self.root, rel)
            try:
                if current[rel][0] == "d":
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    os.unlink(full)
            except FileNotFoundError:
                pass
            except OSError:
                unrestored.append(rel)
        for rel in sorted(deleted + modified, key=lambda r: r.count(os.sep)):  # parents first
            entry = self.listing[rel]
            full = os.path.join(self.root, rel)
            try:
                if os.path.lexists(full) and not os.path.isdir(full) or os.path.islink(full):
                    os.unlink(full)
                elif os.path.isdir(full) and entry[0] != "d":
                    shutil.rmtree(full)
                if entry[0] == "d":
                    os.makedirs(full, exist_ok=True)
                    os.chmod(full, entry[1])
                elif entry[0] == "l":
                    os.symlink(entry[1], full)
                elif rel in self.unbacked or self.backup_dir is None:
                    unrestored.append(rel)
                else:
                    partial = full + ".themisto-restore"
                    shutil.copy2(os.path.join(self.backup_dir, rel), partial)
                    if (os.geteuid() == 0) and (entry[6], entry[7]) != (os.getuid(), os.getgid()):
                        os.chown(partial, entry[6], entry[7])  # the host restores files the kernel's uid owns
                    os.replace(partial, full)
            except OSError:
                unrestored.append(rel)
        if added or deleted or modified:
            restored_now = self._scan()
            for rel in deleted + modified:  # restored files have a new inode and ctime; remember those
                if rel in restored_now and rel not in unrestored:
                    self.listing[rel] = restored_now[rel]
        return {"added": added, "deleted": deleted, "modified": modified, "unrestored": sorted(set(unrestored))}

    def close(self) -> None:
        """Remove the backup copies."""
        if self.backup_dir is not None:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
            self.backup_dir = None


_GUARDS: dict[str, WorkdirGuard] = {}


# ----- branch execution: the child side -------------------------------------------------------------------------


class _BranchTimeout(BaseException):
    """Raised in the child by its own timer; BaseException so that `except Exception` in the candidate passes it."""


class _Recorder:
    """Collects a branch's nbformat outputs in order, keeping at most `cap` bytes and counting the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.outputs: list[dict] = []
        self.kept = 0
        self.total = 0
        self.truncated = False
        self.displays: dict[str, list[dict]] = {}

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        room = self.cap - self.kept
        # utf-8 takes at least a byte per character: a text far over the room is cut before it is encoded
        size = len(text) if len(text) > 4 * max(room, 0) + 4096 else len(text.encode("utf-8", "replace"))
        self.total += size
        if size > room:
            self.truncated = True
            if room <= 0:
                return
            text = text[:room].encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
            size = len(text.encode("utf-8"))
        self.kept += size
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["_parts"].append(text)
        else:
            self.outputs.append({"output_type": "stream", "name": name, "_parts": [text]})

    def display(self, output: dict, display_id: str | None = None) -> None:
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v, default=str)) for v in output["data"].values())
        self.total += size
        if size > self.cap - self.kept:
            self.truncated = True
            return
        self.kept += size
        self.outputs.append(output)
        if display_id:
            self.displays.setdefault(display_id, []).append(output)

    def error(self, ename: str, evalue: str, traceback: list[str]) -> None:
        if sum(len(line) for line in traceback) > self.cap:  # a recursion traceback can be long; keep head and tail
            traceback = traceback[:20] + ["[themisto: traceback truncated]"] + traceback[-20:]
        self.outputs.append({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback})

    def clear(self) -> None:
        self.outputs.clear()
        self.displays.clear()
        self.kept = 0

    def finish(self) -> list[dict]:
        for output in self.outputs:
            if "_parts" in output:
                output["text"] = "".join(output.pop("_parts"))
        if self.truncated:
            marker = OUTPUT_CAP_MARKER.format(total=self.total, cap=self.cap)
            self.outputs.append({"output_type": "stream", "name": "stderr", "text": marker})
        return self.outputs


class _CaptureStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a branch child: writes go to the recorder, never to the kernel's IOPub."""

    def __init__(self, recorder: _Recorder, name: str, fd: int):
        self._recorder, self._name, self._fd = recorder, name, fd

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._recorder.stream(self._name, text)
        return len(text)


def _install_capture(shell: Any, recorder: _Recorder) -> None:
    """Point every output path of the shell at the recorder; nothing the child does may reach zmq."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import StdinNotImplementedError

    class CaptureDisplayPublisher(DisplayPublisher):
        def publish(self, data: dict, metadata: dict | None = None, source: Any = None, *, transient: Any = None,
                    update: bool = False, **kwargs: Any) -> None:
            display_id = (transient or {}).get("display_id")
            if update:
                for output in recorder.displays.get(display_id, []):
                    output["data"], output["metadata"] = data, metadata or {}
                return
            recorder.display({"output_type": "display_data", "data": data, "metadata": metadata or {}}, display_id)

        def clear_output(self, wait: bool = False) -> None:
            recorder.clear()

    class CaptureDisplayHook(DisplayHook):
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: dict, md_dict: dict | None = None) -> None:
            recorder.display({"output_type": "execute_result", "execution_count": self.shell.execution_count,
                              "data": format_dict, "metadata": md_dict or {}})

        def log_output(self, format_dict: dict) -> None:
            pass

        def finish_displayhook(self) -> None:
            self._is_active = False

    def show_traceback(etype: type, evalue: BaseException, stb: list[str]) -> None:
        recorder.error(etype.__name__, str(evalue), list(stb))

    def no_input(*args: Any, **kwargs: Any) -> str:
        raise StdinNotImplementedError("raw_input was called, but this frontend does not support input requests.")

    sys.stdout = _CaptureStream(recorder, "stdout", 1)
    sys.stderr = _CaptureStream(recorder, "stderr", 2)
    shell.display_pub = CaptureDisplayPublisher(shell=shell)
    hook = CaptureDisplayHook(shell=shell, cache_size=shell.cache_size)
    shell.displayhook = hook
    shell.display_trap.hook = hook
    sys.displayhook = hook
    shell._showtraceback = show_traceback
    builtins.input = no_input
    import getpass

    getpass.getpass = no_input
    # The history database connection belongs to the parent: the child must never write to it.
    if getattr(shell, "history_manager", None) is not None:
        shell.history_manager.enabled = False
        shell.history_manager.db_log_output = False


def _read_fd_output(fd: int, limit: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _data_limit(extra_bytes: int) -> tuple[int, int]:
    """(limit, hard): what the process maps now + extra, within the hard RLIMIT_DATA. The heap a forked child
    inherits is counted in its VmData already, so the cap is relative to it."""
    import resource

    used = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                used = int(line.split()[1]) * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = used + int(extra_bytes)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    return limit, hard


@dataclass
class _BranchPlan:
    """What every child of one branch call needs, computed once in the kernel before the forks."""

    timeout_s: float
    memory_bytes: int
    output_bytes: int
    delta: str
    pre_hashes: dict[str, str]
    pre_ids: dict[str, int]
    pre_prints: dict[str, Any]
    random_state: Any


def _fingerprint(value: Any) -> Any:
    """Cheap structure of a value (shape, columns, dtypes, buffers): when it differs, the value surely changed."""
    try:
        module = type(value).__module__ or ""
        if module.startswith("pandas") and type(value).__name__ == "DataFrame":
            blocks = tuple(id(getattr(b, "values", None)) for b in value._mgr.blocks)
            return ("df", value.shape, tuple(map(repr, value.columns)), tuple(map(repr, value.dtypes)),
                    id(value.index), blocks)
        if module.startswith("pandas") and type(value).__name__ == "Series":
            return ("s", value.shape, repr(value.dtype), id(value.index), id(value._mgr.array), value.name)
        if module == "numpy" and hasattr(value, "__array_interface__"):
            return ("nd", value.shape, value.dtype.str, value.__array_interface__["data"][0], value.strides)
        if isinstance(value, (list, dict, set, bytearray)):
            return (type(value).__name__, len(value))
    except Exception:  # noqa: BLE001 - a fingerprint is an optimisation; None means "rehash"
        return None
    return None


def _cheap_size(value: Any) -> int:
    module = type(value).__module__ or ""
    try:
        if module == "numpy" and hasattr(value, "nbytes"):
            return int(value.nbytes)
        if module.startswith("pandas") and hasattr(value, "memory_usage"):
            usage = value.memory_usage(deep=False)
            return int(getattr(usage, "sum", lambda: usage)())
        if isinstance(value, (list, tuple, dict, set, frozenset, str, bytes)):
            return len(value) * 8
    except Exception:  # noqa: BLE001
        return 0
    return 0


def _delta(shell: Any, plan: _BranchPlan) -> dict:
    """Added, changed and deleted user variables against the pre-branch hashes, and the post-branch state hash."""
    post: dict[str, str] = {}
    unverified: list[str] = []
    for name, value in user_variables(shell).items():
        same_object = plan.pre_ids.get(name) == id(value)
        if (plan.delta == "identity" and same_object and _cheap_size(value) > _REHASH_BYTES
                and plan.pre_prints.get(name) is not None and _fingerprint(value) == plan.pre_prints[name]):
            post[name] = plan.pre_hashes[name]  # trusted: same object, same structure, too large to rehash
            unverified.append(name)
        else:
            post[name] = _CACHE.kept_hash(value) or content_hash(value)
    pre = plan.pre_hashes
    return {
        "added": {n: h for n, h in post.items() if n not in pre},
        "changed": {n: h for n, h in post.items() if n in pre and pre[n] != h},
        "deleted": {n: h for n, h in pre.items() if n not in post},
        "state_hash_after": state_hash(post),
        "unverified": sorted(unverified),
    }


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    data = _MSG_HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unsafe_run_candidate(shell: Any, code: str, plan: _BranchPlan, wfd: int) -> None:
    """The one place a candidate runs: in the grandchild, under its own memory cap and timer. Never returns."""
    result: dict[str, Any] = {"status": "error", "ename": "BranchAgentError", "evalue": "the child failed to start"}
    timed_out = [False]
    try:
        os.setpgid(0, 0)  # its own process group, so the kernel can kill it with everything it forks
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        random.setstate(plan.random_state)  # `random` reseeds itself after fork; the branch must see the parent's
        recorder = _Recorder(plan.output_bytes)
        fd_out = {1: os.memfd_create("themisto-stdout"), 2: os.memfd_create("themisto-stderr")}
        for target, source in fd_out.items():
            os.dup2(source, target)  # fd-level output must not reach the kernel's capture pipe (it would leak)
        _install_capture(shell, recorder)
        import resource

        limit, _ = _data_limit(plan.memory_bytes)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

        def on_alarm(signum: int, frame: Any) -> None:
            timed_out[0] = True
            raise _BranchTimeout(f"the cell ran past its {plan.timeout_s:g} s timeout")

        signal.signal(signal.SIGALRM, on_alarm)
        started = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, plan.timeout_s)
        # IPython decides whether to show the last expression by tokenizing the newest history entry; without
        # history that is the previous cell, and one with a SyntaxError makes every candidate fail (TokenError).
        # This is the child's own copy of the history, so the kernel's stays as it was.
        history = getattr(shell, "history_manager", None)
        if history is not None:
            history.input_hist_raw.append(code)
            history.input_hist_parsed.append(code)
        try:
            run = shell.run_cell(code, store_history=False, silent=False)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        duration = time.perf_counter() - started
        try:
            ctypes.CDLL(None).fflush(None)  # C-level stdio buffers would die with os._exit
        except (OSError, AttributeError):
            pass
        for fd, name in ((1, "stdout"), (2, "stderr")):
            recorder.stream(name, _read_fd_output(fd_out[fd], plan.output_bytes))
        error = run.error_before_exec or run.error_in_exec
        if timed_out[0] or isinstance(error, _BranchTimeout):
            recorder.outputs = [o for o in recorder.outputs if o.get("ename") != "_BranchTimeout"]
            result = {"status": "timeout", "ename": "CellTimeout",
                      "evalue": f"the cell ran past its {plan.timeout_s:g} s timeout"}
        elif error is not None:
            result = {"status": "error", "ename": type(error).__name__, "evalue": str(error)}
        else:
            result = {"status": "ok", "ename": None, "evalue": None}
        result["duration_s"] = duration
        result["truncated"] = recorder.truncated
        result["outputs"] = recorder.finish()
        hashing = time.perf_counter()
        result.update(_delta(shell, plan))
        result["delta_s"] = time.perf_counter() - hashing
    except BaseException as error:  # noqa: BLE001 - the child reports whatever happened, then always exits
        result.setdefault("outputs", [])
        result.update({"status": "timeout" if timed_out[0] else "error",
                       "ename": "CellTimeout" if timed_out[0] else "BranchAgentError",
                       "evalue": f"{type(error).__name__}: {error}"[:1000]})
    finally:
        try:
            _send(wfd, b"R", json.dumps(result, default=str).encode("utf-8", "replace"))
        finally:
            os._exit(0)


def _monitor(shell: Any, code: str, plan: _BranchPlan, wfd: int) -> None:
    """The kernel's child: a new session, the subreaper of the candidate's processes, and their reaper. Never returns.

    The candidate runs one level further down, so `os.kill(os.getppid(), 9)` in it hits this monitor, not the kernel.
    """
    code_out = 97
    try:
        os.setsid()
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        child = os.fork()
        if child == 0:
            _unsafe_run_candidate(shell, code, plan, wfd)
        try:
            os.setpgid(child, child)
        except OSError:
            pass  # the child already did it, or already exited
        _send(wfd, b"P", str(child).encode())
        os.close(wfd)
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                exit_code = os.waitstatus_to_exitcode(status)
                code_out = min(exit_code, 99) if exit_code >= 0 else 100 - exit_code  # 100 + signal number
                break
        # Whatever the candidate left behind (sleeping children, a fork storm) dies with its group; orphans that
        # left the group were reparented to this subreaper and are killed one by one.
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + _MONITOR_REAP_S
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                for orphan in _children_of(os.getpid()):
                    try:
                        os.kill(orphan, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.005)
    except BaseException:  # noqa: BLE001 - the monitor must exit, never return into the kernel's code
        code_out = 98
    finally:
        os._exit(code_out)


def _children_of(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


# ----- branch execution: the kernel side ------------------------------------------------------------------------


def _parse_messages(buffer: bytearray, messages: dict[bytes, bytes]) -> None:
    while len(buffer) >= _MSG_HEADER.size:
        kind, length = _MSG_HEADER.unpack_from(buffer)
        if length > _MAX_MESSAGE:
            raise ValueError(f"branch child sent a {length}-byte message")
        if len(buffer) < _MSG_HEADER.size + length:
            return
        messages[kind] = bytes(buffer[_MSG_HEADER.size:_MSG_HEADER.size + length])
        del buffer[:_MSG_HEADER.size + length]


def _wait_monitor(pid: int, until: float) -> int | None:
    """The monitor's wait status once it exits before `until`, else None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= until:
            return None
        time.sleep(0.002)


def _run_one(shell: Any, code: str, plan: _BranchPlan, index: int) -> dict:
    """Fork the monitor, collect the candidate's report until its deadline, then kill and reap everything."""
    rfd, wfd = os.pipe()
    started = time.monotonic()
    deadline = started + plan.timeout_s + _GRACE_S
    gc.freeze()  # the children's collector then never walks (and copies) the kernel's objects
    try:
        monitor = os.fork()
        if monitor == 0:
            os.close(rfd)
            _monitor(shell, code, plan, wfd)
    finally:
        gc.unfreeze()
    os.close(wfd)
    messages: dict[bytes, bytes] = {}
    buffer = bytearray()
    monitor_status: int | None = None
    timed_out = False
    try:
        pidfd = os.pidfd_open(monitor) if hasattr(os, "pidfd_open") else None
    except OSError:
        pidfd = None
    try:
        poller = select.poll()
        poller.register(rfd, select.POLLIN | select.POLLHUP)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        eof = False
        while b"R" not in messages:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            wait_ms = left * 1000 if pidfd is not None else min(left * 1000, 20)
            for fd, _ in poller.poll(max(1, int(wait_ms))):
                if fd == rfd:
                    chunk = os.read(rfd, 1 << 20)
                    if chunk:
                        buffer += chunk
                        _parse_messages(buffer, messages)
                    else:
                        eof = True
                        poller.unregister(rfd)
            if monitor_status is None:
                done, status = os.waitpid(monitor, os.WNOHANG)
                if done:
                    monitor_status = status
                    if pidfd is not None:
                        poller.unregister(pidfd)
            if b"R" in messages:
                break
            if monitor_status is not None and os.WIFEXITED(monitor_status):
                # The monitor reaped the candidate: everything it wrote is in the pipe already.
                os.set_blocking(rfd, False)
                try:
                    while chunk := os.read(rfd, 1 << 20):
                        buffer += chunk
                except BlockingIOError:
                    pass
                _parse_messages(buffer, messages)
                break
            if eof and monitor_status is not None:
                break
            if eof and pidfd is None:
                time.sleep(0.002)
    finally:
        child = int(messages[b"P"]) if b"P" in messages else None
        if child is not None and (timed_out or b"R" not in messages or monitor_status is not None):
            for kill in (os.killpg, os.kill):
                try:
                    kill(child, signal.SIGKILL)
                except OSError:
                    pass
        if monitor_status is None:
            monitor_status = _wait_monitor(monitor, time.monotonic() + _MONITOR_REAP_S + 1.0)
        if monitor_status is None:
            os.kill(monitor, signal.SIGKILL)
            _, monitor_status = os.waitpid(monitor, 0)
        os.close(rfd)
        if pidfd is not None:
            os.close(pidfd)
    elapsed = time.monotonic() - started
    if b"R" in messages:
        result = json.loads(messages[b"R"].decode("utf-8"))
    elif timed_out:
        result = {"status": "timeout", "ename": "CellTimeout",
                  "evalue": f"the cell ran past its {plan.timeout_s:g} s timeout; the branch was killed",
                  "outputs": [], "duration_s": elapsed}
    else:
        result = {"status": "kernel_died", "ename": "KernelDied", "evalue": _death_reason(monitor_status),
                  "outputs": [], "duration_s": elapsed}
    result["index"] = index
    result["wall_s"] = elapsed
    return result


def _death_reason(monitor_status: int | None) -> str:
    if monitor_status is None:
        return "the branch ended without a result"
    if os.WIFSIGNALED(monitor_status):
        return f"the branch's monitor was killed by signal {os.WTERMSIG(monitor_status)} and no result came"
    code = os.WEXITSTATUS(monitor_status)
    if code >= 100:
        return f"the branch process died by signal {code - 100}"
    return f"the branch process exited with status {code} without a result"


def branch(codes: list[str], timeout_s: float = 30.0, memory_bytes: int = 2**30, output_bytes: int = 2**20,
           workdir: str | None = None, delta: str = "hash", shell: Any = None) -> str:
    """Run each candidate in a forked child of this kernel, in the exact current state; JSON list of results.

    The kernel's own state is not changed: each candidate gets a fresh copy-on-write fork. Files under `workdir`
    that a candidate added, changed or deleted are restored after it, and reported.
    """
    if not hasattr(os, "fork"):
        raise OSError("os.fork is not available on this platform; use the replay fallback")
    if delta not in ("hash", "identity"):
        raise ValueError(f"delta must be 'hash' or 'identity', not {delta!r}")
    shell = _shell(shell)
    started = time.perf_counter()
    variables = user_variables(shell)
    pre_hashes = {name: _CACHE.kept_hash(value) or content_hash(value) for name, value in variables.items()}
    plan = _BranchPlan(
        timeout_s=float(timeout_s), memory_bytes=int(memory_bytes), output_bytes=int(output_bytes), delta=delta,
        pre_hashes=pre_hashes, pre_ids={name: id(value) for name, value in variables.items()},
        pre_prints={name: _fingerprint(value) for name, value in variables.items()} if delta == "identity" else {},
        random_state=random.getstate())
    del variables
    guard = None
    if workdir is not None:
        guard = _GUARDS.get(workdir) or WorkdirGuard(workdir)
        _GUARDS[workdir] = guard
        guard.refresh()
    prepared = time.perf_counter() - started
    results = []
    for index, code in enumerate(codes):
        result = _run_one(shell, code, plan, index)
        if guard is not None:
            result["workdir"] = guard.check_and_restore()
        results.append(result)
    return json.dumps({"state_hash_before": state_hash(pre_hashes), "prepare_s": prepared, "results": results},
                      default=str)


def set_data_limit(extra_bytes: int | None) -> str:
    """Lower the kernel's soft RLIMIT_DATA to its current use + extra (None: back to the hard limit); JSON of both.

    The replay fallback uses it to give a candidate the same memory cap as a branch child.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = hard if extra_bytes is None else _data_limit(extra_bytes)[0]
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return json.dumps({"previous_soft": soft, "hard": hard})


def process_count() -> str:
    """JSON count of the processes visible in this kernel's /proc (its pid namespace under bubblewrap) and of
    this process's threads: what a branch must leave as it found them."""
    import threading

    return json.dumps({"processes": sum(1 for entry in os.listdir("/proc") if entry.isdigit()),
                       "threads": threading.active_count()})
