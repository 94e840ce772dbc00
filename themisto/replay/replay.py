"""Replay a trajectory in a sandboxed kernel, recording after every step its output, time, memory and variables.

Replay honours what the log recorded about the kernel: a logged restart restarts the kernel before the next
execution; a logged interrupt needs no action (the interrupted cell already carries its KeyboardInterrupt). Code
runs after the explicit, reversible cleaning of `themisto.ingest.cleaning`; the step keeps the code as the developer ran
it beside what replay ran. A hook called before each step gets the live session, so callers can run candidate
cells in the exact pre-step state (branch execution) without a second replay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal, Sequence

from themisto.ingest.cleaning import clean_for_replay
from themisto.replay.missing_packages import hidden_modules, hide
from themisto.replay.cell_limits import CELL_TIMEOUT_CEILING_S, CELL_TIMEOUT_S, LOGGED_TIME_FACTOR, cell_limit
from themisto.ingest.trajectory import Execution, Trajectory
from themisto.jsonrecords import from_dict

if TYPE_CHECKING:
    from themisto.replay.values import ValueFolder





@dataclass(frozen=True)
class ReplaySettings:
    """How a trajectory is replayed."""

    snapshots: bool = True  # read a runtime snapshot after every step
    values: bool = True  # and store the variables' values with it (replay_to_file: `<steps>.values/`)
    # How long a cell may run (`themisto.replay.cell_limits.cell_limit`): cell_timeout_s where the log did not see it
    # finish, else max(cell_timeout_s, min(cell_timeout_ceiling_s, logged_time_factor x its developer's seconds)).
    # logged_time_factor None: every cell gets cell_timeout_s (a fixed limit, which the host's load then decides).
    cell_timeout_s: float = CELL_TIMEOUT_S
    logged_time_factor: float | None = LOGGED_TIME_FACTOR
    cell_timeout_ceiling_s: float = CELL_TIMEOUT_CEILING_S
    # What those seconds count (`Limits.cell_clock`): the CPU seconds of the kernel and all it started, so that a cell
    # ends as it did on any host, busy or idle; "wall": seconds of the clock (releases built before 2026-12-04).
    cell_clock: Literal["wall", "cpu"] = "cpu"
    # A cell the developer interrupted (the log never says when) is interrupted by replay too, after
    # interrupted_lines executed lines: the same point, and the same state after it, on any host
    # (themisto.runtime.line_budget); or after interrupted_timeout_s seconds of `cell_clock` if it spends them in C
    # first. interrupted_lines None: the seconds alone (releases built before 2026-12-05: 10 s). The real logs'
    # counted cells (a row loop, a search's Python) ran about 1.5 million lines a CPU second while counted: 10
    # million lines are about 7 s of them, which a host whose other core is busy can double, well inside the 60 s
    # (with 30 million lines and 30 s, four of them ended at 18-20 s on an idle host: too near).
    interrupted_timeout_s: float = 60.0
    interrupted_lines: int | None = 10_000_000
    memory_bytes: int = 4 * 2**30
    output_bytes: int = 2**20
    cores: int | None = 1  # per kernel (`Limits.cores`): a cell's results and time the same on any host


@dataclass
class LoggedOutcome:
    """What the original log recorded about the execution a step replays."""

    status: str
    ename: str | None = None
    evalue: str | None = None
    output_types: list[str] = field(default_factory=list)
    code_state: str = "as_logged"  # whether the log kept the code whole (`themisto.vocabulary.CODE_STATES`)
    seconds: float | None = None  # how long the developer's run took (`Trajectory.logged_seconds`); None: not logged


@dataclass
class Step:
    """One replayed execution with its runtime information; names follow the paper's release where they exist."""

    kernel_id: str
    step: int
    cell_id: str
    code: str  # as the developer ran it
    replayed_code: str  # after cleaning; equal to `code` when no rule applied
    cleaning: list[dict]
    restarted_before: bool  # the log recorded a kernel restart right before this step
    status: str  # ok | error | timeout | kernel_died
    ename: str | None
    evalue: str | None
    output: str  # one comparable text: streams, text/plain results, the error and its ANSI-free traceback
    outputs: list[dict]  # rich outputs kept typed (images as placeholders)
    output_types: list[str]
    execution_time: float  # seconds
    memory_bytes: int | None
    state_hash: str | None
    variables: list[dict]
    snapshot_failures: dict[str, str]
    kernel_restarted: bool  # replay lost the namespace here (timeout escalated or the kernel died)
    rebuilt_steps: int  # after an unplanned loss, how many earlier steps were re-run to rebuild the state
    logged: LoggedOutcome
    notebook: str = ""
    task: str | None = None
    # With stored values: {"unstored": {name: reason}, "modules": {name: module}, "aliases": [[name, ...]]}; a
    # variable's value is the file of its hash in the values folder (themisto.replay.values). None: not stored.
    values: dict | None = None
    time_limit_s: float | None = None  # the seconds replay gave the cell (`cell_limits`); None: a replay made before
    source: str | None = None  # the trajectory's source (`Trajectory.source`); None: a replay made before

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        return from_dict(cls, data, logged=from_dict(LoggedOutcome, data["logged"]))


