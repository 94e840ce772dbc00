"""The scorer's records and settings: examples, per-prediction and per-example records, trajectory scores, results.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from themisto.errors import InputError
from themisto.jsonrecords import from_dict
from themisto.scoring.text_scores import chrf, exact_match, rouge_l
from themisto.vocabulary import TASKS, ExampleStatus, Outcome

EXECUTION_SCORES: tuple[str, ...] = ("exec_ok", "output_match", "state_match", "functional_match",
                                     "continuation_match")
# How many logged cells after the target run after each prediction and reference (themisto.scoring.continuation).
CONTINUATION_CELLS = 3
REFERENCE_RUNS = 2
# A slow reference cell (model training) keeps its full time: the branch timeout grows to this many times the time
# the cell took in the release's replay, for the reference and the predictions alike.
SLOW_REFERENCE_FACTOR = 3.0
REASON_CHARS = 300


class ScoreError(InputError):
    """Input the scorer cannot use; the message names the example id (or the release file) concerned."""


@dataclass(frozen=True)
class ScoreSettings:
    """What is scored and how predictions are executed."""

    task: str = "next_cell"
    k: tuple[int, ...] = (1,)  # pass@k for each k (execution only)
    timeout_s: float = 30.0  # per prediction (raised for slow reference cells, see SLOW_REFERENCE_FACTOR)
    # An example whose reference cell took longer than this in the build's replay is refused unrun: its two reference
    # runs and each prediction would hold a core for minutes (a model fit of a JuNE task-2 log: 690 s); the continuation
    # after any example stops before a cell longer than timeout_s (themisto.scoring.continuation.continuation_rows).
    max_reference_s: float = 120.0
    memory_bytes: int = 2**30  # each branch may allocate this much beyond the kernel's current use
    output_bytes: int = 2**20
    max_prediction_chars: int = 100_000  # a longer prediction is refused, not run
    rel_tol: float = 1e-6  # output equivalence: numbers agree within these tolerances
    abs_tol: float = 1e-9
    use_fork: bool | None = None  # None: fork where the platform can, replay the prefix otherwise
    # How a branch finds what a prediction changed: "pages" rehashes only frames and arrays whose buffers it may have
    # written, "hash" rehashes every variable (both exact; see themisto.runtime.branch.run_branches).
    branch_delta: str = "pages"
    verify_state: bool = True  # compare the rebuilt state's hash with the release's state_hash_before
    continuation_cells: int = CONTINUATION_CELLS  # k for continuation_match; 0 turns it off (no extra cells)
    # Start a trajectory's branches from the state its release's values restore (themisto.replay.restore), checked
    # against the state hash, instead of replaying the prefix before its first example, and restore again in the same
    # kernel before each later example whose gap costs more to replay (themisto.release.states.pre_step_states); off:
    # the prefix is replayed.
    restore: bool = False

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ScoreError(f"unknown task {self.task!r} (expected one of {', '.join(TASKS)})")
        if self.branch_delta not in ("pages", "hash"):
            raise ScoreError(f"branch_delta must be 'pages' or 'hash', got {self.branch_delta!r}")
        ks = (self.k,) if isinstance(self.k, int) else tuple(self.k)
        if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
            raise ScoreError(f"k must be positive integers, got {self.k!r}")
        object.__setattr__(self, "k", tuple(sorted(set(ks))))
        if not self.timeout_s > 0:
            raise ScoreError(f"timeout_s must be positive, got {self.timeout_s!r}")
        if not self.max_reference_s > 0:
            raise ScoreError(f"max_reference_s must be positive, got {self.max_reference_s!r}")
        if isinstance(self.continuation_cells, bool) or not isinstance(self.continuation_cells, int) \
                or self.continuation_cells < 0:
            raise ScoreError(f"continuation_cells must be an integer >= 0, got {self.continuation_cells!r}")


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
    continuation_match: bool | None = None  # judged by the next logged cells (themisto.scoring.continuation)
    duration_s: float | None = None  # the prediction's own run time in its branch
    continuation_s: float | None = None  # the continuation cells' own run time after it, in its branch
    # What the prediction touched in the scorer's machinery (gc walks, ctypes, /proc, signals, patched modules, a
    # malformed report), as its branch saw it; empty when nothing. A leaderboard audits these predictions.
    suspicious: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping) -> PredictionRecord:
        return from_dict(cls, data)


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
    # run-specific variables (a clock reading: themisto.release.run_specific) whose rebuilt hash differs, left out of
    # state_verified and counted apart (first 20)
    state_run_specific: list[str] = field(default_factory=list)
    branch_wall_s: float | None = None  # wall time of the step's branch call (references + predictions)
    reference_durations_s: list[float] = field(default_factory=list)  # the reference's own time in each run
    reference_continuation_s: list[float] = field(default_factory=list)  # its continuation cells' own time, each run
    continuation_cells: int | None = None  # logged cells run after each prediction (fewer than k near a restart)
    continuation_problem: str = ""  # why continuation_match is undefined for this example ("" when defined)
    # Why a text_only example of an executing run was not executed: its trajectory's input files or kernel
    # environment are not here (themisto.vocabulary.TEXT_ONLY_REASONS; "" otherwise)
    text_only_reason: str = ""

    @classmethod
    def from_dict(cls, data: Mapping) -> ExampleRecord:
        return from_dict(cls, data)


@dataclass
class TrajectoryScore:
    """The execution records of one trajectory's examples: the unit that is written, and resumed, at a time."""

    kernel_id: str
    examples: list[ExampleRecord]
    predictions: list[PredictionRecord]
    replay_s: float = 0.0  # wall time of the whole trajectory: replay, state checks and branches
    # With ScoreSettings.restore: the first step whose state was restored instead of replayed (None: the prefix was
    # replayed), how many steps were restored (themisto.release.states.pre_step_states restores again where the gap to
    # the next step costs more to replay), how long the restores took together, and why none was used ("" when one
    # was)
    restored_step: int | None = None
    restores: int = 0
    restore_s: float | None = None
    restore_note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TrajectoryScore:
        return from_dict(cls, data, examples=[ExampleRecord.from_dict(e) for e in data["examples"]],
                         predictions=[PredictionRecord.from_dict(p) for p in data["predictions"]])


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
    from themisto.runtime.outputs import mask_volatile
    from themisto.scoring.equivalence import outputs_equivalent

    records = []
    for example in examples:
        # Outputs are compared with what drifts between runs masked (addresses, the execution counter), as the release
        # masks them in targets and history.
        outputs = settings.task == "output_prediction"
        reference = mask_volatile(example.reference) if outputs else example.reference
        for index, prediction in enumerate(example.predictions):
            text = mask_volatile(prediction) if outputs else prediction
            record = PredictionRecord(
                id=example.id, index=index, prediction=prediction, exact_match=exact_match(text, reference),
                rouge_l=rouge_l(text, reference), chrf=chrf(text, reference))
            if outputs:
                verdict = outputs_equivalent(text, reference, rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
                record.output_equivalent, record.equivalence_rule = verdict.equal, verdict.rule
            records.append(record)
    return records


# ---------------------------------------------------------------------------------------------------------------
# The release: the rows that rebuild each example's state, and the workspace it was built over




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
