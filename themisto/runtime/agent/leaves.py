"""Which builtin structures pickle canonically (equal content, equal bytes, in any kernel of one stack), and the
fast ways to hash the common ones: a memo-free pickle, and lists of Timestamps as vectors. Used by `hashing`.

Runs inside the kernel: standard library only (pandas is looked up in sys.modules, never imported).
"""

from __future__ import annotations

import array
import datetime
import hashlib
import io
import itertools
import operator
import pickle
import re
import sys
from typing import Any

from themisto.runtime.agent.addresses import pickle_without_addresses


_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
# Leaves whose memo-free pickle is canonical (equal content, equal bytes) and the same in every kernel of one stack.
_BUILTIN_LEAVES = frozenset({type(None), bool, int, float, complex, str, bytes, datetime.date, datetime.datetime,
                             datetime.time, datetime.timedelta})
# Lists of this many Timestamps or more are hashed as one int64 vector (pickling each one costs ~2 µs).
_TIMESTAMP_VECTOR = 64


def pickle_leaves() -> frozenset:
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
TZ_ATTRIBUTE = operator.attrgetter("tzinfo")


def holds_set_or_object(value: Any) -> bool:
    """True when a builtin structure holds a set or an object whose pickle is not known to be canonical.

    Visits the structure a level at a time: the members of all of a level's containers are gathered and their types
    checked at C speed (a column of short lists has as many containers as rows)."""
    leaves = pickle_leaves()
    allowed = leaves | _CONTAINERS
    if type(value) in (set, frozenset):
        return True
    if type(value) not in _CONTAINERS:
        return False
    level, seen = [value], {id(value)}
    while level:
        dicts = [item for item in level if type(item) is dict]
        members = list(itertools.chain.from_iterable(level if not dicts else
                                                     [item for item in level if type(item) is not dict]))
        if dicts:
            members += itertools.chain.from_iterable(dicts)
            members += itertools.chain.from_iterable(map(dict.values, dicts))
        kinds = set(map(type, members))
        if not kinds <= allowed or set in kinds or frozenset in kinds:
            return True
        if not kinds & _CONTAINERS:
            return False
        found = list(itertools.compress(members, map(_CONTAINERS.__contains__, map(type, members))))
        fresh = dict(zip(map(id, found), found))
        for known in seen.intersection(fresh):  # shared or cyclic: one visit is enough
            del fresh[known]
        seen.update(fresh)
        level = list(fresh.values())
    return False


def hash_timestamps(h: Any, value: Any, kinds: set) -> bool:
    """Hash a list or tuple of leaves holding many naive Timestamps without pickling each (~2 µs apiece): which
    items are Timestamps, their units and nanoseconds as vectors, and the memo-free pickle of the other items.
    False where it does not apply (few Timestamps, a timezone, other members, an older pandas)."""
    pd = sys.modules.get("pandas")
    timestamp = getattr(pd, "Timestamp", None)
    if len(value) < _TIMESTAMP_VECTOR or timestamp not in kinds or not kinds <= pickle_leaves():
        return False
    flags = bytes(map(operator.is_, map(type, value), itertools.repeat(timestamp)))
    stamps = list(itertools.compress(value, flags)) if len(kinds) > 1 else value
    if len(stamps) < _TIMESTAMP_VECTOR:
        return False
    try:
        if set(map(TZ_ATTRIBUTE, stamps)) != {None}:
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
    h.update(fast_pickle(units))
    h.update(nanoseconds.tobytes())
    h.update(fast_pickle(others))
    return True


def fast_pickle(value: Any) -> bytes:
    """The bytes to hash of a value: its pickle without the memo, so equal content gives equal bytes whatever the
    objects' identities, with the sets inside it in a canonical order, and with the memory addresses its state holds
    marked (`addresses`), so a run's own addresses do not count. Never loaded."""
    data = _memo_free_pickle(value, pickle.Pickler)
    if _SET_OPCODES.search(data):  # maybe a set (or just those bytes inside binary data): pickle again, sets sorted
        data = _memo_free_pickle(value, _SortedSetsPickler)
    return pickle_without_addresses(data)


# Protocol 4 writes a set as EMPTY_SET then ADDITEMS, a frozenset as MARK ... FROZENSET.
_SET_OPCODES = re.compile(rb"[\x8f\x91]")


def _memo_free_pickle(value: Any, pickler_class: type) -> bytes:
    buffer = io.BytesIO()
    pickler = pickler_class(buffer, protocol=4)
    pickler.fast = True  # deprecated but exactly what is wanted: no memo, no identity in the bytes
    pickler.dump(value)
    return buffer.getvalue()


class _SortedSetsPickler(pickle.Pickler):
    """Writes each set and frozenset as its members sorted (where all are of one plain kind) or as the sorted
    digests of their bytes. A set's iteration order depends on its history, not only on its members and the hash
    seed: one loaded from a pickle (a state restored from a snapshot) holds the same members as the set it was saved
    from but can list them in another order, so an object holding a set (a fitted vectorizer's `stop_words_`) would
    hash otherwise after every restore."""

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is not set and kind is not frozenset:
            return None
        kinds = set(map(type, obj))
        if len(kinds) == 1 and kinds <= _SORTABLE:  # one plain kind (words, numbers): sorted at C speed
            return (kind.__name__, sorted(obj))
        digests = sorted(hashlib.sha256(fast_pickle(member)).digest() for member in obj)
        return (kind.__name__, b"".join(digests))


# Kinds whose values sort in one total order and pickle canonically (not float: NaN does not sort).
_SORTABLE = frozenset({str, int, bytes})