def _logged(execution: Execution, seconds: float | None) -> LoggedOutcome:
    return LoggedOutcome(execution.status, execution.ename, execution.evalue, execution.output_types,
                         execution.code_state, seconds)


def relogged(steps: list[Step], trajectories: list[Trajectory], where: str) -> list[Step]:
    """`steps` (a replay read back from `where`) with what the log recorded taken from `trajectories` as ingest reads
    them now: a replay observed the code, while the log's verdict on it (its status, whether its code is damaged)
    is ingest's reading, which may have learned since. A step whose code differs from its execution's was replayed
    from another reading of the logs: refused (ValueError), replay again."""
    known = {t.id: t for t in trajectories}
    seconds: dict[str, list[float | None]] = {}
    out = []
    for step in steps:
        trajectory = known.get(step.kernel_id)
        if trajectory is None:
            out.append(step)
            continue
        mine = trajectory.executions
        if step.step >= len(mine) or mine[step.step].code != step.code:
            raise ValueError(f"{where}: trajectory {step.kernel_id} step {step.step} was replayed from another "
                             "reading of the logs (its code differs from the log's now): replay again")
        if trajectory.id not in seconds:
            seconds[trajectory.id] = trajectory.logged_seconds()
        out.append(replace(step, logged=_logged(mine[step.step], seconds[trajectory.id][step.step])))
    return out


def _restart_points(trajectory: Trajectory) -> set[int]:
    return {ev.before for ev in trajectory.events if ev.kind == "restart"}


def life_start(trajectory: Trajectory, step: int) -> int:
    """The first step of the kernel life `step` belongs to (after the last logged restart at or before it)."""
    return max([0] + [point for point in _restart_points(trajectory) if point <= step])


def interrupted_by_developer(status: str | None, ename: str | None) -> bool:
    """Whether the log says its developer interrupted the execution (its KeyboardInterrupt, or a cell left
    running when the kernel was interrupted)."""
    return ename == "KeyboardInterrupt" or status == "interrupted"


def cell_limits(trajectory: Trajectory, settings: ReplaySettings) -> list[float]:
    """The seconds each execution of `trajectory` may run in replay: a cell the developer interrupted gets
    `interrupted_timeout_s`, any other the rule of `themisto.replay.cell_limits` over its logged seconds (an untimed
    one the trajectory's own `cell_timeout_s` where it sets one)."""
    out = []
    # A fixed limit (no logged-time rule) is every cell's; else a trajectory's own default stands for its untimed cells.
    fixed = settings.logged_time_factor is None
    default_s = settings.cell_timeout_s if fixed else (trajectory.cell_timeout_s or settings.cell_timeout_s)
    for execution, seconds in zip(trajectory.executions, trajectory.logged_seconds()):
        if interrupted_by_developer(execution.status, execution.ename):
            out.append(settings.interrupted_timeout_s)
        else:
            out.append(cell_limit(seconds, default_s=default_s, factor=settings.logged_time_factor,
                                  ceiling_s=settings.cell_timeout_ceiling_s))
    return out


