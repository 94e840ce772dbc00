"""Run a model with vLLM on a Themisto release, with and without runtime context, on a GPU machine.

One run folder per task under OUT (OUT/next_cell, OUT/output_prediction), written as `themisto generate --backend
vllm` writes it: resumable, with run.json. Then score each with `themisto score OUT/<task>`.

    pip install -r requirements.txt -r requirements-gpu.txt
    python eval/run_vllm.py --release out/sample --model Qwen/Qwen2.5-Coder-1.5B-Instruct -o runs/qwen \
        [--task next_cell output_prediction] [--context none variables full] [--n 1] [--temperature 0] \
        [--seed 0] [--max-new-tokens 256] [--tensor-parallel-size 1] [--limit K]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from themisto.vocabulary import DEFAULT_CONTEXT_MODES, STATIC_CONTEXT_MODES, TASKS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True, type=Path, help="a release folder written by `themisto build`")
    parser.add_argument("--model", required=True, help="a Hub id or local model folder vLLM can load")
    parser.add_argument("--task", nargs="+", choices=TASKS, default=list(TASKS))
    # The probe mode runs probes in kernels beside the model: `themisto generate --context probe --backend vllm`.
    parser.add_argument("--context", nargs="+", choices=STATIC_CONTEXT_MODES, default=list(DEFAULT_CONTEXT_MODES))
    parser.add_argument("--n", type=int, default=1, help="samples per example and context")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt-tokens", type=int, help="default: the model's context less --max-new-tokens")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--limit", type=int, help="only K test examples, evenly spread")
    parser.add_argument("--batch-size", type=int, default=256, help="prompts per LLM.chat call and per write")
    parser.add_argument("-o", "--output", required=True, type=Path, help="folder for one run folder per task")
    args = parser.parse_args(argv)
    from themisto.errors import InputError
    from themisto.generation.backends import Sampling, make_backend
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run
    from themisto.release.folder import open_release

    sampling = Sampling(n=args.n, temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)
    options = {"tensor_parallel_size": args.tensor_parallel_size, "seed": args.seed}
    try:
        release = open_release(args.release)  # once for both tasks
        # One engine for both tasks: loading the model is most of a small run's time.
        backend = make_backend("vllm", args.model, batch_size=args.batch_size, **options)
        for task in args.task:
            spec = ExampleSpec(tasks=(task,), contexts=tuple(args.context), limit=args.limit,
                               max_prompt_tokens=args.max_prompt_tokens)
            settings = RunSettings(spec=spec, backend="vllm", model=args.model, sampling=sampling,
                                   batch_size=args.batch_size, backend_options=options)
            report = generate_run(release, args.output / task, settings, backend=backend)
            print(f"{task}: {report.written} generations written ({report.resumed} from before) in "
                  f"{report.seconds:.1f} s, {report.run.get('generations_per_s')} generations/s; "
                  f"counts {report.counts}; score with: themisto score {args.output / task}")
    except InputError as exc:
        print(f"run_vllm: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
