"""The transformers backend: a model folder, Hub id or GGUF file on CPU or GPU, batched with left padding."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Callable

from themisto.generation.backends.base import (BackendError, Sampling, parse_tool_calls, require, template_messages,
                                               tokenizer_tools_problem, weights_sha256)
from themisto.generation.run_folder import Generation
from themisto.generation.prompts import Prompt, messages_text

INSTALL = "pip install 'transformers==5.23.0' 'torch==2.13.0' accelerate gguf"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# The number formats `--dtype` offers the weights and activations: `auto` keeps the checkpoint's own (a GGUF file is
# dequantized to float32). bfloat16 runs on the GPUs that have it and on every CPU (natively only with AVX512-BF16 or
# AMX, see native_bfloat16). int8 (CPU only) loads float32 and quantizes every Linear layer's weights to int8 per
# output channel, its activations on the fly (torch's dynamic quantization): a GGUF file's 4-bit weights lose little
# more, and its own runtime (llama.cpp) also multiplies them with 8-bit activations.
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16", "int8")
# How prompts are batched: `fixed`, `batch_size` prompts a batch through `model.generate` (any sampling); `memory`,
# greedy single-sample prompts in batches sized by the device's memory, sorted by length, with a static KV cache
# (themisto.generation.backends.hf_batched; the same answers, at the device's pace). Other prompts take `fixed`.
BATCHINGS: tuple[str, ...] = ("fixed", "memory")


def split_model_path(model: str, gguf_file: str | None) -> tuple[str, str | None]:
    """A `.gguf` file path becomes (its folder, its name), as `from_pretrained(dir, gguf_file=...)` wants it."""
    path = Path(model)
    if gguf_file is None and path.suffix == ".gguf":
        if not path.is_file():
            raise BackendError(f"{model}: no such GGUF file")
        return str(path.parent), path.name
    return model, gguf_file


def local_weights_sha256(source: str, gguf_file: str | None) -> str | None:
    """The sha256 of a local model's weights (the GGUF file, or the folder's weight files); None for a Hub id."""
    local = Path(source)
    if not local.is_dir():
        return None
    files = [local / gguf_file] if gguf_file else [p for p in local.iterdir() if p.suffix in _WEIGHT_SUFFIXES]
    return weights_sha256(files)


def native_bfloat16(device: str, torch) -> bool:
    """Whether `device` computes in bfloat16 itself: a GPU that has it, or a CPU with AVX512-BF16 or AMX (elsewhere
    torch emulates it: measured on this project's AVX2 machine, SmolLM2 ran 4x slower than in float32)."""
    if device.startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def _check_dtype(dtype: str, device: str, torch) -> None:
    if dtype not in DTYPES:
        raise BackendError(f"unknown dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    if dtype == "bfloat16" and not native_bfloat16(device, torch):
        if device.startswith("cuda"):
            raise BackendError("this GPU has no bfloat16: use --dtype float16 or float32")
        warnings.warn("this CPU has no native bfloat16 (AVX512-BF16 or AMX): torch emulates it, slower than float32",
                      stacklevel=3)
    if dtype == "int8" and not device.startswith("cpu"):
        raise BackendError("--dtype int8 (dynamic quantization) runs on the CPU only: use --device cpu")


def _gguf_in(model, dtype, torch):
    """A GGUF-loaded model in `dtype`: cast where its weights were dequantized; kept in float32 (what runs) where
    they stay packed in GGUF blocks, whose kernels compute in float32."""
    if all(p.is_floating_point() for p in model.parameters()):
        return model.to(dtype)
    warnings.warn(f"this GGUF model keeps its weights packed and computes in float32; {dtype} was asked for",
                  stacklevel=3)
    return model


def _encode(tokenizer, text: str) -> list[int]:
    # The chat template already wrote the special tokens; adding them again would double a BOS.
    return tokenizer(text, add_special_tokens=not getattr(tokenizer, "chat_template", None))["input_ids"]


def _template_text(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(template_messages(messages), tools=tools, tokenize=False,
                                             add_generation_prompt=True)
    return messages_text(messages) + "\n"


def chat_overhead(tokenizer) -> int:
    """Tokens the chat template (or the plain-text form) adds around empty system and user messages."""
    return len(_encode(tokenizer, _template_text(tokenizer, [{"role": "system", "content": ""},
                                                             {"role": "user", "content": ""}])))


def load_tokenizer(model: str, revision: str | None = None):
    """The tokenizer of `model` (a folder, a Hub id, or a .gguf file's own), as this backend loads it."""
    transformers = require("transformers", INSTALL)
    source, gguf_file = split_model_path(model, None)
    try:
        return transformers.AutoTokenizer.from_pretrained(source, revision=revision, gguf_file=gguf_file)
    except OSError as exc:
        raise BackendError(f"cannot load the tokenizer of {model!r}: {exc}") from exc


def prompt_token_counter(tokenizer) -> Callable[[str], int]:
    """The prompt budget's token count under `tokenizer`, as this backend counts it: the messages' text plus what
    the chat template adds. `themisto sft-export` takes it so training prompts are cut by the same rule."""
    overhead = chat_overhead(tokenizer)
    return lambda text: len(_encode(tokenizer, text)) + overhead


class TransformersBackend:
    """Greedy or sampled generation with `model.generate`; the tokenizer counts tokens for the prompt budget."""

    def __init__(self, model: str, *, device: str = "auto", dtype: str = "auto", gguf_file: str | None = None,
                 batch_size: int = 8, revision: str | None = None, batching: str = "fixed",
                 memory_fraction: float | None = None, batch_tokens: int | None = None) -> None:
        require("torch", INSTALL)
        transformers = require("transformers", INSTALL)
        import torch

        self.model_name = model
        self.source, self.gguf_file = split_model_path(model, gguf_file)
        if self.gguf_file:
            require("gguf", INSTALL)
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        _check_dtype(dtype, self.device, torch)
        if batching not in BATCHINGS:
            raise BackendError(f"unknown batching {batching!r} (expected one of {', '.join(BATCHINGS)})")
        self.batch_size, self.batching = batch_size, batching
        self.memory_fraction, self.batch_tokens = memory_fraction, batch_tokens
        kwargs = {"revision": revision, "gguf_file": self.gguf_file}
        torch_dtype = {"auto": "auto", "int8": torch.float32}.get(dtype) or getattr(torch, dtype)
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.source, **kwargs)
            # A GGUF file is asked for what its loader gives, float32 (asked for another format, transformers
            # warns that its kernels compute in float32 even where it dequantized the weights); cast below.
            loaded = torch.float32 if self.gguf_file and torch_dtype != "auto" else torch_dtype
            self.model = transformers.AutoModelForCausalLM.from_pretrained(self.source, dtype=loaded, **kwargs)
        except OSError as exc:
            raise BackendError(f"cannot load model {model!r} with transformers: {exc}") from exc
        if self.gguf_file and loaded != torch_dtype:
            self.model = _gguf_in(self.model, torch_dtype, torch)
        self.model.to(self.device).eval()
        if dtype == "int8":
            self.model = torch.ao.quantization.quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8)
        self.dtype = "int8" if dtype == "int8" else str(self.model.dtype).removeprefix("torch.")
        # Decoder-only models continue the last token: pad on the left so every prompt ends where generation starts.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.context_length = getattr(self.model.config, "max_position_embeddings", None)
        self._overhead = chat_overhead(self.tokenizer)

    def _text(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return _template_text(self.tokenizer, messages, tools)

    def native_tools_problem(self) -> str | None:
        """Why this model cannot take native tool calls (None: it can)."""
        if not self.has_chat_template:
            return "the model has no chat template"
        return tokenizer_tools_problem(self.tokenizer)

    def _encode(self, text: str) -> list[int]:
        return _encode(self.tokenizer, text)

    def count_tokens(self, text: str) -> int:
        """Tokens of the messages' text under this model's tokenizer, plus what the chat template adds."""
        return len(self._encode(text)) + self._overhead

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        if self.batching == "memory" and sampling.temperature == 0 and sampling.n == 1 and \
                not any(p.tools for p in prompts):
            return self._generate_greedy(prompts, sampling)
        # Prompts of like length share a batch (less padding: each batch runs as long as its longest prompt); the
        # answers come back in the order asked. Greedy answers do not depend on the batch's other prompts beyond
        # the numerical noise of padding, which this only reduces.
        order = sorted(range(len(prompts)), key=lambda i: len(messages_text(prompts[i].messages)))
        out: list[list[Generation] | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for i, generated in zip(chunk, self._generate_batch([prompts[i] for i in chunk], sampling)):
                out[i] = generated
        return out

    def _generate_batch(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        import torch

        texts = [self._text(p.messages, p.tools) for p in prompts]
        enc = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=not self.has_chat_template)
        enc = {k: v.to(self.device) for k, v in enc.items()}
        sampled = sampling.temperature > 0
        options = {"do_sample": sampled, "max_new_tokens": sampling.max_new_tokens,
                   "num_return_sequences": sampling.n, "pad_token_id": self.tokenizer.pad_token_id}
        if sampled:
            options.update(temperature=sampling.temperature, top_p=sampling.top_p)
            # One seed per batch, from the run's seed and the batch's prompts: a resumed run redraws the same.
            key = f"{sampling.seed}:" + "|".join(p.seed_key() for p in prompts)
            torch.manual_seed(int(hashlib.sha256(key.encode()).hexdigest()[:15], 16))
        else:
            # Greedy: no sampling knobs, or generate() warns that they are ignored.
            options.update(temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            output = self.model.generate(**enc, **options)
        width = enc["input_ids"].shape[1]
        tokens_in = enc["attention_mask"].sum(dim=1).tolist()
        eos = self._stop_ids()
        results = []
        for i in range(len(prompts)):
            samples = []
            for j in range(sampling.n):
                ids = output[i * sampling.n + j, width:].tolist()
                used = next((k + 1 for k, t in enumerate(ids) if t in eos), len(ids))
                text = self.tokenizer.decode(ids[:used], skip_special_tokens=True)
                calls: tuple[dict, ...] = ()
                if prompts[i].tools:  # the parser needs the markup special tokens may carry
                    content, calls = parse_tool_calls(self.tokenizer, self.tokenizer.decode(ids[:used]), texts[i],
                                                      prompts[i].tools)
                    text = content if calls else text  # as an endpoint answers: the calls apart from the text
                samples.append(Generation(text, "ok", None, int(tokens_in[i]), used, tool_calls=calls))
            results.append(samples)
        return results

    def _generate_greedy(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        import torch

        from themisto.generation.backends.hf_batched import DEFAULT_MEMORY_FRACTION, generate_greedy, memory_plan

        ids = [self._encode(self._text(p.messages)) for p in prompts]
        plan = memory_plan(self.model, self.device, torch, batch_tokens=self.batch_tokens,
                           fraction=self.memory_fraction or DEFAULT_MEMORY_FRACTION)
        answers = generate_greedy(self.model, ids, max_new_tokens=sampling.max_new_tokens, stop_ids=self._stop_ids(),
                                  pad_id=self.tokenizer.pad_token_id, device=self.device, torch=torch, plan=plan,
                                  max_batch=self.batch_size)
        return [[Generation(self.tokenizer.decode(answer, skip_special_tokens=True), "ok", None, len(prompt),
                            len(answer))] for prompt, answer in zip(ids, answers)]

    def _stop_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = set(ids if isinstance(ids, list) else [ids]) - {None}
        return ids | ({self.tokenizer.eos_token_id} - {None}) | ({self.tokenizer.pad_token_id} - {None})

    def describe(self) -> dict:
        import transformers

        info = {"backend": "transformers", "version": transformers.__version__, "model": self.model_name,
                "device": self.device, "dtype": self.dtype, "batching": self.batching,
                "chat_template": self.has_chat_template}
        digest = local_weights_sha256(self.source, self.gguf_file)
        if digest is not None:
            info["weights_sha256"] = digest
        else:
            info["model_revision"] = getattr(self.model.config, "_commit_hash", None)
        return info
