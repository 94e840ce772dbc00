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
    "dtype", "execute_limit", "cluster", "resamples", "parallel")


def study_command(args: argparse.Namespace) -> int:
    """Run or resume a fine-tuning study into STUDY/ and print its results table."""
    from themisto.study.run import run_study
    from themisto.study.settings import with_preset

    given = {name: getattr(args, name) for name in _OVERRIDES if getattr(args, name) is not None}
    for name in ("contexts", "tasks"):
        if name in given:
            given[name] = tuple(given[name])
    settings = with_preset(args.preset, {"release": str(args.release), "model": args.model,
                                         "execute": args.execute, "progress": not args.json,
                                         "generate_only": args.generate_only, **given})
    try:
        results = run_study(settings, args.output)
    except KeyboardInterrupt:
        print(f"themisto study: interrupted; rerun the same command to resume into {args.output}", file=sys.stderr)
        return 130
    if settings.generate_only:
        print(json.dumps({"output": str(args.output), "seconds": results["seconds"], "generated": results["generated"]},
                         sort_keys=True) if args.json else
              f"{len(results['generated'])} models generated into {args.output}/runs in {results['seconds']:.0f} s; "
              "the same command without --generate-only scores them")
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
    parser.add_argument("--json", action="store_true", help="no progress bars; print a summary JSON object")
    parser.set_defaults(run=study_command)
