"""Supervised fine-tuning on an `sft-export` folder with TRL's SFTTrainer: full or LoRA, CPU or GPU, resumable.

The result is a model folder that `themisto generate --backend transformers` (and `--backend vllm`) loads as it
is: merged weights and the tokenizer (for LoRA, optionally the adapter alone and the command that merges it), with
`themisto_training.json` (settings, base model, losses, versions) and the export's `manifest.json` beside them.
Checkpoints go to `OUT.checkpoints/`; a run started again with the same settings resumes from the last one.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from themisto.errors import InputError
from themisto.generation.prompts import messages_text
from themisto.resume import folder_written_whole

TRAINING_FILE = "themisto_training.json"
EXPORT_MANIFEST_FILE = "export_manifest.json"
SETTINGS_FILE = "settings.json"  # in the checkpoints folder: what a resumed run must match
METHODS: tuple[str, ...] = ("full", "lora")
FORMATS: tuple[str, ...] = ("chat", "text")
# Columns of an export that name an example; SFTTrainer needs only prompt and completion.
_NAME_COLUMNS = ("id", "task", "context")


class FinetuneError(InputError):
    """Training cannot run as asked; the message names the folder, model or setting concerned."""


@dataclass(frozen=True)
class FinetuneSettings:
    """One fine-tuning run: data, base model, method, format and the optimiser's settings."""

    data: str  # an `themisto sft-export` folder
    base_model: str  # a model folder, a Hub id, or a .gguf file (dequantized into a plain model)
    output: str
    method: str = "full"
    format: str = "chat"  # text: the messages' plain text, as the transformers backend sends to template-less models
    adapter_only: bool = False  # lora: write the adapter and the merge command instead of merged weights
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    max_steps: int = -1  # -1: run `epochs` epochs
    epochs: float = 1.0
    learning_rate: float | None = None  # None: 2e-5 for full, 2e-4 for LoRA
    batch_size: int = 4
    grad_accum: int = 1
    max_length: int = 2048
    save_steps: int = 50
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    limit: int | None = None  # train on the first N examples only
    # Batches of like lengths (transformers' length-grouped sampler, seeded like the random one): less padding. No
    # packing across examples: under SDPA attention packed rows would see each other.
    length_grouped: bool = False
    checkpoints: bool = True  # False: no checkpoint (a short run restarts whole rather than resuming)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise FinetuneError(f"unknown method {self.method!r} (expected one of {', '.join(METHODS)})")
        if self.format not in FORMATS:
            raise FinetuneError(f"unknown format {self.format!r} (expected one of {', '.join(FORMATS)})")
        if self.adapter_only and self.method != "lora":
            raise FinetuneError("--adapter-only needs --method lora (full fine-tuning has no adapter)")
        if self.max_steps == 0 or self.batch_size < 1 or self.grad_accum < 1 or self.save_steps < 1:
            raise FinetuneError("max_steps, batch size, gradient accumulation and save steps must be positive")

    @property
    def lr(self) -> float:
        return self.learning_rate if self.learning_rate is not None else (2e-4 if self.method == "lora" else 2e-5)

    def resumable(self) -> dict:
        """The settings a resumed run must share with the run that wrote the checkpoints."""
        return {k: v for k, v in asdict(self).items() if k not in ("output", "device")}


@dataclass
class FinetuneResult:
    """What a run wrote and how it went: the model folder, steps, losses, and whether it resumed."""

    output: Path
    steps: int
    losses: list[float]
    resumed_from: str | None
    record: dict = field(repr=False, default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Data


def load_export(folder: Path, settings: FinetuneSettings):
    """The export's `datasets` folder (as TRL wants it for `settings.format`) and its manifest."""
    import datasets

    from themisto.training.export import DATASET_DIR, MANIFEST_FILE

    manifest_path = folder / MANIFEST_FILE
    if not (folder / DATASET_DIR).is_dir() or not manifest_path.is_file():
        raise FinetuneError(f"{folder}: not an sft-export folder (no {DATASET_DIR}/ and {MANIFEST_FILE}; "
                            "make one with `themisto sft-export`)")
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    dataset = datasets.load_from_disk(str(folder / DATASET_DIR))
    if settings.limit is not None:
        dataset = dataset.select(range(min(settings.limit, len(dataset))))
    dataset = dataset.remove_columns([c for c in _NAME_COLUMNS if c in dataset.column_names])
    if settings.format == "text":
        dataset = dataset.map(plain_text_example, remove_columns=["prompt", "completion"])
    return dataset, manifest


def plain_text_example(example: dict) -> dict:
    """A conversational example as plain text: the prompt exactly as the transformers backend writes it for a model
    without a chat template (the messages' text and a newline), the completion as the assistant's text."""
    return {"prompt": messages_text(example["prompt"]) + "\n", "completion": example["completion"][0]["content"]}


# ---------------------------------------------------------------------------------------------------------------
# Model


def load_base(settings: FinetuneSettings):
    """The base model and tokenizer; a GGUF file is dequantized into a plain model that `save_pretrained` accepts."""
    import transformers

    from themisto.generation.backends.hf import split_model_path

    source, gguf_file = split_model_path(settings.base_model, None)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype="float32", **kwargs)
    except OSError as exc:
        raise FinetuneError(f"cannot load base model {settings.base_model!r}: {exc}") from exc
    if gguf_file:
        model = dequantized(model)
    if settings.format == "chat" and not getattr(tokenizer, "chat_template", None):
        raise FinetuneError(f"base model {settings.base_model!r} has no chat template, so chat-format examples "
                            "cannot be rendered; pass --format text to train on the plain-text prompts the "
                            "transformers backend sends to models without a template")
    if settings.format == "text":
        tokenizer.chat_template = None  # the saved model must be prompted the way it was trained
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def dequantized(model):
    """A plain copy of a GGUF-loaded model: same config and (already dequantized) weights, without the quantizer,
    so it trains and saves as safetensors."""
    import transformers

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # Tied embeddings share one tensor: the head may be "missing" from the state dict and still be set.
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise FinetuneError(f"dequantizing the GGUF model left weights unmatched: {(missing + unexpected)[:5]}")
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain


