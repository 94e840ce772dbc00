"""Rebuilding a kernel's state: run again, in a fresh kernel, the cells that made it.

The one rebuild: replay's after a cell lost the state (`themisto.replay.replay`), the scorer's after a prediction
took the kernel down, and the branch fallback's before each candidate (`themisto.runtime.branch`). A cell that loses
the state again while it is rebuilt is left out and the rebuild starts over without it, as replay does; a caller that
needs the state exactly as it was asks for `strict` and gets `StateLost` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from themisto.runtime.line_budget import request_metadata


@dataclass(frozen=True)
class RerunCell:
    """One cell of a rebuild: its step in the trajectory, the code to run, its timeout (None: the session's) and its
    line budget (themisto.runtime.line_budget; None: not counted)."""

    step: int
    code: str
    timeout_s: float | None = None
    lines: int | None = None


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: how many cells it ran (over every start) and the steps left out because they lost the
    state (those it was given, and any that lost it again)."""

    ran: int
    lost: frozenset[int]


class StateLost(RuntimeError):
    """A strict rebuild met a cell that lost the state: the state cannot be rebuilt as it was."""

    def __init__(self, step: int, status: str, evalue: str | None):
        self.step = step
        super().__init__(f"step {step} ended {status} while the state was rebuilt ({evalue or 'no detail'})")


def rebuild_state(session: Any, cells: Sequence[RerunCell], *, restart: bool = True,
                  lost: frozenset[int] | set[int] = frozenset(), strict: bool = False) -> Rebuilt:
    """Run `cells` in order in the session's kernel (restarted first when `restart`), leaving out the steps in
    `lost`. A cell that loses the state (its kernel restarted) joins the lost steps and the rebuild starts over in
    the fresh kernel; with `strict` it raises StateLost instead."""
    if restart:
        session.restart()
    left_out, ran = set(lost), 0
    while True:
        for cell in cells:
            if cell.step in left_out:
                continue
            result = session.execute(cell.code, timeout=cell.timeout_s, metadata=request_metadata(cell.lines))
            ran += 1
            if result.kernel_restarted:
                if strict:
                    raise StateLost(cell.step, result.status, result.evalue)
                left_out.add(cell.step)
                break
        else:
            return Rebuilt(ran, frozenset(left_out))
