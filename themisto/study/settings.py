"""What a fine-tuning study is: its modes, seeds, training and generation settings, and the presets that fill them.

A study folder records its settings in `study.json`; a rerun with other settings is refused, naming what differs
(`what_differs`), except those that change how it runs, not what it computes (NOT_RESULTS: `parallel`, `progress`,
`generate_only`, ...), and `seeds`: each seed is whole units of its own, so a later run may add seeds (the results
give each cell's). Where the release and the base model lie may change too (a study generated on a GPU machine is
scored on another): they are matched by the release's content hash and the model's weights
(themisto.study.run.open_study).

>>> StudySettings(release="r", model="m", contexts=("variables",)).contexts
('none', 'variables')
>>> what_differs(StudySettings(release="r", model="m").to_dict(),
...              StudySettings(release="r", model="m", epochs=1.0, seeds=5, parallel=3).to_dict())
'epochs is 2.0 there, 1.0 here'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from themisto.errors import InputError
from themisto.generation.example_spec import ExampleSpec, Spelling
from themisto.modes import context_modes
from themisto.vocabulary import BASELINE_CONTEXT, BENCHMARK_SPLIT, CLUSTER_UNITS, STATIC_CONTEXT_MODES, TASKS

# Every mode whose prompt is fixed before the model runs (a probe conversation exists only once a model had it).
STUDY_CONTEXT_MODES: tuple[str, ...] = STATIC_CONTEXT_MODES
# Settings that do not change a study's results: a folder may be resumed with other values of these.
# `batching` is one of them: the memory-batched greedy path gives the plain path's answers
# (tests/test_generation_batched.py).
NOT_RESULTS: tuple[str, ...] = ("parallel", "progress", "generate_only", "score_only", "budget_s", "batching")
# A study may be given more seeds later (or fewer): each seed adds units of its own and changes none of the others.
EXTENDABLE: tuple[str, ...] = ("seeds",)
BATCHINGS: tuple[str, ...] = ("fixed", "memory")  # themisto.generation.backends.hf.BATCHINGS (not imported: torch)
# Settings that say where something lies: a folder is matched by what lies there (content hash, weights hash).
LOCATIONS: tuple[str, ...] = ("release", "model")


class StudyError(InputError):
    """A study that cannot run as asked; the message names the setting, folder or file concerned."""


# The study's options (`themisto study --tasks ... --test-limit K`) as its refusals name them.
STUDY_OPTIONS = Spelling("--{name} {value}", {"limit": "test-limit", "max_prompt_tokens": "max-prompt-tokens"},
                         StudyError)


@dataclass(frozen=True)
class StudySettings:
    """One study: release and base model, modes and seeds, the fine-tuning and generation settings, what is scored."""

    release: str
    model: str  # the base model: a folder, a Hub id or a .gguf file
    contexts: tuple[str, ...] = STUDY_CONTEXT_MODES  # `none` is always in (the paired effects' control), first
    seeds: int = 3
    tasks: tuple[str, ...] = TASKS
    preset: str = "custom"
    # Fine-tuning (eval/finetune.py's settings, the same for every mode and seed but the seed).
    method: str = "full"
    epochs: float = 2.0
    max_steps: int = -1  # -1: `epochs` epochs (every mode trains on the same rows, so the same steps)
    learning_rate: float = 5e-5
    batch_size: int = 16
    grad_accum: int = 1
    max_length: int = 2600  # tokens of prompt and completion; a row longer in any mode is left out of every mode
    length_grouped: bool = True  # batches of like lengths (in a seeded random order of groups): less padding
    train_limit: int | None = None  # train on this many of the common rows (evenly spread); None: all
    # Generation and the prompt budget, one rule for training and test prompts: the base model's tokenizer.
    max_prompt_tokens: int = 2048
    max_new_tokens: int = 128
    test_limit: int | None = None  # test examples per task (evenly spread); None: all
    generation_batch: int = 64  # prompts a batch at most (with `memory` batching, fewer where memory says so)
    batching: str = "memory"
    device: str = "auto"
    dtype: str = "auto"  # the transformers backend's number format for generation
    # Scoring.
    execute: bool = False  # next_cell predictions run in the exact pre-cell state (needs HF_ALLOW_CODE_EVAL=1)
    execute_limit: int | None = None  # how many next_cell test examples are executed (evenly spread); None: all
    cluster: str = "trajectory"
    resamples: int = 2000
    # How the work runs (not what it computes).
    parallel: int = 1  # (mode, seed) models trained and generated at once: on one GPU several small ones fit
    progress: bool = True
    generate_only: bool = False  # stop once every model has generated: score later, here or on another machine
    score_only: bool = False  # score the finished units and nothing else (the scoring machine trains nothing)
    budget_s: float | None = None  # start no unit that the plan says would end past this many seconds

    def __post_init__(self) -> None:
        contexts = tuple(dict.fromkeys((BASELINE_CONTEXT, *self.contexts)))
        object.__setattr__(self, "contexts", contexts)
        self.test_spec(self.tasks, contexts)  # tasks, modes, the test limit and the budget, checked as a run's
        unknown = [c for c in contexts if c not in STATIC_CONTEXT_MODES]
        if unknown:
            raise StudyError(f"context mode {unknown[0]!r} cannot be trained on (expected some of "
                             f"{', '.join(STATIC_CONTEXT_MODES)})")
        for name in ("seeds", "batch_size", "grad_accum", "max_length", "max_new_tokens", "generation_batch",
                     "parallel", "resamples"):
            if getattr(self, name) < 1:
                raise StudyError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("train_limit", "execute_limit"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise StudyError(f"{name} must be at least 1 (or unset), got {getattr(self, name)}")
        if self.max_prompt_tokens >= self.max_length:
            raise StudyError(f"max_prompt_tokens ({self.max_prompt_tokens}) must leave room for the completion "
                             f"within max_length ({self.max_length})")
        if self.batching not in BATCHINGS:
            raise StudyError(f"batching must be one of {', '.join(BATCHINGS)}, got {self.batching!r}")
        if self.generate_only and self.score_only:
            raise StudyError("--generate-only and --score-only exclude each other")
        if self.budget_s is not None and self.budget_s <= 0:
            raise StudyError(f"budget_s must be positive, got {self.budget_s}")
        if self.cluster not in CLUSTER_UNITS:
            raise StudyError(f"cluster must be one of {', '.join(CLUSTER_UNITS)}, got {self.cluster!r}")

    def test_spec(self, tasks: tuple[str, ...], contexts: tuple[str, ...]) -> ExampleSpec:
        """The test examples of `tasks` in `contexts` as the study's runs generate them (its test limit and prompt
        budget), refused as the study's options spell them."""
        return ExampleSpec(tasks=tasks, contexts=contexts, split=BENCHMARK_SPLIT, limit=self.test_limit,
                           max_prompt_tokens=self.max_prompt_tokens, spelling=STUDY_OPTIONS)

    @property
    def runtime_modes(self) -> tuple[str, ...]:
        return tuple(mode.name for mode in context_modes(self.contexts) if not mode.is_baseline)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["contexts"], data["tasks"] = list(self.contexts), list(self.tasks)
        return data