def _lora_config(settings: FinetuneSettings):
    import peft

    return peft.LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                           target_modules="all-linear", task_type="CAUSAL_LM")


def _precision(settings: FinetuneSettings) -> dict:
    """Device and precision options: fp32 on CPU (SFTConfig defaults to bf16), bf16 on a GPU that supports it."""
    import torch

    cuda = torch.cuda.is_available() if settings.device == "auto" else settings.device == "cuda"
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise FinetuneError("--device cuda was asked and torch sees no CUDA device")
    bf16 = bool(cuda and torch.cuda.is_bf16_supported())
    return {"use_cpu": not cuda, "bf16": bf16, "fp16": False}


def example_tokens(example: dict, tokenizer, format: str = "chat") -> int:
    """Tokens an export example (prompt and completion messages) takes in training, in `format` (FORMATS)."""
    if format == "chat":
        return len(tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True,
                                                 return_dict=False))
    text = plain_text_example(example)
    return len(tokenizer(text["prompt"] + text["completion"])["input_ids"]) + 1  # + the EOS TRL appends


def _within_length(dataset, tokenizer, settings: FinetuneSettings):
    """Examples whose prompt and completion fit `max_length` tokens (SFTTrainer would cut the completion's end)."""
    def length(example: dict) -> int:
        if settings.format == "chat":
            return example_tokens(example, tokenizer, "chat")
        return len(tokenizer(example["prompt"] + example["completion"])["input_ids"]) + 1  # + the EOS TRL appends

    kept = dataset.filter(lambda example: length(example) <= settings.max_length)
    return kept, len(dataset) - len(kept)


def _sampling(config_class, grouped: bool) -> dict:
    """The length-grouped sampler as this transformers names it (`train_sampling_strategy` since 5.x, before it
    `group_by_length`), or the random one."""
    from dataclasses import fields

    names = {f.name for f in fields(config_class)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length" if grouped else "random"}
    return {"group_by_length": grouped}


def _sft_config(settings: FinetuneSettings, work: Path):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(work), max_steps=settings.max_steps, num_train_epochs=settings.epochs,
        per_device_train_batch_size=settings.batch_size, gradient_accumulation_steps=settings.grad_accum,
        learning_rate=settings.lr, max_length=settings.max_length, seed=settings.seed, data_seed=settings.seed,
        logging_steps=1, save_strategy="steps" if settings.checkpoints else "no", save_steps=settings.save_steps,
        save_total_limit=2, report_to=[], completion_only_loss=True, disable_tqdm=True,
        **_sampling(SFTConfig, settings.length_grouped), **_precision(settings))


