"""Kernel side: stop a cell after a fixed amount of Python work, the same point on any host.

A cell its developer interrupted did not finish for them, and the log does not say when they pressed stop (in the
real logs such a cell's `execute` line is missing). A limit in seconds, even CPU seconds, stops such a cell wherever
the host had got it to: on a host whose other core is busy the same work costs up to twice the CPU seconds (the real
release's cells took 1.5 to 2.4 times as long beside two busy processes), and a loop that fills a table leaves a
longer or a shorter table for every later step. So the host gives such a cell a budget of executed lines
(`LINE_BUDGET_KEY` in its request's metadata): the kernel counts the lines the cell and the code it calls execute,
and raises `LineBudgetSpent` (a KeyboardInterrupt, as the developer's Ctrl-C was) when the budget is spent; the host
reports the cell stopped at its limit (`timeout`), as it reports one stopped by seconds, and reseeds the random
generators after either, so a cell stopped by lines on one host and by seconds on another leaves the same status and
draws. The count leaves out the kernel's own machinery (ipykernel, IPython, zmq, asyncio, threading, logging, tqdm
and themisto), whose paths depend on the clock (whether an output flush is already scheduled, whether a progress bar
redraws), so a cell that does not branch on the clock itself stops at the same line with the same state. A cell that
spends its time in C (a model fit) executes few lines and meets the host's limit in seconds first; a cell that
catches KeyboardInterrupt goes on until it does. Tracing costs a counted cell 2-6 times its speed (measured here: a
pandas row-append loop 2.4x, a bare Python loop 5.8x); only cells with a budget are traced.
"""

from __future__ import annotations

import os
import sys

# The request metadata key that carries a cell's budget (an int: lines).
LINE_BUDGET_KEY = "themisto_line_budget"


class LineBudgetSpent(KeyboardInterrupt):
    """Raised in a counted cell once its budget of lines is spent (the host reads its name in the reply)."""
# Modules whose lines are not counted: the kernel's own machinery, whose paths depend on the clock.
_NOT_COUNTED = ("ipykernel", "IPython", "zmq", "tornado", "jupyter_client", "traitlets", "comm", "asyncio",
                "threading", "logging", "selectors", "queue", "tqdm", "themisto")


def _uncounted_places() -> tuple[str, ...]:
    """The files and folders of `_NOT_COUNTED` (as code objects name them), found without importing them."""
    import importlib.util

    places = []
    for name in _NOT_COUNTED:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin:
            continue
        if spec.submodule_search_locations:  # a package: everything under its folder
            places += [os.path.join(folder, "") for folder in spec.submodule_search_locations]
        else:
            places.append(spec.origin)
    return tuple(places)


class LineBudget:
    """Counts the lines a cell executes in this thread (`start`), and raises KeyboardInterrupt in the cell once
    `lines` have run; `stop` ends the count."""

    def __init__(self) -> None:
        self._uncounted: tuple[str, ...] | None = None  # found at the first counted cell, not at every kernel start
        self._counted: dict[object, bool] = {}  # per code object: whether its lines count
        self.lines = self.left = 0
        self.counting = False

    def _on_call(self, frame, event, arg):
        code = frame.f_code
        counted = self._counted.get(code)
        if counted is None:
            counted = self._counted[code] = not code.co_filename.startswith(self._uncounted)
        return self._on_line if counted else None

    def _on_line(self, frame, event, arg):
        if event == "line":
            self.left -= 1
            if self.left <= 0:
                # Raised here, it surfaces in the cell at this line; CPython then stops tracing the thread.
                raise LineBudgetSpent(f"the cell ran its budget of {self.lines:,} lines")
        return self._on_line

    def start(self, lines: int) -> None:
        if self._uncounted is None:
            self._uncounted = _uncounted_places()
        self.lines = self.left = int(lines)
        self.counting = True
        sys.settrace(self._on_call)

    def stop(self) -> None:
        # Only after a counted cell: a branch child's audit hook reports every sys.settrace as tampering.
        if self.counting:
            self.counting = False
            sys.settrace(None)


def install(ipython: object) -> None:
    """Count the lines of every cell whose request carries LINE_BUDGET_KEY (from IPython's pre_run_cell to its
    post_run_cell, so the snapshot that follows a cell is never counted)."""
    kernel = getattr(ipython, "kernel", None)
    if kernel is None:
        return
    budget = LineBudget()

    def before(*_: object) -> None:
        lines = (kernel.get_parent("shell") or {}).get("metadata", {}).get(LINE_BUDGET_KEY)
        if isinstance(lines, int) and not isinstance(lines, bool) and lines > 0:
            budget.start(lines)

    def after(*_: object) -> None:
        budget.stop()

    ipython.events.register("pre_run_cell", before)  # type: ignore[attr-defined]
    ipython.events.register("post_run_cell", after)  # type: ignore[attr-defined]


def request_metadata(lines: int | None, metadata: dict | None = None) -> dict | None:
    """Host side: a cell request's metadata (`metadata`, or None) with its line budget added when it has one."""
    if lines is None:
        return metadata
    return {**(metadata or {}), LINE_BUDGET_KEY: int(lines)}
