"""The closed vocabularies the stages share, declared here once: tasks, context modes, splits and statuses.

Every stage, the command line's `choices` and defaults included, takes these names from here. Each set is a
`Literal` (for the type of a record's field) and the tuple of its values in their order (for checks, choices and
tables), the tuple derived from the `Literal` so the two cannot disagree. The context modes are the exception: they
are objects declared in `themisto.modes` (a new mode is one entry of its table plus its template in
`themisto.generation.prompts`), and their names here are derived from that table. Standard library only:
`import themisto.vocabulary` loads nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

from themisto import modes as _modes

# The benchmark's two tasks; each is also a config of the release (beside `trajectories`).
Task = Literal["next_cell", "output_prediction"]
TASKS: tuple[str, ...] = get_args(Task)

# Runtime-context modes of a prompt: declared in `themisto.modes` (what each needs and shows, looked up by name with
# `context_mode`); the names below are derived from its table. `BASELINE_CONTEXT` is the control paired effects
# compare against; `PROBE_BASE_CONTEXT` the prompt a probe-mode conversation starts from (its second paired effect).
# `STATIC_CONTEXT_MODES`: the modes whose prompt is a picture of the state fixed before the model runs (what
# `themisto sft-export` can write); `DEFAULT_CONTEXT_MODES`: what `generate` and `sft-export` run with no --context.
CONTEXT_MODES: tuple[str, ...] = _modes.CONTEXT_MODES
ContextMode = Literal[CONTEXT_MODES]  # type: ignore[valid-type]  # the table's names (nothing annotates with it)
BASELINE_CONTEXT: str = _modes.BASELINE_CONTEXT
PROBE_CONTEXT: str = _modes.PROBE_CONTEXT
PROBE_BASE_CONTEXT: str = _modes.PROBE_BASE_CONTEXT
STATIC_CONTEXT_MODES: tuple[str, ...] = _modes.STATIC_CONTEXT_MODES
DEFAULT_CONTEXT_MODES: tuple[str, ...] = _modes.DEFAULT_CONTEXT_MODES

# How a probe-mode model asks for a probe: a fenced block any model can write, or the backend's native tool calls.
ProbeProtocol = Literal["text", "native"]
PROBE_PROTOCOLS: tuple[str, ...] = get_args(ProbeProtocol)
# Why a probe-mode conversation ended: the model answered without asking; it used every probe allowed (then it is
# asked for its answer); the next probe's output would not have fitted the prompt budget (likewise); the backend
# failed; or the pre-cell state could not be served (the trajectory's replay failed there).
ProbeStop = Literal["answered", "max_probes", "budget", "backend_failed", "state_unavailable"]
PROBE_STOPS: tuple[str, ...] = get_args(ProbeStop)

# Splits of a release: `test` is the benchmark; `train` holds other trajectories (and participants) for fine-tuning.
Split = Literal["test", "train"]
SPLITS: tuple[str, ...] = get_args(Split)
BENCHMARK_SPLIT: Split = "test"
# The examples a run generates for: a split, or `all` of them (test, then train). Only a `test` run is a submission;
# a model not trained on `train` may be scored on it (more examples, more participants: the results table says so).
RunSplit = Literal["test", "train", "all"]
RUN_SPLITS: tuple[str, ...] = get_args(RunSplit)
ALL_SPLITS: RunSplit = "all"

# What a score's bootstrap resamples as one independent unit: whole trajectories, or whole participants (a
# participant's trajectories are one developer's habits, not independent draws; `themisto.scoring.intervals`).
ClusterUnit = Literal["trajectory", "participant"]
CLUSTER_UNITS: tuple[str, ...] = get_args(ClusterUnit)

# One generation line's status: `skipped` (the prompt did not fit) and `failed` (the backend gave up) score 0.
GenerationStatus = Literal["ok", "skipped", "failed"]
GENERATION_STATUSES: tuple[str, ...] = get_args(GenerationStatus)

# How a cell ended in a kernel or in a branch of one; `timeout` and `kernel_died` are a cell that did not finish.
CellStatus = Literal["ok", "error", "timeout", "kernel_died"]
CELL_STATUSES: tuple[str, ...] = get_args(CellStatus)
UnfinishedStatus = Literal["timeout", "kernel_died"]
UNFINISHED_STATUSES: tuple[str, ...] = get_args(UnfinishedStatus)

# What the log recorded about an execution. "unknown": the log never said how it ended (no finished event).
LoggedStatus = Literal["ok", "error", "interrupted", "unknown"]
LOGGED_STATUSES: tuple[str, ...] = get_args(LoggedStatus)
# The logged outcomes a replay can be compared with (an interrupt or an unknown end says nothing of the result).
COMPARABLE_LOGGED: tuple[str, ...] = ("ok", "error")

# What is known of a logged execution's code: `as_logged` (the log's own text, no damage seen), `repaired` (the
# log's text was damaged and is restored from evidence that agrees with every character the log kept), `damaged`
# (known damaged and nothing restores it: never a target, marked wherever it is shown as history).
CodeState = Literal["as_logged", "repaired", "damaged"]
CODE_STATES: tuple[str, ...] = get_args(CodeState)
# What a log line or an execution lost (themisto.ingest.june_log names each by file and line): a line cut short, a
# line that parsed but lost text, a line that lost its last fields, an `execute` with no `finished_execute`, and a
# code logged as having run ok that does not compile (so not the code that ran).
DamageKind = Literal["cut_line", "lost_text", "lost_fields", "no_finish", "uncompilable"]
DAMAGE_KINDS: tuple[str, ...] = get_args(DamageKind)

# A scored prediction's outcome: how its cell ended, or `refused` (it was not run).
Outcome = Literal[CellStatus, "refused"]
OUTCOMES: tuple[str, ...] = get_args(Outcome)

# How an example fared as a whole: `scored` counts in the functional scores; the others are reported, not guessed.
ExampleStatus = Literal["text_only", "scored", "nondeterministic", "reference_unfinished", "reference_diverged",
                        "refused"]
EXAMPLE_STATUSES: tuple[str, ...] = get_args(ExampleStatus)
# Why an executing run scored an example by text only: its trajectory's input files are not where they were or differ
# from those it replayed over, or its kernel environment is not installed (themisto.release.workspaces).
TextOnlyReason = Literal["sources_missing", "sources_changed", "environment_missing"]
TEXT_ONLY_REASONS: tuple[str, ...] = get_args(TextOnlyReason)

# Subsets and breakdowns of a score: all examples or the hard ones (no baseline solves them); the third of its
# trajectory a target lies in.
SUBSETS: tuple[str, ...] = ("all", "hard")
POSITIONS: tuple[str, ...] = ("early", "middle", "late")

