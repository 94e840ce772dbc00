"""`themisto sft-export`: a release split as supervised fine-tuning examples in TRL's conversational format.

Each example is `{"prompt": [system, user], "completion": [assistant]}` plus its `id`, `task` and `context`;
SFTTrainer then puts the loss on the completion only. Prompts come from `render_prompt`, the function generation
sends to every backend, so a model is trained on exactly the prompts it is evaluated on; the completion is the target
in the fenced block the prompt asks for. Only execution-verified targets are kept (`themisto.training.verify`).
The output folder holds `examples.jsonl`, `dataset/` (`datasets.save_to_disk`) and `manifest.json`, written whole
or not at all.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection

from themisto.errors import InputError
from themisto.generation.example_spec import COMMAND_LINE, ExampleSpec
from themisto.generation.prompts import render_prompt, template_sha256
from themisto.modes import context_mode
from themisto.resume import folder_written_whole
from themisto.release.folder import ReleaseInfo
from themisto.training.verify import DROP_REASONS, Verifier, has_snapshot
from themisto.vocabulary import DEFAULT_CONTEXT_MODES, STATIC_CONTEXT_MODES, TASKS

EXAMPLES_FILE = "examples.jsonl"
DATASET_DIR = "dataset"
MANIFEST_FILE = "manifest.json"
MIXES: tuple[str, ...] = ("all", "one")
# Reasons beyond the verification rules: what rendering and de-duplication leave out.
EXPORT_DROP_REASONS: dict[str, str] = {
    **DROP_REASONS,
    "prompt_over_budget": "the prompt is over --max-prompt-tokens even after trimming history and reprs",
    "duplicate": "the same prompt and completion were already exported (a re-run cell in the same state)",
}
_BACKTICK_RUN = re.compile(r"(?m)^[ \t]*(`{3,})")


class ExportError(InputError):
    """The export cannot run as asked; the message names the release, split, task, context or folder."""


# `themisto sft-export`'s options as its refusals name them.
EXPORT_OPTIONS = replace(COMMAND_LINE, error=ExportError)


@dataclass(frozen=True)
class ExportSettings:
    """What to export: which split, tasks and context modes, and how context modes are mixed over rows."""

    split: str = "train"
    tasks: tuple[str, ...] = TASKS
    contexts: tuple[str, ...] = DEFAULT_CONTEXT_MODES  # `trace` by name; never `probe` (STATIC_CONTEXT_MODES)
    # all: every verified row once per context mode; one: each row once, in a context mode drawn with `seed`.
    mix: str = "all"
    seed: int = 0
    verify: bool = True  # False keeps targets the replay did not reproduce (the manifest says so)
    # Counted as generation counts them: with the model's tokenizer where the export is given its counter
    # (`export_sft(count_tokens=...)`, e.g. `prompt_token_counter` of the base model), else the estimate UTF-8
    # bytes / 3 that generation uses for backends without a tokenizer. The manifest says which.
    max_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        # What it shares with a run (tasks, modes, split, budget) is checked as a run's, refused as its options.
        spec = ExampleSpec(tasks=self.tasks, contexts=self.contexts, split=self.split,
                           max_prompt_tokens=self.max_prompt_tokens, spelling=EXPORT_OPTIONS)
        dynamic = [c for c in self.contexts if c not in STATIC_CONTEXT_MODES]
        if dynamic:
            raise spec.refused("contexts", self.contexts, f"{', '.join(dynamic)} cannot be exported (a probe "
                               f"conversation exists only once a model has had it; expected some of "
                               f"{', '.join(STATIC_CONTEXT_MODES)})")
        if self.mix not in MIXES:
            raise ExportError(f"unknown context mix {self.mix!r} (expected one of {', '.join(MIXES)})")


@dataclass
class ExportReport:
    """What an export wrote: examples per task and context, and rows dropped per task and reason."""

    out: Path
    examples: int
    by_task_context: dict[str, dict[str, int]]
    dropped: dict[str, dict[str, int]]
    manifest: dict = field(repr=False, default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# The release


def _task_rows(release: ReleaseInfo, settings: ExportSettings) -> dict[str, list[dict]]:
    """Each task's rows of `settings.split`, exactly as a run reads its test rows (generation's loader, the same
    history fields); a missing split is an ExportError."""
    from themisto.generation.release_rows import load_task_rows

    for task in settings.tasks:
        have = release.splits(task)
        if have and settings.split not in have:
            raise ExportError(f"{release.path}: {task} has no `{settings.split}` split (it has: {', '.join(have)})")
        release.require(task, settings.split)
    return {task: load_task_rows(release, task, settings.contexts, split=settings.split) for task in settings.tasks}


def _verifier(release: ReleaseInfo, settings: ExportSettings) -> Verifier | None:
    """What checks each row's target against the split's replay (None: targets kept unverified)."""
    from themisto.release.folder import TRAJECTORIES

    if not settings.verify:
        return None
    if not release.has(TRAJECTORIES, settings.split):
        raise ExportError(f"{release.path}: the trajectories config has no `{settings.split}` split, which "
                          "verification reads (--no-verify exports without it)")
    return Verifier(release.rows(TRAJECTORIES, settings.split))


# ---------------------------------------------------------------------------------------------------------------
# Examples


def fenced(text: str, language: str = "") -> str:
    """`text` in a fenced block that `extract_answer` reads back: a fence longer than any backtick run in it."""
    longest = max((len(m.group(1)) for m in _BACKTICK_RUN.finditer(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"


def completion_text(row: dict, task: str) -> str:
    """The answer the prompt's instruction asks for: the target in a ```python block (code) or a ``` block (output)."""
    return fenced(row["target"], "python" if task == "next_cell" else "")


