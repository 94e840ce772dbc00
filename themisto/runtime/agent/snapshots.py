"""Snapshots of the user namespace, with records of unchanged values kept between them, and the values stored.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import datetime
import json
import operator
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from themisto.runtime.agent.namespace import UNHASHABLE, get_shell, qualname, user_variables
from themisto.runtime.agent.hashing import content_digest, is_frame_or_array, state_hash
from themisto.runtime.agent.leaves import TZ_ATTRIBUTE, pickle_leaves
from themisto.runtime.agent.describe import describe, memory_usage
from themisto.runtime.agent.values import STORE, VALUES_DIR_ENV, Caps, modules_and_aliases


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
    leaves = pickle_leaves()
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
        return all(map(_tz_is_immutable, set(map(TZ_ATTRIBUTE, timed))))
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
        if is_frame_or_array(value):
            digest, plain = content_digest(value)
            key = (qualname(value), digest, self.display, _engines_built(value))
            kept = self.by_content.get(key) or self.next_by_content.get(key)
            if kept is None:
                record, failure = describe(name, value, digest)
                kept = _Kept(_unnamed(record), failure)
            if plain and self.display is not None and not digest.startswith(UNHASHABLE):
                self.next_by_content[key] = kept
            return _named(name, kept)
        record, failure = describe(name, value, None)
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


CACHE = _SnapshotCache()


def _snapshot_dict(shell: Any, values: dict | None = None) -> dict:
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
    cache = CACHE
    cache.begin()
    namespace = user_variables(shell)
    try:
        for name, value in namespace.items():
            try:
                record, failure = cache.describe(name, value)
            except Exception as error:  # noqa: BLE001 - one bad variable never loses the others
                record = {"name": name, "type": qualname(value), "size": 0, "repr": "",
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
    found = {"variables": variables, "memory_bytes": memory["rss"], "uss_bytes": memory["uss"],
             "state_hash": state_hash(hashes), "failures": failures}
    if values is not None:
        found["values"] = _store_values(shell, namespace, hashes, values)
    found["elapsed_s"] = round(time.perf_counter() - started, 6)
    return found


def _store_values(shell: Any, namespace: dict[str, Any], hashes: dict[str, str], values: dict) -> dict:
    """The values of the namespace written into values["folder"] (themisto.runtime.agent.values), with the
    modules and the names bound to one object."""
    started = time.perf_counter()
    history = shell.user_ns.get("In") or [""]
    stored = STORE.store_all({name: (value, hashes[name]) for name, value in namespace.items()}, values["folder"],
                             Caps(**values.get("caps", {})), history[-1] if isinstance(history, list) else None)
    stored["modules"], stored["aliases"] = modules_and_aliases(shell, list(namespace))
    stored["elapsed_s"] = round(time.perf_counter() - started, 6)
    return stored


def snapshot(shell: Any = None, values: dict | None = None) -> str:
    """The runtime snapshot of the user namespace as JSON: variables, memory_bytes, state_hash, failures; with
    `values` ({"folder", "caps"}), each value also written into that folder (and "values" says how)."""
    return json.dumps(_snapshot_dict(get_shell(shell), values), default=str)


def snapshot_and_store(shell: Any = None, seconds: float | None = None, held: list[str] | None = None) -> str:
    """`snapshot`, the values written into the session's values folder (VALUES_DIR_ENV, set when the kernel
    starts: the host picks them up from there), spending at most `seconds` on them (default: Caps.seconds); `held`:
    hashes of values the host holds exactly already, not written again (ValueStore.held)."""
    folder = os.environ.get(VALUES_DIR_ENV)
    if not folder:
        raise RuntimeError(f"{VALUES_DIR_ENV} is not set: this kernel has no values folder")
    STORE.held(held)
    caps = {} if seconds is None else {"seconds": float(seconds)}
    return snapshot(shell, {"folder": folder, "caps": caps})


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
