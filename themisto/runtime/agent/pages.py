"""Which memory a forked branch child may have written, from /proc/self/pagemap: a page it wrote is its own copy
("exclusively mapped", bit 56), a page it never wrote is still shared with the kernel it was forked from.

Runs inside the kernel: standard library only. A page counts as unwritten only when it is present, anonymous, not
exclusive and not all zeros (a page dropped and read again maps the shared zero page); anything else, and anything
this module cannot read, counts as written. The caller must first end every other process that could share the
child's pages (its descendants), and keep KSM off (`usable()`), or a written page could look shared.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from array import array

PAGE = mmap.PAGESIZE
_ENTRY = 8
# Bits 56-63 of a pagemap entry are its last byte (little-endian): present 0x80, swapped 0x40, file-page or
# shared-anonymous 0x20, exclusively mapped 0x01. Unwritten is exactly "present and none of the others".
_TOP_MASK, _TOP_SHARED = 0xE1, 0x80
_WRITTEN = bytes(0 if (b & _TOP_MASK) == _TOP_SHARED else 1 for b in range(256))
_KSM_RUN = "/sys/kernel/mm/ksm/run"


def usable() -> bool:
    """Whether the flags can be trusted here: pagemap is readable and KSM is not merging pages (a merged page is
    shared, whatever was written to it)."""
    try:
        with open(_KSM_RUN) as f:
            if f.read().strip() != "0":
                return False
    except FileNotFoundError:
        pass  # a kernel without KSM
    except OSError:
        return False
    if sys.byteorder != "little":
        return False
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            return len(f.read(_ENTRY)) == _ENTRY
    except OSError:
        return False


def _pages(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The page ranges [first, last] the byte spans cover, merged."""
    ranges: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if high <= low:
            continue
        first, last = low // PAGE, (high - 1) // PAGE
        if ranges and first <= ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return ranges


def _zero_pages(first: int, count: int) -> bool:
    """Whether any of these (present) pages holds only zeros: it may be the shared zero page standing where a
    written page was dropped, so it counts as written."""
    view = memoryview((ctypes.c_char * (count * PAGE)).from_address(first * PAGE)).cast("B")
    heads = array("Q", view.cast("Q")[:: PAGE // 8].tobytes())  # the first word of each page
    if 0 not in heads:
        return False
    zero = bytes(PAGE)
    return any(view[i * PAGE:(i + 1) * PAGE] == zero for i, head in enumerate(heads) if head == 0)


def written(spans: list[tuple[int, int]]) -> bool:
    """True when any page under the spans may have been written by this process since it was forked."""
    try:
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            for first, last in _pages(spans):
                count = last - first + 1
                f.seek(first * _ENTRY)
                entries = f.read(count * _ENTRY)
                if len(entries) != count * _ENTRY:
                    return True
                if 1 in entries[7::_ENTRY].translate(_WRITTEN):
                    return True
                if _zero_pages(first, count):
                    return True
    except (OSError, ValueError, OverflowError):
        return True
    return False
