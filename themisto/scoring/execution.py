"""Execution in the exact pre-cell state: one replay per trajectory, the reference and the predictions branched
before each scored step. The only module here that runs predictions (`unsafe_execute_trajectory`).
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from themisto.scoring.continuation import (continuation_rows, judge_continuation, own_alarms,
                                           reference_continuation_problem, state_names)
from themisto.gate import ExecutionPermit
from themisto.scoring.judging import (clip, continuation_time, finish_example, judge, reference_problem, refused,
                                      unjudged)
from themisto.scoring.records import (
    REFERENCE_RUNS,
    SLOW_REFERENCE_FACTOR,
    Example,
    ExampleRecord,
    PredictionRecord,
    ScoreSettings,
    TrajectoryScore,
)
from themisto.release.folder import ReleaseError, ReleaseInfo
from themisto.release.workspaces import ReleaseInputs, SourceFolders
from themisto.scoring.release_state import release_inputs
from themisto.settings import usable_cores
from themisto.vocabulary import EXAMPLE_STATUSES


# An example's record with its predictions' (in prediction order).
Scored = tuple[ExampleRecord, list[PredictionRecord]]


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
            result = replace(result, index=index)
        except (BranchError, AgentError) as error:
            result = BranchResult(index=index, status="kernel_died", outputs=[], ename="KernelDied",
                                  evalue=f"it took the kernel down (the state was rebuilt): {clip(str(error))}")
            rebuild()
        results.append(result)
    return results


def _state_check(session, previous: dict) -> dict:
    """The live state against the release's after the previous step: whether its hash agrees, and the names that
    differ (ExampleRecord fields); {} when the release recorded no state."""
    from themisto.runtime.agent.delta import namespace_delta
    from themisto.runtime.snapshot import take_snapshot

    expected = previous["state_hash"]
    if expected is None:
        return {}
    snapshot = take_snapshot(session)
    recorded = {v["name"]: v["hash"] for v in previous["variables"] or []}
    vouched, run_specific = snapshot.vouched(previous["variables"] or [])
    differing = sorted(set().union(*namespace_delta(recorded, snapshot.hashes()).values()) - set(run_specific))
    return {"state_verified": vouched == expected, "state_differences": differing[:20],
            "state_run_specific": run_specific[:20]}


@dataclass(frozen=True)
class _StepCells:
    """What runs in a step's branches: the reference and the continuation as replay ran them, the prefix the replay
    fallback rebuilds the state from, the names compared after the continuation, and the branch timeout."""

    reference: str
    after: list[str]
    prefix: list[str]
    names: list[str] | None
    timeout_s: float


def _step_cells(rows: Sequence[dict], step: int, prefix: list[str], settings: ScoreSettings) -> _StepCells:
    from themisto.ingest.cleaning import clean_for_replay

    # The reference runs as replay ran it: after the same cleaning; predictions get the same cleaning.
    reference = clean_for_replay(rows[step]["code"]).code
    # Each branch runs its cell, then the developer's next cells (the continuation), in sequence.
    following = (continuation_rows(rows, step, settings.continuation_cells, max_s=settings.timeout_s)
                 if settings.continuation_cells else [])
    after = [clean_for_replay(r["code"]).code for r in following]
    names = state_names(reference, after, prefix) if settings.continuation_cells else None
    slowest = max(float(r.get("execution_time") or 0.0) for r in [rows[step], *following])
    return _StepCells(reference, after, prefix, names, max(settings.timeout_s, SLOW_REFERENCE_FACTOR * slowest))


def _branch_step(session, step: int, rows: Sequence[dict], examples: list[Scored], prefix: list[str],
                 settings: ScoreSettings, rebuild: Callable[[], None]) -> list[Scored]:
    """Run the reference twice and every prediction for `step` as branches of the live pre-step state; the
    examples' and predictions' records, judged."""
    from themisto.ingest.cleaning import clean_for_replay

    row = rows[step]
    slow = float(row.get("execution_time") or 0.0)
    if slow > settings.max_reference_s:  # refused unrun: the state is left as it is, the walk goes on
        return _refused(examples, f"its reference cell took {slow:.0f} s in the build's replay, over the "
                                  f"{settings.max_reference_s:.0f} s the scorer gives a reference (max_reference_s)")
    examples = [(example, [r if len(r.prediction) <= settings.max_prediction_chars else refused(
        r, f"the prediction has {len(r.prediction):,} characters, over the limit of "
           f"{settings.max_prediction_chars:,}") for r in own]) for example, own in examples]
    ready = [r for _, own in examples for r in own if r.outcome != "refused"]
    checked = _state_check(session, rows[step - 1]) if settings.verify_state and not (
        step == 0 or row["restarted_before"]) else {}
    cells = _step_cells(rows, step, prefix, settings)
    codes = ([[cells.reference, *cells.after]] * REFERENCE_RUNS
             + [[clean_for_replay(r.prediction).code, *cells.after] for r in ready])
    began = time.perf_counter()
    results = _run_isolated(session, codes, rebuild, timeout_s=cells.timeout_s, memory_bytes=settings.memory_bytes,
                            output_bytes=settings.output_bytes, prefix=cells.prefix, use_fork=settings.use_fork,
                            state_names=cells.names, delta=settings.branch_delta)
    step_facts = {**checked, "reference_status": results[0].status,
                  "branch_wall_s": round(time.perf_counter() - began, 6),
                  "reference_durations_s": [round(float(r.duration_s), 6) for r in results[:REFERENCE_RUNS]],
                  "reference_continuation_s": [continuation_time(r) for r in results[:REFERENCE_RUNS]]}
    problem = reference_problem(results[0], results[1], row, settings)
    continuation = _continuation_problem(results, cells, settings)
    judged = iter(_judged(ready, results, cells, continuation == "", settings))  # in the order of `ready`
    verdicts = []
    for example, own in examples:
        records = [next(judged) if r.outcome != "refused" else r for r in own]
        verdicts.append(_example_verdict(replace(example, **step_facts), records, problem, continuation,
                                         len(cells.after), settings))
    return verdicts


def _judged(ready: list[PredictionRecord], results: list, cells: _StepCells, continuation: bool,
            settings: ScoreSettings) -> list[PredictionRecord]:
    """Each ready prediction's record, judged against the first reference run (and its continuation, when the
    reference's defines one)."""
    first = results[0]
    judged = []
    for record, result in zip(ready, results[REFERENCE_RUNS:]):
        verdict = replace(judge(record, first, result, settings),
                          suspicious=own_alarms(result, results[:REFERENCE_RUNS]))
        if continuation:
            verdict = judge_continuation(verdict, first, result, cells.names, len(cells.after), settings)
        judged.append(verdict)
    return judged


