"""The vLLM backend. On a machine with vLLM and a GPU: the tiny model through `LLM.chat`, and eval/run_vllm.py end
to end. Everywhere: what the backend hands vLLM, checked against `VLLMWithoutGPUStandIn` (a stand-in module that
records the calls, since vLLM needs a CUDA GPU this machine lacks)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_generation_prompts import rows  # noqa: F401  (the release rows fixture)

from themisto.generation.backends import Sampling, make_backend
from themisto.generation.backends.vllm_offline import prompt_seed
from themisto.generation.prompts import render_prompt

REPO = Path(__file__).resolve().parents[1]


def _gpu_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install -r requirements-gpu.txt on a CUDA machine)"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU"


needs_vllm_and_gpu = pytest.mark.skipif(_gpu_missing() is not None, reason=_gpu_missing() or "")


class VLLMWithoutGPUStandIn(types.ModuleType):
    """Plays the `vllm` module where no GPU is: records LLM(...) options and chat(...) calls, answers each prompt
    with one output per requested sample."""

    __version__ = "stand-in"

    def __init__(self) -> None:
        super().__init__("vllm")
        self.llm_options: dict = {}
        self.chats: list[tuple[list, list]] = []
        stand_in = self

        class SamplingParams:
            def __init__(self, **kwargs) -> None:
                self.kwargs = kwargs

        class Tokenizer:
            def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
                return "".join(f"<{m['role']}>{m['content']}" for m in messages)

            def __call__(self, text, add_special_tokens=False):
                return {"input_ids": text.split()}

        class LLM:
            def __init__(self, model, **options) -> None:
                stand_in.llm_options = {"model": model, **options}
                self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=4096,
                                                                                           revision="r1"))

            def get_tokenizer(self):
                return Tokenizer()

            def chat(self, messages, sampling_params, use_tqdm=True):
                stand_in.chats.append((messages, sampling_params))
                return [types.SimpleNamespace(prompt_token_ids=[0] * 10, outputs=[
                    types.SimpleNamespace(text=f"```python\nx = {i}\n```", token_ids=[1, 2, 3])
                    for i in range(p.kwargs["n"])]) for p in sampling_params]

        self.SamplingParams, self.LLM = SamplingParams, LLM


def test_the_backend_gives_vllm_explicit_sampling_params_and_per_prompt_seeds(rows, monkeypatch):  # noqa: F811
    stand_in = VLLMWithoutGPUStandIn()
    monkeypatch.setitem(sys.modules, "vllm", stand_in)
    backend = make_backend("vllm", "org/model", tensor_parallel_size=2, seed=5, batch_size=2)
    assert stand_in.llm_options == {"model": "org/model", "tensor_parallel_size": 2, "seed": 5,
                                    "enable_prefix_caching": True, "dtype": "auto", "gpu_memory_utilization": 0.9}
    prompts = [render_prompt(r, "next_cell", c) for r in rows["next_cell"][:2] for c in ("none", "full")]
    out = backend.generate(prompts, Sampling(n=3, temperature=0.7, top_p=0.9, max_new_tokens=99, seed=11))
    assert len(stand_in.chats) == 2 and [len(s) for s in out] == [3, 3, 3, 3]
    params = [p.kwargs for _, batch in stand_in.chats for p in batch]
    assert all(p["max_tokens"] == 99 and p["n"] == 3 and p["temperature"] == 0.7 and p["top_p"] == 0.9
               for p in params)
    assert [p["seed"] for p in params] == [prompt_seed(11, p) for p in prompts]
    assert len({p["seed"] for p in params}) == 4  # each (example, context) draws its own samples
    assert out[0][2].raw == "```python\nx = 2\n```" and (out[0][0].tokens_in, out[0][0].tokens_out) == (10, 3)
    assert backend.context_length == 4096 and backend.describe()["model_revision"] == "r1"


@needs_vllm_and_gpu
def test_vllm_generates_with_the_tiny_model(tiny_model_dir, rows):  # noqa: F811
    backend = make_backend("vllm", str(tiny_model_dir), gpu_memory_utilization=0.3)
    prompts = [render_prompt(r, "next_cell", "variables") for r in rows["next_cell"][:4]]
    greedy = backend.generate(prompts, Sampling(max_new_tokens=16))
    assert all(len(s) == 1 and s[0].raw and 0 < s[0].tokens_out <= 16 for s in greedy)
    sampled = backend.generate(prompts, Sampling(n=2, temperature=1.0, max_new_tokens=16, seed=3))
    again = backend.generate(prompts[::-1], Sampling(n=2, temperature=1.0, max_new_tokens=16, seed=3))[::-1]
    assert [[g.raw for g in s] for s in sampled] == [[g.raw for g in s] for s in again]  # seeds per prompt


@needs_vllm_and_gpu
def test_eval_run_vllm_writes_run_folders_for_both_tasks(small_release, tiny_model_dir, tmp_path):
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, str(REPO / "eval" / "run_vllm.py"), "--release", str(small_release),
                           "--model", str(tiny_model_dir), "--context", "none", "variables", "--limit", "3",
                           "--max-new-tokens", "16", "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for task in ("next_cell", "output_prediction"):
        lines = (out / task / "generations.jsonl").read_text().splitlines()
        assert len(lines) == 3 * 2 and all(json.loads(x)["status"] == "ok" for x in lines)
        assert json.loads((out / task / "run.json").read_text())["backend"] == "vllm"
