"""What a branch changed in the user namespace: the one namespace-delta function, and the hashes after a candidate,
rehashing only what it may have changed. Runs inside the kernel: standard library only.

Before the forks the kernel hashes every variable and, for frames and arrays, takes a fingerprint that stands the
address and layout of each large raw buffer for its bytes (`hashing.footprint`). After the candidate, a frame or array
whose fingerprint is the same and whose buffers lie on pages the child never wrote (`pages.written`) has the same
content, so it keeps its hash; everything else is hashed again in full. `full=True` rehashes everything (the exact
fallback, and where the page flags cannot be trusted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from themisto.runtime.agent.hashing import content_hash, footprint
from themisto.runtime.agent.pages import usable as pages_usable
from themisto.runtime.agent.pages import written


def namespace_delta(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Names added, changed and deleted between two {name: content hash} maps: added and changed carry the hash after,
    deleted the hash before."""
    return {
        "added": {n: h for n, h in after.items() if n not in before},
        "changed": {n: h for n, h in after.items() if n in before and before[n] != h},
        "deleted": {n: h for n, h in before.items() if n not in after},
    }


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
    for name, value in variables.items():
        digest = kept_hash(value)
        if digest is None and prints:
            taken = footprint(value)
            if taken is not None:
                digest, fingerprint, spans = taken
                if spans:
                    found.prints[name] = (fingerprint, spans)
        found.hashes[name] = digest if digest is not None else content_hash(value)
    return found


def hash_after(variables: Mapping[str, Any], before: Before, kept_hash: Callable[[Any], str | None],
               full: bool, end: Callable[[], bool]) -> tuple[dict[str, str], list[str]]:
    """Every variable's content hash after the candidate, and the names the page check kept without rehashing.

    `end` ends every process the candidate started (they would share its pages) and says whether it could; it runs
    only when the page check is used."""
    after: dict[str, str] = {}
    kept: list[str] = []
    use_pages = not full and bool(before.prints) and pages_usable() and end()
    for name, value in variables.items():
        digest = kept_hash(value)
        if digest is None and use_pages and name in before.prints:
            taken = footprint(value, content=False)
            fingerprint, spans = before.prints[name]
            if taken is not None and taken[1:] == (fingerprint, spans) and not written(list(spans)):
                digest = before.hashes[name]
                kept.append(name)
        after[name] = digest if digest is not None else content_hash(value)
    return after, kept
