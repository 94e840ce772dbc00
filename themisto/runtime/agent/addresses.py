"""Memory addresses inside values: the one rule that tells them, for the hashes and the stored values.

A CPython object's address (`id()`) differs in every process, and libraries keep addresses in their objects'
state (scikit-learn's fitted vectorizers keep `_stop_words_id = id(self.stop_words)`), or in texts (`<Foo object at
0x7f…>`). Hashed or stored as they are, such values change from run to run, so two builds of one log disagree and
every state after them fails the scorer's check against the release. The rule is about the class, not about one
attribute: an int shaped like a user-space address of a 64-bit Linux process (8-byte aligned, in the ranges where
x86-64 and aarch64 place a position-independent executable's heap and the mmap area), and an `0x…` text of such an
int, stand for "an address" wherever a value is hashed or stored. The rule is a function of the value alone, so
the kernel that made a value and any process that reads it back agree. A program's own number of that shape (a
multiple of 8 near 2^47) would be taken for an address too; none of the corpus's sessions holds one.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import pickletools
import re

# Where a 64-bit Linux process's objects live: [low, high) ranges of user-space addresses (x86-64: the executable's
# heap above 0x55…, the mmap area below 0x7fff…; aarch64: 0xaaaa… and 0xffff…). The mmap area starts up to 2^40
# bytes (28 random bits of pages, the default) below the top, or 2^44 (32 bits, the most allowed), and shared
# libraries and large allocations lie below its start: measured here, 6 of 300 interpreters had `id(None)` at
# 0x7efc…-0x7eff…, so the range reaches down 2^44 and more. (With an unlimited stack the kernel lays the mmap
# area out from the bottom; the kernel launcher sets a finite one.)
_RANGES = ((0x5500_0000_0000, 0x5800_0000_0000), (0x6f00_0000_0000, 0x8000_0000_0000),
           (0xaaaa_0000_0000, 0xab00_0000_0000), (0xffff_0000_0000, 0x1_0000_0000_0000))
ADDRESS_MARK = b"@address@"
# An address as text: `0x` and 12 hex digits (Python prints ids without leading zeros), inside a word boundary.
_HEX = re.compile(rb"0x([0-9a-fA-F]{12})(?![0-9a-fA-F])")
# Pickle's LONG1 opcode with a 6- or 7-byte argument: how protocol 2+ writes an int of 2^39..2^55.
_LONG1 = re.compile(rb"\x8a[\x06\x07]", re.DOTALL)


def is_address(value: int) -> bool:
    """Whether an int has the shape of an object's address in a 64-bit Linux process."""
    return value & 7 == 0 and any(low <= value < high for low, high in _RANGES)


def hex_text(data: bytes) -> bytes:
    """`data` with every `0x…` text of an address replaced by `0x@address@`."""
    if b"0x" not in data:
        return data
    return _HEX.sub(lambda m: b"0x" + ADDRESS_MARK if is_address(int(m.group(1), 16)) else m.group(0), data)


# What a stored value holds in place of an address of the process that made it (an address too, so the value read
# back hashes as the one stored): two builds store the same bytes.
STORED_ADDRESS = 0x7f00_0000_0000


def stored_int(value: int) -> int:
    """The int a stored value holds for `value`: STORED_ADDRESS for an address, else `value`."""
    return STORED_ADDRESS if is_address(value) else value


def stored_text(text: str) -> str:
    """The str a stored value holds for `text`: each `0x…` text of an address replaced by STORED_ADDRESS's."""
    if "0x" not in text:
        return text
    placeholder = b"0x%x" % STORED_ADDRESS
    data = text.encode("utf-8", "surrogatepass")
    return _HEX.sub(lambda m: placeholder if is_address(int(m.group(1), 16)) else m.group(0), data).decode(
        "utf-8", "surrogatepass")


def pickle_without_addresses(data: bytes) -> bytes:
    """A pickle's bytes with each int that is an address, and each address in its texts, replaced by a mark: the
    bytes to hash (never to load). Only a candidate found by a byte search is confirmed by walking the opcodes, so a
    pickle without one costs a search, and bytes inside an array's buffer are never taken for an int."""
    spans = []
    for match in _LONG1.finditer(data):
        start = match.start()
        width = data[start + 1]
        if is_address(int.from_bytes(data[start + 2:start + 2 + width], "little", signed=True)):
            spans.append(start)
    if spans:
        wanted = set(spans)
        confirmed = [pos for op, arg, pos in pickletools.genops(data)
                     if op.name == "LONG1" and pos in wanted and isinstance(arg, int) and is_address(arg)]
        if confirmed:
            parts, last = [], 0
            for pos in confirmed:
                parts += [data[last:pos], ADDRESS_MARK]
                last = pos + 2 + data[pos + 1]
            data = b"".join(parts) + data[last:]
    return hex_text(data)
