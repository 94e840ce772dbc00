"""Greedy generation in fixed batches against batches sized by memory (`--batching fixed` / `memory`): prompts/s of
each and how many of the memory path's answers are the fixed path's, per number format, on a release's test prompts.

    python bench/batched_generation.py --release R --model M [--prompts 64] [--max-prompt-tokens 2048]
                                       [--max-new-tokens 128] [--batch-size 64] [--dtypes float32 bfloat16]
                                       [--device auto] [--json]

In float32 the two paths give the same answers (tests/test_generation_batched.py); in bfloat16 the padding of a
batch changes the rounding, so any two batchings may differ on near ties: the count says how often. On a GPU this
is the parity check and the prompts/s the study's plan assumes (scripts/gpu_study.sh runs it first).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prompts(release: Path, backend, count: int, budget: int):
    from themisto.generation.prompts import render_prompt
    from themisto.generation.release_rows import load_task_rows
    from themisto.release.folder import open_release

    rows = load_task_rows(open_release(release), "next_cell", ("variables",), limit=count)
    prompts = [render_prompt(r, "next_cell", "variables", count_tokens=backend.count_tokens, max_prompt_tokens=budget)
               for r in rows]
    return [p for p in prompts if p.skipped_reason is None]


def _timed(backend, prompts, sampling) -> tuple[list, float]:
    import torch

    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = backend.generate(prompts, sampling)
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - started


def measure(args, dtype: str) -> dict:
    from themisto.generation.backends import Sampling, make_backend

    started = time.perf_counter()
    fixed = make_backend("transformers", args.model, device=args.device, dtype=dtype, batch_size=args.batch_size)
    load_s = time.perf_counter() - started
    memory = copy.copy(fixed)
    memory.batching, memory.batch_size = "memory", max(args.batch_size, 256)
    prompts = _prompts(args.release, fixed, args.prompts, args.max_prompt_tokens)
    sampling = Sampling(max_new_tokens=args.max_new_tokens)
    for backend in (fixed, memory):  # warm-up: first-call allocations and imports (the static cache's dynamo)
        backend.generate(prompts[:2], Sampling(max_new_tokens=2))
    a, fixed_s = _timed(fixed, prompts, sampling)
    b, memory_s = _timed(memory, prompts, sampling)
    same = sum(x[0].raw == y[0].raw for x, y in zip(a, b))
    return {"dtype": dtype, "device": fixed.device, "prompts": len(prompts), "load_s": round(load_s, 1),
            "tokens_in": sum(x[0].tokens_in or 0 for x in a), "tokens_out": sum(x[0].tokens_out or 0 for x in a),
            "fixed_s": round(fixed_s, 2), "memory_s": round(memory_s, 2),
            "fixed_prompts_per_s": round(len(prompts) / fixed_s, 2),
            "memory_prompts_per_s": round(len(prompts) / memory_s, 2),
            "speedup": round(fixed_s / memory_s, 2), "same_answers": same}


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import add_record_options, finish

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_options(parser)
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--model", required=True, help="a model folder, Hub id or .gguf file")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=2048)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64, help="the fixed path's batch (the study's old one)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], metavar="DTYPE")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    results = {dtype: measure(args, dtype) for dtype in args.dtypes}
    if args.json:
        import json

        print(json.dumps(results, sort_keys=True))
    else:
        for r in results.values():
            print(f"{r['dtype']:>9} on {r['device']}: {r['prompts']} prompts, fixed {r['fixed_prompts_per_s']} "
                  f"prompts/s, memory {r['memory_prompts_per_s']} prompts/s ({r['speedup']}x); "
                  f"{r['same_answers']} of {r['prompts']} answers the same")
    finish("greedy generation, fixed batches against batches sized by memory", results, args, quiet=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