def _continuation_problem(results: list, cells: _StepCells, settings: ScoreSettings) -> str | None:
    """Why continuation_match stays None for the step's examples ("" when it is judged; None when it is off)."""
    if not settings.continuation_cells:
        return None
    return reference_continuation_problem(results[0], results[1], cells.names, len(cells.after), settings) or ""


def _example_verdict(example: ExampleRecord, records: list[PredictionRecord], problem: tuple[str, str] | None,
                     continuation: str | None, continuation_cells: int,
                     settings: ScoreSettings) -> tuple[ExampleRecord, list[PredictionRecord]]:
    """The example's record and its predictions' once the reference runs have said whether it defines an answer
    (`problem`: its status and reason when not) and a continuation answer (`continuation`, as _continuation_problem
    says)."""
    if continuation is not None:
        example = replace(example, continuation_cells=continuation_cells, continuation_problem=continuation)
    if problem is not None:
        return replace(example, status=problem[0], reason=problem[1]), [unjudged(r) for r in records]
    example, records = finish_example(example, records, settings)
    if continuation == "":
        records = [replace(r, continuation_match=False) if r.outcome == "refused" else r for r in records]
    return example, records


def unsafe_execute_trajectory(permit: ExecutionPermit, release: ReleaseInfo, kernel_id: str,
                              examples: Sequence[Example], records: Mapping[str, list[PredictionRecord]],
                              inputs: ReleaseInputs, settings: ScoreSettings) -> TrajectoryScore:
    """Bring one kernel, over the trajectory's own input files (`inputs`), to each scored step's state in turn
    (`themisto.release.states.pre_step_states`: replayed, or restored from the release's values with
    `settings.restore`) and run every example's predictions in branches of it.

    The only function that runs model-written code; it needs a permit from `themisto.gate.permit`. An example
    whose state cannot be rebuilt ends `refused` with the reason; one whose trajectory's files or environment are
    not here stays `text_only`, with the reason; nothing here raises for one prediction's sake.
    """
    from themisto.release.states import pre_step_states
    from themisto.release.workspaces import SourcesUnavailable
    from themisto.runtime.branch import BranchError
    from themisto.runtime.rebuild import StateLost
    from themisto.runtime.sandbox import KernelStartError
    from themisto.runtime.snapshot import AgentError

    permit.check()
    began = time.perf_counter()
    rows = release.trajectory(kernel_id)
    by_step = _by_step(release, settings.task, kernel_id, examples, records)
    done: dict[str, Scored] = {}  # by example id
    failure, walk, step = None, None, None
    try:
        with pre_step_states(release, kernel_id, by_step, inputs, restore=settings.restore) as walk:
            for state in walk:
                step = state.step
                scored, branched = _score_step(state, rows, by_step[step], settings)
                done.update(_by_id(scored))
                if not branched:
                    state.rebuild()  # later steps need this step's state; StateLost here ends the trajectory
    except SourcesUnavailable as error:  # its files or environment are not here: scored by text only, counted
        done.update(_by_id([(replace(example, text_only_reason=error.reason, reason=clip(str(error))), own)
                            for step_examples in by_step.values() for example, own in step_examples]))
    except StateLost as error:
        failure = f"replaying {kernel_id} failed: rebuilding the state before step {step}: {error}"
    except (KernelStartError, AgentError, BranchError, OSError, ReleaseError) as error:
        failure = f"replaying {kernel_id} failed: {type(error).__name__}: {error}"
    pending = [(e, own) for step_examples in by_step.values() for e, own in step_examples if e.id not in done]
    done.update(_by_id(_refused(pending, failure or f"replay of {kernel_id} never reached the example's step")))
    return TrajectoryScore(kernel_id=kernel_id, examples=[done[e.id][0] for e in examples],
                           predictions=[r for e in examples for r in done[e.id][1]],
                           replay_s=round(time.perf_counter() - began, 6),
                           **(asdict(walk.restored) if walk is not None else {}))


