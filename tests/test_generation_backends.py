"""The transformers backend on the tiny local model (batched, left padding, greedy and sampled, token counts), the
baseline backend, and what a missing package or an unknown backend says."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from test_generation_prompts import rows  # noqa: F401  (the release rows fixture)

from themisto.generation.backends import BackendError, Sampling, make_backend
from themisto.generation.backends.base import require
from themisto.generation.backends import hf
from themisto.generation.backends.hf import split_model_path
from themisto.generation.prompts import messages_text, render_prompt


# The tests below hold in both number formats the main job may choose between (all but the batching one above).
@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def tiny(tiny_model_dir, request):
    return make_backend("transformers", str(tiny_model_dir), device="cpu", batch_size=4, dtype=request.param)


@pytest.fixture(scope="module")
def tiny_float32(tiny_model_dir):
    return make_backend("transformers", str(tiny_model_dir), device="cpu", batch_size=4, dtype="float32")


# float32 only: in bfloat16 padding changes the rounding, and with it the argmax of near ties (measured: the tiny
# model's batched answers differ from its answers one by one), so its answers depend on their batch.
def test_greedy_batches_with_left_padding_match_one_by_one(tiny_float32, rows):  # noqa: F811
    tiny = tiny_float32
    prompts = [render_prompt(r, "next_cell", "none") for r in rows["next_cell"][:3]]
    lengths = {len(messages_text(p.messages)) for p in prompts}
    assert len(lengths) == 3  # different lengths: the batch really is padded
    sampling = Sampling(max_new_tokens=8)
    batched = tiny.generate(prompts, sampling)
    alone = [tiny.generate([p], sampling)[0] for p in prompts]
    assert [[g.raw for g in s] for s in batched] == [[g.raw for g in s] for s in alone]
    for samples, prompt in zip(batched, prompts):
        (g,) = samples
        assert g.status == "ok" and g.raw and 1 <= g.tokens_out <= 8
        # the backend's own count (used for the budget) agrees with what the model was fed, within the joins
        assert abs(tiny.count_tokens(messages_text(prompt.messages)) - g.tokens_in) <= 3


def test_sampling_draws_n_different_samples_and_repeats_with_the_seed(tiny, rows):  # noqa: F811
    prompts = [render_prompt(r, "output_prediction", "none") for r in rows["output_prediction"][:2]]
    sampling = Sampling(n=3, temperature=1.0, top_p=0.95, max_new_tokens=6, seed=7)
    first = tiny.generate(prompts, sampling)
    assert [len(s) for s in first] == [3, 3]
    assert len({g.raw for g in first[0]}) > 1
    again = tiny.generate(prompts, sampling)
    assert [[g.raw for g in s] for s in again] == [[g.raw for g in s] for s in first]


def test_the_budget_counts_with_the_model_tokenizer(tiny, rows):  # noqa: F811
    row = max(rows["next_cell"], key=lambda r: len(r["history"]))
    whole = render_prompt(row, "next_cell", "full", count_tokens=tiny.count_tokens, max_prompt_tokens=100_000)
    budget = whole.tokens // 2
    cut = render_prompt(row, "next_cell", "full", count_tokens=tiny.count_tokens, max_prompt_tokens=budget)
    assert cut.skipped_reason is None and cut.kept.history_shown < cut.kept.history_total
    (g,), = tiny.generate([cut], Sampling(max_new_tokens=2))
    assert g.tokens_in <= budget + 3


def test_describe_names_the_weights_and_their_number_format(tiny, tiny_model_dir):
    info = tiny.describe()
    assert info["backend"] == "transformers" and info["version"] and info["model"] == str(tiny_model_dir)
    assert len(info["weights_sha256"]) == 64 and info["chat_template"] is True
    assert info["dtype"] == str(tiny.model.dtype).removeprefix("torch.") and info["dtype"] in ("float32", "bfloat16")


def test_an_unknown_dtype_is_refused_with_the_choices(tiny_model_dir):
    with pytest.raises(BackendError, match="unknown dtype 'fp8'.*auto, float32, bfloat16, float16, int8"):
        make_backend("transformers", str(tiny_model_dir), device="cpu", dtype="fp8")


class _MockGpuWithoutBfloat16:
    """Stands in for torch on a GPU without bfloat16 (no GPU here): only what the dtype check asks."""

    class cuda:  # noqa: N801 - torch's own name
        @staticmethod
        def is_bf16_supported() -> bool:
            return False


def test_bfloat16_is_refused_on_a_gpu_without_it_and_warned_about_on_a_cpu_without_it():
    import torch

    with pytest.raises(BackendError, match="this GPU has no bfloat16"):
        hf._check_dtype("bfloat16", "cuda", _MockGpuWithoutBfloat16)
    native = hf.native_bfloat16("cpu", torch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf._check_dtype("bfloat16", "cpu", torch)
        hf._check_dtype("float32", "cpu", torch)
    assert [str(w.message) for w in caught] == ([] if native else [
        "this CPU has no native bfloat16 (AVX512-BF16 or AMX): torch emulates it, slower than float32"])


def test_a_gguf_path_loads_from_its_folder(tmp_path):
    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    assert split_model_path(str(gguf), None) == (str(tmp_path), "m.Q4.gguf")
    assert split_model_path("org/model", None) == ("org/model", None)
    with pytest.raises(BackendError, match="no such GGUF file"):
        split_model_path(str(tmp_path / "missing.gguf"), None)


def test_baseline_backend_repeats_its_prediction_per_sample(rows):  # noqa: F811
    backend = make_backend("baseline", "previous-output")
    prompts = [render_prompt(r, "output_prediction", "none") for r in rows["output_prediction"][:2]]
    out = backend.generate(prompts, Sampling(n=2))
    assert [[g.raw for g in s] for s in out] == [[r["history"][-1]["output"]] * 2
                                                 for r in rows["output_prediction"][:2]]
    with pytest.raises(BackendError, match="unknown baseline model 'oracle'"):
        make_backend("baseline", "oracle")


def test_unknown_backend_and_missing_packages_name_the_fix(monkeypatch):
    with pytest.raises(BackendError, match="unknown backend 'llamacpp'"):
        make_backend("llamacpp", "x")
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if vLLM were not installed
    with pytest.raises(BackendError, match=r"pip install -r requirements-gpu.txt"):
        make_backend("vllm", "x")
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(BackendError, match=r"pip install 'openai=="):
        require("openai", "pip install 'openai==3.57.0'")
    with pytest.raises(BackendError, match="temperature must be >= 0"):
        Sampling(temperature=-1)


def test_importing_the_stage_imports_no_model_library():
    code = ("import sys, themisto.generation, themisto.generation.prompts, themisto.generation.baselines, "
            "themisto.generation.backends, themisto.generation.runs\n"
            "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'openai', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_int8_quantizes_the_linear_layers_generates_and_says_so(tiny_model_dir, rows):
    import torch

    int8 = make_backend("transformers", str(tiny_model_dir), device="cpu", batch_size=4, dtype="int8")
    linear = [m for m in int8.model.modules() if type(m) is torch.nn.Linear]
    assert linear == [] and int8.describe()["dtype"] == "int8"
    prompt = render_prompt(rows["next_cell"][0], "next_cell", "none")
    (g,), = int8.generate([prompt], Sampling(max_new_tokens=3))
    assert g.status == "ok" and g.tokens_out >= 1
    with pytest.raises(BackendError, match="int8 .* runs on the CPU only"):
        hf._check_dtype("int8", "cuda", torch)
