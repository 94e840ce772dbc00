"""Fine-tune a causal LM on a `themisto sft-export` folder with TRL's SFTTrainer (full or LoRA, CPU or GPU).

    python eval/finetune.py train --data EXPORT/ --model BASE -o MODEL/ [--method lora] [--max-steps N]
    python eval/finetune.py merge ADAPTER/ -o MODEL/          # an --adapter-only LoRA run, merged into its base

BASE is a model folder, a Hub id, or a .gguf file (dequantized into a plain model first). MODEL/ is a model folder
that `themisto generate --backend transformers` and `--backend vllm` take as it is, with themisto_training.json
(settings, losses, versions) and export_manifest.json beside the weights. Rerunning an interrupted command resumes
from its last checkpoint (MODEL.checkpoints/).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def _train_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="fine-tune a base model on an sft-export folder")
    parser.add_argument("--data", required=True, help="an sft-export folder")
    parser.add_argument("--model", required=True, help="base model: a folder, a Hub id or a .gguf file")
    parser.add_argument("-o", "--output", required=True, help="model folder to write")
    parser.add_argument("--method", choices=("full", "lora"), default="full")
    parser.add_argument("--adapter-only", action="store_true",
                        help="lora: write the adapter and the merge command instead of merged weights")
    parser.add_argument("--format", choices=("chat", "text"), default="chat",
                        help="text: plain-text prompts, for a base model without a chat template")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=-1, help="optimizer steps (default: --epochs epochs)")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, help="default 2e-5 (full) or 2e-4 (lora)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=2048, help="longer examples are left out (counted)")
    parser.add_argument("--save-steps", type=int, default=50, help="checkpoint every N steps (for resuming)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--limit", type=int, help="train on the first N examples only")
    parser.add_argument("--length-grouped", action="store_true",
                        help="batches of like lengths, in a seeded random order (less padding; no packing)")
    parser.add_argument("--overwrite", action="store_true", help="replace MODEL/ and its checkpoints")
    parser.add_argument("--json", action="store_true", help="print the training record as one JSON object")


def _merge_parser(subparsers) -> None:
    parser = subparsers.add_parser("merge", help="merge an --adapter-only LoRA folder into its base model")
    parser.add_argument("adapter", help="the adapter folder eval/finetune.py wrote")
    parser.add_argument("-o", "--output", required=True, help="model folder to write")
    parser.add_argument("--overwrite", action="store_true")


def train(args: argparse.Namespace) -> int:
    from themisto.training.finetune import FinetuneSettings, finetune

    settings = FinetuneSettings(
        data=args.data, base_model=args.model, output=args.output, method=args.method, format=args.format,
        adapter_only=args.adapter_only, lora_r=args.lora_r, lora_alpha=args.lora_alpha, max_steps=args.max_steps,
        epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size, grad_accum=args.grad_accum,
        max_length=args.max_length, save_steps=args.save_steps, seed=args.seed, device=args.device,
        limit=args.limit, length_grouped=args.length_grouped)
    result = finetune(settings, overwrite=args.overwrite)
    record = result.record
    if args.json:
        print(json.dumps(record))
        return 0
    resumed = f", resumed from {record['resumed_from']}" if record["resumed_from"] else ""
    print(f"trained {record['steps']} steps on {record['examples']['trained_on']} examples "
          f"({record['examples']['over_max_length']} over --max-length left out) in {record['train_seconds']:.1f} s "
          f"on {record['device']}{resumed}; loss {record['first_loss']:.4f} -> {record['final_loss']:.4f}")
    if record["merge_command"]:
        print(f"wrote the LoRA adapter to {result.output}; merge it with: {record['merge_command']}")
    else:
        print(f"wrote {result.output}: generate with `themisto generate --backend transformers --model "
              f"{result.output} ...`")
    return 0


def merge(args: argparse.Namespace) -> int:
    from themisto.training.finetune import merge_adapter

    print(f"wrote {merge_adapter(args.adapter, args.output, overwrite=args.overwrite)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _train_parser(subparsers)
    _merge_parser(subparsers)
    args = parser.parse_args(argv)
    from themisto.errors import InputError

    try:
        return train(args) if args.command == "train" else merge(args)
    except KeyboardInterrupt:
        from themisto.training.finetune import checkpoints_folder

        print(f"finetune {args.command}: interrupted; rerun the same command to resume from the last checkpoint in "
              f"{checkpoints_folder(args.output)}", file=sys.stderr)
        return 130
    # Input errors (export folder, base model, settings) print one line; anything else is a bug with its traceback.
    except (InputError, FileNotFoundError) as exc:
        print(f"finetune {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