def _score_step(state, rows: Sequence[dict], examples: list[Scored],
                settings: ScoreSettings) -> tuple[list[Scored], bool]:
    """One served step's examples, branched and judged, and whether its state could be branched (if not, each is
    refused with the reason, and the caller rebuilds the state for the steps after it)."""
    from themisto.runtime.branch import BranchError
    from themisto.runtime.rebuild import StateLost
    from themisto.runtime.snapshot import AgentError

    def rebuild() -> None:
        try:
            state.rebuild()
        except StateLost as error:
            raise BranchError(f"rebuilding the state before step {state.step}: {error}") from error

    try:
        if not state.session.alive:
            raise BranchError("the replay kernel is not running")
        return _branch_step(state.session, state.step, rows, examples, state.prefix, settings, rebuild), True
    except (BranchError, AgentError) as error:
        return _refused(examples, f"the state before step {state.step} could not be branched: {error}"), False


def _by_step(release: ReleaseInfo, task: str, kernel_id: str, examples: Sequence[Example],
             records: Mapping[str, list[PredictionRecord]]) -> dict[int, list[Scored]]:
    """Each scored step's examples, as yet unexecuted (their text records)."""
    by_step: dict[int, list[Scored]] = {}
    task_rows = release.task_rows(task)
    for example in examples:
        step = int(task_rows[example.id]["step"])
        blank = ExampleRecord(id=example.id, predictions=len(example.predictions), kernel_id=kernel_id, step=step)
        by_step.setdefault(step, []).append((blank, list(records[example.id])))
    return by_step


def _by_id(scored: list[Scored]) -> dict[str, Scored]:
    return {example.id: (example, own) for example, own in scored}


def _refused(examples: list[Scored], reason: str) -> list[Scored]:
    return [(refused(example, reason), [refused(r, reason) for r in own]) for example, own in examples]


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


