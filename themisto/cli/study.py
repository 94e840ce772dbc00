"""The study subcommand: fine-tune a model per context mode and seed, generate, score, and report the effects."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from themisto.vocabulary import CLUSTER_UNITS, STATIC_CONTEXT_MODES, TASKS

# Options whose value, when given, overrides the preset's (argparse default None means "not given").
_OVERRIDES: tuple[str, ...] = (
    "contexts", "seeds", "tasks", "method", "epochs", "max_steps", "learning_rate", "batch_size", "grad_accum",
    "max_length", "train_limit", "max_prompt_tokens", "max_new_tokens", "test_limit", "generation_batch", "device",
    "dtype", "execute_limit", "cluster", "resamples", "parallel", "batching", "budget_s")


def study_command(args: argparse.Namespace) -> int:
    """Run or resume a fine-tuning study into STUDY/ and print its results table."""
    from themisto.release.folder import open_release
    from themisto.study.run import run_study
    from themisto.study.settings import with_preset

    given = {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None}
    for name in ("contexts", "tasks"):
        if name in given:
            given[name] = tuple(given[name])
    settings = with_preset(args.preset, {"release": str(args.release), "model": args.model,
                                         "execute": args.execute, "progress": not args.json,
                                         "generate_only": args.generate_only, "score_only": args.score_only,
                                         **given})
    release = open_release(settings.release)  # once for the whole study: its units take this handle
    if args.plan:
        return _print_plan(settings, release, args)
    try:
        results = run_study(settings, release, args.output, prepare_only=args.prepare_only)
    except KeyboardInterrupt:
        print(f"themisto study: interrupted; rerun the same command to resume into {args.output}", file=sys.stderr)
        return 130
    if "generated" in results:  # --generate-only, or stopped by --budget-s: nothing scored
        print(json.dumps({"output": str(args.output), "seconds": results["seconds"], "generated": results["generated"],
                          "left": results["left"]}, sort_keys=True) if args.json else
              f"{len(results['generated'])} units generated into {args.output}/runs in {results['seconds']:.0f} s"
              + (f"; {len(results['left'])} left for a later run ({', '.join(results['left'])})" if results["left"]
                 else "; the same command without --generate-only scores them"))
        return 0
    if args.json:
        print(json.dumps({"output": str(args.output), "seconds": results["seconds"],
                          "path_check": results["path_check"],
                          "effects": {task: [e for e in r["effects"] if e["metric"] == r["headline"]]
                                      for task, r in results["tasks"].items()}}, sort_keys=True))
        return 0
    from themisto.study.report import render_markdown

    print(render_markdown(results))
    print(f"wrote {args.output}/results.json, results.md and effects.png in {results['seconds']:.0f} s")
    return 0


def _print_plan(settings, release, args: argparse.Namespace) -> int:
    """--plan: each unit's rows, tokens, prompts and estimated time, and where each throughput figure comes from."""
    from themisto.study.plan import plan_study, render_plan
    from themisto.study.settings import StudyError

    given = {}
    for item in args.throughput or ():
        name, _, value = item.partition("=")
        try:
            given[name] = float(value)
        except ValueError:
            raise StudyError(f"--throughput {item!r}: expected NAME=NUMBER") from None
    plan = plan_study(settings, release, args.output, given)
    print(json.dumps(plan.to_dict(), sort_keys=True) if args.json else render_plan(plan, settings, settings.budget_s),
          end="\n" if args.json else "")
    return 0


