"""Generation backends behind one two-method interface; each is imported only when chosen.

transformers (CPU or GPU, a model folder, Hub id or GGUF file), openai (any OpenAI-compatible endpoint), vllm
(offline `LLM` on GPU) and baseline (model-free predictions).
"""

from __future__ import annotations

import importlib

from themisto.generation.backends.base import Backend, BackendError, Sampling
from themisto.generation.run_folder import Generation

BACKENDS: tuple[str, ...] = ("transformers", "openai", "vllm", "baseline")
_MODULES = {
    "transformers": ("themisto.generation.backends.hf", "TransformersBackend"),
    "openai": ("themisto.generation.backends.openai_api", "OpenAIBackend"),
    "vllm": ("themisto.generation.backends.vllm_offline", "VLLMBackend"),
    "baseline": ("themisto.generation.backends.baseline", "BaselineBackend"),
}

__all__ = ["BACKENDS", "Backend", "BackendError", "Generation", "Sampling", "make_backend"]


def make_backend(name: str, model: str, **options) -> Backend:
    """Make the named backend for `model`; options are the backend's own keyword settings."""
    if name not in _MODULES:
        raise BackendError(f"unknown backend {name!r} (expected one of {', '.join(BACKENDS)})")
    module_name, class_name = _MODULES[name]
    return getattr(importlib.import_module(module_name), class_name)(model, **options)
