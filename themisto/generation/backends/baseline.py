"""The model-free baselines as a backend: every sample of a prompt is the baseline's prediction for its row."""

from __future__ import annotations

from themisto import __name__ as _package
from themisto.generation.backends.base import BackendError, Sampling
from themisto.generation.run_folder import Generation
from themisto.generation.baselines import BASELINES, baseline_prediction
from themisto.generation.prompts import Prompt


class BaselineBackend:
    """`--backend baseline --model previous-cell` (or common-cell, previous-output, last-repr)."""

    raw_is_answer = True  # a baseline's text is the prediction itself: no fenced block to extract

    def __init__(self, model: str) -> None:
        if model not in BASELINES:
            raise BackendError(f"unknown baseline model {model!r} (expected one of {', '.join(BASELINES)})")
        self.model = model

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        out = []
        for prompt in prompts:
            if prompt.row is None or prompt.task is None:
                raise BackendError("the baseline backend needs prompts rendered from rows (Prompt.row, Prompt.task)")
            prediction = baseline_prediction(self.model, prompt.row, prompt.task)
            out.append([Generation(prediction, "ok", None, 0, 0) for _ in range(sampling.n)])
        return out

    def describe(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version(_package)
        except PackageNotFoundError:
            own = None
        return {"backend": "baseline", "version": own, "model": self.model, "model_revision": None}
