"""Subcommands that run or train models: generate, sft-export."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from themisto.cli.common import (add_ray_option, add_source_options, default_of, format_counts, ray_target,
                                 source_folders)
from themisto.vocabulary import CONTEXT_MODES, PROBE_CONTEXT, PROBE_PROTOCOLS, RUN_SPLITS, STATIC_CONTEXT_MODES, TASKS


def sft_export_command(args: argparse.Namespace) -> int:
    """Write a release split as TRL prompt/completion examples (JSONL + datasets folder) with a manifest."""
    from themisto.release.folder import open_release
    from themisto.training.export import ExportSettings, export_sft

    settings = ExportSettings(split=args.split, tasks=tuple(args.task), contexts=tuple(args.context), mix=args.mix,
                              seed=args.mix_seed, verify=not args.no_verify, max_prompt_tokens=args.max_prompt_tokens)
    counter = {}
    if args.count_with:  # the prompt budget counted as generation counts it for that model
        from themisto.generation.backends.hf import load_tokenizer, prompt_token_counter

        counter = {"count_tokens": prompt_token_counter(load_tokenizer(args.count_with)),
                   "counted_with": f"tokenizer of {args.count_with}"}
    report = export_sft(open_release(args.release), args.output, settings, overwrite=args.overwrite, **counter)
    if args.json:
        print(json.dumps({"output": str(args.output), **report.manifest["counts"], "dropped": report.dropped},
                         ensure_ascii=False, sort_keys=True))
        return 0
    for task, contexts in report.by_task_context.items():
        dropped = {reason: n for reason, n in report.dropped[task].items() if n}
        print(f"{task}: " + ", ".join(f"{context} {n}" for context, n in contexts.items())
              + f"; dropped: {format_counts(dropped)}")
    for note in report.manifest["notes"]:
        print(f"note: {note}")
    print(f"wrote {report.examples} examples to {args.output}")
    return 0


def add_sft_export(subparsers: argparse._SubParsersAction) -> None:
    from themisto.training.export import MIXES, ExportSettings

    contexts = list(default_of(ExportSettings, "contexts"))
    parser = subparsers.add_parser("sft-export", help="a release split as fine-tuning examples (TRL format)")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder")
    parser.add_argument("--split", default=default_of(ExportSettings, "split"),
                        help="split to export (default: %(default)s)")
    parser.add_argument("--task", nargs="+", choices=TASKS, default=list(default_of(ExportSettings, "tasks")),
                        help="tasks (default: both)")
    parser.add_argument("--context", nargs="+", choices=STATIC_CONTEXT_MODES, default=contexts,
                        help=f"runtime-context modes (default: {' '.join(contexts)})")
    parser.add_argument("--mix", choices=MIXES, default=default_of(ExportSettings, "mix"),
                        help="all: each row once per context mode; one: each row once, in a seeded context mode")
    parser.add_argument("--mix-seed", type=int, default=default_of(ExportSettings, "seed"),
                        help="seed of --mix one (which context each row gets)")
    parser.add_argument("--max-prompt-tokens", type=int,
                        help="cut prompts to this budget as generation does (drop those that cannot fit): counted "
                             "with --count-with's tokenizer, else estimated (UTF-8 bytes / 3)")
    parser.add_argument("--count-with", metavar="MODEL",
                        help="count the prompt budget with this model's tokenizer (a folder, Hub id or .gguf file), "
                             "as `themisto generate --backend transformers` counts it for the same model")
    parser.add_argument("--no-verify", action="store_true",
                        help="keep targets the replay did not reproduce (the manifest says so)")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT when it is not empty")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="folder to write")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.set_defaults(run=sft_export_command)


# ---------------------------------------------------------------------------------------------------------------
# generate


def _backend_options(args: argparse.Namespace) -> dict:
    """The options each backend takes from the command line (recorded in run.json; a resume must match them)."""
    if args.backend == "transformers":
        # `fixed` is left out, so a run folder written before the option existed resumes as it was.
        batching = {} if args.batching == "fixed" else {"batching": args.batching}
        return {"device": args.device, "dtype": args.dtype, **batching}
    if args.backend == "openai":
        return {"base_url": args.base_url, "concurrency": args.concurrency, "max_retries": args.max_retries,
                "timeout_s": args.request_timeout}
    if args.backend == "vllm":
        return {"tensor_parallel_size": args.tensor_parallel_size, "seed": args.seed}
    return {}


def _generation_backend(args: argparse.Namespace, settings):
    """With --ray, a data-parallel backend (one engine per Ray actor) as a context manager; else None (the run
    makes its own backend)."""
    import contextlib

    target = ray_target(args)
    if target is None:
        return contextlib.nullcontext(None)
    from themisto.distributed.ray_generation import ray_backend

    gpus = float(args.tensor_parallel_size) if args.backend == "vllm" else None
    return ray_backend(settings, target, actors=args.ray_actors, gpus_per_actor=gpus)


def generate_command(args: argparse.Namespace) -> int:
    """Generate predictions for every example of a split (test unless told) × context mode × sample into a
    resumable run folder."""
    from themisto.generation.backends import Sampling
    from themisto.generation.delta import DeltaSettings
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.probe_protocol import ProbeSettings
    from themisto.generation.runs import RunSettings, generate_run
    from themisto.release.folder import open_release

    sampling = Sampling(n=args.n, temperature=args.temperature, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, seed=args.seed)
    probe = ProbeSettings(max_probes=args.probes, output_chars=args.probe_chars, timeout_s=args.probe_timeout,
                          protocol=args.probe_protocol)
    spec = ExampleSpec(tasks=(args.task,), contexts=tuple(args.context), split=args.split, limit=args.limit,
                       max_prompt_tokens=args.max_prompt_tokens, probe=probe,
                       delta=DeltaSettings(cells=args.delta_cells))
    settings = RunSettings(spec=spec, backend=args.backend, model=args.model, sampling=sampling,
                           batch_size=args.batch_size, backend_options=_backend_options(args))
    try:
        release = open_release(args.release)
        with _generation_backend(args, settings) as backend:
            report = generate_run(release, args.output, settings, backend=backend, progress=not args.json,
                                  execute_probes=args.execute_probes, workspace=source_folders(args))
    except KeyboardInterrupt:
        print(f"themisto generate: interrupted; rerun the same command to resume into {args.output}",
              file=sys.stderr)
        return 130
    summary = {"output": str(report.folder), "written": report.written, "resumed": report.resumed,
               "torn_line_dropped": report.torn_line_dropped, "counts": report.counts,
               "seconds": round(report.seconds, 2), "generations_per_s": report.run.get("generations_per_s")}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        counts = ", ".join(f"{k} {v}" for k, v in report.counts.items())
        print(f"wrote {report.written} generations ({report.resumed} from before) to {report.folder} in "
              f"{report.seconds:.1f} s: {counts}")
    return 0


def _add_mode_options(parser: argparse.ArgumentParser) -> None:
    """The options of the context modes that take settings: the probe mode's and the delta mode's."""
    from themisto.generation.probe_protocol import ProbeSettings

    parser.add_argument("--execute-probes", action="store_true",
                        help=f"the `{PROBE_CONTEXT}` mode runs the model's probes (model-written code) in branches of "
                             "the live pre-cell state: it needs this and HF_ALLOW_CODE_EVAL=1")
    parser.add_argument("--probes", type=int, default=default_of(ProbeSettings, "max_probes"), metavar="N",
                        help="probe mode: probes per answer (default %(default)s)")
    parser.add_argument("--probe-chars", type=int, default=default_of(ProbeSettings, "output_chars"), metavar="C",
                        help="probe mode: characters of each probe's output shown (default %(default)s)")
    parser.add_argument("--probe-timeout", type=float, default=default_of(ProbeSettings, "timeout_s"), metavar="S",
                        help="probe mode: seconds each probe may run (default %(default)g)")
    parser.add_argument("--probe-protocol", choices=PROBE_PROTOCOLS, default=default_of(ProbeSettings, "protocol"),
                        help="probe mode: a fenced ```probe block (text, default) or the backend's tool calls")
    parser.add_argument("--delta-cells", type=int, metavar="N", help="delta mode: only the last N history cells and "
                        "what each changed (default: as many as the prompt budget allows)")
    add_source_options(parser, "probe mode")


def add_generate(subparsers: argparse._SubParsersAction) -> None:
    from themisto.generation.backends import BACKENDS, Sampling
    from themisto.generation.backends.hf import BATCHINGS, DTYPES, TransformersBackend
    from themisto.generation.backends.openai_api import OpenAIBackend
    from themisto.generation.backends.vllm_offline import VLLMBackend
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings

    parser = subparsers.add_parser("generate", help="run a model (or a baseline) on a release's task, resumable")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder (themisto build)")
    parser.add_argument("--task", required=True, choices=TASKS)
    contexts = list(default_of(ExampleSpec, "contexts"))
    parser.add_argument("--context", nargs="+", choices=CONTEXT_MODES, default=contexts, metavar="MODE",
                        help=f"runtime-context modes: {', '.join(CONTEXT_MODES)} (default: {' '.join(contexts)})")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--model", required=True, help="model folder, Hub id or .gguf file; endpoint model name; "
                        "or a baseline: previous-cell, common-cell, previous-output, last-repr (or, probing, "
                        "probe-previous-cell, probe-last-repr)")
    parser.add_argument("--n", type=int, default=default_of(Sampling, "n"),
                        help="samples per example and context (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=default_of(Sampling, "temperature"),
                        help="0 = greedy (default %(default)g)")
    parser.add_argument("--top-p", type=float, default=default_of(Sampling, "top_p"), help="default %(default)g")
    parser.add_argument("--seed", type=int, default=default_of(Sampling, "seed"), help="default %(default)s")
    parser.add_argument("--max-new-tokens", type=int, default=default_of(Sampling, "max_new_tokens"),
                        help="default %(default)s")
    parser.add_argument("--max-prompt-tokens", type=int,
                        help="prompt budget (default: the model's context length less --max-new-tokens)")
    parser.add_argument("--limit", type=int, help="only K examples, evenly spread over the split")
    parser.add_argument("--split", choices=RUN_SPLITS, default=default_of(ExampleSpec, "split"),
                        help="the examples: test (the default: a submission), train, or all (test, then train); a "
                             "model not trained on train may be scored on it")
    parser.add_argument("--batch-size", type=int, default=default_of(RunSettings, "batch_size"),
                        help="prompts per batch and per write (default %(default)s)")
    parser.add_argument("--device", default=default_of(TransformersBackend, "device"),
                        help="transformers: cpu, cuda, auto (default %(default)s)")
    parser.add_argument("--dtype", default=default_of(TransformersBackend, "dtype"), choices=DTYPES,
                        help="transformers: the weights' number format (default auto: the checkpoint's own; a GGUF "
                             "is dequantized to float32); bfloat16 on a CPU or a GPU that has it, float16 on a GPU; "
                             "int8 on a CPU: float32 with every Linear layer dynamically quantized")
    parser.add_argument("--batching", default=default_of(TransformersBackend, "batching"), choices=BATCHINGS,
                        help="transformers: fixed (--batch-size prompts a batch through model.generate) or memory "
                             "(greedy prompts sorted by length in batches sized by the device's memory, at most "
                             "--batch-size rows, with a static KV cache: the same answers; default %(default)s)")
    parser.add_argument("--base-url", help="openai: the endpoint (default: OPENAI_BASE_URL); key from OPENAI_API_KEY")
    parser.add_argument("--concurrency", type=int, default=default_of(OpenAIBackend, "concurrency"),
                        help="openai: requests in flight (default %(default)s)")
    parser.add_argument("--max-retries", type=int, default=default_of(OpenAIBackend, "max_retries"),
                        help="openai: retries on 429/5xx/timeouts (default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=default_of(OpenAIBackend, "timeout_s"),
                        help="openai: seconds per request (default %(default)g)")
    parser.add_argument("--tensor-parallel-size", type=int, default=default_of(VLLMBackend, "tensor_parallel_size"),
                        help="vllm: GPUs per model (default %(default)s)")
    _add_mode_options(parser)
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="RUN", help="run folder")
    parser.add_argument("--json", action="store_true", help="no progress bar; print a summary JSON object")
    parser.add_argument("--ray-actors", type=int, help="with --ray: engines, one per actor (default: one per GPU "
                        "for vllm, else one per CPU); each batch of --batch-size prompts is split among them")
    add_ray_option(parser, "generate", unit="one engine per actor")
    parser.set_defaults(run=generate_command)