def _contexts_for(row: dict, settings: ExportSettings) -> tuple[str, ...]:
    if settings.mix == "all":
        return settings.contexts
    rng = random.Random(f"{settings.seed}/{row['id']}")
    return (rng.choice(settings.contexts),)


@dataclass
class _Collected:
    examples: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)


def _add(collected: _Collected, row: dict, task: str, context: str, settings: ExportSettings,
         count_tokens: Callable[[str], int] | None) -> None:
    if context_mode(context).needs_snapshot and not has_snapshot(row):
        collected.dropped.append({"id": row["id"], "task": task, "context": context, "reason": "no_snapshot"})
        return
    prompt = render_prompt(row, task, context, count_tokens=count_tokens,
                           max_prompt_tokens=settings.max_prompt_tokens)
    if prompt.skipped_reason:
        collected.dropped.append({"id": row["id"], "task": task, "context": context, "reason": "prompt_over_budget"})
        return
    completion = [{"role": "assistant", "content": completion_text(row, task)}]
    key = hashlib.sha256(json.dumps([task, prompt.messages, completion], sort_keys=True).encode()).hexdigest()
    if key in collected.seen:
        collected.dropped.append({"id": row["id"], "task": task, "context": context, "reason": "duplicate"})
        return
    collected.seen.add(key)
    collected.examples.append({"id": row["id"], "task": task, "context": context, "prompt": prompt.messages,
                               "completion": completion})


def collect_examples(release: ReleaseInfo, settings: ExportSettings,
                     progress: Callable[[str], None] | None = None, *,
                     count_tokens: Callable[[str], int] | None = None,
                     only: Collection[tuple[str, str]] | None = None) -> _Collected:
    """Verify, render and de-duplicate the examples of every task and context mode asked for, from the rows of
    `settings.split`; `only`: the (task, id) pairs to consider (others are not read), `count_tokens`: the prompt
    budget's counter."""
    rows_by_task = _task_rows(release, settings)
    verifier = _verifier(release, settings)
    collected = _Collected()
    wanted = set(only) if only is not None else None
    for task, rows in rows_by_task.items():
        for row in rows:
            if wanted is not None and (task, row["id"]) not in wanted:
                continue
            reason = verifier.problem(row, task) if verifier else None
            if reason is not None:
                collected.dropped.append({"id": row["id"], "task": task, "context": None, "reason": reason})
                continue
            for context in _contexts_for(row, settings):
                _add(collected, row, task, context, settings, count_tokens)
        if progress:
            progress(f"{task}: {len(rows)} rows read")
    if not collected.examples:
        raise ExportError(f"{release.path}: no example left to export from `{settings.split}` "
                          f"({len(collected.dropped)} dropped: {_reason_summary(collected.dropped)})")
    return collected


def _reason_summary(dropped: list[dict]) -> str:
    counts = Counter(item["reason"] for item in dropped)
    return ", ".join(f"{reason} {n}" for reason, n in counts.most_common()) or "none"


# ---------------------------------------------------------------------------------------------------------------
# Manifest and writing


