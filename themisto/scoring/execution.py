"""Execution in the exact pre-cell state: one replay per trajectory, the reference and the predictions branched
before each scored step. The only module here that runs predictions (`unsafe_execute_trajectory`).
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, fields
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from themisto.scoring.continuation import (continuation_rows, judge_continuation, own_alarms,
                                           reference_continuation_problem, state_names)
from themisto.scoring.gate import ExecutionPermit
from themisto.scoring.judging import clip, continuation_time, finish_example, judge, reference_problem, refuse
from themisto.scoring.records import (
    REFERENCE_RUNS,
    SLOW_REFERENCE_FACTOR,
    Example,
    ExampleRecord,
    PredictionRecord,
    ReplayDone,
    ScoreSettings,
    TrajectoryScore,
)
from themisto.scoring.release_state import Release, prepare_workspace, trajectory_from_rows
from themisto.vocabulary import EXAMPLE_STATUSES


def _life_start(rows: Sequence[dict], step: int) -> int:
    """The first step of the kernel life `step` belongs to (after the last logged restart at or before it)."""
    return max([0] + [r["step"] for r in rows[:step + 1] if r["restarted_before"]])


def _rebuild_state(session, rows: Sequence[dict], step: int, timeout_s: float) -> None:
    """Restart the kernel and re-run this kernel life's cells before `step` as replay ran them (skipping the steps
    that lost the state in the release's replay, as replay's own rebuild does)."""
    from themisto.ingest.cleaning import clean_for_replay
    from themisto.runtime.branch import BranchError

    session.restart()
    for row in rows[_life_start(rows, step):step]:
        if row.get("kernel_restarted"):
            continue
        cell = session.execute(clean_for_replay(row["code"]).code, timeout=timeout_s)
        if cell.kernel_restarted:
            raise BranchError(f"rebuilding the state before step {step}: step {row['step']} ended {cell.status}")


def _run_isolated(session, codes: list[str], rebuild: Callable[[], None], **options):
    """Run the codes as branches in one call; when that call takes the kernel down (a prediction killed every
    process of its user, say), rebuild the state and run them one by one, so only the culprit ends `kernel_died`."""
    from themisto.runtime.branch import BranchError, BranchResult, run_branches
    from themisto.runtime.snapshot import AgentError

    try:
        return run_branches(session, codes, **options)
    except (BranchError, AgentError):
        rebuild()
    results = []
    for index, code in enumerate(codes):
        try:
            [result] = run_branches(session, [code], **options)
            result.index = index
        except (BranchError, AgentError) as error:
            result = BranchResult(index=index, status="kernel_died", outputs=[], ename="KernelDied",
                                  evalue=f"it took the kernel down (the state was rebuilt): {clip(str(error))}")
            rebuild()
        results.append(result)
    return results


def _verify_state(session, previous: dict, summaries: list[ExampleRecord]) -> None:
    """Compare the live state with the release's after the previous step: its hash, and the names that differ."""
    from themisto.runtime.agent.delta import namespace_delta
    from themisto.runtime.snapshot import take_snapshot

    expected = previous["state_hash"]
    if expected is None:
        return
    snapshot = take_snapshot(session)
    recorded = {v["name"]: v["hash"] for v in previous["variables"] or []}
    now = snapshot.hashes()
    differing = sorted(set().union(*namespace_delta(recorded, now).values()))
    for summary in summaries:
        summary.state_verified = snapshot.state_hash == expected
        summary.state_differences = differing[:20]


