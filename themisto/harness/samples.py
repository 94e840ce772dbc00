"""A release's task rows as Inspect samples: each one's input the exact prompt `themisto generate` renders (same
template, same budget rule), its target the reference, its id the release id, and its metadata what a run folder's
`generations.jsonl` records as `kept` plus where the example lies (trajectory and step: the interval's cluster).

Token counts: the dataset is built before Inspect has a model to ask, so the budget counts with the stated estimate
(`themisto.generation.prompts.approx_tokens`, UTF-8 bytes / 3: deliberately high), as `themisto generate` does for
backends without a local tokenizer; the metadata says which counter was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from themisto.errors import InputError
from themisto.generation.backends.base import Sampling
from themisto.generation.example_spec import ExampleSpec, Spelling
from themisto.generation.prompts import Prompt, approx_tokens, render_prompt
from themisto.modes import context_mode

TOKEN_COUNTER = "approx_tokens (UTF-8 bytes / 3)"


class HarnessError(InputError):
    """A task parameter the Inspect tasks cannot take; the message names the parameter."""


# Each `-T` parameter of an Inspect task that sets a field of its example spec: the field (a probe or delta mode's
# setting by its dotted path); the task functions' defaults are the spec's (tests/test_example_spec.py).
SPEC_PARAMETERS: dict[str, str] = {
    "context": "contexts", "split": "split", "limit": "limit", "max_prompt_tokens": "max_prompt_tokens",
    "probes": "probe.max_probes", "probe_chars": "probe.output_chars", "probe_timeout": "probe.timeout_s",
    "delta_cells": "delta.cells",
}
# The spec's refusals as Inspect's `-T` parameters name them (`-T limit=0`); the task is the task's own name.
INSPECT_OPTIONS = Spelling("-T {name}={value}", {field: name for name, field in SPEC_PARAMETERS.items()},
                           HarnessError)


@dataclass(frozen=True)
class HarnessSettings:
    """One Inspect task's parameters (`-T key=value`), checked: its examples (`spec`: one task in one context mode,
    refused in `INSPECT_OPTIONS`' spelling; the probe mode speaks native tool calls), and what the harness alone
    has: which release, whether predictions are executed, and whether probes are."""

    spec: ExampleSpec
    release: str
    execute: bool = False
    execute_probes: bool = False

    def __post_init__(self) -> None:
        if self.execute and self.spec.task != "next_cell":
            raise HarnessError(f"-T execute=true: execution scores exist for next_cell only, not {self.spec.task}")
        if self.probing and self.spec.probe.protocol != "native":
            raise HarnessError("the probe mode speaks to Inspect models through tool calls (protocol native)")

    @property
    def probing(self) -> bool:
        return context_mode(self.spec.context).is_probe


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
    spec = settings.spec
    if settings.probing:
        # As `themisto generate` does: the first prompt leaves room for the probes' calls and replies.
        return render_prompt(row, spec.task, spec.context, count_tokens=approx_tokens,
                             max_prompt_tokens=spec.first_probe_budget(Sampling().max_new_tokens, approx_tokens),
                             probe=spec.probe)
    return render_prompt(row, spec.task, spec.context, count_tokens=approx_tokens,
                         max_prompt_tokens=spec.max_prompt_tokens, delta=spec.delta)


def sample_of(row: dict, prompt: Prompt, settings: HarnessSettings):
    """One row's Inspect Sample (a skipped prompt keeps its place, with the reason in its metadata)."""
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ChatMessageSystem, ChatMessageUser

    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser}
    messages = [kinds[m["role"]](content=m["content"]) for m in prompt.messages]
    metadata = {"task": settings.spec.task, "context": settings.spec.context, "kernel_id": row["kernel_id"],
                "step": int(row["step"]), "kept": prompt.kept.to_dict() if prompt.kept else None,
                "skipped": prompt.skipped_reason, "tokens_in": prompt.tokens, "token_counter": TOKEN_COUNTER}
    return Sample(input=messages or [ChatMessageUser(content="(skipped)")], target=row["target"], id=row["id"],
                  metadata=metadata)


def task_samples(settings: HarnessSettings):
    """The release (opened here, once for the task: a `ReleaseInfo`) and the task's samples, in the order `themisto
    generate` takes its rows."""
    from themisto.generation.release_rows import load_task_rows, require_task
    from themisto.release.folder import open_release

    spec = settings.spec
    info = open_release(resolve_release(settings.release))
    require_task(info, spec.task, spec.split)
    rows = load_task_rows(info, spec.task, spec.contexts, limit=spec.limit, split=spec.split)
    return info, [sample_of(row, _prompt(row, settings), settings) for row in rows]
