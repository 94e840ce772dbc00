"""The model-free baselines as a backend: every sample of a prompt is the baseline's prediction for its row."""

from __future__ import annotations

import re

from themisto import __name__ as _package
from themisto.generation.backends.base import BackendError, Sampling
from themisto.generation.baselines import (BASELINES, PROBING_BASELINES, baseline_prediction, baseline_probes,
                                           probing_answer)
from themisto.generation.probe_protocol import PROBE_TAG
from themisto.generation.run_folder import Generation
from themisto.generation.prompts import Prompt

# A probe's reply as `ProbeRun.reply` writes it: the output is the one fenced block of the message.
_REPLY_OUTPUT = re.compile(r"\n```\n(.*)\n```\n", re.S)


class BaselineBackend:
    """`--backend baseline --model previous-cell` (or common-cell, previous-output, last-repr; or a probing baseline,
    probe-previous-cell or probe-last-repr, which in a probe conversation asks its probes first, in the text
    protocol, reading each reply as a model would)."""

    raw_is_answer = True  # a baseline's text is the prediction itself: no fenced block to extract

    def __init__(self, model: str) -> None:
        known = (*BASELINES, *PROBING_BASELINES)
        if model not in known:
            raise BackendError(f"unknown baseline model {model!r} (expected one of {', '.join(known)})")
        self.model = model

    def native_tools_problem(self) -> str | None:
        return "a baseline writes the text protocol only"

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        out = []
        for prompt in prompts:
            if prompt.row is None or prompt.task is None:
                raise BackendError("the baseline backend needs prompts rendered from rows (Prompt.row, Prompt.task)")
            prediction = self._reply(prompt)
            out.append([Generation(prediction, "ok", None, 0, 0) for _ in range(sampling.n)])
        return out

    def _reply(self, prompt: Prompt) -> str:
        if self.model not in PROBING_BASELINES:
            return baseline_prediction(self.model, prompt.row, prompt.task)
        if prompt.probes_left is None:  # not a probe conversation: answer as the static twin
            return baseline_prediction(PROBING_BASELINES[self.model], prompt.row, prompt.task)
        replies = [m["content"] for m in prompt.messages[2:] if m["role"] in ("user", "tool")]
        asked = baseline_probes(self.model, prompt.row, prompt.task)
        if prompt.probes_left > 0 and len(replies) < len(asked):
            return f"```{PROBE_TAG}\n{asked[len(replies)]}\n```"
        outputs = [match.group(1) for match in map(_REPLY_OUTPUT.search, replies) if match]
        return probing_answer(self.model, prompt.row, prompt.task, outputs)

    def describe(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own = version(_package)
        except PackageNotFoundError:
            own = None
        return {"backend": "baseline", "version": own, "model": self.model, "model_revision": None}
