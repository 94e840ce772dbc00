"""The closed vocabularies the stages share, declared here once: tasks, context modes, splits and statuses.

Every stage, the command line's `choices` and defaults included, takes these names from here, so a new context
mode is one edit below plus its template (`themisto.generation.prompts`). Each set is a `Literal` (for the type of
a record's field) and the tuple of its values in their order (for checks, choices and tables), the tuple derived
from the `Literal` so the two cannot disagree. Standard library only: `import themisto.vocabulary` loads nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

# The benchmark's two tasks; each is also a config of the release (beside `trajectories`).
Task = Literal["next_cell", "output_prediction"]
TASKS: tuple[str, ...] = get_args(Task)

# Runtime-context modes of a prompt, in the order tables show them; `none` is the baseline paired effects compare
# against. `none` shows no snapshot; every other mode needs the release's snapshots. `trace`: each history cell
# followed by the variables it changed, as JSON (themisto.generation.trace). `probe` is the `variables` prompt plus
# the right to run probes (model-written code) in branches of the live pre-cell state.
ContextMode = Literal["none", "variables", "full", "trace", "probe"]
CONTEXT_MODES: tuple[str, ...] = get_args(ContextMode)
BASELINE_CONTEXT = "none"
PROBE_CONTEXT = "probe"
PROBE_BASE_CONTEXT = "variables"  # the prompt a probe-mode conversation starts from; its second paired effect
# Modes whose prompt is a picture of the state fixed before the model runs: no code runs to make it, so these are
# what `themisto sft-export` can write (a probe conversation exists only once a model has had it).
STATIC_CONTEXT_MODES: tuple[str, ...] = tuple(c for c in CONTEXT_MODES if c != PROBE_CONTEXT)
# What `themisto generate` and `themisto sft-export` run when no --context is given (`probe` needs the execution
# opt-in; `trace` is asked for by name).
DEFAULT_CONTEXT_MODES: tuple[str, ...] = ("none", "variables", "full")

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

# Subsets and breakdowns of a score: all examples or the hard ones (no baseline solves them); the third of its
# trajectory a target lies in.
SUBSETS: tuple[str, ...] = ("all", "hard")
POSITIONS: tuple[str, ...] = ("early", "middle", "late")

