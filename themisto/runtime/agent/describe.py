"""Sizes, bounded reprs, shapes and the kernel's memory: one variable described for a snapshot.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import os
import random
import sys
import types
from typing import Any

from themisto.runtime.agent.namespace import qualname, safe_repr
from themisto.runtime.agent.hashing import content_hash
from themisto.runtime.agent.leaves import pickle_leaves


# ----- sizes, reprs, shapes -------------------------------------------------------------------------------------

# Deep sizes walk at most this many objects, then extrapolate from what they saw.
_SIZE_NODES = 20_000
# Flat containers of leaves up to this length are sized exactly at C speed (the walk below is Python-level).
_FLAT_SIZE_MAX = 1_000_000
# DataFrames longer than this get their object columns' deep size estimated from a sample.
_EXACT_DEEP_ROWS = 200_000


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
    if len(members) > _FLAT_SIZE_MAX or not set(map(type, members)) <= pickle_leaves():
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




_LAZY_PANDAS_MODULES = ("pandas.core.groupby", "pandas.core.window", "pandas.core.resample")


def describe(name: str, value: Any, digest: str | None = None) -> tuple[dict, str | None]:
    """One variable's record (name, type, size, repr, hash, shape/dtype/len/columns) and the failure if any;
    `digest`: its content hash when the caller has it already."""
    record: dict[str, Any] = {"name": name, "type": qualname(value)}
    failure = None
    try:
        record["size"] = size_of(value)
    except Exception as error:  # noqa: BLE001
        record["size"] = sys.getsizeof(value)
        failure = f"size: {type(error).__name__}: {error}"[:300]
    record["repr"], repr_error = safe_repr(value)
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