def add_study(subparsers: argparse._SubParsersAction) -> None:
    from themisto.generation.backends.hf import DTYPES
    from themisto.study.settings import PRESET_NAMES, PRESETS, STUDY_CONTEXT_MODES, StudySettings

    d = StudySettings(release="", model="")  # the defaults shown in --help are the settings' own
    parser = subparsers.add_parser("study", help="the fine-tuning study: a model per context mode and seed, trained "
                                                 "on the same train rows, scored with paired effects")
    parser.add_argument("--release", required=True, type=Path, metavar="DIR", help="release folder (themisto build)")
    parser.add_argument("--model", required=True, help="base model: a folder, a Hub id or a .gguf file")
    parser.add_argument("-o", "--output", required=True, type=Path, metavar="STUDY", help="study folder")
    parser.add_argument("--preset", choices=PRESET_NAMES, default=d.preset,
                        help="gpu: the study on one GPU (bf16, several models at once); cpu-check: the same path on a "
                             "reduced configuration that ends in minutes on a CPU (a path check, not a result); "
                             "options given explicitly override the preset")
    parser.add_argument("--contexts", nargs="+", choices=STATIC_CONTEXT_MODES, metavar="MODE",
                        help=f"modes to train with (none is always in; default {' '.join(STUDY_CONTEXT_MODES)})")
    parser.add_argument("--seeds", type=int, help=f"seeds per mode (default {d.seeds})")
    parser.add_argument("--tasks", nargs="+", choices=TASKS, help="tasks (default: both)")
    parser.add_argument("--execute", action="store_true",
                        help="run next_cell predictions in the exact pre-cell state (also needs HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--execute-limit", type=int, metavar="K",
                        help="next_cell test examples executed, evenly spread (default: all generated)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), help=f"default {d.device}")
    parser.add_argument("--dtype", choices=DTYPES, help=f"generation's number format (default {d.dtype})")
    parser.add_argument("--method", choices=("full", "lora"), help=f"default {d.method}")
    parser.add_argument("--epochs", type=float, help=f"default {d.epochs}")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (default: --epochs epochs)")
    parser.add_argument("--learning-rate", type=float, help=f"default {d.learning_rate}")
    parser.add_argument("--batch-size", type=int, help=f"default {d.batch_size}")
    parser.add_argument("--grad-accum", type=int, help=f"default {d.grad_accum}")
    parser.add_argument("--max-length", type=int, help=f"training tokens per row (default {d.max_length})")
    parser.add_argument("--train-limit", type=int, help="train on this many of the common rows (default: all)")
    parser.add_argument("--max-prompt-tokens", type=int,
                        help=f"prompt budget in training and test, counted with the base model's tokenizer "
                             f"(default {d.max_prompt_tokens})")
    parser.add_argument("--max-new-tokens", type=int, help=f"default {d.max_new_tokens}")
    parser.add_argument("--test-limit", type=int, help="test examples per task, evenly spread (default: all)")
    parser.add_argument("--generation-batch", type=int, help=f"prompts per batch (default {d.generation_batch})")
    parser.add_argument("--cluster", choices=CLUSTER_UNITS, help=f"the bootstrap's unit (default {d.cluster})")
    parser.add_argument("--resamples", type=int, help=f"bootstrap resamples (default {d.resamples})")
    parser.add_argument("--parallel", type=int, help=f"models trained and generated at once (default {d.parallel}; gpu: {PRESETS['gpu']['parallel']})")
    parser.add_argument("--generate-only", action="store_true",
                        help="stop once every model has generated (on a GPU machine, say); the same command without "
                             "it scores, here or on a machine given STUDY without models/ and exports/: the release "
                             "and the base model are matched by their content, not their paths")
    parser.add_argument("--score-only", action="store_true",
                        help="score the finished units and run nothing else (a study stopped by its budget, on the "
                             "scoring machine); the results give each cell's seeds and the units left")
    parser.add_argument("--budget-s", type=float, metavar="SECONDS",
                        help="start no unit that the plan says would end past SECONDS from the start (a started "
                             "unit runs to its end: the folder keeps whole units, which a later run resumes)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="write STUDY/study.json and the train rows every mode shares (rows.json), then stop: "
                             "what a short GPU slot then need not spend time on (scripts/gpu_study.sh)")
    parser.add_argument("--plan", action="store_true",
                        help="print, before anything runs, each unit's rows, optimizer steps, training tokens, test "
                             "prompts and estimated time, and where each throughput figure comes from; runs nothing")
    parser.add_argument("--throughput", nargs="+", metavar="NAME=VALUE",
                        help="--plan: state a figure (train_tokens_per_s, prompts_per_s, "
                             "unit_overhead_s, side_by_side) instead of the measured or stated one")
    parser.add_argument("--batching", choices=("fixed", "memory"),
                        help=f"generation: memory (greedy, batches sized by memory, the same answers) or fixed "
                             f"(default {d.batching})")
    parser.add_argument("--json", action="store_true", help="no progress bars; print a summary JSON object")
    parser.set_defaults(run=study_command)
