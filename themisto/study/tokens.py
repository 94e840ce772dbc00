"""A study unit's training work counted before it runs: its optimizer steps and the padded tokens they put through the
model (what `themisto.study.plan` estimates from and what `themisto.study.run` records).

>>> padded_tokens([10, 20, 30, 40], micro_batch=2)  # (40 + 40) + (20 + 20)
120
>>> padded_tokens([10, 20, 30, 40], micro_batch=2, order=[0, 3, 1, 2])  # (40 + 40) + (30 + 30)
140
"""

from __future__ import annotations

import math
import random

from themisto.study.settings import StudySettings


def padded_tokens(lengths: list[int], micro_batch: int, *, order: list[int] | None = None) -> int:
    """Tokens one pass over `lengths` puts through the model in micro-batches, each padded to its longest row:
    grouped by length (sorted) unless `order` gives another."""
    seq = [lengths[i] for i in order] if order is not None else sorted(lengths, reverse=True)
    return sum(len(chunk) * max(chunk) for chunk in (seq[k:k + micro_batch] for k in range(0, len(seq), micro_batch)))


def random_padded_tokens(lengths: list[int], micro_batch: int, *, draws: int = 5) -> float:
    """The mean of `padded_tokens` over random orders (the trainer's default sampler)."""
    rng = random.Random(0)
    total = 0
    for _ in range(draws):
        order = list(range(len(lengths)))
        rng.shuffle(order)
        total += padded_tokens(lengths, micro_batch, order=order)
    return total / draws


def optimizer_steps(rows: int, settings: StudySettings) -> int:
    """The trainer's optimizer steps for `rows` rows (as transformers counts them)."""
    if settings.max_steps > 0:
        return settings.max_steps
    micro_batches = math.ceil(rows / settings.batch_size)
    per_epoch = max(1, math.ceil(micro_batches / settings.grad_accum))
    return math.ceil(settings.epochs * per_epoch)


def unit_tokens(lengths: list[int], settings: StudySettings, steps: int) -> int:
    """Padded training tokens of one unit: passes over the rows in micro-batches, as many as its steps make."""
    if not lengths:
        return 0
    one_pass = padded_tokens(lengths, settings.batch_size) if settings.length_grouped else \
        random_padded_tokens(lengths, settings.batch_size)
    passes = steps * settings.batch_size * settings.grad_accum / len(lengths)
    return int(one_pass * passes)
