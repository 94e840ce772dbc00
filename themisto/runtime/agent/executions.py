"""How many cells the kernel has run since it was first asked: a count IPython's `pre_execute` event moves, so that
what the kernel computed of its own namespace can be kept while the count stands (a probe conversation asks for a
branch of one state many times; the state is hashed once, not once per probe).

`pre_execute` fires for every non-empty cell, silent ones included (a restore's cells, a replay's); the agent's own
calls are empty cells carrying user expressions, which return before it fires, so they never move the count; the
few of them that change the namespace (a restore) move it themselves (`moved`). Code the kernel runs outside a cell
(a thread a cell started) is not counted: such a state has no one pre-cell state anyway.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

from typing import Any

_EVENT = "pre_execute"


class _Count:
    """The pre_execute callback: one per kernel process, registered on the first ask."""

    def __init__(self) -> None:
        self.cells = 0

    def __call__(self) -> None:
        self.cells += 1


_COUNT = _Count()


def cells_run(shell: Any) -> int | None:
    """The count of cells the kernel has run since it was first asked; None when it cannot count (a shell without
    events). A callback found missing (a cell removed it) is registered again and the count moved, so nothing kept
    at an earlier count is taken for this state: the cells run meanwhile went uncounted."""
    events = getattr(shell, "events", None)
    callbacks = getattr(events, "callbacks", None)
    if not isinstance(callbacks, dict) or _EVENT not in callbacks:
        return None
    if not any(callback is _COUNT or getattr(callback, "__wrapped__", None) is _COUNT  # adapted by backcall
               for callback in callbacks[_EVENT]):
        try:
            events.register(_EVENT, _COUNT)
        except (ValueError, TypeError, AttributeError):
            return None
        _COUNT.cells += 1
    return _COUNT.cells


def moved() -> None:
    """Say that the namespace changed without a cell (an agent call rebuilt it): what was kept no longer holds."""
    _COUNT.cells += 1