def line_budgets(trajectory: Trajectory, settings: ReplaySettings) -> list[int | None]:
    """The lines each execution of `trajectory` may run in replay (themisto.runtime.line_budget): a cell the
    developer interrupted `interrupted_lines`, any other no count (None)."""
    return [settings.interrupted_lines if interrupted_by_developer(e.status, e.ename) else None
            for e in trajectory.executions]


class _Held:
    """What the session's kernel has heard of the values `folder` holds exactly (`ValueStore.held` in the kernel): a
    value an earlier kernel life or another trajectory stored is not encoded, written and read back again. The kernel
    hears of the entries added since it last heard (all of them after a restart), on the request of its snapshot."""

    def __init__(self, folder: ValueFolder | None):
        self.folder = folder
        self.heard_at = (-1, 0)  # (the kernel start that heard, how many of the folder's entries it heard of)
        self.pending = self.heard_at

    def news(self, session) -> list[str]:
        """The hashes to send with the next snapshot request (`heard()` once the snapshot came back)."""
        if self.folder is None:
            return []
        starts = session.kernel_starts
        held, count = self.folder.exact_since(self.heard_at[1] if starts == self.heard_at[0] else 0)
        self.pending = (starts, count)
        return held

    def heard(self) -> None:
        self.heard_at = self.pending


def replay(trajectory: Trajectory, session, settings: ReplaySettings = ReplaySettings(), *,
           values: ValueFolder | None = None, start: int = 0, stop_before: int | None = None,
           limits: Sequence[float] | None = None) -> Iterator[Step]:
    """Replay `trajectory` in a started `KernelSession`, yielding one Step per execution as it completes; with
    `values` (and snapshots on), each snapshot's values are stored there. From `start` on, when the session holds
    the state before it already (restored from stored values: themisto.replay.restore; or left there by a replay
    that stopped before it); until `stop_before`, when given: the replay ends before that step runs, the kernel
    holding the state the step started from (after the log's restart there, with the modules hidden that the log
    shows missing). `limits`: each execution's seconds, where the caller knows better than `cell_limits` (a
    release's trajectory: `themisto.release.states.release_limits`)."""
    from themisto.runtime.line_budget import request_metadata
    from themisto.runtime.outputs import output_text, output_types, rich_outputs
    from themisto.runtime.rebuild import rebuild_state
    from themisto.runtime.snapshot import held_arguments, snapshot_expressions

    values_dir = session.values_dir if values is not None and settings.snapshots else None
    expressions = snapshot_expressions(store=values_dir is not None) if settings.snapshots else None
    held = _Held(values if values_dir is not None else None)
    restarts = _restart_points(trajectory)
    session_start = life_start(trajectory, start)  # first step of the current kernel life, as the log recorded it
    lost: set[int] = set()  # steps that cost the namespace; never re-run when rebuilding it
    limits = list(limits) if limits is not None else cell_limits(trajectory, settings)
    budgets = line_budgets(trajectory, settings)
    logged_seconds = trajectory.logged_seconds()
    hidden = hidden_modules(trajectory.executions, restarts)
    hidden_in: tuple[int, frozenset[str]] = (-1, frozenset())  # (kernel start, modules) the kernel hides now
    for i, execution in enumerate(trajectory.executions):
        if i < start:
            continue
        restarted = i in restarts and i > 0
        if restarted and i > start:  # at `start` the session holds the state after the restart already
            session.restart()
            session_start = i
        if hidden[i] != hidden_in[1] or (hidden[i] and session.kernel_starts != hidden_in[0]):
            hide(session, hidden[i])
            hidden_in = (session.kernel_starts, hidden[i])
        if i == stop_before:
            return
        cleaned = clean_for_replay(execution.code)
        # The snapshot rides on the cell's own request (no second round trip), after a failed cell too
        # (themisto.runtime.launcher); a cell that lost the state is read with a separate silent request below.
        result = session.execute(cleaned.code, timeout=limits[i], user_expressions=expressions,
                                 metadata=request_metadata(budgets[i], held_arguments(held.news(session))))
        rebuilt = 0
        if result.kernel_restarted:
            # The developer's kernel kept its state here; ours lost it. Re-run this kernel life's earlier steps
            # (not the ones that lost it) so the steps after this one see the state they saw in the log.
            done = rebuild_state(session, life_cells(trajectory, session_start, i, settings, limits), restart=False,
                                 lost=lost | {i})
            lost, rebuilt = set(done.lost), done.ran
        snap, snap_error = _snapshot_after(session, result, settings, rebuilt > 0, values_dir, held)
        stored = None
        if snap is not None and snap.values is not None:
            values.take(values_dir, snap.values.written)
            stored = {"unstored": snap.values.unstored, "modules": snap.values.modules,
                      "aliases": snap.values.aliases}
        yield Step(
            kernel_id=trajectory.id, step=i, cell_id=execution.cell_id, code=execution.code,
            replayed_code=cleaned.code, cleaning=[asdict(c) for c in cleaned.changes], restarted_before=restarted,
            status=result.status, ename=result.ename, evalue=result.evalue, output=output_text(result.outputs),
            outputs=rich_outputs(result.outputs), output_types=output_types(result.outputs),
            execution_time=round(result.duration_s, 6), memory_bytes=snap.memory_bytes if snap else None,
            state_hash=snap.state_hash if snap else None,
            variables=[v.to_dict() for v in snap.variables.values()] if snap else [],
            snapshot_failures=dict(snap.failures) if snap else snap_error,
            kernel_restarted=result.kernel_restarted, rebuilt_steps=rebuilt,
            logged=_logged(execution, logged_seconds[i]), notebook=trajectory.notebook, task=trajectory.task,
            values=stored, time_limit_s=limits[i], source=trajectory.source,
        )


