"""The `probe` mode's native tool calls with real models: a tiny model trained here to call `run_probe` (a random one
never would), behind a real `transformers serve` process on 127.0.0.1 and in the transformers backend; the vLLM
backend's side of the same path against `VLLMWithoutGPUStandIn`'s kind of stand-in (vLLM needs a CUDA GPU); and a
real model that writes no probe through the text protocol."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from _tiny_model import build_scripted_model

from themisto.generation.backends import Sampling, make_backend
from themisto.generation.backends.base import BackendError
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.probe_protocol import TOOL_NAME, TOOL_SCHEMA, ProbeSettings
from themisto.generation.prompts import approx_tokens, render_prompt
from themisto.generation.runs import RunSettings, generate_run
from themisto.release.folder import open_release
from themisto.vocabulary import PROBE_CONTEXT

pytestmark = pytest.mark.slow

# One probe: the model learns one reply (the call) to the first prompt; after the probe's answer it is told to
# answer, without tools, and whatever it writes is its answer. Short prompts and three examples keep it cheap.
SETTINGS = ProbeSettings(max_probes=1, output_chars=100, protocol="native")
SAMPLING = Sampling(max_new_tokens=60)
BUDGET = 800  # the first prompt gets BUDGET less the probe's room, as the model was trained on
LIMIT = 3
SPEC = ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,), limit=LIMIT, max_prompt_tokens=BUDGET,
                   probe=SETTINGS)
CALL = '<tool_call>\n{"name": "run_probe", "arguments": {"code": "len(words)"}}\n</tool_call>'


def _first_prompts(release: Path, model: Path) -> list[list[dict]]:
    """Each next_cell row's first probe prompt as a run renders it, counted as an endpoint's run counts (UTF-8
    bytes / 3) and as the transformers backend does (the model's tokenizer)."""
    counters = [approx_tokens, make_backend("transformers", str(model), device="cpu").count_tokens]
    prompts = []
    for count in counters:
        prompts += [render_prompt(r, "next_cell", PROBE_CONTEXT, probe=SETTINGS, count_tokens=count,
                                  max_prompt_tokens=SPEC.first_probe_budget(SAMPLING.max_new_tokens, count)).messages
                    for r in open_release(release).rows("next_cell", "test")]
    return prompts


@pytest.fixture(scope="module")
def tool_model(probe_release, tmp_path_factory) -> Path:
    release, _ = probe_release
    return build_scripted_model(tmp_path_factory.mktemp("tool-model") / "model", CALL,
                                lambda folder: _first_prompts(release, folder), tools=[TOOL_SCHEMA], steps=120)


def _run(release, workspace, out, backend: str, model: str, **options) -> list[dict]:
    settings = RunSettings(SPEC, backend=backend, model=model, sampling=SAMPLING, backend_options=options)
    generate_run(open_release(release), out, settings, progress=False, execute_probes=True, workspace=workspace)
    return [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]


def _check_native(lines: list[dict], release: Path, *, server_may_refuse_the_answer: bool = False) -> None:
    rows = {r["id"]: r for r in open_release(release).rows("next_cell", "test")}
    assert len(lines) == LIMIT and {r["id"] for r in lines} <= set(rows)
    for record in lines:
        transcript = record["probes"]
        assert transcript["protocol"] == "native"
        # The call was asked for, run, its answer sent back in a `tool` turn; then the model answered. What the
        # tiny model writes in that second turn was never trained (its prompt holds the replay's timings, so it
        # differs between builds): `transformers serve` answers HTTP 500 when that text opens a tool call it cannot
        # parse, and the harness must then record the backend's failure on this line, after the probe it ran.
        if server_may_refuse_the_answer and record["status"] == "failed":
            assert transcript["stop"] == "backend_failed" and "HTTP 500" in record["reason"], record
            assert (transcript["used"], transcript["turns"]) == (1, 2), record
        else:
            assert record["status"] == "ok", record
            assert (transcript["used"], transcript["stop"], transcript["turns"]) == (1, "max_probes", 2), record
        words = next(v for v in rows[record["id"]]["variables_before"] if v["name"] == "words")
        for probe in transcript["probes"]:
            # The call came back parsed from the model's reply; it ran in the example's own pre-cell state.
            assert (probe["code"], probe["status"], probe["output"]) == ("len(words)", "ok", str(words["len"]))


def test_native_tool_calls_against_a_real_transformers_serve_process(probe_release, tool_model, served, tmp_path,
                                                                     allow_execution):
    release, workspace = probe_release
    backend = make_backend("openai", str(tool_model), base_url=served)  # the session's server loads this folder
    [[answer]] = backend.generate([render_prompt(open_release(release).rows("next_cell", "test")[0], "next_cell",
                                                 PROBE_CONTEXT, probe=SETTINGS)], SAMPLING)
    assert answer.status == "ok", answer.reason
    # The server's HTTP 500 on an untrained second turn is retried as any 5xx is (its four retries, the backoff
    # test_generation_openai checks): a short backoff, or such a line waits 15 s in sleeps before it is recorded.
    lines = _run(release, workspace, tmp_path / "run", "openai", str(tool_model), base_url=served, backoff_s=0.05)
    _check_native(lines, release, server_may_refuse_the_answer=True)


def test_native_tool_calls_through_the_transformers_backend(probe_release, tool_model, tmp_path,
                                                            allow_execution):
    release, workspace = probe_release
    _check_native(_run(release, workspace, tmp_path / "run", "transformers", str(tool_model), device="cpu"),
                  release)


def test_a_model_whose_template_has_no_tools_is_refused_the_native_protocol(probe_release, tiny_model_dir, tmp_path,
                                                                            allow_execution):
    release, workspace = probe_release
    with pytest.raises(BackendError, match="chat template does not render tools"):
        _run(release, workspace, tmp_path / "run", "transformers", str(tiny_model_dir), device="cpu")
    assert not (tmp_path / "run" / "generations.jsonl").exists()


def test_the_text_protocol_with_a_model_that_writes_no_probe(probe_release, tiny_model_dir, tmp_path,
                                                             allow_execution):
    release, workspace = probe_release
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,), max_prompt_tokens=2000,
                                       probe=ProbeSettings(max_probes=2)),
                           backend="transformers", model=str(tiny_model_dir), sampling=Sampling(max_new_tokens=8))
    generate_run(open_release(release), tmp_path / "run", settings, progress=False, execute_probes=True, workspace=workspace)
    lines = [json.loads(line) for line in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    assert lines and all(r["status"] == "ok" and r["probes"]["stop"] == "answered" and r["probes"]["turns"] == 1
                         for r in lines)
    # The first prompt left the probes their room (two replies of 2,000 characters: more than half the budget, so
    # half): the model saw at most 1,000 tokens (and what its chat template adds).
    assert all(r["tokens_in"] <= 1000 + 20 for r in lines)


# ---------------------------------------------------------------------------------------------------------------
# vLLM: what the backend hands `LLM.chat` and how it reads the calls back


def test_the_vllm_backend_offers_tools_and_reads_the_calls_with_the_model_s_tokenizer(tool_model, monkeypatch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    chats = []

    class LLMWithoutGPUStandIn:
        """Stands in for vLLM's offline LLM (it needs a CUDA GPU): the model's real tokenizer, a reply per prompt."""

        def __init__(self, model, **options) -> None:
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=4096))

        def get_tokenizer(self):
            return tokenizer

        def chat(self, messages, sampling_params, use_tqdm=True, tools=None):
            chats.append((messages, tools))
            text = CALL if tools else "```python\nx = 1\n```"
            return [types.SimpleNamespace(prompt_token_ids=[0] * 5, prompt="", outputs=[
                types.SimpleNamespace(text=text + "<|im_end|>", token_ids=[1, 2])]) for _ in messages]

    stand_in = types.ModuleType("vllm")
    stand_in.__version__ = "stand-in"
    stand_in.LLM = LLMWithoutGPUStandIn
    stand_in.SamplingParams = lambda **kwargs: kwargs
    monkeypatch.setitem(sys.modules, "vllm", stand_in)
    backend = make_backend("vllm", str(tool_model))
    assert backend.native_tools_problem() is None
    call = {"id": "c0", "type": "function", "function": {"name": TOOL_NAME, "arguments": '{"code": "len(words)"}'}}
    asked = [{"role": "user", "content": "look"}, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "c0", "content": "3"}]
    from themisto.generation.prompts import Prompt

    with_tools = Prompt(asked, "", id="a", context=PROBE_CONTEXT, probes_left=1, tools=[TOOL_SCHEMA])
    without = Prompt(asked[:1], "", id="b", context=PROBE_CONTEXT, probes_left=0)
    [[first], [second]] = backend.generate([with_tools, without], Sampling())
    assert first.tool_calls and first.tool_calls[0]["name"] == TOOL_NAME
    assert json.loads(first.tool_calls[0]["arguments"]) == {"code": "len(words)"} and second.tool_calls == ()
    # One chat call per tools list; a call's arguments reach the template as an object, not a JSON string.
    assert sorted((len(m), t is not None) for m, t in chats) == [(1, False), (1, True)]
    sent = next(m for m, t in chats if t)[0]
    assert sent[1]["tool_calls"][0]["function"]["arguments"] == {"code": "len(words)"}
