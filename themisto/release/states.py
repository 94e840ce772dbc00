"""The one server of a release trajectory's live pre-step states, in trajectory order, from one kernel.

Scoring's execution (the reference and the predictions branched before each scored step), generation's `probe` mode
(a conversation's probes branched before its example's step) and the Inspect probe tool all need the exact kernel
state a developer had before a step. Here a trajectory's `trajectories` rows become a Trajectory again and one
sandboxed kernel is brought to each asked step in turn, by replaying the cells up to it or, where the release stores
values and that is cheaper, by restoring the state from them (`themisto.replay.restore`, checked against the state
hash the build recorded):

    with pre_step_states(release, kernel_id, [3, 7], workspace) as states:
        for state in states:          # the kernel holds the state before state.step
            ...                       # branch it; state.rebuild() after a branch took the kernel down

Leaving a step resumes the walk from that step's state; the walk ends after the last asked step. Errors of the kernel
or of the replay (KernelStartError, AgentError, OSError) propagate from the `with` or the loop: the steps not yet
handed out were not served.
"""

from __future__ import annotations

import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from themisto.release.folder import ReleaseInfo
from themisto.release.workspaces import ReleaseInputs, SourceFolders, open_inputs, trajectory_from_rows
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


@dataclass
class RestoreRecord:
    """What restoring from stored values did in one walk (the `TrajectoryScore` fields of the same names): the first
    step restored (None: every state was replayed to), how many, their seconds together, and why none or the last
    one was not used ("" when every one was)."""

    restored_step: int | None = None
    restores: int = 0
    restore_s: float | None = None
    restore_note: str | None = None


