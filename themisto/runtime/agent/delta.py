"""What a branch changed in the user namespace: the one namespace-delta function, and the hashes after a candidate,
rehashing only what it may have changed. Runs inside the kernel: standard library only.

Before the forks the kernel hashes every variable and, for frames and arrays, takes a fingerprint that stands the
address and layout of each large raw buffer for its bytes (`footprint`). After the candidate, a frame or array
whose fingerprint is the same and whose buffers lie on pages the child never wrote (`pages.written`) has the same
content, so it keeps its hash; everything else is hashed again in full. `full=True` rehashes everything (the exact
fallback, and where the page flags cannot be trusted).

The kernel's hashes and fingerprints of a state are kept for its next branch calls until a cell runs
(`hash_before_once`): a probe conversation asks for many branches of one state, which is hashed once.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from themisto.runtime.agent.hashing import content_digest, hash_each, is_frame_or_array, raw_bytes
from themisto.runtime.agent.namespace import HASH_CHARS, UNHASHABLE
from themisto.runtime.agent.pages import usable as pages_usable
from themisto.runtime.agent.pages import written


# Raw buffers at least this large are where a Footprint stands their address for their bytes (smaller ones are cheap
# to hash, and share their pages with other objects).
SPAN_BYTES = 1 << 16


class Footprint:
    """A hash sink for frames and arrays: the content hash (when asked) and a fingerprint that holds everything the
    content hash reads except large raw buffers, for which it takes their address and layout, listing where they lie.

    Equal fingerprints and unwritten spans mean equal content (themisto.runtime.agent.pages says which are unwritten).
    """

    def __init__(self, content: bool = True):
        self.content = hashlib.sha256() if content else None
        self.print = hashlib.sha256()
        self.spans: list[tuple[int, int]] = []

    def update(self, data: Any) -> None:
        if self.content is not None:
            self.content.update(data)
        self.print.update(data)

    def raw(self, values: Any) -> None:
        """Feed a numpy array's raw bytes: in full where small, else its place in memory to the fingerprint."""
        if values.nbytes < SPAN_BYTES:
            self.update(raw_bytes(values))
            return
        if self.content is not None:
            self.content.update(raw_bytes(values))
        address = values.__array_interface__["data"][0]
        low = high = 0
        for size, stride in zip(values.shape, values.strides):
            low, high = low + min(0, stride * (size - 1)), high + max(0, stride * (size - 1))
        low, high = address + low, address + high + values.itemsize
        self.print.update(repr(("span", address, values.shape, values.strides, values.dtype.str)).encode())
        # The partial pages at either end share their page with other objects, which Python writes all the time:
        # their bytes go into the fingerprint, and only the whole pages between are left to the page flags.
        inner_low = min(high, -(-low // mmap.PAGESIZE) * mmap.PAGESIZE)
        inner_high = max(inner_low, high // mmap.PAGESIZE * mmap.PAGESIZE)
        self.print.update(ctypes.string_at(low, inner_low - low) + ctypes.string_at(inner_high, high - inner_high))
        if inner_high > inner_low:
            self.spans.append((inner_low, inner_high))

    def hexdigest(self) -> str:
        return (self.content or self.print).hexdigest()


# An index this long of Python objects costs as much to fingerprint as to hash.
_OBJECT_INDEX_ROWS = 10_000


def _raw_dtype(dtype: Any) -> bool:
    """False for Python objects (numpy's object dtype, pandas' strings): their bytes are not in the buffer."""
    return not getattr(dtype, "hasobject", False) and str(getattr(dtype, "name", "")) not in ("string", "str")


def _mostly_buffers(value: Any) -> bool:
    """Whether the value's content lies in raw buffers, so a fingerprint costs far less than its content hash."""
    if type(value).__name__ == "ndarray":
        return _raw_dtype(value.dtype)
    index = value if type(value).__name__.endswith("Index") else value.index
    if not _raw_dtype(index.dtype) and len(index) > _OBJECT_INDEX_ROWS:
        return False
    if type(value).__name__ == "DataFrame":
        return all(map(_raw_dtype, value.dtypes))
    return type(value).__name__.endswith("Index") or _raw_dtype(value.dtype)


def footprint(value: Any, content: bool = True) -> tuple[str | None, str, tuple] | None:
    """A frame's or array's (content hash or None when not asked, fingerprint, spans of its large raw buffers);
    None for any other value, for one whose content is mostly Python objects, and for one that cannot be hashed."""
    if not is_frame_or_array(value):
        return None
    try:
        if not _mostly_buffers(value):
            return None
    except Exception:  # noqa: BLE001 - a value that will not say what it holds is hashed in full
        return None
    sink = Footprint(content)
    digest = content_digest(value, sink)[0]
    if digest.startswith((UNHASHABLE, "repr:")):
        return None
    return (digest if content else None), sink.print.hexdigest()[:HASH_CHARS], tuple(sink.spans)


# The words of a namespace delta, declared once: the keys of a branch's report and the fields of the host's
# `BranchResult` (themisto.runtime.branch) that hold what a candidate or a probe did to the user's variables.
NAMESPACE_CHANGES: tuple[str, ...] = ("added", "changed", "deleted")


def namespace_delta(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Names added, changed and deleted between two {name: content hash} maps (keyed by `NAMESPACE_CHANGES`): added
    and changed carry the hash after, deleted the hash before."""
    added = {n: h for n, h in after.items() if n not in before}
    changed = {n: h for n, h in after.items() if n in before and before[n] != h}
    deleted = {n: h for n, h in before.items() if n not in after}
    return dict(zip(NAMESPACE_CHANGES, (added, changed, deleted)))


@dataclass
class Before:
    """The namespace before the branches: each name's content hash, and the fingerprint and buffer spans of the
    frames and arrays that hold large buffers."""

    hashes: dict[str, str]
    prints: dict[str, tuple[str, tuple]] = field(default_factory=dict)


def hash_before(variables: Mapping[str, Any], kept_hash: Callable[[Any], str | None], prints: bool) -> Before:
    """Hash every variable (through the snapshot cache where identity proves a value unchanged); with `prints`, also
    take the fingerprints the page check needs."""
    found = Before({})

    def known(name: str, value: Any) -> str | None:
        digest = kept_hash(value)
        if digest is None and prints:
            taken = footprint(value)
            if taken is not None:
                digest, fingerprint, spans = taken
                if spans:
                    found.prints[name] = (fingerprint, spans)
        return digest

    found.hashes = hash_each(variables, known)
    return found


_KEPT: dict[str, Any] = {}  # the last Before and the state it was taken in


def hash_before_once(variables: Mapping[str, Any], kept_hash: Callable[[Any], str | None], prints: bool,
                     cells: int | None) -> tuple[Before, bool]:
    """`hash_before`, kept for the next branch call while the state stands: no cell has run since (`cells`: the
    count of themisto.runtime.agent.executions; None, it cannot be told: hashed again) and every name is bound to
    the same object. A probe conversation asks for many branches of one state: it is hashed once, not per probe.
    The Before, and whether it was the kept one."""
    key = None if cells is None else (cells, prints, tuple((name, id(value)) for name, value in variables.items()))
    if key is not None and _KEPT.get("key") == key:
        return _KEPT["before"], True
    _KEPT.clear()
    before = hash_before(variables, kept_hash, prints)
    if key is not None:
        _KEPT.update(key=key, before=before)
    return before, False


def hash_after(variables: Mapping[str, Any], before: Before, kept_hash: Callable[[Any], str | None],
               full: bool, end: Callable[[], bool]) -> tuple[dict[str, str], list[str]]:
    """Every variable's content hash after the candidate, and the names the page check kept without rehashing.

    `end` ends every process the candidate started (they would share its pages) and says whether it could; it runs
    only when the page check is used. The page check reads every frame's pages before anything is rehashed."""
    kept: list[str] = []
    use_pages = not full and bool(before.prints) and pages_usable() and end()
    for name, value in variables.items() if use_pages else ():
        if name in before.prints and kept_hash(value) is None:
            taken = footprint(value, content=False)
            fingerprint, spans = before.prints[name]
            if taken is not None and taken[1:] == (fingerprint, spans) and not written(list(spans)):
                kept.append(name)
    return hash_each(variables, lambda name, value: before.hashes[name] if name in kept else kept_hash(value)), kept
