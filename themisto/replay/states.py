"""A release trajectory's live pre-step states, served in trajectory order from one replay.

The scorer's execution (predictions branched before each scored step) and generation's `probe` mode (a model's
probes branched before its example's step) both need the exact kernel state a developer had before a step. Here the
release's `trajectories` rows become a Trajectory again, it is replayed once in a fresh sandboxed kernel, and each
asked step's state is handed to a callback before the step runs; the replay stops after the last asked step.
"""

from __future__ import annotations

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


def trajectory_from_rows(rows: Sequence[dict]):
    """A Trajectory that replays a release's `trajectories` rows: the developer's code, logged outcomes, restarts."""
    from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory

    executions = [Execution(cell_id=r["cell_id"], code=r["code"], status=r.get("logged_status") or "unknown",
                            ename=r.get("logged_ename"), evalue=r.get("logged_evalue")) for r in rows]
    events = [KernelEvent("restart", before=r["step"]) for r in rows if r["restarted_before"] and r["step"] > 0]
    first = rows[0]
    return Trajectory(id=first["kernel_id"], notebook=first.get("notebook") or "", source="release",
                      executions=executions, events=events, task=first.get("task"))


def recorded_replay_settings(recorded: dict) -> ReplaySettings:
    """The replay settings a release was built with (its build report's record), without snapshots: whoever walks
    the states takes its own."""
    known = {f.name for f in fields(ReplaySettings)}
    return ReplaySettings(**{**{k: v for k, v in recorded.items() if k in known}, "snapshots": False})


def walk_states(rows: Sequence[dict], steps: Iterable[int], workspace: str | Path, settings: ReplaySettings,
                at_step: Callable[[PreStepState], None], *, limits=None,
                restore: Callable[[Any, int], int] | None = None) -> None:
    """Replay the trajectory of `rows` (one kernel's `trajectories` rows, in step order) once in a fresh sandboxed
    kernel over a copy of `workspace`, and call `at_step` with the live state before each of `steps`, in order.
    `restore(session, first asked step)`, when given, rebuilds a state from stored values first (themisto.replay.
    restore) and returns the step the kernel now holds the state before (0: nothing restored); the replay starts
    there instead of at the first cell.

    `limits` (`themisto.runtime.kernel.Limits`) defaults to what the replay settings give. Errors of the kernel or of
    the replay propagate (KernelStartError, AgentError, OSError): the steps `at_step` has not seen were not served.
    """
    from themisto.replay.replay import kernel_limits, life_cells, life_start, rebuild_before, replay
    from themisto.runtime.kernel import KernelSession

    asked = sorted(set(int(s) for s in steps))
    if not asked:
        return
    trajectory = trajectory_from_rows(rows[: asked[-1] + 1])
    lost = frozenset(r["step"] for r in rows if r["kernel_restarted"])  # the release's replay lost the state there
    wanted = set(asked)

    def before_step(_trajectory, step: int, session) -> None:
        if step in wanted:
            prefix = [cell.code for cell in life_cells(trajectory, life_start(trajectory, step), step, settings)
                      if cell.step not in lost]
            at_step(PreStepState(step, session, prefix, lambda: rebuild_before(session, trajectory, step, settings,
                                                                                lost=lost, strict=True)))
        if step == asked[-1]:
            raise _Done

    try:
        with KernelSession(workspace, limits if limits is not None else kernel_limits(settings)) as session:
            start = restore(session, asked[0]) if restore is not None else 0
            for _ in replay(trajectory, session, settings, before_step=before_step, start=start):
                pass
    except _Done:
        pass
