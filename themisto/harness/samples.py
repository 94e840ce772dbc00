"""A release's task rows as Inspect samples: each one's input the exact prompt `themisto generate` renders (same
template, same budget rule), its target the reference, its id the release id, and its metadata what a run folder's
`generations.jsonl` records as `kept` plus where the example lies (trajectory and step: the interval's cluster).

Token counts: the dataset is built before Inspect has a model to ask, so the budget counts with the stated estimate
(`themisto.generation.prompts.approx_tokens`, UTF-8 bytes / 3: deliberately high), as `themisto generate` does for
backends without a local tokenizer; the metadata says which counter was used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from themisto.errors import InputError
from themisto.generation.backends.base import Sampling
from themisto.generation.delta import DeltaSettings
from themisto.generation.probe_protocol import ProbeSettings
from themisto.generation.prompts import Prompt, approx_tokens, render_prompt
from themisto.modes import context_mode
from themisto.vocabulary import BENCHMARK_SPLIT, CONTEXT_MODES, RUN_SPLITS, TASKS

TOKEN_COUNTER = "approx_tokens (UTF-8 bytes / 3)"


class HarnessError(InputError):
    """A task parameter the Inspect tasks cannot take; the message names the parameter."""


@dataclass(frozen=True)
class HarnessSettings:
    """One Inspect task's parameters (`-T key=value`), checked: which release, task, context mode, split and rows,
    the prompt budget, whether predictions are executed, the probe mode's settings (native tool calls) and the delta
    mode's."""

    task: str
    release: str
    context: str = "none"
    split: str = BENCHMARK_SPLIT
    limit: int | None = None
    max_prompt_tokens: int | None = None
    execute: bool = False
    execute_probes: bool = False
    probe: ProbeSettings = field(default_factory=lambda: ProbeSettings(protocol="native"))
    delta: DeltaSettings = field(default_factory=DeltaSettings)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise HarnessError(f"task {self.task!r}: expected one of {', '.join(TASKS)}")
        if self.context not in CONTEXT_MODES:
            raise HarnessError(f"-T context={self.context}: expected one of {', '.join(CONTEXT_MODES)}")
        if self.split not in RUN_SPLITS:
            raise HarnessError(f"-T split={self.split}: expected one of {', '.join(RUN_SPLITS)}")
        if self.limit is not None and self.limit < 1:
            raise HarnessError(f"-T limit={self.limit}: must be at least 1")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise HarnessError(f"-T max_prompt_tokens={self.max_prompt_tokens}: must be at least 1")
        if self.execute and self.task != "next_cell":
            raise HarnessError(f"-T execute=true: execution scores exist for next_cell only, not {self.task}")
        if self.probe.protocol != "native":
            raise HarnessError("the probe mode speaks to Inspect models through tool calls (protocol native)")

    @property
    def probing(self) -> bool:
        return context_mode(self.context).is_probe


def resolve_release(release: str) -> Path:
    """A release folder: `release` itself when it is one, else the Hub dataset it names, downloaded (or taken from
    the Hub cache) with huggingface_hub."""
    path = Path(release)
    if path.is_dir():
        return path
    if release.count("/") != 1 or path.exists():
        raise HarnessError(f"-T release={release}: no such release folder (nor a Hub dataset id owner/name)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=release, repo_type="dataset"))


def _prompt(row: dict, settings: HarnessSettings) -> Prompt:
    budget = settings.max_prompt_tokens
    if settings.probing:
        from themisto.generation.probing import reserve_tokens

        # As `themisto generate` does: the first prompt leaves room for the probes' calls and replies.
        reserve = min(budget // 2, reserve_tokens(settings.probe, Sampling().max_new_tokens, approx_tokens)) \
            if budget else 0
        return render_prompt(row, settings.task, settings.context, count_tokens=approx_tokens,
                             max_prompt_tokens=budget - reserve if budget else None, probe=settings.probe)
    return render_prompt(row, settings.task, settings.context, count_tokens=approx_tokens, max_prompt_tokens=budget,
                         delta=settings.delta)


def sample_of(row: dict, prompt: Prompt, settings: HarnessSettings):
    """One row's Inspect Sample (a skipped prompt keeps its place, with the reason in its metadata)."""
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser

    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser}
    messages = [kinds[m["role"]](content=m["content"]) for m in prompt.messages]
    metadata = {"task": settings.task, "context": settings.context, "kernel_id": row["kernel_id"],
                "step": int(row["step"]), "kept": prompt.kept.to_dict() if prompt.kept else None,
                "skipped": prompt.skipped_reason, "tokens_in": prompt.tokens, "token_counter": TOKEN_COUNTER}
    return Sample(input=messages or [ChatMessageUser(content="(skipped)")], target=row["target"], id=row["id"],
                  metadata=metadata)


def task_samples(settings: HarnessSettings):
    """The release (opened here, once for the task: a `ReleaseInfo`) and the task's samples, in the order `themisto
    generate` takes its rows."""
    from themisto.generation.release_rows import load_task_rows, require_task
    from themisto.release.folder import open_release

    info = open_release(resolve_release(settings.release))
    require_task(info, settings.task, settings.split)
    rows = load_task_rows(info, settings.task, (settings.context,), limit=settings.limit, split=settings.split)
    return info, [sample_of(row, _prompt(row, settings), settings) for row in rows]
