"""Replay a trajectory in a sandboxed kernel, recording after every step its output, time, memory and variables.

Replay honours what the log recorded about the kernel: a logged restart restarts the kernel before the next
execution; a logged interrupt needs no action (the interrupted cell already carries its KeyboardInterrupt). Code
runs after the explicit, reversible cleaning of `themisto.ingest.cleaning`; the step keeps the code as the developer ran
it beside what replay ran. A hook called before each step gets the live session, so callers can run candidate
cells in the exact pre-step state (branch execution) without a second replay.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from themisto.ingest.cleaning import clean_for_replay
from themisto.ingest.trajectory import Execution, Trajectory
from themisto.jsonrecords import from_dict
from themisto.resume import LineWriter, write_json_atomic

# Called before step `i` runs, with the trajectory, `i` and the live session (the exact pre-step state).
BeforeStep = Callable[[Trajectory, int, "KernelSession"], None]  # noqa: F821 (imported lazily)


@dataclass(frozen=True)
class ReplaySettings:
    """How a trajectory is replayed."""

    snapshots: bool = True  # read a runtime snapshot after every step
    cell_timeout_s: float = 60.0
    # A cell the developer interrupted gets this long before replay interrupts it too.
    interrupted_timeout_s: float = 10.0
    memory_bytes: int = 4 * 2**30
    output_bytes: int = 2**20


@dataclass
class LoggedOutcome:
    """What the original log recorded about the execution a step replays."""

    status: str
    ename: str | None = None
    evalue: str | None = None
    output_types: list[str] = field(default_factory=list)


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

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        return from_dict(cls, data, logged=from_dict(LoggedOutcome, data["logged"]))


def _logged(execution: Execution) -> LoggedOutcome:
    return LoggedOutcome(execution.status, execution.ename, execution.evalue, execution.output_types)


def _restart_points(trajectory: Trajectory) -> set[int]:
    return {ev.before for ev in trajectory.events if ev.kind == "restart"}


def life_start(trajectory: Trajectory, step: int) -> int:
    """The first step of the kernel life `step` belongs to (after the last logged restart at or before it)."""
    return max([0] + [point for point in _restart_points(trajectory) if point <= step])


def _timeout_for(execution: Execution, settings: ReplaySettings) -> float:
    if execution.ename == "KeyboardInterrupt" or execution.status == "interrupted":
        return settings.interrupted_timeout_s
    return settings.cell_timeout_s


def replay(trajectory: Trajectory, session, settings: ReplaySettings = ReplaySettings(), *,
           before_step: BeforeStep | None = None) -> Iterator[Step]:
    """Replay `trajectory` in a started `KernelSession`, yielding one Step per execution as it completes."""
    from themisto.runtime.outputs import output_text, output_types, rich_outputs
    from themisto.runtime.rebuild import rebuild_state
    from themisto.runtime.snapshot import SNAPSHOT_EXPRESSIONS

    restarts = _restart_points(trajectory)
    session_start = 0  # first step of the current kernel life, as the log recorded it
    lost: set[int] = set()  # steps that cost the namespace; never re-run when rebuilding it
    for i, execution in enumerate(trajectory.executions):
        restarted = i in restarts and i > 0
        if restarted:
            session.restart()
            session_start = i
        if before_step is not None:
            before_step(trajectory, i, session)
        cleaned = clean_for_replay(execution.code)
        # The snapshot rides on the cell's own request (no second round trip); IPython evaluates it only after a
        # cell that succeeded, so failed cells are read with a separate silent request below.
        result = session.execute(cleaned.code, timeout=_timeout_for(execution, settings),
                                 user_expressions=SNAPSHOT_EXPRESSIONS if settings.snapshots else None)
        rebuilt = 0
        if result.kernel_restarted:
            # The developer's kernel kept its state here; ours lost it. Re-run this kernel life's earlier steps
            # (not the ones that lost it) so the steps after this one see the state they saw in the log.
            done = rebuild_state(session, life_cells(trajectory, session_start, i, settings), restart=False,
                                 lost=lost | {i})
            lost, rebuilt = set(done.lost), done.ran
        snap, snap_error = _snapshot_after(session, result, settings, rebuilt > 0)
        yield Step(
            kernel_id=trajectory.id, step=i, cell_id=execution.cell_id, code=execution.code,
            replayed_code=cleaned.code, cleaning=[asdict(c) for c in cleaned.changes], restarted_before=restarted,
            status=result.status, ename=result.ename, evalue=result.evalue, output=output_text(result.outputs),
            outputs=rich_outputs(result.outputs), output_types=output_types(result.outputs),
            execution_time=round(result.duration_s, 6), memory_bytes=snap.memory_bytes if snap else None,
            state_hash=snap.state_hash if snap else None,
            variables=[v.to_dict() for v in snap.variables.values()] if snap else [],
            snapshot_failures=dict(snap.failures) if snap else snap_error,
            kernel_restarted=result.kernel_restarted, rebuilt_steps=rebuilt, logged=_logged(execution),
            notebook=trajectory.notebook, task=trajectory.task,
        )


def _snapshot_after(session, result, settings: ReplaySettings, rebuilt: bool):
    """The snapshot after a step (None when off or unreadable) and what could not be read. (The cell's own time,
    `result.duration_s`, ends where the kernel announced the cell's end, before it took the snapshot.)"""
    from themisto.runtime.snapshot import AgentError, snapshot_from_expressions, take_snapshot

    if not settings.snapshots:
        return None, {}
    try:
        snap = None if rebuilt else snapshot_from_expressions(result.user_expressions)
        return (snap if snap is not None else take_snapshot(session)), {}
    except AgentError as exc:  # recorded on the step; one unreadable state does not end the replay
        return None, {"<snapshot>": str(exc)[:500]}


def life_cells(trajectory: Trajectory, start: int, end: int, settings: ReplaySettings) -> list:
    """Steps start..end-1 as replay runs them (cleaned, each with its timeout): what rebuilds the state they made."""
    from themisto.runtime.rebuild import RerunCell

    return [RerunCell(j, clean_for_replay(trajectory.executions[j].code).code,
                      _timeout_for(trajectory.executions[j], settings)) for j in range(start, end)]


def rebuild_before(session, trajectory: Trajectory, step: int, settings: ReplaySettings = ReplaySettings(), *,
                   lost: frozenset[int] | set[int] = frozenset(), strict: bool = False):
    """Restart the kernel and rebuild the state replay had before `step`: the cells of its kernel life before it,
    without the `lost` steps (those that lost the state in the replay). `themisto.runtime.rebuild.rebuild_state`
    does the work (with `strict`, a cell that loses the state again raises StateLost)."""
    from themisto.runtime.rebuild import rebuild_state

    return rebuild_state(session, life_cells(trajectory, life_start(trajectory, step), step, settings),
                         lost=lost, strict=strict)


def kernel_limits(settings: ReplaySettings):
    """The kernel limits a replay with these settings runs under."""
    from themisto.runtime.kernel import Limits

    return Limits(memory_bytes=settings.memory_bytes, cell_timeout_s=settings.cell_timeout_s,
                  output_bytes=settings.output_bytes)


def replay_trajectory(trajectory: Trajectory, workspace: str | Path | None,
                      settings: ReplaySettings = ReplaySettings(), *,
                      before_step: BeforeStep | None = None) -> Iterator[Step]:
    """Replay `trajectory` in its own fresh sandboxed kernel over a copy of `workspace`."""
    from themisto.runtime.kernel import KernelSession

    with KernelSession(workspace, kernel_limits(settings)) as session:
        yield from replay(trajectory, session, settings, before_step=before_step)


# ---------------------------------------------------------------------------------------------------------------
# Resumable replay to a JSONL file of steps


@dataclass(frozen=True)
class ReplayFailure:
    """A trajectory a runner could not replay (e.g. its worker died on every try); `reason` says why."""

    reason: str


# A runner replays the pending trajectories and yields, for each as it finishes (in any order), the trajectory's id
# and its steps in step order, or a ReplayFailure. `local_runner` replays one after the other in this process;
# themisto.distributed.ray_runner spreads them over a Ray cluster.
Runner = Callable[[list[Trajectory], "Path | None", ReplaySettings, Callable[[str], None]],
                  Iterator[tuple[str, "Iterable[Step] | ReplayFailure"]]]


class ReplayIncomplete(RuntimeError):
    """Some trajectories failed; the finished ones are kept and a rerun replays only the failed ones."""

    def __init__(self, out: Path, failed: dict[str, str]):
        self.failed = dict(failed)
        listed = "; ".join(f"{tid}: {reason}" for tid, reason in sorted(failed.items())[:5])
        super().__init__(f"{out}: {len(failed)} trajectory(ies) failed ({listed}); the others are kept in "
                         f"{_partial_path(out)}, and a rerun replays only the failed ones")


def local_runner(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
                 say: Callable[[str], None]) -> Iterator[tuple[str, Iterable[Step]]]:
    """Replay the trajectories one after the other in this process, streaming each one's steps."""
    for trajectory in pending:
        yield trajectory.id, with_progress(trajectory, replay_trajectory(trajectory, workspace, settings), say)


def with_progress(trajectory: Trajectory, steps: Iterable[Step], say: Callable[[str], None]) -> Iterator[Step]:
    """`steps` as they come, saying every 25 steps how far the trajectory is."""
    n, t0 = len(trajectory.executions), time.perf_counter()
    for step in steps:
        yield step
        if (step.step + 1) % 25 == 0 or step.step + 1 == n:
            say(f"{trajectory.id}: {step.step + 1}/{n} steps ({time.perf_counter() - t0:.1f} s)")


@dataclass
class ReplayRun:
    """What a replay to file did: steps written, trajectories replayed now and resumed from an earlier run."""

    path: Path
    steps: int
    replayed: list[str]
    resumed: list[str]
    seconds: float


def _progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress.json")


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _digest(trajectory: Trajectory) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(asdict(trajectory), sort_keys=True, default=str).encode("utf-8")).hexdigest()


