"""The go a candidate forked ahead of its turn waits for: the kernel's hashes it needs after its cell (it may have
been forked while the kernel was still hashing), written to its go socket when its turn comes; the end of that
socket instead of a go cancels it. Runs inside the kernel and its children: standard library only.
"""

from __future__ import annotations

import marshal
import os
from typing import Any


def go_message(plan: Any) -> bytes:
    """The go a candidate waits for, with what it needs of the kernel's hashes: a candidate forked while the kernel
    was still hashing has none of them in its copy of the plan. Values marshal cannot carry are dropped from the
    identity fingerprints (those names are then rehashed)."""
    prints = {name: found if _marshals(found) else None for name, found in plan.pre_prints.items()}
    payload = marshal.dumps((plan.pre_hashes, plan.page_prints, plan.pre_ids, prints))
    return b"g" + len(payload).to_bytes(8, "big") + payload


def _marshals(value: Any) -> bool:
    try:
        marshal.dumps(value)
    except ValueError:
        return False
    return True


def _read_exactly(fd: int, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def await_go(fd: int, plan: Any) -> bool:
    """Block until the kernel lets this candidate go (True, the plan's hashes filled in) or cancels it (False)."""
    head = _read_exactly(fd, 9)
    if len(head) != 9 or head[:1] != b"g":
        return False
    payload = _read_exactly(fd, int.from_bytes(head[1:], "big"))
    plan.pre_hashes, plan.page_prints, plan.pre_ids, plan.pre_prints = marshal.loads(payload)
    return True