def _branch_step(session, step: int, rows: Sequence[dict], examples: list[Example],
                 records: dict[str, list[PredictionRecord]], example_records: dict[str, ExampleRecord],
                 settings: ScoreSettings, rebuild: Callable[[], None]) -> None:
    """Run the reference twice and every prediction for `step` as branches of the live pre-step state; judge them."""
    from themisto.ingest.cleaning import clean_for_replay

    row = rows[step]
    ready = []
    for example in examples:
        for record in records[example.id]:
            if len(record.prediction) > settings.max_prediction_chars:
                refuse([], [record], f"the prediction has {len(record.prediction):,} characters, over the limit "
                                      f"of {settings.max_prediction_chars:,}")
            else:
                ready.append(record)
    if settings.verify_state and not (step == 0 or row["restarted_before"]):
        _verify_state(session, rows[step - 1], [example_records[e.id] for e in examples])
    # The reference runs as replay ran it: after the same cleaning; predictions get the same cleaning.
    reference = clean_for_replay(rows[step]["code"]).code
    # The replay fallback (no fork) rebuilds the state from the cells since the last restart.
    prefix = [clean_for_replay(r["code"]).code for r in rows[_life_start(rows, step):step] if not r["kernel_restarted"]]
    # Each branch runs its cell, then the developer's next cells (the continuation), in sequence.
    following = continuation_rows(rows, step, settings.continuation_cells) if settings.continuation_cells else []
    after = [clean_for_replay(r["code"]).code for r in following]
    names = state_names(reference, after, prefix) if settings.continuation_cells else None
    codes = [[reference, *after]] * REFERENCE_RUNS + [[clean_for_replay(r.prediction).code, *after] for r in ready]
    slowest = max(float(r.get("execution_time") or 0.0) for r in [row, *following])
    timeout = max(settings.timeout_s, SLOW_REFERENCE_FACTOR * slowest)
    began = time.perf_counter()
    results = _run_isolated(session, codes, rebuild, timeout_s=timeout, memory_bytes=settings.memory_bytes,
                            output_bytes=settings.output_bytes, prefix=prefix, use_fork=settings.use_fork,
                            state_names=names, delta=settings.branch_delta)
    wall = time.perf_counter() - began
    first, second = results[0], results[1]
    problem = reference_problem(first, second, row, settings)
    # Why continuation_match stays None for this example ("" when it is judged; None when it is off).
    unjudged = None
    if settings.continuation_cells:
        unjudged = reference_continuation_problem(first, second, names, len(after), settings) or ""
    for record, result in zip(ready, results[REFERENCE_RUNS:]):
        judge(record, first, result, settings)
        record.suspicious = own_alarms(result, results[:REFERENCE_RUNS])
        if unjudged == "":
            judge_continuation(record, first, result, names, len(after), settings)
    for example in examples:
        summary = example_records[example.id]
        summary.reference_status, summary.branch_wall_s = first.status, round(wall, 6)
        summary.reference_durations_s = [round(float(r.duration_s), 6) for r in results[:REFERENCE_RUNS]]
        summary.reference_continuation_s = [continuation_time(r) for r in results[:REFERENCE_RUNS]]
        if unjudged is not None:
            summary.continuation_cells, summary.continuation_problem = len(after), unjudged
        if problem is not None:
            summary.status, summary.reason = problem
            for record in records[example.id]:
                if record.outcome != "refused":
                    record.exec_ok = record.output_match = record.state_match = record.functional_match = None
                    record.continuation_match = None
        else:
            summary.status = "scored"
            finish_example(summary, records[example.id], settings)
            for record in records[example.id]:
                if record.outcome == "refused" and unjudged == "":
                    record.continuation_match = False


def unsafe_execute_trajectory(permit: ExecutionPermit, release: Release, kernel_id: str, examples: Sequence[Example],
                              records: Mapping[str, list[PredictionRecord]], workspace: Path,
                              settings: ScoreSettings) -> TrajectoryScore:
    """Replay one trajectory once and run every example's predictions in branches of its pre-step states.

    The only function that runs model-written code; it needs a permit from `themisto.scoring.gate.permit`. An example
    whose state cannot be rebuilt ends `refused` with the reason; nothing here raises for one prediction's sake.
    """
    from themisto.replay.replay import ReplaySettings, replay
    from themisto.runtime.branch import BranchError
    from themisto.runtime.kernel import KernelSession, Limits
    from themisto.runtime.sandbox import KernelStartError
    from themisto.runtime.snapshot import AgentError

    permit.check()
    began = time.perf_counter()
    rows = release.trajectories[kernel_id]
    by_step: dict[int, list[Example]] = {}
    for example in examples:
        by_step.setdefault(int(release.task_rows[example.id]["step"]), []).append(example)
    summaries = {e.id: ExampleRecord(id=e.id, predictions=len(e.predictions), kernel_id=kernel_id,
                                     step=int(release.task_rows[e.id]["step"])) for e in examples}
    own = {e.id: [r.__class__(**asdict(r)) for r in records[e.id]] for e in examples}
    last = max(by_step)
    known = {f.name for f in fields(ReplaySettings)}
    replay_settings = ReplaySettings(**{**{k: v for k, v in release.replay.items() if k in known}, "snapshots": False})
    trajectory = trajectory_from_rows(rows[: last + 1])

    def before_step(_trajectory, step: int, session) -> None:
        if step in by_step:
            def rebuild() -> None:
                _rebuild_state(session, rows, step, replay_settings.cell_timeout_s)

            try:
                if not session.alive:
                    raise BranchError("the replay kernel is not running")
                _branch_step(session, step, rows, by_step[step], own, summaries, settings, rebuild)
            except (BranchError, AgentError) as error:
                step_examples = by_step[step]
                refuse([summaries[e.id] for e in step_examples], [r for e in step_examples for r in own[e.id]],
                        f"the state before step {step} could not be branched: {error}")
                rebuild()  # later steps need this step's state; a failure here ends the trajectory (refused)
        if step == last:
            raise ReplayDone

    limits = Limits(memory_bytes=replay_settings.memory_bytes, cell_timeout_s=replay_settings.cell_timeout_s,
                    output_bytes=replay_settings.output_bytes)
    try:
        with KernelSession(workspace, limits) as session:
            for _ in replay(trajectory, session, replay_settings, before_step=before_step):
                pass
    except ReplayDone:
        pass
    except (KernelStartError, AgentError, BranchError, OSError) as error:
        pending = [e for e in examples if summaries[e.id].status == "text_only"]
        refuse([summaries[e.id] for e in pending], [r for e in pending for r in own[e.id]],
                f"replaying {kernel_id} failed: {type(error).__name__}: {error}")
    pending = [e for e in examples if summaries[e.id].status == "text_only"]
    refuse([summaries[e.id] for e in pending], [r for e in pending for r in own[e.id]],
            f"replay of {kernel_id} never reached the example's step")
    return TrajectoryScore(kernel_id=kernel_id, examples=[summaries[e.id] for e in examples],
                           predictions=[r for e in examples for r in own[e.id]],
                           replay_s=round(time.perf_counter() - began, 6))


