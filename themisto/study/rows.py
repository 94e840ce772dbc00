"""The rows a study trains on: the train split's rows that every context mode can verify and fit, so that only the
prompt differs between modes.

A row is kept when, in every mode, the export keeps it (its target verified, its prompt within the budget, not a
duplicate) and its prompt and completion fit the fine-tuning length; the prompt budget and the length are counted
with the base model's tokenizer, the counter generation uses for the same model. Then each mode's export is written
from exactly those rows (`themisto.training.export.export_sft(only=...)`), and checked to hold them all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Callable

from themisto.study.settings import StudySettings, StudyError


@dataclass
class CommonRows:
    """The (task, id) rows every mode trains on, in release order, and what each mode's prompts cost in tokens."""

    keys: list[tuple[str, str]]
    tokens: dict[str, dict[str, float]]  # mode -> prompt_mean, completion_mean, total_mean
    census: dict = field(default_factory=dict)  # how many rows each rule left out
    lengths: dict[str, list[int]] = field(default_factory=dict)  # mode -> each row's training tokens, in keys' order

    def to_dict(self) -> dict:
        return {"rows": len(self.keys), "keys": [list(k) for k in self.keys], "tokens": self.tokens,
                "census": self.census, "lengths": self.lengths}

    @classmethod
    def from_dict(cls, data: dict) -> CommonRows:
        return cls([tuple(k) for k in data["keys"]], data["tokens"], data.get("census", {}), data.get("lengths", {}))


def load_tokenizer(model: str):
    """The base model's tokenizer (a .gguf file's own), as fine-tuning and the transformers backend load it."""
    from themisto.generation.backends import BackendError
    from themisto.generation.backends.hf import load_tokenizer as load

    try:
        tokenizer = load(model)
    except BackendError as exc:
        raise StudyError(f"base model: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise StudyError(f"base model {model!r} has no chat template: the study trains and prompts in the chat "
                         "format")
    return tokenizer


def _export_settings(settings: StudySettings, contexts: tuple[str, ...]):
    from themisto.training.export import ExportSettings

    return ExportSettings(split="train", tasks=settings.tasks, contexts=contexts, mix="all",
                          max_prompt_tokens=settings.max_prompt_tokens)


def common_rows(release, settings: StudySettings, tokenizer, counter: Callable[[str], int]) -> CommonRows:
    """Render every train row of `release` (its handle) in every mode and keep those every mode exports and fits
    within `max_length`."""
    from themisto.generation.release_rows import spread
    from themisto.generation.prompts import messages_text
    from themisto.training.export import collect_examples
    from themisto.training.finetune import example_tokens

    export = _export_settings(settings, settings.contexts)
    collected = collect_examples(release, export, count_tokens=counter)
    order: dict[tuple[str, str], int] = {}
    per_key: dict[tuple[str, str], dict[str, tuple[int, int]]] = {}
    over: Counter = Counter()
    for example in collected.examples:
        key = (example["task"], example["id"])
        order.setdefault(key, len(order))
        total = example_tokens(example, tokenizer, "chat")
        if total > settings.max_length:
            over[example["context"]] += 1
            continue
        per_key.setdefault(key, {})[example["context"]] = (counter(messages_text(example["prompt"])), total)
    every = [k for k in sorted(per_key, key=order.__getitem__) if len(per_key[k]) == len(settings.contexts)]
    keys = spread(every, settings.train_limit)
    if not keys:
        raise StudyError(f"{settings.release}: no train row is kept in every mode ({', '.join(settings.contexts)}) "
                         f"within max_length {settings.max_length} and max_prompt_tokens {settings.max_prompt_tokens}")
    tokens, lengths = {}, {}
    for mode in settings.contexts:
        prompt = [per_key[k][mode][0] for k in keys]
        total = lengths[mode] = [per_key[k][mode][1] for k in keys]
        tokens[mode] = {"prompt_mean": round(fmean(prompt), 1), "total_mean": round(fmean(total), 1),
                        "completion_mean": round(fmean(t - p for t, p in zip(total, prompt)), 1)}
    dropped = Counter((d["context"] or "all", d["reason"]) for d in collected.dropped)
    census = {"rendered": len(order), "in_every_mode": len(every), "kept": len(keys),
              "over_max_length": dict(over),
              "dropped": {f"{context}/{reason}": n for (context, reason), n in sorted(dropped.items())}}
    return CommonRows(keys, tokens, census, lengths)


def export_mode(release, settings: StudySettings, mode: str, rows: CommonRows, out: Path,
                counter: Callable[[str], int]):
    """Write `mode`'s sft-export of exactly `rows` of `release` into `out`; an export that lost a row is an error."""
    from themisto.training.export import export_sft

    report = export_sft(release, out, _export_settings(settings, (mode,)), overwrite=True,
                        count_tokens=counter, counted_with=f"tokenizer of {settings.model}", only=rows.keys)
    if report.examples != len(rows.keys):
        raise StudyError(f"{out}: the {mode} export holds {report.examples} rows, expected the {len(rows.keys)} "
                         "common to every mode (the release changed under the study?)")
    return report