def release_limits(rows: Sequence[dict], settings: ReplaySettings) -> list[float]:
    """Each row's limit when its trajectory is walked again: the release's rows keep no logged times, so the rule of
    `themisto.replay.cell_limits` runs over the seconds the build's replay took (a step it stopped at its limit is
    stopped after as long again), so that a long cell that ended in the build ends here too, on a host of any load."""
    from themisto.replay.cell_limits import cell_limit
    from themisto.replay.replay import interrupted_by_developer

    out = []
    # A fixed limit (no logged-time rule) is every cell's; else a trajectory's own default stands for its untimed cells.
    own = (rows[0].get("rebuild") or {}).get("cell_timeout_s") if rows else None
    default_s = settings.cell_timeout_s if settings.logged_time_factor is None else (own or settings.cell_timeout_s)
    for row in rows:
        seconds = float(row.get("execution_time") or 0.0)
        if interrupted_by_developer(row.get("logged_status"), row.get("logged_ename")):
            out.append(settings.interrupted_timeout_s)
        elif row.get("status") == "timeout":
            out.append(max(seconds, 1.0))
        else:
            out.append(cell_limit(seconds, default_s=default_s, factor=settings.logged_time_factor,
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


class PreStepStates:
    """The walk `pre_step_states` hands out: iterate it once for each asked step's state, in step order; `restored`
    says what restoring did."""

    def __init__(self, release: ReleaseInfo, rows: Sequence[dict], steps: Iterable[int], session,
                 settings: ReplaySettings, restore: bool):
        self.asked = sorted(set(int(s) for s in steps))
        self.rows, self.session, self.settings = rows, session, settings
        last = self.asked[-1] if self.asked else -1
        self.trajectory = trajectory_from_rows(rows[: last + 1]) if self.asked else None
        self.limits = release_limits(rows[: last + 1], settings)
        self.lost = frozenset(r["step"] for r in rows if r["kernel_restarted"])  # the build's replay lost the state
        self.values = release.values() if restore else None
        self.restored = RestoreRecord()
        if restore and not self.values.rows:
            self.values, self.restored.restore_note = None, "no restore: the release stores no values"

    def __iter__(self) -> Iterator[PreStepState]:
        from themisto.replay.replay import life_start, replay

        holds = 0  # the kernel holds the state before this step (0: fresh)
        restoring, last_s = self.values is not None, None
        for number, step in enumerate(self.asked):
            # Restore before the first asked step, and before a later one whose gap costs more to replay than the
            # last restore took; the same kernel restores again, its modules imported once.
            if restoring and (number == 0 or life_start(self.trajectory, step) < step
                              and _worth_restoring(self.rows, holds, step, last_s)):
                seconds = self._restore(step)
                if seconds is not None:
                    holds, last_s = step, seconds
                else:
                    if life_start(self.trajectory, step) < step:
                        restoring = False  # this trajectory's values do not restore its states: replay it
                    if number:
                        # The failed restore left a fresh kernel; the cells skipped may have written files the
                        # later ones read, so the replay starts over from the first cell.
                        self.session.restart()
                    holds = 0
            # Up to the step (from a restored state too: the replay hides there what the log shows missing).
            for _ in replay(self.trajectory, self.session, self.settings, start=holds, stop_before=step,
                            limits=self.limits):
                pass
            holds = step
            yield self._state(step)

    def _state(self, step: int) -> PreStepState:
        from themisto.replay.replay import life_cells, life_start, rebuild_before

        trajectory, settings, session = self.trajectory, self.settings, self.session
        prefix = [cell.code for cell in life_cells(trajectory, life_start(trajectory, step), step, settings,
                                                   self.limits) if cell.step not in self.lost]
        return PreStepState(step, session, prefix, lambda: rebuild_before(
            session, trajectory, step, settings, lost=self.lost, strict=True, limits=self.limits))

    def _restore(self, step: int) -> float | None:
        """Restore the state before `step` from the release's values: its seconds, or None (the kernel is fresh)."""
        from themisto.replay.restore import RestoreError, restore_before

        record = self.restored
        try:
            done = restore_before(self.session, self.rows, step, self.values,
                                  cell_timeout_s=self.settings.cell_timeout_s)
        except RestoreError as error:
            record.restore_note = f"no restore: {str(error)[:300]}"
            return None
        if done.step is None:
            record.restore_note = done.note
            return None
        if record.restored_step is None:
            record.restored_step = done.step
        if record.restore_note is None:
            record.restore_note = ""
        record.restores += 1
        record.restore_s = round((record.restore_s or 0.0) + done.seconds, 6)
        return done.seconds


@contextmanager
def pre_step_states(release: ReleaseInfo, kernel_id: str, steps: Iterable[int],
                    inputs: ReleaseInputs | SourceFolders | str | Path | None, *, limits=None,
                    restore: bool = False) -> Iterator[PreStepStates]:
    """One fresh sandboxed kernel over a copy of the trajectory `kernel_id`'s input files (`inputs`: found for the
    release already, or where to look for them, `themisto.release.workspaces`), started where and in the environment
    its replay was, brought in turn to the state before each of `steps`: iterate what this yields. With `restore`, a
    state is restored from the release's stored values where that is cheaper than replaying to it (none stored: every
    state is replayed to, and the record says why). `limits` (`themisto.runtime.kernel.Limits`) defaults to what the
    release's replay settings give. A ReleaseError when the release has no rows of that trajectory (or cannot say
    how to rebuild its states); `themisto.release.workspaces.SourcesUnavailable` when its files or environment are
    not here."""
    from themisto.replay.replay import kernel_limits
    from themisto.runtime.kernel import KernelSession
    from themisto.runtime.sandbox import environment_python

    rows = release.trajectory(kernel_id)
    with ExitStack() as stack:
        if not isinstance(inputs, ReleaseInputs):
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="themisto-states-")))
            inputs = open_inputs(release, inputs, tmp)
        placement = inputs.place(kernel_id)
        settings = recorded_replay_settings(release.replay)
        session = stack.enter_context(KernelSession(
            placement.folder, limits if limits is not None else kernel_limits(settings),
            python=environment_python(placement.environment), start_dir=placement.start_dir))
        yield PreStepStates(release, rows, steps, session, settings, restore)


# A restore's cost before any was measured in this kernel: a cold one (the modules imported) at the median step of the
# real task-1 trajectory took 2.3-4.6 s at load 2.4.
_RESTORE_GUESS_S = 5.0


def _worth_restoring(rows: Sequence[dict], step: int, following: int, last_s: float | None) -> bool:
    """Whether restoring the state before `following` is cheaper than replaying the cells from `step` to it, by the
    times the release's replay recorded for them and what the last restore in this kernel took."""
    gap_s = sum(float(r.get("execution_time") or 0.0) for r in rows if step <= r["step"] < following)
    return gap_s > (last_s if last_s is not None else _RESTORE_GUESS_S)