def _resume_point(work: Path, settings: FinetuneSettings, overwrite: bool) -> str | None:
    """The last checkpoint of an interrupted run with the same settings, or None; other checkpoints are an error."""
    from transformers.trainer_utils import get_last_checkpoint

    recorded = work / SETTINGS_FILE
    if overwrite and work.exists():
        shutil.rmtree(work)
    last = get_last_checkpoint(str(work)) if work.is_dir() else None
    if last is None:  # nothing to resume: (re)start with these settings
        work.mkdir(parents=True, exist_ok=True)
        recorded.write_text(json.dumps(settings.resumable(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return None
    previous = json.loads(recorded.read_text(encoding="utf-8")) if recorded.is_file() else {}
    if previous != settings.resumable():
        changed = sorted(k for k in set(previous) | set(settings.resumable())
                         if previous.get(k) != settings.resumable().get(k))
        raise FinetuneError(f"{work}: holds checkpoints of a run with other settings (differs in {changed[:5]}); "
                            "pass --overwrite to start over")
    return last


def _losses(log_history: list[dict]) -> list[float]:
    return [float(entry["loss"]) for entry in log_history if "loss" in entry]


# ---------------------------------------------------------------------------------------------------------------
# Run


def checkpoints_folder(output: str | Path) -> Path:
    """Where a run keeps its checkpoints until the model folder is written: beside it, `OUT.checkpoints`."""
    output = Path(output)
    return output.with_name(output.name + ".checkpoints")


def finetune(settings: FinetuneSettings, *, overwrite: bool = False, callbacks: tuple = ()) -> FinetuneResult:
    """Train, then write the model folder whole; an interrupted run resumes from its last checkpoint when rerun."""
    from trl import SFTTrainer

    out, data = Path(settings.output), Path(settings.data)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FinetuneError(f"{out}: exists and is not an empty folder (pass --overwrite to replace it)")
    dataset, manifest = load_export(data, settings)
    work = checkpoints_folder(out)
    resume = _resume_point(work, settings, overwrite)
    model, tokenizer = load_base(settings)
    dataset, too_long = _within_length(dataset, tokenizer, settings)
    if len(dataset) == 0:
        raise FinetuneError(f"{data}: every example is longer than --max-length {settings.max_length} tokens")
    trainer = SFTTrainer(model=model, args=_sft_config(settings, work), train_dataset=dataset,
                         processing_class=tokenizer, callbacks=list(callbacks),
                         peft_config=_lora_config(settings) if settings.method == "lora" else None)
    started = time.monotonic()
    # The trainer prints its log dictionaries; stdout belongs to the caller (eval/finetune.py --json prints one JSON
    # object there), so they go to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train(resume_from_checkpoint=resume)
    losses = _losses(trainer.state.log_history)
    if not losses or not all(math.isfinite(x) for x in losses):
        raise FinetuneError(f"training diverged (losses {losses[-5:]}); lower --learning-rate (was {settings.lr}); "
                            f"checkpoints are kept in {work}")
    record = _record(settings, manifest, trainer, losses, resume, time.monotonic() - started,
                     {"trained_on": len(dataset), "over_max_length": too_long})
    save_model_folder(trainer.model, tokenizer, out, record, manifest, merge=not settings.adapter_only)
    shutil.rmtree(work, ignore_errors=True)
    return FinetuneResult(out, trainer.state.global_step, losses, resume, record)


def describe_base_model(model: str) -> dict:
    """A base model as given, with the sha256 of its weights where they are local files (a study moved to another
    machine is matched by them, not by where the files lie)."""
    from themisto.generation.backends.hf import local_weights_sha256, split_model_path

    source, gguf_file = split_model_path(model, None)
    info: dict[str, Any] = {"model": model, "gguf_file": gguf_file, "dequantized": bool(gguf_file)}
    digest = local_weights_sha256(source, gguf_file)
    if digest is not None:
        info["weights_sha256"] = digest
    return info


def _record(settings: FinetuneSettings, manifest: dict, trainer, losses: list[float], resume: str | None,
            seconds: float, examples: dict) -> dict:
    import peft
    import torch
    import transformers
    import trl

    args = trainer.args
    return {
        "format": 1,
        "settings": asdict(settings),
        "learning_rate": settings.lr,
        "base_model": describe_base_model(settings.base_model),
        "export": {"path": str(Path(settings.data).resolve()), "release": manifest.get("release"),
                   "split": manifest.get("split"), "counts": manifest.get("counts")},
        "examples": examples,
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "losses": losses,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "train_seconds": round(seconds, 3),
        "resumed_from": Path(resume).name if resume else None,
        "device": "cpu" if args.use_cpu else "cuda",
        "precision": "bf16" if args.bf16 else "fp32",
        "packages": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "peft": peft.__version__},
        "merge_command": None,
    }


def save_model_folder(model, tokenizer, out: Path, record: dict, manifest: dict, *, merge: bool) -> None:
    """Write weights (LoRA merged unless `merge` is False), tokenizer, training record and export manifest, whole."""
    if out.exists() and not out.is_dir():
        out.unlink()
    with folder_written_whole(out) as tmp:
        is_adapter = hasattr(model, "peft_config")
        if is_adapter and merge:
            model = model.merge_and_unload()
        elif is_adapter:
            record["merge_command"] = f"python eval/finetune.py merge {out} -o {out}-merged"
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        (tmp / EXPORT_MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                                encoding="utf-8")


def merge_adapter(adapter: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Merge an `--adapter-only` run's LoRA adapter into its base model and write a plain model folder."""
    import peft

    adapter, out = Path(adapter), Path(out)
    record_path = adapter / TRAINING_FILE
    if not record_path.is_file() or not (adapter / "adapter_config.json").is_file():
        raise FinetuneError(f"{adapter}: not an adapter folder written by eval/finetune.py --adapter-only")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FinetuneError(f"{out}: exists and is not an empty folder (pass --overwrite to replace it)")
    record = json.loads(record_path.read_text(encoding="utf-8"))
    settings = FinetuneSettings(**record["settings"])
    base, _ = load_base(settings)
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(adapter))
    merged = peft.PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    manifest = json.loads((adapter / EXPORT_MANIFEST_FILE).read_text(encoding="utf-8"))
    record = {**record, "merged_from": str(adapter.resolve()), "merge_command": None}
    save_model_folder(merged, tokenizer, out, record, manifest, merge=True)
    return out