# The presets: `gpu` is the study (every verified row, full fine-tuning in bf16 on one GPU, several models at once);
# `cpu-check` runs the same code path on a reduced configuration that ends in minutes on a laptop's CPU. Its figures
# check the path; they are not a result (results.md says so).
PRESETS: dict[str, dict] = {
    # Batches of 16 rows as 2 micro-batches of 8 (the same optimizer steps; a micro-batch of 16 rows of 2,600 tokens
    # holds ~20 GB of logits alone; with 8, three models training side by side and generating in their share of
    # the memory stay within an H100's 80 GB, by estimate: ~10 + ~13 GB each at worst); 300 test examples a
    # task (next_cell has 1,661), all of them executed when scored; generation in batches sized by memory. One seed:
    # by the plan's estimate on the real release (docs/fine-tuning.md) every mode with 3 seeds takes 14 min of an
    # H100 (4 modes; 17 with 5), 2 seeds 9.5 min (12 with 5), 1 seed 5 min (6 with 5): one fits an 8-minute slot,
    # and a later slot adds seeds (`--seeds 3`: a study takes more seeds, each whole units of its own).
    "gpu": {"seeds": 1, "method": "full", "epochs": 2.0, "max_steps": -1, "learning_rate": 5e-5, "batch_size": 8,
            "grad_accum": 2, "max_length": 2600, "max_prompt_tokens": 2048, "max_new_tokens": 128,
            "test_limit": 300, "execute_limit": 300, "generation_batch": 256, "batching": "memory",
            "device": "cuda", "dtype": "bfloat16", "parallel": 3},
    "cpu-check": {"contexts": (BASELINE_CONTEXT, "variables"), "seeds": 2, "method": "full", "max_steps": 1,
                  "learning_rate": 5e-5, "batch_size": 2, "max_length": 1024, "max_prompt_tokens": 768,
                  "max_new_tokens": 24, "train_limit": 8, "test_limit": 4, "execute_limit": 2,
                  "generation_batch": 8, "device": "cpu", "dtype": "auto", "parallel": 1},
}
PRESET_NAMES: tuple[str, ...] = ("custom", *PRESETS)
PATH_CHECK_NOTE = ("a path check (--preset cpu-check: {steps} optimizer step(s) on {rows} rows, {tests} test "
                   "examples per task): these figures check that the study runs end to end; they are not a result")


def with_preset(preset: str, given: dict) -> StudySettings:
    """The settings of `preset` (custom: the defaults), with every option the user gave explicitly on top."""
    if preset not in PRESET_NAMES:
        raise StudyError(f"unknown preset {preset!r} (expected one of {', '.join(PRESET_NAMES)})")
    known = {f.name for f in fields(StudySettings)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise StudyError(f"unknown study setting(s): {', '.join(unknown)}")
    base = PRESETS.get(preset, {})
    return StudySettings(**{**base, **given, "preset": preset})


def is_path_check(settings: StudySettings) -> bool:
    return settings.preset == "cpu-check"


def what_differs(recorded: dict, asked: dict, *, ignore: tuple[str, ...] = ()) -> str | None:
    """The first setting that differs between a folder's recorded study and the one asked for, as a sentence
    (`ignore`: settings checked otherwise, such as LOCATIONS by content)."""
    from themisto.resume import settings_difference

    def results_only(data: dict) -> dict:
        return {k: v for k, v in data.items() if k not in NOT_RESULTS and k not in EXTENDABLE and k not in ignore}

    return settings_difference(results_only(recorded), results_only(asked))
