"""Data-parallel generation on Ray: one backend (for vLLM, one engine on its own GPU) per Ray actor.

`RayBackend` is a backend like the others (`generate`, `describe`), so `themisto.generation.runs.generate_run` writes
the same run folder, resumes it the same way, and a run begun on one machine can be finished on a cluster. Each batch
of prompts is cut into one contiguous shard per actor and the answers are put back in prompt order; prompt seeds do
not depend on the batch (vLLM's backend seeds each prompt itself), so the records match a one-engine run.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

from themisto.distributed.cluster import RayTarget, check_reachable, forwarded_environment, ray_session


class Engine:
    """(A Ray actor) one backend made on its worker: the model is loaded once and serves every shard sent to it."""

    def __init__(self, name: str, model: str, options: dict) -> None:
        from themisto.generation.backends import make_backend

        self.backend = make_backend(name, model, **options)

    def traits(self) -> dict:
        """What the run reads from a backend besides `generate`: prompt budget helpers and answer extraction."""
        return {"describe": self.backend.describe(), "raw_is_answer": getattr(self.backend, "raw_is_answer", False),
                "context_length": getattr(self.backend, "context_length", None),
                "counts_tokens": callable(getattr(self.backend, "count_tokens", None))}

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [self.backend.count_tokens(text) for text in texts]

    def generate(self, prompts: list, sampling) -> list:
        return self.backend.generate(prompts, sampling)


def shards(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous (start, stop) ranges covering range(n), sizes differing by at most one; empty ones left out.

    >>> shards(5, 2)
    [(0, 3), (3, 5)]
    """
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        if stop > start:
            bounds.append((start, stop))
        start = stop
    return bounds


class RayBackend:
    """A backend whose `generate` spreads each batch over `len(actors)` engines and merges the answers in order."""

    def __init__(self, ray, actors: list) -> None:
        self._ray, self._actors = ray, actors
        traits = ray.get(actors[0].traits.remote())
        self._describe = traits["describe"]
        self.raw_is_answer = traits["raw_is_answer"]
        self.context_length = traits["context_length"]
        if traits["counts_tokens"]:
            # The run trims prompts with the model's own tokenizer; ask the engine's (cached: trimming re-counts).
            self.count_tokens = lru_cache(maxsize=65536)(self._count_tokens)

    def _count_tokens(self, text: str) -> int:
        return self._ray.get(self._actors[0].count_tokens.remote([text]))[0]

    def generate(self, prompts: list, sampling) -> list:
        parts = shards(len(prompts), len(self._actors))
        refs = [actor.generate.remote(prompts[start:stop], sampling)
                for actor, (start, stop) in zip(self._actors, parts)]
        merged: list = []
        for answers in self._ray.get(refs):
            merged.extend(answers)
        return merged

    def describe(self) -> dict:
        # The engines' own description: a run folder written on Ray resumes locally, and the other way round.
        return dict(self._describe)


@contextmanager
def ray_backend(settings, target: RayTarget, *, actors: int | None = None,
                gpus_per_actor: float | None = None) -> Iterator[RayBackend]:
    """A RayBackend for a run's `settings` (themisto.generation.runs.RunSettings) on `target`: `actors` engines
    (default: one per GPU for vLLM, else one per CPU), a vLLM engine on one GPU unless told otherwise. Ray and the
    engines are released on exit."""
    from themisto.generation.runs import backend_options

    if target.address is not None:
        check_reachable(target.address, target.temp_dir)
    gpus = (1.0 if settings.backend == "vllm" else 0.0) if gpus_per_actor is None else gpus_per_actor
    with ray_session(target) as ray:
        if actors is None:
            actors = max(1, int(ray.cluster_resources().get("GPU" if gpus else "CPU", 1) // (gpus or 1)))
        engine = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=1, max_task_retries=1,
                            runtime_env={"env_vars": forwarded_environment()})(Engine)
        options = backend_options(settings)
        handles = [engine.remote(settings.backend, settings.model, options) for _ in range(actors)]
        try:
            yield RayBackend(ray, handles)
        finally:
            for handle in handles:
                ray.kill(handle)
