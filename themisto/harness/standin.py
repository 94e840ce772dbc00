"""`themisto-standin`: a stand-in model provider, registered through the package's Inspect entry point, for trying
the tasks with no model and no network:

    inspect eval themisto/next_cell -T release=out/sample --model themisto-standin/fixed --limit 8

It is no model: every reply is one fixed text (`-M reply=TEXT`, default `STANDIN_REPLY`), and token usage is counted
with the estimate the harness states for prompts (`themisto.generation.prompts.approx_tokens`, UTF-8 bytes / 3).
Inspect's own `mockllm` counts a reply's tokens with tiktoken's `o200k_base`, a download on first use, so offline it
fails before the first sample.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage, modelapi

from themisto.generation.prompts import approx_tokens

STANDIN = "themisto-standin"
STANDIN_REPLY = "```\n(a stand-in reply: no model ran)\n```"


@modelapi(name=STANDIN)
class StandInModel(ModelAPI):
    """Replies `reply` to every prompt, with usage counted locally; its name says it is a stand-in."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig = GenerateConfig(), reply: str = STANDIN_REPLY, **model_args: Any) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        self.reply = str(reply)

    async def generate(self, input, tools, tool_choice, config) -> ModelOutput:
        output = ModelOutput.from_content(model=f"{STANDIN}/{self.model_name}", content=self.reply)
        prompt, reply = sum(approx_tokens(message.text) for message in input), approx_tokens(self.reply)
        output.usage = ModelUsage(input_tokens=prompt, output_tokens=reply, total_tokens=prompt + reply)
        return output

    async def count_text_tokens(self, text: str) -> int:
        return approx_tokens(text)
