"""How long a replayed cell may run: the rule that gives a cell the time its developer's run took, so a long cell ends
in replay as it ended in the log whatever the load of the host that builds the release.

limit = max(default, min(ceiling, factor × logged seconds)) for a cell the log saw finish; the default for one it did
not (no `execute` or no finish logged). The logged seconds are `Trajectory.logged_seconds` (a queued cell's wait is
not counted). A developer's run had the cores of a laptop (sklearn's `n_jobs=-1` used them all) and the real inputs;
a replay kernel has one core (`ReplaySettings.cores`) on a host of any load, and the look-alike inputs: hence a
factor, and a ceiling because a logged finish can lie hours after the cell's start (a laptop asleep, a cell waiting
for input: 10,474 s for a commented-out line in the real logs), and a cell that hangs in replay costs its whole limit.
"""

from __future__ import annotations

# The limit of a cell the log never saw finish, and the floor of every limit. Each kernel has one core: a model fit
# that took 37 s with two cores takes about 70 s on one (real logs, 69be72c3), and a 60 s budget turned two completed
# cells into timeouts.
CELL_TIMEOUT_S = 120.0
# A cell the developer saw finish in t seconds may run LOGGED_TIME_FACTOR × t: their searches used every core of their
# machine (n_jobs=-1), the replay one. 9667b100's grid search (162 forests x 5 folds, 288 s for its developer) needs
# about 1,800 CPU seconds on one core (a forest of 300 trees of depth 8 / 500 of depth 12 on 1,440 random rows of 12
# features took 1.5 / 3.0 CPU s here; the look-alike train set has 1,800 rows): 6.3 x its developer's time.
LOGGED_TIME_FACTOR = 8.0
# No cell runs longer than this, whatever the log says (the real logs' longest searches: 288 s and 619 s).
CELL_TIMEOUT_CEILING_S = 3600.0


def cell_limit(logged_s: float | None, *, default_s: float = CELL_TIMEOUT_S, factor: float | None = LOGGED_TIME_FACTOR,
               ceiling_s: float = CELL_TIMEOUT_CEILING_S) -> float:
    """The seconds a replayed cell may run, from the seconds its developer's run took (None: not logged, or the rule
    is off with `factor` None: the default).

    >>> cell_limit(None), cell_limit(10.0), cell_limit(288.4), cell_limit(10_473.7), cell_limit(288.4, factor=None)
    (120.0, 120.0, 2307.2, 3600.0, 120.0)
    """
    if logged_s is None or factor is None:
        return default_s
    return max(default_s, min(ceiling_s, round(factor * logged_s, 3)))


def describe(default_s: float, factor: float | None, ceiling_s: float, clock: str = "wall", *,
             interrupted_s: float | None = None, interrupted_lines: int | None = None) -> str:
    """The rule in words, for the release's settings and its card (`clock`: what a limit's seconds count;
    `interrupted_s` and `interrupted_lines`: the limits of a cell its developer interrupted, where recorded)."""
    if factor is None:
        rule = f"every cell may run {default_s:g} s (a fixed limit: --cell-timeout)"
    else:
        rule = (f"a cell the log saw finish may run max({default_s:g} s, min({ceiling_s:g} s, {factor:g} x the "
                f"seconds its developer's run took)); a cell it did not see finish, {default_s:g} s")
    if interrupted_lines is not None:
        rule += (f"; a cell its developer interrupted is interrupted after {interrupted_lines:,} executed lines (the "
                 f"same point on any host), or after {interrupted_s:g} s if it spends them in compiled code first")
    elif interrupted_s is not None:
        rule += f"; a cell its developer interrupted, {interrupted_s:g} s"
    if clock != "cpu":
        return rule
    from themisto.runtime.kernel_requests import CPU_CLOCK_WALL_FACTOR

    return (f"{rule}; seconds of CPU of the kernel and all it started, whatever the host's load (a cell that waits "
            f"without computing is stopped after {CPU_CLOCK_WALL_FACTOR:g} x its limit in seconds of the clock not "
            f"spent waiting for a core)")
