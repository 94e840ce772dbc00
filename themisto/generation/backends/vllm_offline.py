"""The vLLM backend: offline `LLM.chat` on GPU with explicit `SamplingParams` (vLLM's `max_tokens` defaults to 16,
and without params it takes the model's generation config), tensor parallel, prefix caching for the history that
the context modes share."""

from __future__ import annotations

import hashlib
import json

from themisto.generation.backends.base import (BackendError, Sampling, parse_tool_calls, require, template_messages,
                                               tokenizer_tools_problem)
from themisto.generation.run_folder import Generation
from themisto.generation.prompts import Prompt

INSTALL = "pip install -r requirements-gpu.txt  (vllm==0.33.0, CUDA only)"


def prompt_seed(seed: int, prompt: Prompt) -> int:
    """A per-prompt seed, so that a prompt draws the same samples whatever batch (or resumed run) it is in."""
    return int(hashlib.sha256(f"{seed}:{prompt.seed_key()}".encode()).hexdigest()[:8], 16)


def sampling_params(vllm, sampling: Sampling, seed: int):
    """vLLM's SamplingParams with every setting given explicitly."""
    return vllm.SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                               max_tokens=sampling.max_new_tokens, seed=seed)


class VLLMBackend:
    """`LLM(model, tensor_parallel_size, seed, enable_prefix_caching=True)`; one `chat` call per batch of prompts."""

    def __init__(self, model: str, *, tensor_parallel_size: int = 1, seed: int = 0, max_model_len: int | None = None,
                 dtype: str = "auto", tokenizer: str | None = None, gpu_memory_utilization: float = 0.9,
                 batch_size: int = 256) -> None:
        self.vllm = require("vllm", INSTALL)
        self.model_name = model
        self.batch_size = batch_size
        options = {"tensor_parallel_size": tensor_parallel_size, "seed": seed, "enable_prefix_caching": True,
                   "dtype": dtype, "gpu_memory_utilization": gpu_memory_utilization}
        if max_model_len:
            options["max_model_len"] = max_model_len
        if tokenizer:
            options["tokenizer"] = tokenizer
        try:
            self.llm = self.vllm.LLM(model=model, **options)
        except (OSError, ValueError) as exc:
            raise BackendError(f"vLLM cannot load model {model!r}: {exc}") from exc
        self.options = options
        self.tokenizer = self.llm.get_tokenizer()
        config = getattr(self.llm.llm_engine, "model_config", None)
        self.context_length = getattr(config, "max_model_len", None)
        empty = self.tokenizer.apply_chat_template([{"role": "system", "content": ""}, {"role": "user", "content": ""}],
                                                   tokenize=False, add_generation_prompt=True)
        self._overhead = len(self.tokenizer(empty, add_special_tokens=False)["input_ids"])

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + self._overhead

    def native_tools_problem(self) -> str | None:
        """Why this model cannot take native tool calls (None: it can): its tokenizer's template and parser."""
        return tokenizer_tools_problem(self.tokenizer)

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        out: dict[int, list[Generation]] = {}
        for start in range(0, len(prompts), self.batch_size):
            batch = list(enumerate(prompts[start:start + self.batch_size], start=start))
            # `LLM.chat` takes one tools list per call: prompts that offer tools go in a call of their own.
            for tools in {json.dumps(p.tools, sort_keys=True) for _, p in batch}:
                group = [(i, p) for i, p in batch if json.dumps(p.tools, sort_keys=True) == tools]
                params = [sampling_params(self.vllm, sampling, prompt_seed(sampling.seed, p)) for _, p in group]
                options = {"tools": group[0][1].tools} if group[0][1].tools else {}
                results = self.llm.chat([template_messages(p.messages) for _, p in group], params, use_tqdm=False,
                                        **options)
                for (i, prompt), result in zip(group, results):
                    out[i] = [self._generation(prompt, result, o) for o in result.outputs]
        return [out[i] for i in range(len(prompts))]

    def _generation(self, prompt: Prompt, result, output) -> Generation:
        tokens_in = len(result.prompt_token_ids or []) or None
        content, calls = parse_tool_calls(self.tokenizer, output.text, getattr(result, "prompt", None) or "",
                                          prompt.tools)
        # As an endpoint answers: the calls apart from the text.
        return Generation(content if calls else output.text, "ok", None, tokens_in, len(output.token_ids),
                          tool_calls=calls)

    def describe(self) -> dict:
        return {"backend": "vllm", "version": self.vllm.__version__, "model": self.model_name,
                "model_revision": getattr(getattr(self.llm.llm_engine, "model_config", None), "revision", None),
                "options": self.options}