def _snapshot_after(session, result, settings: ReplaySettings, rebuilt: bool, values_dir: Path | None = None,
                    held: _Held | None = None):
    """The snapshot after a step (None when off or unreadable; its values written into `values_dir` when given,
    but those `held` already) and what could not be read. (The cell's own time, `result.duration_s`, ends where the
    kernel announced the cell's end, before it took the snapshot.)"""
    from themisto.runtime.snapshot import AgentError, snapshot_from_expressions, take_snapshot

    if not settings.snapshots:
        return None, {}
    held = held or _Held(None)
    try:
        snap = None if rebuilt else snapshot_from_expressions(result.user_expressions)
        if snap is None:
            snap = take_snapshot(session, store=values_dir is not None, held=held.news(session))
        held.heard()
        return snap, {}
    except AgentError as exc:  # recorded on the step; one unreadable state does not end the replay
        return None, {"<snapshot>": str(exc)[:500]}


def life_cells(trajectory: Trajectory, start: int, end: int, settings: ReplaySettings,
               limits: Sequence[float] | None = None) -> list:
    """Steps start..end-1 as replay runs them (cleaned, each with its limit: `limits`, else `cell_limits`, and its
    line budget): what rebuilds the state they made."""
    from themisto.runtime.rebuild import RerunCell

    limits = limits if limits is not None else cell_limits(trajectory, settings)
    budgets = line_budgets(trajectory, settings)
    return [RerunCell(j, clean_for_replay(trajectory.executions[j].code).code, limits[j], budgets[j])
            for j in range(start, end)]


