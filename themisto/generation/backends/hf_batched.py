"""Greedy generation for many prompts of one model, at the pace of the device rather than of Python: prompts sorted
by length, batches sized by memory in tokens (not a fixed count), a static KV cache allocated once per batch, and
rows dropped from the batch as they finish. The transformers backend takes this path for greedy, single-sample
prompts without tools (`batching="memory"`); its answers equal `model.generate`'s (tests/test_generation_batched.py).

>>> plan_batches([5, 40, 12, 38], max_new_tokens=10, budget_tokens=100, max_batch=8)
[[1, 3], [2, 0]]
"""

from __future__ import annotations

from dataclasses import dataclass

# The share of a device's memory one model's generation may plan for (the rest: weights, the allocator's slack, and
# the other models of a study generating or training beside it, which divide it further).
DEFAULT_MEMORY_FRACTION = 0.5
# On a CPU a larger batch buys little (the cores are busy at a few rows) and costs padding: a fixed token budget.
CPU_BATCH_TOKENS = 16_384
# Rows are dropped from the batch once this share of it has finished (each drop copies the cache).
SHRINK_AT = 0.25


@dataclass(frozen=True)
class MemoryPlan:
    """How many tokens (prompt and new, summed over a batch's rows) one batch may hold, and why."""

    budget_tokens: int
    bytes_per_token: int
    source: str


def bytes_per_token(config, element_size: int) -> int:
    """Bytes one token of a batch costs: its keys and values in every layer, and the activations of one layer in
    the prefill (hidden states, queries, keys, values, the MLP's two projections), counted twice for slack."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv = 2 * text.num_hidden_layers * kv_heads * head_dim * element_size
    activations = 2 * (6 * text.hidden_size + 3 * text.intermediate_size) * element_size
    return kv + activations


def memory_plan(model, device: str, torch, *, fraction: float = DEFAULT_MEMORY_FRACTION,
                batch_tokens: int | None = None) -> MemoryPlan:
    """The token budget of one batch: given, or on a GPU `fraction` of its total memory. Not of what is free now:
    the batches, and so (in bfloat16, where padding changes the rounding) the answers, are then the same on every run
    of the same settings on the same GPU; a batch that does not fit is split (generate_greedy)."""
    per_token = bytes_per_token(model.config, next(model.parameters()).element_size())
    if batch_tokens is not None:
        return MemoryPlan(batch_tokens, per_token, "given (batch_tokens)")
    if not device.startswith("cuda"):
        return MemoryPlan(CPU_BATCH_TOKENS, per_token, "the CPU default")
    torch.cuda.empty_cache()  # what a finished training left in the allocator's cache is free for this
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return MemoryPlan(max(1, int(total * fraction // per_token)), per_token,
                      f"{fraction:.2f} of {total / 2**30:.0f} GiB")


def plan_batches(lengths: list[int], *, max_new_tokens: int, budget_tokens: int, max_batch: int) -> list[list[int]]:
    """Prompt indices grouped into batches, longest first (an oversized batch fails at once, not at the end):
    each batch's rows × (its longest prompt + the new tokens) within `budget_tokens`, at most `max_batch` rows, at
    least one."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches:
            batch = batches[-1]
            width = lengths[batch[0]] + max_new_tokens  # the batch's first row is its longest
            if len(batch) < max_batch and (len(batch) + 1) * width <= budget_tokens:
                batch.append(i)
                continue
        batches.append([i])
    return batches


def _left_padded(rows: list[list[int]], pad_id: int, device: str, torch):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, row in enumerate(rows):
        ids[k, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[k, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def greedy_batch(model, rows: list[list[int]], *, max_new_tokens: int, stop_ids: set[int], pad_id: int,
                 device: str, torch) -> list[list[int]]:
    """Each row's greedy continuation, up to and including its first stop token (at most `max_new_tokens`), from one
    prefill into a static cache and one forward pass per new token for the rows still running."""
    from transformers import StaticCache

    ids, mask = _left_padded(rows, pad_id, device, torch)
    width = ids.shape[1]
    cache = StaticCache(config=model.config, max_cache_len=width + max_new_tokens)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    alive = list(range(len(rows)))  # the original row of each batch row
    answers: list[list[int]] = [[] for _ in rows]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                cache_position=torch.arange(width, device=device), use_cache=True, logits_to_keep=1)
    last = positions[:, -1]
    stopped = torch.zeros(len(rows), dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        tokens = out.logits[:, -1].argmax(-1)
        for row, token in zip(alive, tokens.tolist()):
            answers[row].append(token)
        stopped |= torch.isin(tokens, stops)
        finished = int(stopped.sum())
        if step + 1 == max_new_tokens or finished == len(alive):
            break
        if finished >= SHRINK_AT * len(alive):  # drop the finished rows: later steps compute only the rest
            keep = (~stopped).nonzero().flatten()
            cache.reorder_cache(keep)
            alive = [alive[k] for k in keep.tolist()]
            tokens, mask, last, stopped = tokens[keep], mask[keep], last[keep], stopped[keep]
        # A row that stopped but was kept (too few stopped to shrink) runs on; its extra tokens are cut below.
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        last = last + 1
        out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None],
                    past_key_values=cache, cache_position=torch.tensor([width + step], device=device),
                    use_cache=True)
    return [_until_stop(answer, stop_ids) for answer in answers]


def _until_stop(tokens: list[int], stop_ids: set[int]) -> list[int]:
    used = next((k + 1 for k, t in enumerate(tokens) if t in stop_ids), len(tokens))
    return tokens[:used]


def generate_greedy(model, prompts: list[list[int]], *, max_new_tokens: int, stop_ids: set[int], pad_id: int,
                    device: str, torch, plan: MemoryPlan, max_batch: int) -> list[list[int]]:
    """Every prompt's greedy continuation, in the order given; a batch the device cannot hold is split in two and
    retried (the memory plan is an estimate)."""
    out: list[list[int] | None] = [None] * len(prompts)
    pending = plan_batches([len(p) for p in prompts], max_new_tokens=max_new_tokens,
                           budget_tokens=plan.budget_tokens, max_batch=max_batch)
    while pending:
        batch = pending.pop(0)
        try:
            with torch.inference_mode():
                answers = greedy_batch(model, [prompts[i] for i in batch], max_new_tokens=max_new_tokens,
                                       stop_ids=stop_ids, pad_id=pad_id, device=device, torch=torch)
        except getattr(torch, "OutOfMemoryError", RuntimeError):
            if len(batch) == 1:
                raise
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            half = len(batch) // 2
            pending[:0] = [batch[:half], batch[half:]]
            continue
        for i, answer in zip(batch, answers):
            out[i] = answer
    return out