def _resume_header(workspace: str | Path | None, settings: ReplaySettings, out: Path) -> dict:
    """What changes a replay's steps besides the trajectory itself: the settings, the workspace's files and the
    kernel's environment (interpreter, hash seed, package versions)."""
    from themisto.resume import folder_fingerprint
    from themisto.runtime.sandbox import kernel_environment

    return {"settings": asdict(settings), "workspace": folder_fingerprint(workspace, output=out),
            "kernel": kernel_environment()}


def _load_progress(out: Path, header: dict, digests: dict[str, str],
                   say: Callable[[str], None]) -> tuple[list[str], int]:
    """Trajectories an earlier interrupted run finished with the same settings, workspace and trajectory content
    (themisto.resume); partial lines of the others are dropped, and a changed setting starts everything anew."""
    from themisto.resume import ResumeError, read_lines, settings_difference, write_text_atomic

    progress, partial = _progress_path(out), _partial_path(out)
    recorded = json.loads(progress.read_text(encoding="utf-8")) if progress.exists() and partial.exists() else None
    difference = None if recorded is None else settings_difference(recorded.get("header") or {}, header)
    try:
        lines = read_lines(partial)[0] if recorded is not None and difference is None else []
    except ResumeError as error:
        difference = str(error)
    if recorded is None or difference is not None:
        if difference is not None:
            say(f"{out}: the earlier replay cannot be resumed ({difference}); replaying every trajectory anew")
        partial.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
        return [], 0
    earlier = recorded.get("digests") or {}
    done = [t for t in recorded["done"] if t in digests and earlier.get(t) == digests[t]]
    for changed in sorted(set(recorded["done"]) - set(done)):
        say(f"{changed}: the trajectory differs from the one replayed earlier (or is no longer given); replayed anew")
    kept = [line for line in lines if isinstance(line, dict) and line.get("kernel_id") in done]
    write_text_atomic(partial, "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in kept))
    return done, len(kept)


def replay_to_file(trajectories: Iterable[Trajectory], out: str | Path, workspace: str | Path | None,
                   settings: ReplaySettings = ReplaySettings(), *, resume: bool = True,
                   progress: Callable[[str], None] | None = None, runner: Runner | None = None) -> ReplayRun:
    """Replay every trajectory, writing steps as they complete; the final file appears only when all are done.

    An interrupted run leaves `<out>.partial` and `<out>.progress.json`; the next run with `resume=True` keeps the
    trajectories that finished and replays the rest (a trajectory is replayed whole: its state needs its prefix).
    A run with other settings or another workspace replays everything anew and says which setting differs.
    Trajectories may finish in any order (`runner`); the final file lists them in input order, so it is the same
    whichever runner wrote it. A trajectory the runner reports failed raises ReplayIncomplete once the rest is done.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trajectories = list(trajectories)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    header, digests = _resume_header(workspace, settings, out), {t.id: _digest(t) for t in trajectories}
    done, steps = _load_progress(out, header, digests, say) if resume else ([], 0)
    if not resume:
        _partial_path(out).unlink(missing_ok=True)
        _progress_path(out).unlink(missing_ok=True)
    resumed = list(done)
    replayed: list[str] = []
    failed: dict[str, str] = {}
    for trajectory in trajectories:
        if trajectory.id in done:
            say(f"{trajectory.id}: already replayed, kept from the earlier run")
    pending = [t for t in trajectories if t.id not in done]
    results = (runner or local_runner)(pending, workspace, settings, say)
    try:
        with LineWriter(_partial_path(out), sort_keys=True) as writer:
            for trajectory_id, result in results:
                if isinstance(result, ReplayFailure):
                    failed[trajectory_id] = result.reason
                else:
                    for step in result:
                        writer.write(step.to_dict())
                        steps += 1
                    done.append(trajectory_id)
                    replayed.append(trajectory_id)
                write_json_atomic(_progress_path(out), {"header": header, "done": done, "failed": failed,
                                                        "digests": {t: digests[t] for t in done}})
    finally:
        # A runner holding workers (Ray tasks and their kernels) releases them here, also on Ctrl-C.
        close = getattr(results, "close", None)
        if close is not None:
            close()
    if failed:
        raise ReplayIncomplete(out, failed)
    _write_in_order(_partial_path(out), out, [t.id for t in trajectories])
    _progress_path(out).unlink(missing_ok=True)
    return ReplayRun(out, steps, replayed, resumed, time.perf_counter() - started)


def _write_in_order(partial: Path, out: Path, order: list[str]) -> None:
    """Move `partial` to `out` with its trajectories in `order` (each one's lines kept together, as written)."""
    rank = {tid: i for i, tid in enumerate(order)}
    spans: list[tuple[int, int, int]] = []  # (rank, offset, length) of each line
    offset = 0
    with partial.open("rb") as fh:
        for line in fh:
            spans.append((rank[json.loads(line)["kernel_id"]], offset, len(line)))
            offset += len(line)
    if all(a[0] <= b[0] for a, b in zip(spans, spans[1:])):
        partial.replace(out)  # already in order (always so for the local runner)
        return
    spans.sort(key=lambda span: span[0])  # stable: steps keep their order within a trajectory
    tmp = out.with_name(out.name + ".ordering")
    with partial.open("rb") as src, tmp.open("wb") as dst:
        for _, start, length in spans:
            src.seek(start)
            dst.write(src.read(length))
    tmp.replace(out)
    partial.unlink()


def read_steps(path: str | Path) -> list[Step]:
    """Read a steps JSONL file; a malformed line is an error naming the file and line."""
    path = Path(path)
    steps = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                steps.append(Step.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                raise ValueError(f"{path}:{lineno}: not a replayed step ({exc})") from exc
    return steps