# ---------------------------------------------------------------------------------------------------------------
# Aggregate




def same_predictions(earlier: TrajectoryScore, group: Sequence[Example],
                      by_id: Mapping[str, list[PredictionRecord]]) -> bool:
    """Whether an earlier run scored exactly these examples with exactly these predictions."""
    have = {(r.id, r.index, r.prediction) for r in earlier.predictions}
    want = {(r.id, r.index, r.prediction) for e in group for r in by_id[e.id]}
    return have == want


# ---------------------------------------------------------------------------------------------------------------
# Files: predictions in, results out (written per trajectory, resumable)


def default_workers() -> int:
    """As many trajectories at once as this process may use cores (one kernel each)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# One pending trajectory: its number in the run, its id and its examples.
Pending = tuple[int, str, list[Example]]
# Runs (permit, release, pending, by_id, settings, workspace) and yields each pending trajectory with its
# TrajectoryScore as it finishes, in any order: `threads_runner` here, themisto.distributed.ray_scoring on Ray.
TrajectoryRunner = Callable[..., Iterator[tuple[Pending, TrajectoryScore]]]


def threads_runner(workers: int | None = None) -> TrajectoryRunner:
    """Score `workers` trajectories at once in this process (default: one per core), each in its own kernel."""

    def run(permit: ExecutionPermit, release: Release, pending: list[Pending],
            by_id: Mapping[str, list[PredictionRecord]], settings: ScoreSettings,
            workspace: str | Path | None) -> Iterator[tuple[Pending, TrajectoryScore]]:
        with tempfile.TemporaryDirectory(prefix="themisto-score-") as tmp:
            folder = prepare_workspace(release, workspace, Path(tmp))  # only a run that executes needs it
            count = max(1, min(workers or default_workers(), len(pending)))
            # Threads suffice: each trajectory's work happens in its own kernel process; the host only waits.
            with ThreadPoolExecutor(max_workers=count, thread_name_prefix="themisto-score") as pool:
                futures = {pool.submit(unsafe_execute_trajectory, permit, release, item[1], item[2], by_id, folder,
                                       settings): item for item in pending}
                for future in as_completed(futures):
                    yield futures[future], future.result()

    return run


def execute_examples(permit: ExecutionPermit, release: Release, examples: list[Example],
             by_id: dict[str, list[PredictionRecord]], summaries: dict[str, ExampleRecord], settings: ScoreSettings,
             workspace: str | Path | None, done: Mapping[str, TrajectoryScore],
             on_trajectory: Callable[[TrajectoryScore], None] | None, progress: Callable[[str], None],
             workers: int | None = None, runner: TrajectoryRunner | None = None) -> None:
    """Execute every trajectory's examples (`workers` trajectories at once, each in its own kernel; default: one per
    core; or as `runner` says, e.g. on Ray) and put the records into `summaries` and `by_id`; the same records
    whatever the number of workers."""
    groups: dict[str, list[Example]] = {}
    for example in examples:
        groups.setdefault(release.task_rows[example.id]["kernel_id"], []).append(example)
    ordered = sorted(groups.items())
    results: dict[str, TrajectoryScore] = {}
    pending = []
    for number, (kernel_id, group) in enumerate(ordered, start=1):
        earlier = done.get(kernel_id)
        if earlier is not None and same_predictions(earlier, group, by_id):
            results[kernel_id] = earlier
            progress(f"[{number}/{len(groups)}] {kernel_id}: kept from the earlier run")
        else:
            pending.append((number, kernel_id, group))
    if pending:
        run = runner or threads_runner(workers)
        for (number, kernel_id, group), result in run(permit, release, pending, by_id, settings, workspace):
            results[kernel_id] = result
            if on_trajectory is not None:
                on_trajectory(result)
            counts = {s: sum(1 for e in result.examples if e.status == s) for s in EXAMPLE_STATUSES}
            progress(f"[{number}/{len(groups)}] {kernel_id}: {len(group)} example(s) in "
                     f"{result.replay_s:.1f} s ({', '.join(f'{s} {n}' for s, n in counts.items() if n)})")
    for kernel_id, _ in ordered:
        for summary in results[kernel_id].examples:
            summaries[summary.id] = summary
        for record in results[kernel_id].predictions:
            by_id[record.id][record.index] = record
