"""Score predictions for Themisto's two tasks: the paper's text scores, and for next_cell, execution in the exact
pre-cell kernel state.

Text scores (exact match, ROUGE-L, chrF; for output prediction also the equivalence verdict) need nothing but the
texts. Execution scores replay each trajectory of a release once in a fresh sandboxed kernel; before every scored
step the reference cell (twice, to catch nondeterminism) and all predictions for that step run as forked branches
of the live kernel, so each sees exactly the state the developer's cell saw and none disturbs the others. Executing
predictions needs both opt-in switches of `themisto.scoring.gate`.

Bad input raises ScoreError naming the example id before anything runs (lengths that differ, an unknown id, a
prediction that is not a string, a reference that is not the release's target, a release without the rows or the
workspace to rebuild an example's state). Where one example cannot be executed at run time (its replay broke, the
kernel could not branch), its predictions get the outcome `refused` with the reason and scoring goes on.

>>> result = score(["df.head()", "df.tail()"], ["df.head()", "df.head()"], ids=["k/5", "k/6"])
>>> result.scores["exact_match"], [p.exact_match for p in result.predictions]
(0.5, [1.0, 0.0])
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from statistics import fmean
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from themisto.scoring.gate import ExecutionPermit, permit as gate_permit
from themisto.scoring.text_scores import chrf, exact_match, rouge_l

TASKS: tuple[str, ...] = ("next_cell", "output_prediction")
Outcome = Literal["ok", "error", "timeout", "kernel_died", "refused"]
OUTCOMES: tuple[str, ...] = ("ok", "error", "timeout", "kernel_died", "refused")
# How an example fared as a whole: `scored` counts in the functional scores; the others are reported, not guessed.
ExampleStatus = Literal["text_only", "scored", "nondeterministic", "reference_unfinished", "reference_diverged",
                        "refused"]
EXAMPLE_STATUSES: tuple[str, ...] = ("text_only", "scored", "nondeterministic", "reference_unfinished",
                                     "reference_diverged", "refused")
EXECUTION_SCORES: tuple[str, ...] = ("exec_ok", "output_match", "state_match", "functional_match")
REFERENCE_RUNS = 2
# A slow reference cell (model training) keeps its full time: the branch timeout grows to this many times the time
# the cell took in the release's replay, for the reference and the predictions alike.
_SLOW_REFERENCE_FACTOR = 3.0
_REASON_CHARS = 300
# `<Colorbar at 0x7f18c81afad0>`: an object's address is its identity, not its content, and two forked runs of the
# same cell allocate at different addresses.
_ADDRESS_RE = re.compile(r"\b(at |id=)0x[0-9a-fA-F]{4,}\b")


class ScoreError(ValueError):
    """Input the scorer cannot use; the message names the example id (or the release file) concerned."""


class _ReplayDone(Exception):
    """Raised by the before-step hook once the last scored step of a trajectory has run: the rest is not needed."""


@dataclass(frozen=True)
class ScoreSettings:
    """What is scored and how predictions are executed."""

    task: str = "next_cell"
    k: tuple[int, ...] = (1,)  # pass@k for each k (execution only)
    timeout_s: float = 30.0  # per prediction (raised for slow reference cells, see _SLOW_REFERENCE_FACTOR)
    memory_bytes: int = 2**30  # each branch may allocate this much beyond the kernel's current use
    output_bytes: int = 2**20
    max_prediction_chars: int = 100_000  # a longer prediction is refused, not run
    rel_tol: float = 1e-6  # output equivalence: numbers agree within these tolerances
    abs_tol: float = 1e-9
    use_fork: bool | None = None  # None: fork where the platform can, replay the prefix otherwise
    verify_state: bool = True  # compare the rebuilt state's hash with the release's state_hash_before

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ScoreError(f"unknown task {self.task!r} (expected one of {', '.join(TASKS)})")
        ks = (self.k,) if isinstance(self.k, int) else tuple(self.k)
        if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
            raise ScoreError(f"k must be positive integers, got {self.k!r}")
        object.__setattr__(self, "k", tuple(sorted(set(ks))))
        if not self.timeout_s > 0:
            raise ScoreError(f"timeout_s must be positive, got {self.timeout_s!r}")


@dataclass
class Example:
    """One example to score: its id, the reference text and one or more predictions."""

    id: str
    reference: str
    predictions: list[str]


@dataclass
class PredictionRecord:
    """One prediction's scores; the execution fields stay None when it was not executed."""

    id: str
    index: int  # which prediction of the example
    prediction: str
    exact_match: float
    rouge_l: float
    chrf: float
    output_equivalent: bool | None = None  # output_prediction: equivalent per themisto.scoring.equivalence
    equivalence_rule: str | None = None
    outcome: Outcome | None = None
    reason: str = ""  # why it failed (error, timeout, output or state difference, refusal); "" when it matched
    exec_ok: bool | None = None
    output_match: bool | None = None
    state_match: bool | None = None
    functional_match: bool | None = None
    duration_s: float | None = None  # the prediction's own run time in its branch

    @classmethod
    def from_dict(cls, data: Mapping) -> PredictionRecord:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class ExampleRecord:
    """How one example fared: whether its functional scores count, why not, and its pass@k."""

    id: str
    predictions: int
    status: ExampleStatus = "text_only"
    reason: str = ""
    kernel_id: str | None = None
    step: int | None = None
    reference_status: str | None = None  # the reference cell's outcome in its branches
    correct: int | None = None  # predictions with a functional match
    pass_at_k: dict[str, float] = field(default_factory=dict)
    state_verified: bool | None = None  # rebuilt state hash == the release's; None where not checked
    state_differences: list[str] = field(default_factory=list)  # variables whose rebuilt hash differs (first 20)
    branch_wall_s: float | None = None  # wall time of the step's branch call (references + predictions)
    reference_durations_s: list[float] = field(default_factory=list)  # the reference's own time in each run

    @classmethod
    def from_dict(cls, data: Mapping) -> ExampleRecord:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass
