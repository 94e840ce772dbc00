"""A release trajectory's live pre-step states, served in trajectory order from one replay.

The scorer's execution (predictions branched before each scored step) and generation's `probe` mode (a model's
probes branched before its example's step) both need the exact kernel state a developer had before a step. Here the
release's `trajectories` rows become a Trajectory again, it is replayed once in a fresh sandboxed kernel, and each
asked step's state is handed to a callback before the step runs; the replay stops after the last asked step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from themisto.replay.replay import ReplaySettings


@dataclass(frozen=True)
class PreStepState:
    """The live state before `step`: its session, the cells that rebuild it (the branch fallback's prefix), and
    `rebuild()`, which restarts the kernel and rebuilds this state (after a branch took the kernel down; it raises
    `themisto.runtime.rebuild.StateLost` when a cell loses the state again)."""

    step: int
    session: Any
    prefix: list[str]
    rebuild: Callable[[], None]


class _Done(Exception):
    """The last asked step has been served: the rest of the trajectory is not needed."""


class _Jump(Exception):
    """The next asked step is cheaper to restore than to replay up to."""

    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


def trajectory_from_rows(rows: Sequence[dict]):
    """A Trajectory that replays a release's `trajectories` rows: the developer's code, logged outcomes, restarts."""
    from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory

    executions = [Execution(cell_id=r["cell_id"], code=r["code"], status=r.get("logged_status") or "unknown",
                            ename=r.get("logged_ename"), evalue=r.get("logged_evalue")) for r in rows]
    events = [KernelEvent("restart", before=r["step"]) for r in rows if r["restarted_before"] and r["step"] > 0]
    first = rows[0]
    return Trajectory(id=first["kernel_id"], notebook=first.get("notebook") or "", source="release",
                      executions=executions, events=events, task=first.get("task"))


def release_limits(rows: Sequence[dict], settings: ReplaySettings) -> list[float]:
    """Each row's limit when its trajectory is walked again: the release's rows keep no logged times, so the rule of
    `themisto.replay.cell_limits` runs over the seconds the build's replay took (a step it stopped at its limit is
    stopped after as long again), so that a long cell that ended in the build ends here too, on a host of any load."""
    from themisto.replay.cell_limits import cell_limit
    from themisto.replay.replay import interrupted_by_developer

    out = []
    for row in rows:
        seconds = float(row.get("execution_time") or 0.0)
        if interrupted_by_developer(row.get("logged_status"), row.get("logged_ename")):
            out.append(settings.interrupted_timeout_s)
        elif row.get("status") == "timeout":
            out.append(max(seconds, 1.0))
        else:
            out.append(cell_limit(seconds, default_s=settings.cell_timeout_s, factor=settings.logged_time_factor,
                                  ceiling_s=settings.cell_timeout_ceiling_s))
    return out


def recorded_replay_settings(recorded: dict) -> ReplaySettings:
    """The replay settings a release was built with (its build report's record), without snapshots: whoever walks
    the states takes its own."""
    known = {f.name for f in fields(ReplaySettings)}
    # A release that does not say its clock was built when every limit counted wall seconds, one that does not say
    # its line budget before interrupted cells had one.
    return ReplaySettings(**{"cell_clock": "wall", "interrupted_lines": None,
                             **{k: v for k, v in recorded.items() if k in known},
                             "snapshots": False})


def walk_states(rows: Sequence[dict], steps: Iterable[int], workspace: str | Path, settings: ReplaySettings,
                at_step: Callable[[PreStepState], None], *, limits=None,
                restore: Callable[[Any, int], int] | None = None) -> None:
    """Replay the trajectory of `rows` (one kernel's `trajectories` rows, in step order) once in a fresh sandboxed
    kernel over a copy of `workspace`, and call `at_step` with the live state before each of `steps`, in order.
    `restore(session, step)`, when given, rebuilds the state before an asked step from stored values (themisto.replay.
    restore) and returns the step the kernel now holds the state before (0: nothing restored, and the kernel is fresh
    or still holds the state it held); the replay goes on from there. It is asked before the first asked step, and
    again before each later one whose gap the replay's own times say costs more to replay than the last restore
    took (`_worth_restoring`): the same kernel restores again, its modules imported once, however many steps it
    restores. After a restore that fails (the kernel restarted fresh), the replay starts over from the first cell,
    serving no step twice, and the trajectory restores no more.

    `limits` (`themisto.runtime.kernel.Limits`) defaults to what the replay settings give. Errors of the kernel or of
    the replay propagate (KernelStartError, AgentError, OSError): the steps `at_step` has not seen were not served.
    """
    from themisto.replay.replay import kernel_limits, life_cells, life_start, rebuild_before, replay
    from themisto.runtime.kernel import KernelSession

    asked = sorted(set(int(s) for s in steps))
    if not asked:
        return
    trajectory = trajectory_from_rows(rows[: asked[-1] + 1])
    cell_seconds = release_limits(rows[: asked[-1] + 1], settings)
    lost = frozenset(r["step"] for r in rows if r["kernel_restarted"])  # the release's replay lost the state there
    wanted, served = set(asked), set()
    restoring = {"on": restore is not None, "last_s": None}

    def restored(session, step: int) -> int:
        began = time.perf_counter()
        found = restore(session, step)
        if found == step:
            restoring["last_s"] = time.perf_counter() - began
        elif life_start(trajectory, step) < step:
            restoring["on"] = False  # this trajectory's values do not restore its states: replay it
        return found

    def before_step(_trajectory, step: int, session) -> None:
        if step in wanted and step not in served:
            served.add(step)
            prefix = [cell.code for cell in life_cells(trajectory, life_start(trajectory, step), step, settings,
                                                       cell_seconds) if cell.step not in lost]
            at_step(PreStepState(step, session, prefix, lambda: rebuild_before(session, trajectory, step, settings,
                                                                                lost=lost, strict=True,
                                                                                limits=cell_seconds)))
            following = next((s for s in asked if s > step), None)
            if (following is not None and restoring["on"] and life_start(trajectory, following) < following
                    and _worth_restoring(rows, step, following, restoring["last_s"])):
                raise _Jump(following)
        if step == asked[-1]:
            raise _Done

    try:
        with KernelSession(workspace, limits if limits is not None else kernel_limits(settings)) as session:
            start = restored(session, asked[0]) if restore is not None else 0
            while True:
                try:
                    for _ in replay(trajectory, session, settings, before_step=before_step, start=start,
                                    limits=cell_seconds):
                        pass
                    return
                except _Jump as jump:
                    start = restored(session, jump.step)
                    if start != jump.step:
                        session.restart()  # whatever the failed restore left, the replay starts over from a fresh kernel
                        start = 0
    except _Done:
        pass


# A restore's cost before any was measured in this kernel: a cold one (the modules imported) at the median step of the
# real task-1 trajectory took 2.3-4.6 s at load 2.4.
_RESTORE_GUESS_S = 5.0


def _worth_restoring(rows: Sequence[dict], step: int, following: int, last_s: float | None) -> bool:
    """Whether restoring the state before `following` is cheaper than replaying the cells from `step` to it, by the
    times the release's replay recorded for them and what the last restore in this kernel took."""
    gap_s = sum(float(r.get("execution_time") or 0.0) for r in rows if step <= r["step"] < following)
    return gap_s > (last_s if last_s is not None else _RESTORE_GUESS_S)
