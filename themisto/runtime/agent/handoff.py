"""What passes between the kernel and a branch's processes, both ends of it: the go a candidate forked ahead of its
turn waits for (the kernel's hashes it needs after its cell: it may have been forked while the kernel was still
hashing), written to its go socket when its turn comes, the end of that socket instead of a go cancelling it; and
the monitor's messages to the kernel (its walls, the candidate's pid, the candidate's end).

Runs inside the kernel and its children: standard library only.
"""

from __future__ import annotations

import marshal
import os
import struct
from typing import Any

# A monitor's message: its kind (one byte) and its length, then its payload.
MESSAGE_HEADER = struct.Struct(">cQ")
_MAX_MESSAGE = 512 * 2**20


def send_message(fd: int, kind: bytes, payload: bytes) -> None:
    """Write one message of `kind` to the kernel (the monitor's side)."""
    data = MESSAGE_HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def parse_messages(buffer: bytearray, messages: dict[bytes, bytes]) -> None:
    """Move the complete messages at the start of `buffer` into `messages` by kind (the kernel's side)."""
    while len(buffer) >= MESSAGE_HEADER.size:
        kind, length = MESSAGE_HEADER.unpack_from(buffer)
        if length > _MAX_MESSAGE:
            raise ValueError(f"branch child sent a {length}-byte message")
        if len(buffer) < MESSAGE_HEADER.size + length:
            return
        messages[kind] = bytes(buffer[MESSAGE_HEADER.size:MESSAGE_HEADER.size + length])
        del buffer[:MESSAGE_HEADER.size + length]


def go_message(plan: Any, cells: list[str] | None = None) -> bytes:
    """The go a candidate waits for, with what it needs of the kernel's hashes: a candidate forked while the kernel
    was still hashing has none of them in its copy of the plan; and its `cells` where it was forked before they were
    known (a probe's branch forked ahead, `themisto.runtime.agent.ahead`). Values marshal cannot carry are dropped
    from the identity fingerprints (those names are then rehashed)."""
    prints = {name: found if _marshals(found) else None for name, found in plan.pre_prints.items()}
    payload = marshal.dumps((plan.pre_hashes, plan.page_prints, plan.pre_ids, prints,
                             None if cells is None else [str(cell) for cell in cells]))
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


def await_go(fd: int, plan: Any) -> tuple[bool, list[str] | None]:
    """Block until the kernel lets this candidate go (True, the plan's hashes filled in, and its cells when they came
    with the go) or cancels it (False)."""
    head = _read_exactly(fd, 9)
    if len(head) != 9 or head[:1] != b"g":
        return False, None
    payload = _read_exactly(fd, int.from_bytes(head[1:], "big"))
    plan.pre_hashes, plan.page_prints, plan.pre_ids, plan.pre_prints, cells = marshal.loads(payload)
    return True, cells
