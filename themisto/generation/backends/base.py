"""What every backend shares: the sampling settings and the two-method interface (a sample's record is
`themisto.generation.run_folder.Generation`, the one schema of a generations line)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from themisto.errors import InputError
from themisto.generation.run_folder import Generation

if TYPE_CHECKING:
    from themisto.generation.prompts import Prompt


class BackendError(InputError):
    """A backend cannot be made or used as asked: unknown name or model, a missing package (the message gives the
    pip command), sampling settings out of range."""


@dataclass(frozen=True)
class Sampling:
    """Sampling settings a run records; temperature 0 means greedy decoding."""

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise BackendError(f"n must be at least 1, got {self.n}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise BackendError(f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}")
        if self.max_new_tokens < 1:
            raise BackendError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")

    def to_dict(self) -> dict:
        return asdict(self)


class Backend(Protocol):
    """Generates `sampling.n` samples per prompt, in prompt order, and describes itself for run.json.

    A backend may also offer `count_tokens(text) -> int` (its own tokenizer) and `context_length` (tokens), which
    the run uses for the prompt budget, and `native_tools_problem() -> str | None`: why it cannot offer tools to the
    model and parse its tool calls (None: it can), which the probe mode's native protocol needs.
    """

    def generate(self, prompts: list[Prompt], sampling: Sampling) -> list[list[Generation]]: ...

    def describe(self) -> dict: ...


def require(module: str, install: str):
    """Import an optional package, or raise BackendError with the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] != module.split(".")[0]:
            raise
        raise BackendError(f"the {module} package is not installed; install it with: {install}") from None


def weights_sha256(paths: list[Path]) -> str:
    """One sha256 over weight files (their names and contents, sorted by name)."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: p.name):
        digest.update(path.name.encode("utf-8") + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def skipped(prompt: Prompt, n: int) -> list[Generation]:
    """The records of a prompt that is not sent (over budget): one per sample, with the reason."""
    return [Generation("", "skipped", prompt.skipped_reason, prompt.tokens, None) for _ in range(n)]


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates take them: a tool call's arguments as an object, not the JSON string the OpenAI
    API carries."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [{**call, "function": {**call["function"], "arguments": _arguments(call["function"])}}
                     for call in calls]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def _arguments(function: dict):
    import json

    arguments = function.get("arguments")
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


def tokenizer_tools_problem(tokenizer) -> str | None:
    """Why a Hugging Face tokenizer cannot carry native tool calls: its chat template never renders `tools`, or it
    has no `response_template` to parse the model's calls back (transformers' `parse_response`); None when it can."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    if "tools" not in template:
        return "its chat template does not render tools"
    if getattr(tokenizer, "response_template", None) is None:
        return "its tokenizer has no response_template to parse tool calls with"
    return None


def parse_tool_calls(tokenizer, text: str, prefix: str, tools: list[dict] | None) -> tuple[str, tuple[dict, ...]]:
    """The content and the tool calls of a reply, parsed with the tokenizer's `response_template`; the text as it is
    and no calls when no tools were offered or nothing parses."""
    import json

    if not tools or getattr(tokenizer, "response_template", None) is None:
        return text, ()
    try:
        parsed = tokenizer.parse_response(text, prefix=prefix, tools=tools)
    except (ValueError, KeyError, TypeError):  # a malformed call is the model's answer, not the run's failure
        return text, ()
    calls = []
    for index, call in enumerate(parsed.get("tool_calls") or []):
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments")
        calls.append({"id": f"call_{index}", "name": str(function.get("name")),
                      "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
    return str(parsed.get("content") or ""), tuple(calls)