def rebuild_before(session, trajectory: Trajectory, step: int, settings: ReplaySettings = ReplaySettings(), *,
                   lost: frozenset[int] | set[int] = frozenset(), strict: bool = False,
                   limits: Sequence[float] | None = None):
    """Restart the kernel and rebuild the state replay had before `step`: the cells of its kernel life before it,
    without the `lost` steps (those that lost the state in the replay). `themisto.runtime.rebuild.rebuild_state`
    does the work (with `strict`, a cell that loses the state again raises StateLost)."""
    from themisto.runtime.rebuild import rebuild_state

    return rebuild_state(session, life_cells(trajectory, life_start(trajectory, step), step, settings, limits),
                         lost=lost, strict=strict)


def kernel_limits(settings: ReplaySettings):
    """The kernel limits a replay with these settings runs under."""
    from themisto.runtime.kernel import Limits

    return Limits(memory_bytes=settings.memory_bytes, cell_timeout_s=settings.cell_timeout_s,
                  cell_clock=settings.cell_clock,
                  output_bytes=settings.output_bytes, cores=settings.cores)


def kernel_session(trajectory: Trajectory, workspace: str | Path | None, settings: ReplaySettings):
    """A (not yet started) sandboxed kernel session for `trajectory`: over a copy of its own subfolder of `workspace`
    where it names one (`Trajectory.workspace`), started in its `start_dir`, in its kernel environment."""
    from themisto.runtime.kernel import KernelSession
    from themisto.runtime.sandbox import environment_python

    folder = workspace
    if workspace is not None and trajectory.workspace:
        folder = Path(workspace) / trajectory.workspace
    environment = (trajectory.provenance or {}).get("environment")
    return KernelSession(folder, kernel_limits(settings), python=environment_python(environment),
                         start_dir=trajectory.start_dir)


def replay_trajectory(trajectory: Trajectory, workspace: str | Path | None,
                      settings: ReplaySettings = ReplaySettings(), *,
                      values: ValueFolder | None = None) -> Iterator[Step]:
    """Replay `trajectory` in its own fresh sandboxed kernel over a copy of `workspace` (values stored in
    `values` when given and the settings ask for them)."""
    with kernel_session(trajectory, workspace, settings) as session:
        yield from replay(trajectory, session, settings, values=values if settings.values else None)


def replay_in_turn(trajectories: list[Trajectory], workspace: str | Path | None,
                   settings: ReplaySettings = ReplaySettings(), *,
                   values: ValueFolder | None = None) -> Iterator[tuple[Trajectory, Iterator[Step]]]:
    """`replay_trajectory` for each of `trajectories`, one after the other, with the next one's kernel started while
    the current one replays: its start (the workspace copied, about 0.7 s to a ready kernel) hides behind the
    current one's cells. Each kernel is its own session (its own uid, folders and copy of the workspace), so one
    started early shares nothing with the one replaying. Consume (or drop) each steps iterator before the next."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from themisto.runtime.kernel import KernelSession

    def started(trajectory: Trajectory) -> KernelSession:
        session = kernel_session(trajectory, workspace, settings)
        session.start()  # closes what it began when it fails
        return session

    def steps(trajectory: Trajectory, session: KernelSession) -> Iterator[Step]:
        try:
            yield from replay(trajectory, session, settings, values=values if settings.values else None)
        finally:
            session.close()

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="themisto-kernel-ahead")
    ahead: Future | None = None
    current: KernelSession | None = None
    try:
        for index, trajectory in enumerate(trajectories):
            future, ahead = ahead or pool.submit(started, trajectory), None
            current = future.result()  # a start that failed raises here, at its own trajectory
            if index + 1 < len(trajectories):
                ahead = pool.submit(started, trajectories[index + 1])
            yield trajectory, steps(trajectory, current)
            current.close()  # already closed when its steps were consumed
    finally:
        if current is not None:
            current.close()
        if ahead is not None:
            try:
                ahead.result().close()
            except Exception:  # noqa: BLE001 - a start that failed has nothing left to close
                pass
        pool.shutdown(wait=True)

