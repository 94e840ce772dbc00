"""The OpenAI-compatible backend: hosted APIs, `vllm serve`, `transformers serve`.

One chat completion per (prompt, sample), a bounded number in flight, retries with exponential backoff on rate
limits, server errors, timeouts and dropped connections; past the retries the sample is recorded as `failed` with
the reason — never dropped.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from themisto.generation.backends.base import BackendError, Sampling, require
from themisto.generation.run_folder import Generation
from themisto.generation.prompts import Prompt

INSTALL = "pip install 'openai==3.57.0'"
# Local servers (vllm serve, transformers serve) accept any key; the client insists on one.
LOCAL_KEY = "EMPTY"
MAX_RETRY_AFTER_S = 60.0


class OpenAIBackend:
    """Chat completions against `base_url` (default: OPENAI_BASE_URL), `concurrency` requests at a time."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 concurrency: int = 8, max_retries: int = 4, timeout_s: float = 120.0, backoff_s: float = 1.0) -> None:
        openai = require("openai", INSTALL)
        from themisto.settings import settings

        self.model = model
        self.base_url = base_url or settings().openai_base_url
        if not self.base_url:
            raise BackendError("the openai backend needs an endpoint: --base-url URL or OPENAI_BASE_URL")
        if concurrency < 1 or max_retries < 0:
            raise BackendError(f"concurrency must be >= 1 and max_retries >= 0, got {concurrency}, {max_retries}")
        self.concurrency, self.max_retries, self.backoff_s = concurrency, max_retries, backoff_s
        # The client's own retries are off: ours count, back off and record why a sample failed.
        self.client = openai.OpenAI(base_url=self.base_url, api_key=api_key or settings().openai_api_key or LOCAL_KEY,
                                    timeout=timeout_s, max_retries=0)
        self._retryable = (openai.RateLimitError, openai.InternalServerError, openai.APITimeoutError,
                           openai.APIConnectionError)
        self._status_error = openai.APIStatusError
        self.fingerprints: set[str] = set()

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]:
        jobs = [(i, j) for i in range(len(prompts)) for j in range(sampling.n)]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            done = list(pool.map(lambda job: self._one(prompts[job[0]], sampling, job[1]), jobs))
        out: list[list[Generation]] = [[] for _ in prompts]
        for (i, _), generation in zip(jobs, done):
            out[i].append(generation)
        return out

    def native_tools_problem(self) -> str | None:
        """None: an OpenAI-compatible endpoint takes `tools`; one that does not answers with an error, recorded."""
        return None

    def _request(self, prompt: Prompt, sampling: Sampling, sample: int):
        tools = {"tools": prompt.tools, "tool_choice": "auto"} if prompt.tools else {}
        return self.client.chat.completions.create(
            model=self.model, messages=prompt.messages, max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed + sample, **tools)

    def _one(self, prompt: Prompt, sampling: Sampling, sample: int) -> Generation:
        attempt = 0
        while True:
            try:
                response = self._request(prompt, sampling, sample)
            except self._retryable as exc:
                if attempt >= self.max_retries:
                    return Generation("", "failed", f"{_describe(exc)} after {attempt + 1} attempts", None, None)
                time.sleep(self._delay(exc, attempt))
                attempt += 1
                continue
            except self._status_error as exc:  # 4xx other than 429: asking again would not help
                return Generation("", "failed", _describe(exc), None, None)
            return self._generation(response)

    def _delay(self, exc, attempt: int) -> float:
        """Exponential backoff, or the server's Retry-After when it names a longer wait (bounded)."""
        delay = self.backoff_s * 2 ** attempt
        response = getattr(exc, "response", None)
        retry_after = response.headers.get("retry-after") if response is not None else None
        try:
            return min(max(delay, float(retry_after)), MAX_RETRY_AFTER_S) if retry_after else delay
        except ValueError:  # an HTTP date: keep our own backoff
            return delay

    def _generation(self, response) -> Generation:
        if getattr(response, "system_fingerprint", None):
            self.fingerprints.add(response.system_fingerprint)
        choices = getattr(response, "choices", None) or []
        if not choices or choices[0].message is None:
            return Generation("", "failed", "the endpoint answered without a choice", None, None)
        usage = getattr(response, "usage", None)
        calls = tuple({"id": str(call.id), "name": str(call.function.name), "arguments": call.function.arguments or ""}
                      for call in choices[0].message.tool_calls or [] if getattr(call, "function", None))
        return Generation(choices[0].message.content or "", "ok", None,
                          getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None),
                          tool_calls=calls)

    def describe(self) -> dict:
        import openai

        return {"backend": "openai", "version": openai.__version__, "model": self.model, "base_url": self.base_url,
                "model_revision": None, "system_fingerprints": sorted(self.fingerprints)}


def _describe(exc) -> str:
    status = getattr(exc, "status_code", None)
    kind = type(exc).__name__
    message = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{kind} (HTTP {status}): {message}" if status else f"{kind}: {message}"