# One pending trajectory: its number in the run, its id and its examples.
Pending = tuple[int, str, list[Example]]
# Runs (permit, release, pending, by_id, settings, workspace) and yields each pending trajectory with its
# TrajectoryScore as it finishes, in any order: `threads_runner` here, themisto.distributed.ray_scoring on Ray.
TrajectoryRunner = Callable[..., Iterator[tuple[Pending, TrajectoryScore]]]


def threads_runner(workers: int | None = None) -> TrajectoryRunner:
    """Score `workers` trajectories at once in this process (default: one per core), each in its own kernel."""

    def run(permit: ExecutionPermit, release: ReleaseInfo, pending: list[Pending],
            by_id: Mapping[str, list[PredictionRecord]], settings: ScoreSettings,
            workspace: SourceFolders | str | Path | None) -> Iterator[tuple[Pending, TrajectoryScore]]:
        with tempfile.TemporaryDirectory(prefix="themisto-score-") as tmp:
            folder = release_inputs(release, workspace, Path(tmp))  # only a run that executes needs it
            count = max(1, min(workers or usable_cores(), len(pending)))
            # Threads suffice: each trajectory's work happens in its own kernel process; the host only waits.
            with ThreadPoolExecutor(max_workers=count, thread_name_prefix="themisto-score") as pool:
                futures = {pool.submit(unsafe_execute_trajectory, permit, release, item[1], item[2], by_id, folder,
                                       settings): item for item in pending}
                for future in as_completed(futures):
                    yield futures[future], future.result()

    return run


def execute_examples(permit: ExecutionPermit, release: ReleaseInfo, examples: list[Example],
                     by_id: Mapping[str, list[PredictionRecord]], settings: ScoreSettings,
                     workspace: SourceFolders | str | Path | None, done: Mapping[str, TrajectoryScore],
                     on_trajectory: Callable[[TrajectoryScore], None] | None, progress: Callable[[str], None],
                     workers: int | None = None, runner: TrajectoryRunner | None = None) -> dict[str, Scored]:
    """Execute every trajectory's examples (`workers` trajectories at once, each in its own kernel; default: one per
    core; or as `runner` says, e.g. on Ray) from their text records `by_id`; each example's executed record and its
    predictions', by example id: the same records whatever the number of workers."""
    groups: dict[str, list[Example]] = {}
    task_rows = release.task_rows(settings.task)
    for example in examples:
        groups.setdefault(task_rows[example.id]["kernel_id"], []).append(example)
    ordered = sorted(groups.items())
    results: dict[str, TrajectoryScore] = {}
    pending = []
    for number, (kernel_id, group) in enumerate(ordered, start=1):
        earlier = done.get(kernel_id)
        # An earlier run's trajectory is kept unless its files were not there then (they may be now)
        if earlier is not None and same_predictions(earlier, group, by_id) and not any(
                e.text_only_reason for e in earlier.examples):
            results[kernel_id] = earlier
            progress(f"[{number}/{len(groups)}] {kernel_id}: kept from the earlier run")
        else:
            pending.append((number, kernel_id, group))
    if pending:
        # Longest replay first (to its last scored step), so that no long trajectory starts last and holds the run
        # alone on one core at its end (the sample's and the two-source release's longest hold a third of the rows).
        pending.sort(key=lambda item: max(int(task_rows[e.id]["step"]) for e in item[2]), reverse=True)
        run = runner or threads_runner(workers)
        for (number, kernel_id, group), result in run(permit, release, pending, by_id, settings, workspace):
            results[kernel_id] = result
            if on_trajectory is not None:
                on_trajectory(result)
            counts = {s: sum(1 for e in result.examples if e.status == s) for s in EXAMPLE_STATUSES}
            progress(f"[{number}/{len(groups)}] {kernel_id}: {len(group)} example(s) in "
                     f"{result.replay_s:.1f} s ({', '.join(f'{s} {n}' for s, n in counts.items() if n)})")
    executed: dict[str, Scored] = {}
    for kernel_id, _ in ordered:
        predictions: dict[str, list[PredictionRecord]] = {}
        for record in results[kernel_id].predictions:
            predictions.setdefault(record.id, []).append(record)
        for example in results[kernel_id].examples:
            executed[example.id] = (example, sorted(predictions.get(example.id, []), key=lambda r: r.index))
    return executed