class TrajectoryScore:
    """The execution records of one trajectory's examples: the unit that is written, and resumed, at a time."""

    kernel_id: str
    examples: list[ExampleRecord]
    predictions: list[PredictionRecord]
    replay_s: float = 0.0  # wall time of the whole trajectory: replay, state checks and branches

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TrajectoryScore:
        return cls(kernel_id=data["kernel_id"], examples=[ExampleRecord.from_dict(e) for e in data["examples"]],
                   predictions=[PredictionRecord.from_dict(p) for p in data["predictions"]],
                   replay_s=float(data.get("replay_s", 0.0)))


@dataclass
class ScoreResult:
    """Aggregate scores, one record per example and per prediction, the settings used and any notes."""

    task: str
    scores: dict[str, Any]
    examples: list[ExampleRecord]
    predictions: list[PredictionRecord]
    settings: ScoreSettings
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"task": self.task, "scores": self.scores, "settings": asdict(self.settings), "notes": self.notes,
                "examples": [asdict(e) for e in self.examples], "predictions": [asdict(p) for p in self.predictions]}


# ---------------------------------------------------------------------------------------------------------------
# Input


def make_examples(predictions: Sequence, references: Sequence, ids: Sequence[str] | None = None) -> list[Example]:
    """Check and align the inputs: one reference and one or more string predictions per id (ids unique)."""
    if isinstance(predictions, (str, bytes)) or isinstance(references, (str, bytes)):
        raise ScoreError("predictions and references must be lists (one entry per example), not a single string")
    predictions, references = list(predictions), list(references)
    if len(predictions) != len(references):
        raise ScoreError(f"got {len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ScoreError("no predictions to score")
    if ids is None:
        ids = [f"#{i}" for i in range(len(predictions))]
    ids = [str(i) for i in ids]
    if len(ids) != len(predictions):
        raise ScoreError(f"got {len(ids)} ids for {len(predictions)} predictions")
    seen: set[str] = set()
    examples = []
    for example_id, prediction, reference in zip(ids, predictions, references):
        if example_id in seen:
            raise ScoreError(f"example {example_id}: the id appears more than once")
        seen.add(example_id)
        if not isinstance(reference, str):
            raise ScoreError(f"example {example_id}: the reference is {type(reference).__name__}, expected str")
        candidates = [prediction] if isinstance(prediction, str) else prediction
        if not isinstance(candidates, (list, tuple)) or not candidates:
            raise ScoreError(f"example {example_id}: the prediction is {type(prediction).__name__}, "
                             "expected str or a non-empty list of str")
        for index, text in enumerate(candidates):
            if not isinstance(text, str):
                raise ScoreError(f"example {example_id}: prediction {index} is {type(text).__name__}, expected str")
        examples.append(Example(example_id, reference, list(candidates)))
    return examples


# ---------------------------------------------------------------------------------------------------------------
# Text scores


def text_records(examples: Sequence[Example], settings: ScoreSettings) -> list[PredictionRecord]:
    """One record per prediction with its exact match, ROUGE-L, chrF (and output equivalence for output_prediction)."""
    from themisto.scoring.equivalence import outputs_equivalent

    records = []
    for example in examples:
        for index, prediction in enumerate(example.predictions):
            record = PredictionRecord(
                id=example.id, index=index, prediction=prediction,
                exact_match=exact_match(prediction, example.reference),
                rouge_l=rouge_l(prediction, example.reference), chrf=chrf(prediction, example.reference))
            if settings.task == "output_prediction":
                verdict = outputs_equivalent(prediction, example.reference, rel_tol=settings.rel_tol,
                                             abs_tol=settings.abs_tol)
                record.output_equivalent, record.equivalence_rule = verdict.equal, verdict.rule
            records.append(record)
    return records


# ---------------------------------------------------------------------------------------------------------------
# The release: the rows that rebuild each example's state, and the workspace it was built over


@dataclass
class Release:
    """What execution needs from a release: task rows by id, trajectory rows by kernel, workspace, replay settings."""

    name: str  # the folder, for messages
    task_rows: dict[str, dict]
    trajectories: dict[str, list[dict]]
    workspace: dict  # the build's record: {"look_alike_seed", "size", "tasks"} or {"given": name}; {} if unknown
    replay: dict  # the build's ReplaySettings as a dict; {} if unknown


def _parquet_rows(folder: Path, config: str) -> list[dict]:
    import pyarrow.parquet as pq

    from themisto.release.parquet import README, split_card

    card = folder / README
    if not card.is_file():
        raise ScoreError(f"{card}: missing; a release folder declares its configs there")
    data, _ = split_card(card.read_text(encoding="utf-8"))
    declared = {c.get("config_name"): c for c in data.get("configs") or []}
    if config not in declared:
        raise ScoreError(f"{card}: the release has no {config!r} config")
    rows: list[dict] = []
    for entry in declared[config].get("data_files") or []:
        for path in sorted(folder.glob(entry["path"])):
            rows += pq.read_table(path).to_pylist()
    return rows


def load_release(folder: str | Path, task: str = "next_cell") -> Release:
    """Read a release folder written by `themisto build`: the task's rows (all splits) and its trajectories."""
    from themisto.release.parquet import BUILD_FILE

    folder = Path(folder)
    if not folder.is_dir():
        raise ScoreError(f"{folder}: no such release folder")
    task_rows = {row["id"]: row for row in _parquet_rows(folder, task)}
    trajectories: dict[str, list[dict]] = {}
    for row in _parquet_rows(folder, "trajectories"):
        trajectories.setdefault(row["kernel_id"], []).append(row)
    for rows in trajectories.values():
        rows.sort(key=lambda r: r["step"])
    build: dict = {}
    if (folder / BUILD_FILE).is_file():
        build = json.loads((folder / BUILD_FILE).read_text(encoding="utf-8"))
    return Release(name=str(folder), task_rows=task_rows, trajectories=trajectories,
                   workspace=dict(build.get("source", {}).get("workspace") or {}),
                   replay=dict(build.get("settings", {}).get("replay") or {}))


def check_against_release(examples: Sequence[Example], release: Release) -> None:
    """Every id is in the release, its reference is the release's target, and its state can be rebuilt."""
    unknown = [e.id for e in examples if e.id not in release.task_rows]
    if unknown:
        raise ScoreError(f"example {unknown[0]}: no such id in {release.name}"
                         + (f" (and {len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else ""))
    for example in examples:
        row = release.task_rows[example.id]
        if example.reference != row["target"]:
            raise ScoreError(f"example {example.id}: the reference is not the release's target for this id")
        steps = release.trajectories.get(row["kernel_id"], [])
        if [r["step"] for r in steps[: row["step"] + 1]] != list(range(row["step"] + 1)):
            raise ScoreError(f"example {example.id}: the release's `trajectories` rows of {row['kernel_id']} do not "
                             f"hold steps 0..{row['step']}, so the state before step {row['step']} cannot be rebuilt")


def prepare_workspace(release: Release, workspace: str | Path | None, tmp: Path) -> Path:
    """The input files the release was replayed over: `workspace` if given, else regenerated from the build's seed."""
    if workspace is not None:
        if not Path(workspace).is_dir():
            raise ScoreError(f"{workspace}: no such workspace directory")
        return Path(workspace)
    spec = release.workspace
    if "look_alike_seed" in spec:
        from themisto.ingest.workspace import write_workspace

        return write_workspace(tmp / "ws", spec.get("tasks") or ("task1", "task2"), seed=int(spec["look_alike_seed"]),
                               size=spec.get("size", "small")).root
    if "given" in spec:
        raise ScoreError(f"{release.name}: the release was replayed over a given workspace ({spec['given']!r}); "
                         "pass that folder as the workspace to rebuild the states")
    raise ScoreError(f"{release.name}: the build does not record the workspace it was replayed over "
                     "(no themisto_build.json source.workspace); pass the workspace folder")


def trajectory_from_rows(rows: Sequence[dict]):
    """A Trajectory that replays a release's `trajectories` rows: the developer's code, logged outcomes, restarts."""
    from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory

    executions = [Execution(cell_id=r["cell_id"], code=r["code"], status=r.get("logged_status") or "unknown",
                            ename=r.get("logged_ename"), evalue=r.get("logged_evalue")) for r in rows]
    events = [KernelEvent("restart", before=r["step"]) for r in rows if r["restarted_before"] and r["step"] > 0]
    first = rows[0]
    return Trajectory(id=first["kernel_id"], notebook=first.get("notebook") or "", source="release",
                      executions=executions, events=events, task=first.get("task"))


# ---------------------------------------------------------------------------------------------------------------
# Execution


def compared_output(outputs: list[dict]) -> str:
    """The text two runs' outputs are compared by: output_text plus a placeholder for each image, object addresses
    masked.

    >>> compared_output([{"output_type": "execute_result", "metadata": {},
    ...                   "data": {"text/plain": "<Colorbar at 0x7f18c81afad0>", "image/png": "iVBORw0KGgo="}}])
    '<Colorbar at 0x…>\\n<image/png 8 bytes>'
    """
    from themisto.scoring.equivalence import image_placeholder
    from themisto.runtime.outputs import output_text, rich_outputs

    text = _ADDRESS_RE.sub(r"\g<1>0x…", output_text(outputs))
    images = [image_placeholder(r["mime"], r["bytes"]) for r in rich_outputs(outputs) if "bytes" in r]
    return "\n".join([text, *images]) if images else text


def _clip(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def _delta(result) -> dict[str, dict[str, str]]:
    return {"added": dict(result.added), "changed": dict(result.changed), "deleted": dict(result.deleted)}


def _reference_problem(first, second, recorded: dict, settings: ScoreSettings) -> tuple[str, str] | None:
    """(example status, reason) when the two reference runs cannot define a functional answer, else None.

    `recorded` is the release's row of the step: a reference that ends otherwise in its branch than in the release's
    replay (it needs more memory or time than a branch gets) defines no answer either.
    """
    from themisto.scoring.equivalence import outputs_equivalent

    if first.status != second.status:
        return "nondeterministic", f"the reference ended {first.status} in one run and {second.status} in the other"
    if first.status in ("timeout", "kernel_died"):
        return "reference_unfinished", (f"the reference cell ended {first.status} in its branch "
                                        f"({_clip(first.evalue or '')})")
    if first.status != recorded.get("status") or (first.status == "error" and first.ename != recorded.get("ename")):
        got = first.status if first.status == "ok" else f"{first.status} ({first.ename}: {_clip(first.evalue or '')})"
        return "reference_diverged", (f"the reference ended {got} in its branch where the release's replay recorded "
                                      f"{recorded.get('status')} {recorded.get('ename') or ''}".rstrip())
    verdict = outputs_equivalent(compared_output(second.outputs), compared_output(first.outputs),
                                 rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
    if not verdict.equal:
        return "nondeterministic", f"the reference printed different outputs in two runs ({_clip(verdict.reason)})"
    a, b = _delta(first), _delta(second)
    if a != b:
        names = sorted({n for kind in a for n in set(a[kind].items()) ^ set(b[kind].items())})
        return "nondeterministic", ("the reference left different values in two runs: "
                                    + ", ".join(n for n, _ in names[:5]))
    return None


def _state_difference(reference, candidate) -> str | None:
    """Why the candidate's namespace change differs from the reference's, or None when it matches.

    Every name the reference added or changed must end with the same content hash, every name it deleted must be
    deleted; the candidate may add names of its own, but not change or delete names the reference left alone.
    """
    after = {**candidate.changed, **candidate.added}
    for name, digest in {**reference.changed, **reference.added}.items():
        if name not in after:
            what = "added" if name in reference.added else "changed"
            return f"`{name}` was {what} by the reference, not by the prediction"
        if after[name] != digest:
            return f"`{name}` holds a different value than after the reference"
    missing = sorted(set(reference.deleted) - set(candidate.deleted))
    if missing:
        return f"`{missing[0]}` was deleted by the reference, not by the prediction"
    left_alone = (set(candidate.changed) | set(candidate.deleted)) - set(reference.changed) - set(reference.deleted)
    if left_alone:
        name = min(left_alone)
        return f"`{name}` was {'deleted' if name in candidate.deleted else 'changed'} by the prediction only"
    return None


def _judge(record: PredictionRecord, reference, candidate, settings: ScoreSettings) -> None:
    """Fill the record's outcome and execution scores from its branch result against the reference's."""
    from themisto.scoring.equivalence import outputs_equivalent

    record.outcome = candidate.status
    record.duration_s = round(float(candidate.duration_s), 6)
    if candidate.status in ("timeout", "kernel_died"):
        record.exec_ok = record.output_match = record.state_match = record.functional_match = False
        what = "ran past its time limit" if candidate.status == "timeout" else "its branch process died"
        record.reason = f"{what} ({_clip(candidate.evalue)})" if candidate.evalue else what
        return
    if reference.status == "ok":
        record.exec_ok = candidate.status == "ok"
    else:  # the developer's cell raised: reproducing the same exception is not an execution failure
        record.exec_ok = candidate.status == "ok" or candidate.ename == reference.ename
    verdict = outputs_equivalent(compared_output(candidate.outputs), compared_output(reference.outputs),
                                 rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
    state = _state_difference(reference, candidate)
    record.output_match, record.state_match = verdict.equal, state is None
    record.functional_match = verdict.equal and state is None
    reasons = []
    if candidate.status == "error":
        reasons.append(f"{candidate.ename}: {candidate.evalue}")
    if not verdict.equal:
        reasons.append(f"output differs: {verdict.reason}")
    if state is not None:
        reasons.append(f"state differs: {state}")
    record.reason = _clip("; ".join(reasons))


def _refuse(examples: Iterable[ExampleRecord], predictions: Iterable[PredictionRecord], reason: str) -> None:
    for example in examples:
        example.status, example.reason = "refused", _clip(reason)
    for record in predictions:
        record.outcome, record.reason = "refused", _clip(reason)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of Chen et al. (2021) from n samples of which c are correct.

    >>> pass_at_k(5, 0, 1), pass_at_k(5, 5, 3), round(pass_at_k(4, 1, 2), 4)
    (0.0, 1.0, 0.5)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k), as a product so large n never overflows.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _finish_example(example: ExampleRecord, records: list[PredictionRecord], settings: ScoreSettings) -> None:
    for record in records:
        if record.outcome == "refused":  # refused for its own sake (too long) in a scorable example: a failure
            record.exec_ok = record.output_match = record.state_match = record.functional_match = False
    example.correct = sum(1 for r in records if r.functional_match)
    example.pass_at_k = {f"pass@{k}": pass_at_k(len(records), example.correct, k)
                         for k in settings.k if k <= len(records)}


def _life_start(rows: Sequence[dict], step: int) -> int:
    """The first step of the kernel life `step` belongs to (after the last logged restart at or before it)."""
    return max([0] + [r["step"] for r in rows[:step + 1] if r["restarted_before"]])


def _rebuild_state(session, rows: Sequence[dict], step: int, timeout_s: float) -> None:
    """Restart the kernel and re-run this kernel life's cells before `step` as replay ran them (skipping the steps
    that lost the state in the release's replay, as replay's own rebuild does)."""
    from themisto.runtime.branch import BranchError
    from themisto.ingest.cleaning import clean_for_replay

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
                                  evalue=f"it took the kernel down (the state was rebuilt): {_clip(str(error))}")
            rebuild()
        results.append(result)
    return results


def _branch_step(session, step: int, rows: Sequence[dict], examples: list[Example],
                 records: dict[str, list[PredictionRecord]], example_records: dict[str, ExampleRecord],
                 settings: ScoreSettings, rebuild: Callable[[], None]) -> None:
    """Run the reference twice and every prediction for `step` as branches of the live pre-step state; judge them."""
    from themisto.ingest.cleaning import clean_for_replay
    from themisto.runtime.snapshot import take_snapshot

    row = rows[step]
    ready = []
    for example in examples:
        for record in records[example.id]:
            if len(record.prediction) > settings.max_prediction_chars:
                _refuse([], [record], f"the prediction has {len(record.prediction):,} characters, over the limit "
                                      f"of {settings.max_prediction_chars:,}")
            else:
                ready.append(record)
    if settings.verify_state and not (step == 0 or row["restarted_before"]):
        expected = rows[step - 1]["state_hash"]
        if expected is not None:
            snapshot = take_snapshot(session)
            recorded = {v["name"]: v["hash"] for v in rows[step - 1]["variables"] or []}
            now = snapshot.hashes()
            differing = sorted(n for n in set(recorded) | set(now) if recorded.get(n) != now.get(n))
            for example in examples:
                example_records[example.id].state_verified = snapshot.state_hash == expected
                example_records[example.id].state_differences = differing[:20]
    # The reference runs as replay ran it: after the same cleaning; predictions get the same cleaning.
    reference = clean_for_replay(rows[step]["code"]).code
    codes = [reference] * REFERENCE_RUNS + [clean_for_replay(r.prediction).code for r in ready]
    timeout = max(settings.timeout_s, _SLOW_REFERENCE_FACTOR * float(row.get("execution_time") or 0.0))
    # The replay fallback (no fork) rebuilds the state from the cells since the last restart.
    prefix = [clean_for_replay(r["code"]).code for r in rows[_life_start(rows, step):step] if not r["kernel_restarted"]]
    began = time.perf_counter()
    results = _run_isolated(session, codes, rebuild, timeout_s=timeout, memory_bytes=settings.memory_bytes,
                            output_bytes=settings.output_bytes, prefix=prefix, use_fork=settings.use_fork)
    wall = time.perf_counter() - began
    first, second = results[0], results[1]
    problem = _reference_problem(first, second, row, settings)
    for record, result in zip(ready, results[REFERENCE_RUNS:]):
        _judge(record, first, result, settings)
    for example in examples:
        summary = example_records[example.id]
        summary.reference_status, summary.branch_wall_s = first.status, round(wall, 6)
        summary.reference_durations_s = [round(float(r.duration_s), 6) for r in results[:REFERENCE_RUNS]]
        if problem is not None:
            summary.status, summary.reason = problem
            for record in records[example.id]:
                if record.outcome != "refused":
                    record.exec_ok = record.output_match = record.state_match = record.functional_match = None
        else:
            summary.status = "scored"
            _finish_example(summary, records[example.id], settings)


def unsafe_execute_trajectory(permit: ExecutionPermit, release: Release, kernel_id: str, examples: Sequence[Example],
                              records: Mapping[str, list[PredictionRecord]], workspace: Path,
                              settings: ScoreSettings) -> TrajectoryScore:
    """Replay one trajectory once and run every example's predictions in branches of its pre-step states.

    The only function that runs model-written code; it needs a permit from `themisto.scoring.gate.permit`. An example
    whose state cannot be rebuilt ends `refused` with the reason; nothing here raises for one prediction's sake.
    """
    from themisto.runtime.branch import BranchError
    from themisto.runtime.kernel import KernelSession, Limits
    from themisto.runtime.sandbox import KernelStartError
    from themisto.replay.replay import ReplaySettings, replay
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
                _refuse([summaries[e.id] for e in step_examples], [r for e in step_examples for r in own[e.id]],
                        f"the state before step {step} could not be branched: {error}")
                rebuild()  # later steps need this step's state; a failure here ends the trajectory (refused)
        if step == last:
            raise _ReplayDone

    limits = Limits(memory_bytes=replay_settings.memory_bytes, cell_timeout_s=replay_settings.cell_timeout_s,
                    output_bytes=replay_settings.output_bytes)
    try:
        with KernelSession(workspace, limits) as session:
            for _ in replay(trajectory, session, replay_settings, before_step=before_step):
                pass
    except _ReplayDone:
        pass
    except (KernelStartError, AgentError, BranchError, OSError) as error:
        pending = [e for e in examples if summaries[e.id].status == "text_only"]
        _refuse([summaries[e.id] for e in pending], [r for e in pending for r in own[e.id]],
                f"replaying {kernel_id} failed: {type(error).__name__}: {error}")
    pending = [e for e in examples if summaries[e.id].status == "text_only"]
    _refuse([summaries[e.id] for e in pending], [r for e in pending for r in own[e.id]],
            f"replay of {kernel_id} never reached the example's step")
    return TrajectoryScore(kernel_id=kernel_id, examples=[summaries[e.id] for e in examples],
                           predictions=[r for e in examples for r in own[e.id]],
                           replay_s=round(time.perf_counter() - began, 6))


# ---------------------------------------------------------------------------------------------------------------
# Aggregate


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return fmean(kept) if kept else None


def aggregate(examples: Sequence[ExampleRecord], predictions: Sequence[PredictionRecord], settings: ScoreSettings,
              *, executed: bool) -> tuple[dict[str, Any], list[str]]:
    """The aggregate scores and notes: each score is a mean over examples of the mean over their predictions."""
    by_id: dict[str, list[PredictionRecord]] = {}
    for record in predictions:
        by_id.setdefault(record.id, []).append(record)
    names = ["exact_match", "rouge_l", "chrf"] + (["output_equivalent"] if settings.task == "output_prediction" else [])
    scores: dict[str, Any] = {name: _mean(_mean(getattr(r, name) for r in records) for records in by_id.values())
                              for name in names}
    scores["examples"], scores["predictions"] = len(by_id), len(predictions)
    notes: list[str] = []
    if not executed:
        return scores, notes
    scored = [e for e in examples if e.status == "scored"]
    for name in EXECUTION_SCORES:
        scores[name] = _mean(_mean(getattr(r, name) for r in by_id[e.id]) for e in scored)
    for k in settings.k:
        if scored and all(e.predictions >= k for e in scored):
            scores[f"pass@{k}"] = fmean(e.pass_at_k[f"pass@{k}"] for e in scored)
        else:
            scores[f"pass@{k}"] = None
            if scored:
                notes.append(f"pass@{k} needs at least {k} predictions for every scored example")
    scores["scored_examples"] = len(scored)
    for status in ("nondeterministic", "reference_unfinished", "reference_diverged", "refused"):
        ids = [e.id for e in examples if e.status == status]
        scores[f"{status}_examples"] = len(ids)
        if ids:
            notes.append(f"{len(ids)} example(s) {status.replace('_', ' ')}, not in the functional scores: "
                         + ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else ""))
    unverified = [e.id for e in examples if e.state_verified is False]
    scores["state_mismatch_examples"] = len(unverified)
    if unverified:
        notes.append(f"{len(unverified)} example(s) ran in a rebuilt state whose hash differs from the release's: "
                     + ", ".join(unverified[:10]))
    scores["outcomes"] = {o: sum(1 for r in predictions if r.outcome == o) for o in OUTCOMES}
    return scores, notes


# ---------------------------------------------------------------------------------------------------------------
# The door


def score(predictions: Sequence, references: Sequence, *, ids: Sequence[str] | None = None,
          settings: ScoreSettings | None = None, execute: bool = False, release: str | Path | Release | None = None,
          workspace: str | Path | None = None, done: Mapping[str, TrajectoryScore] | None = None,
          on_trajectory: Callable[[TrajectoryScore], None] | None = None,
          progress: Callable[[str], None] | None = None) -> ScoreResult:
    """Score predictions (a string, or a list of strings, per example) against references.

    With `execute=True` (and HF_ALLOW_CODE_EVAL=1) next_cell predictions also run in the exact pre-cell state
    rebuilt from `release`; `done` holds trajectories scored by an earlier run (resume), `on_trajectory` receives
    each trajectory as it finishes.
    """
    settings = settings or ScoreSettings()
    permit = gate_permit(execute=True) if execute else None  # refuses before any input is read
    examples = make_examples(predictions, references, ids)
    if permit is not None and settings.task != "next_cell":
        raise ScoreError(f"execution scores exist for next_cell only, not {settings.task}; score without execute")
    if permit is not None and ids is None:
        raise ScoreError("execution needs the example ids (`ids`) to find each example's state in the release")
    if permit is not None and release is None:
        raise ScoreError("execution needs the release (`release`) the examples come from")
    records = text_records(examples, settings)
    by_id: dict[str, list[PredictionRecord]] = {}
    for record in records:
        by_id.setdefault(record.id, []).append(record)
    summaries = {e.id: ExampleRecord(id=e.id, predictions=len(e.predictions)) for e in examples}
    if permit is not None:
        loaded = release if isinstance(release, Release) else load_release(release, settings.task)
        check_against_release(examples, loaded)
        _execute(permit, loaded, examples, by_id, summaries, settings, workspace, done or {}, on_trajectory,
                 progress or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    ordered_examples = [summaries[e.id] for e in examples]
    ordered_records = [r for e in examples for r in by_id[e.id]]
    scores, notes = aggregate(ordered_examples, ordered_records, settings, executed=permit is not None)
    return ScoreResult(settings.task, scores, ordered_examples, ordered_records, settings, notes)


def _execute(permit: ExecutionPermit, release: Release, examples: list[Example],
             by_id: dict[str, list[PredictionRecord]], summaries: dict[str, ExampleRecord], settings: ScoreSettings,
             workspace: str | Path | None, done: Mapping[str, TrajectoryScore],
             on_trajectory: Callable[[TrajectoryScore], None] | None, progress: Callable[[str], None]) -> None:
    groups: dict[str, list[Example]] = {}
    for example in examples:
        groups.setdefault(release.task_rows[example.id]["kernel_id"], []).append(example)
    with tempfile.TemporaryDirectory(prefix="themisto-score-") as tmp:
        folder: Path | None = None
        for number, (kernel_id, group) in enumerate(sorted(groups.items()), start=1):
            earlier = done.get(kernel_id)
            if earlier is not None and _same_predictions(earlier, group, by_id):
                result = earlier
                progress(f"[{number}/{len(groups)}] {kernel_id}: kept from the earlier run")
            else:
                if folder is None:  # only a run that executes something needs the workspace
                    folder = prepare_workspace(release, workspace, Path(tmp))
                result = unsafe_execute_trajectory(permit, release, kernel_id, group, by_id, folder, settings)
                if on_trajectory is not None:
                    on_trajectory(result)
                counts = {s: sum(1 for e in result.examples if e.status == s) for s in EXAMPLE_STATUSES}
                progress(f"[{number}/{len(groups)}] {kernel_id}: {len(group)} example(s) in {result.replay_s:.1f} s "
                         f"({', '.join(f'{s} {n}' for s, n in counts.items() if n)})")
            for summary in result.examples:
                summaries[summary.id] = summary
            for record in result.predictions:
                by_id[record.id][record.index] = record


def _same_predictions(earlier: TrajectoryScore, group: Sequence[Example],
                      by_id: Mapping[str, list[PredictionRecord]]) -> bool:
    """Whether an earlier run scored exactly these examples with exactly these predictions."""
    have = {(r.id, r.index, r.prediction) for r in earlier.predictions}
    want = {(r.id, r.index, r.prediction) for e in group for r in by_id[e.id]}
    return have == want


# ---------------------------------------------------------------------------------------------------------------
# Files: predictions in, results out (written per trajectory, resumable)


def read_predictions(path: str | Path) -> tuple[list[str], list]:
    """Ids and predictions from a JSONL file of `{"id": ..., "prediction": str | [str, ...]}` lines; a malformed
    line, a prediction that is not text, or a repeated id is an error naming the file and line."""
    path = Path(path)
    ids: list[str] = []
    predictions: list = []
    first_line: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ScoreError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "id" not in record or "prediction" not in record:
                raise ScoreError(f"{path}:{lineno}: expected an object with `id` and `prediction`")
            example_id, prediction = str(record["id"]), record["prediction"]
            texts = prediction if isinstance(prediction, list) else [prediction]
            if not texts or not all(isinstance(t, str) for t in texts):
                raise ScoreError(f"{path}:{lineno}: example {example_id}: `prediction` must be a string or a "
                                 "non-empty list of strings")
            if example_id in first_line:
                raise ScoreError(f"{path}:{lineno}: example {example_id} was already given on line "
                                 f"{first_line[example_id]}")
            first_line[example_id] = lineno
            ids.append(example_id)
            predictions.append(prediction)
    if not ids:
        raise ScoreError(f"{path}: no predictions")
    return ids, predictions


@dataclass
class ScoreRun:
    """What `score_to_file` did: the result, where it went, and which trajectories an earlier run had scored."""

    result: ScoreResult
    path: Path
    resumed: list[str]
    seconds: float


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def _load_partial(partial: Path, header: dict, say: Callable[[str], None]) -> dict[str, TrajectoryScore]:
    """Trajectories an interrupted run with the same settings finished; a cut last line ends what is trusted."""
    if not partial.exists():
        return {}
    lines = partial.read_text(encoding="utf-8").splitlines()
    try:
        if not lines or json.loads(lines[0]) != header:
            say(f"{partial}: written with other settings or predictions; starting over")
            return {}
    except json.JSONDecodeError:
        return {}
    done: dict[str, TrajectoryScore] = {}
    for line in lines[1:]:
        try:
            item = TrajectoryScore.from_dict(json.loads(line))
        except (json.JSONDecodeError, KeyError, TypeError):
            break
        done[item.kernel_id] = item
    return done


def score_to_file(release: str | Path, predictions: str | Path, out: str | Path,
                  settings: ScoreSettings = ScoreSettings(), *, execute: bool = False,
                  workspace: str | Path | None = None, resume: bool = True,
                  progress: Callable[[str], None] | None = None) -> ScoreRun:
    """Score a predictions JSONL against a release's targets and write the results JSON to `out`.

    With execution, each finished trajectory is appended to `<out>.partial.jsonl` at once, and a rerun with the
    same settings and predictions keeps those trajectories; `out` appears whole when everything is scored.
    """
    import hashlib

    started = time.perf_counter()
    out = Path(out)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if execute:
        gate_permit(execute=True)  # refuse before reading anything
    ids, texts = read_predictions(predictions)
    loaded = load_release(release, settings.task)
    unknown = [i for i in ids if i not in loaded.task_rows]
    if unknown:
        raise ScoreError(f"{predictions}: example {unknown[0]}: no such id in {release}"
                         + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    references = [loaded.task_rows[i]["target"] for i in ids]
    partial = _partial_path(out)
    digest = hashlib.sha256(json.dumps([ids, texts], ensure_ascii=False).encode("utf-8")).hexdigest()
    header = {"settings": json.loads(json.dumps(asdict(settings))), "predictions_sha256": digest,
              "release": str(release)}
    done = _load_partial(partial, header, say) if resume and execute else {}
    if execute:
        out.parent.mkdir(parents=True, exist_ok=True)
        kept = [json.dumps(header, sort_keys=True)]
        kept += [json.dumps(t.to_dict(), ensure_ascii=False) for t in done.values()]
        partial.write_text("\n".join(kept) + "\n", encoding="utf-8")
    fh = partial.open("a", encoding="utf-8") if execute else None

    def write(item: TrajectoryScore) -> None:
        fh.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
        fh.flush()

    try:
        result = score(texts, references, ids=ids, settings=settings, execute=execute, release=loaded,
                       workspace=workspace, done=done, on_trajectory=write if fh else None, progress=say)
    finally:
        if fh is not None:
            fh.close()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result.to_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out)
    partial.unlink(missing_ok=True)
    return ScoreRun(result, out, sorted(done), time.perf_counter() - started)