def _augmentation(settings: ExportSettings) -> list[dict]:
    names = []
    if settings.split == "train":
        names.append({"name": "all_eligible_steps",
                      "description": "every eligible step of the train trajectories is a row (the test split of "
                                     "output_prediction is the paper's sample; train holds them all)"})
    if len(settings.contexts) > 1:
        how = ("each verified row once per context mode" if settings.mix == "all" else
               f"each verified row once, in one context mode drawn with seed {settings.seed}")
        names.append({"name": f"context_mix_{settings.mix}",
                      "description": f"{how} ({', '.join(settings.contexts)}), so one model learns to use the "
                                     "runtime state when the prompt shows it"})
    return names


def _counts(collected: _Collected, settings: ExportSettings) -> tuple[dict, dict]:
    by_task_context = {t: {c: 0 for c in settings.contexts} for t in settings.tasks}
    for example in collected.examples:
        by_task_context[example["task"]][example["context"]] += 1
    dropped = {t: {r: 0 for r in EXPORT_DROP_REASONS} for t in settings.tasks}
    for item in collected.dropped:
        dropped[item["task"]][item["reason"]] += 1
    return by_task_context, dropped


def build_manifest(release: ReleaseInfo, settings: ExportSettings, collected: _Collected,
                   counted_with: str = "estimate") -> dict:
    """The manifest: release and its hash, templates, settings, counts, dropped rows with reasons, augmentation."""
    import datasets
    import transformers
    import trl

    by_task_context, dropped = _counts(collected, settings)
    return {
        "format": 1,
        "release": {"path": str(release.path.resolve()), "content_hash": release.content_hash},
        "split": settings.split,
        "settings": asdict(settings),
        "prompt_tokens_counted_with": counted_with,
        "templates": {t: {c: template_sha256(t, c) for c in settings.contexts} for t in settings.tasks},
        "completion": "the target in the fenced block the prompt asks for (```python for next_cell, ``` for output)",
        "verification": ("execution-verified: a row is kept when replay ended its step as logged, so did every "
                         "cell of its history, and (output_prediction) its output types match the log and it is not "
                         "capped" if settings.verify else "off: targets are not checked against the log"),
        "counts": {"examples": len(collected.examples),
                   "by_task": {t: sum(c.values()) for t, c in by_task_context.items()},
                   "by_context": {c: sum(by_task_context[t][c] for t in settings.tasks) for c in settings.contexts},
                   "by_task_context": by_task_context},
        "dropped": dropped,
        "drop_reasons": EXPORT_DROP_REASONS,
        "dropped_examples": collected.dropped,
        "augmentation": _augmentation(settings),
        "notes": ["the test split is the benchmark: a model trained on it cannot be scored on it"]
        if settings.split == "test" else [],
        "packages": {"datasets": datasets.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__},
    }


def _write(folder: Path, collected: _Collected, manifest: dict) -> None:
    import datasets

    with (folder / EXAMPLES_FILE).open("w", encoding="utf-8") as fh:
        for example in collected.examples:
            fh.write(json.dumps(example, ensure_ascii=False) + "\n")
    message = datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")})
    features = datasets.Features({"id": datasets.Value("string"), "task": datasets.Value("string"),
                                  "context": datasets.Value("string"), "prompt": message, "completion": message})
    datasets.Dataset.from_list(collected.examples, features=features).save_to_disk(str(folder / DATASET_DIR))
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out}: exists and is not an empty folder (pass --overwrite to replace it)")


def export_sft(release: ReleaseInfo, out: str | Path, settings: ExportSettings = ExportSettings(), *,
               overwrite: bool = False, progress: Callable[[str], None] | None = None,
               count_tokens: Callable[[str], int] | None = None, counted_with: str = "estimate",
               only: Collection[tuple[str, str]] | None = None) -> ExportReport:
    """Export `settings.split` of `release` into `out` (examples.jsonl, dataset/, manifest.json), whole or nothing.
    `count_tokens` counts the prompt budget (named `counted_with` in the manifest; default: generation's estimate);
    `only` keeps just these (task, id) rows (the fine-tuning study's rows common to every mode)."""
    out = Path(out)
    _check_out(out, overwrite)
    collected = collect_examples(release, settings, progress, count_tokens=count_tokens, only=only)
    manifest = build_manifest(release, settings, collected, counted_with)
    if out.exists() and not out.is_dir():
        out.unlink()  # _check_out allowed replacing it
    with folder_written_whole(out) as tmp:
        _write(tmp, collected, manifest)
    by_task_context, dropped = _counts(collected, settings)
    return ExportReport(out, len(collected.examples), by_task_context, dropped, manifest)
