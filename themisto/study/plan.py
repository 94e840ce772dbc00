"""A study's plan, before anything runs: each unit's rows, optimizer steps, training tokens and test prompts, and an
estimated time from throughput figures that each say where they come from (measured in this study folder, measured
elsewhere and stated, or assumed).

A unit's time is its training tokens over the training throughput, its prompts over the generation throughput, and
a fixed overhead (process start, loading, saving); units side by side share the device, so the wall time is the sum
over units divided by the side-by-side speed-up. Training tokens are counted as batches pad them: rows grouped by
length (the study's sampler) pad little, rows in random order pad to the longest of each batch.

>>> Figure(50.0, "assumed", "a target").text("prompts/s")
'50 prompts/s (assumed: a target)'
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from themisto.study.settings import StudyError, StudySettings
from themisto.study.tokens import optimizer_steps, unit_tokens

MEASURED_HERE, MEASURED_ELSEWHERE, ASSUMED = "measured here", "measured elsewhere", "assumed"
# SmolLM2-135M, counted as model_parameters counts (the stated figures were measured with it); another size scales
# them by the ratio (compute grows with the parameters).
REFERENCE_PARAMETERS = 134_479_872
# The H200 figures (DESIGN.md, "Fine-tuning", 2026-12-04, on the real release): 150 optimizer steps of 16 rows in
# 90-100 s per mode, in random order; plus ~45 s of loading and saving (with a checkpoint every 50 steps, which study
# units no longer write); generation with the transformers backend in fixed batches of 64: 5.4 prompts/s. The same
# real release's train rows (the study's 1,410 common rows, none/variables/full/trace, SmolLM2's tokenizer, built
# 2026-12-05) take 2,323 tokens a row in random batches of 16, padding included (`themisto.study.tokens.random_padded_tokens`).
H200_STEP_SECONDS, H200_ROWS_PER_STEP, REAL_PADDED_ROW = 95 / 150, 16, 2323
H200_PROMPTS_PER_S = 5.4
CPU_STEP_SECONDS = 607  # one optimizer step of 16 such rows on a 2-core CPU (DESIGN.md, 2026-12-04)


@dataclass(frozen=True)
class Figure:
    """One throughput figure and where it comes from (`kind`: measured here, measured elsewhere, assumed)."""

    value: float
    kind: str
    source: str

    def text(self, unit: str) -> str:
        return f"{self.value:,.3g} {unit} ({self.kind}: {self.source})"


@dataclass(frozen=True)
class Throughput:
    """Per model alone on the device: training tokens/s (padded, forward and backward), greedy prompts/s at the
    study's budgets, seconds of overhead per unit; and how much faster `parallel` units run together than in turn."""

    train_tokens_per_s: Figure
    prompts_per_s: Figure
    unit_overhead_s: Figure
    side_by_side: Figure

    def rows(self) -> list[tuple[str, str]]:
        return [("training", self.train_tokens_per_s.text("tokens/s per model")),
                ("generation", self.prompts_per_s.text("prompts/s per model")),
                ("overhead", self.unit_overhead_s.text("s per unit")),
                ("side by side", self.side_by_side.text("x"))]


@dataclass(frozen=True)
class UnitPlan:
    """One unit's work: a (mode, seed) model trained and generating, or the base model generating (mode None)."""

    name: str
    mode: str | None
    seed: int | None
    rows: int
    steps: int
    train_tokens: int
    prompts: int
    seconds: float
    done: bool

    def to_dict(self) -> dict:
        return {"unit": self.name, "mode": self.mode, "seed": self.seed, "rows": self.rows, "steps": self.steps,
                "train_tokens": self.train_tokens, "prompts": self.prompts, "seconds": round(self.seconds, 1),
                "done": self.done}


@dataclass(frozen=True)
class StudyPlan:
    """Every unit in the order the study runs them, the figures used, and the estimated wall time of what is left."""

    units: list[UnitPlan]
    throughput: Throughput
    parallel: int
    device: str
    notes: list[str]

    @property
    def wall_seconds(self) -> float:
        return sum(u.seconds for u in self.units if not u.done) / self.speedup

    @property
    def speedup(self) -> float:
        return max(1.0, min(float(self.parallel), self.throughput.side_by_side.value))

    def fitting(self, budget_s: float) -> list[str]:
        """The units not yet done that start within `budget_s`, in order (the study's budget rule)."""
        spent, out = 0.0, []
        for unit in self.units:
            if unit.done:
                continue
            spent += unit.seconds / self.speedup
            if spent > budget_s:
                break
            out.append(unit.name)
        return out

    def to_dict(self) -> dict:
        return {"units": [u.to_dict() for u in self.units], "parallel": self.parallel, "device": self.device,
                "speedup": self.speedup, "wall_seconds": round(self.wall_seconds, 1), "notes": self.notes,
                "throughput": {name: {"value": f.value, "kind": f.kind, "source": f.source}
                               for name, f in (("train_tokens_per_s", self.throughput.train_tokens_per_s),
                                               ("prompts_per_s", self.throughput.prompts_per_s),
                                               ("unit_overhead_s", self.throughput.unit_overhead_s),
                                               ("side_by_side", self.throughput.side_by_side))}}


# ---------------------------------------------------------------------------------------------------------------
# Throughput figures


def model_parameters(config) -> int:
    """Parameters of a decoder from its config (embeddings, attention with grouped keys and values, gated MLP)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    hidden = text.hidden_size
    embeddings = text.vocab_size * hidden * (1 if getattr(text, "tie_word_embeddings", False) else 2)
    attention = hidden * (heads * head_dim * 2 + kv_heads * head_dim * 2)
    return embeddings + text.num_hidden_layers * (attention + 3 * hidden * text.intermediate_size)


def stated_throughput(device: str, parameters: int) -> Throughput:
    """The figures a plan uses where this study folder has measured none: measured elsewhere where there is a
    measurement, assumed where there is none; scaled from SmolLM2-135M to `parameters`."""
    scale = REFERENCE_PARAMETERS / max(parameters, 1)
    scaled = "" if abs(scale - 1) < 0.05 else f"; scaled by {scale:,.3g} from 135 M to {parameters:,} parameters"
    row = f"the real release's {REAL_PADDED_ROW:,} tokens a row in random batches of 16, padding included"
    if device.startswith("cuda"):
        train = Figure(H200_ROWS_PER_STEP * REAL_PADDED_ROW / H200_STEP_SECONDS * scale, MEASURED_ELSEWHERE,
                       f"150 steps of 16 rows in 90-100 s per mode on one H200, bf16 (DESIGN.md, fine-tuning, "
                       f"2026-12-04), at {row}; an H100 has the same compute{scaled}")
        prompts = Figure(50.0 * scale, ASSUMED,
                         "the memory-batched greedy path's target on one H100 (bf16, <= 2,048 prompt tokens, 128 "
                         f"new); measured on an H200 in fixed batches of 64: {H200_PROMPTS_PER_S} prompts/s{scaled}")
        overhead = Figure(25.0, ASSUMED, "a process start, the base model's load, a model saved and loaded again "
                          "(measured on the H200: ~45 s with a checkpoint every 50 steps, which units no longer write)")
        side = Figure(2.0, ASSUMED, "models of 135 M parameters side by side on one GPU, each leaving most of it idle")
    else:
        train = Figure(H200_ROWS_PER_STEP * REAL_PADDED_ROW / CPU_STEP_SECONDS * scale, MEASURED_ELSEWHERE,
                       f"one optimizer step of 16 rows in {CPU_STEP_SECONDS} s on a 2-core CPU (DESIGN.md, "
                       f"fine-tuning, 2026-12-04), at {row}{scaled}")
        prompts = Figure(1 / 3.5 * scale, MEASURED_ELSEWHERE,
                         f"SmolLM2 about 3.5 s a prompt on a 2-core CPU (DESIGN.md, round 2 main job){scaled}")
        overhead = Figure(30.0, ASSUMED, "loading the base model (a GGUF file: ~15 s here) and saving a model")
        side = Figure(1.0, ASSUMED, "units in turn: a CPU's cores are busy with one")
    return Throughput(train, prompts, overhead, side)


def measured_throughput(records: list[dict], device: str) -> Throughput | None:
    """The figures of the units this study folder finished on `device` (None where it finished none there)."""
    trained = [r for r in records if r and r.get("device") == device and r.get("train_tokens") is not None
               and r.get("mode") is not None and r.get("train_seconds")]
    generated = [r for r in records if r and r.get("device") == device and r.get("prompts")
                 and r.get("generate_seconds")]
    if not trained or not generated:
        return None
    parallel = max(int(r.get("parallel") or 1) for r in trained + generated)
    where = f"{len(trained)} unit(s) of this study folder, {parallel} side by side"
    overheads = [r["unit_seconds"] - (r.get("train_seconds") or 0) - r["generate_seconds"] for r in generated]
    return Throughput(
        Figure(sum(r["train_tokens"] for r in trained) / sum(r["train_seconds"] for r in trained), MEASURED_HERE,
               where),
        Figure(sum(r["prompts"] for r in generated) / sum(r["generate_seconds"] for r in generated), MEASURED_HERE,
               f"{len(generated)} unit(s) of this study folder, {parallel} side by side"),
        Figure(max(0.0, sum(overheads) / len(overheads)), MEASURED_HERE, where),
        Figure(float(parallel), MEASURED_HERE, f"the figures above were measured with {parallel} side by side"))


def with_given(throughput: Throughput, given: dict[str, float]) -> Throughput:
    """`throughput` with the figures given on the command line (`--throughput NAME=VALUE`)."""
    known = {"train_tokens_per_s", "prompts_per_s", "unit_overhead_s", "side_by_side"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise StudyError(f"--throughput: unknown figure {unknown[0]!r} (expected one of {', '.join(sorted(known))})")
    return replace(throughput, **{k: Figure(v, "given", "--throughput on the command line") for k, v in given.items()})


# ---------------------------------------------------------------------------------------------------------------
# The plan


def build_plan(settings: StudySettings, rows, test_counts: dict[str, int], throughput: Throughput, device: str,
               done: set[str]) -> StudyPlan:
    """Every unit of `settings` in run order with its work and estimated seconds; `rows`: the CommonRows (with
    each mode's per-row tokens), `test_counts`: test examples per task, `done`: names of finished units."""
    from themisto.study.scores import BASE_SYSTEM, eval_contexts
    from themisto.study.units import work_order

    examples = sum(min(n, settings.test_limit or n) for n in test_counts.values())
    notes = []
    if not rows.lengths:
        notes.append("rows.json holds no per-row tokens (written before plans): training tokens are mean tokens "
                     "x rows, unpadded")
    units = []
    for unit in work_order(settings):
        if unit is None:
            prompts = examples * len(settings.contexts)
            seconds = prompts / throughput.prompts_per_s.value + throughput.unit_overhead_s.value
            units.append(UnitPlan(BASE_SYSTEM, None, None, 0, 0, 0, prompts, seconds, BASE_SYSTEM in done))
            continue
        steps = optimizer_steps(len(rows.keys), settings)
        lengths = rows.lengths.get(unit.mode) or [int(rows.tokens[unit.mode]["total_mean"])] * len(rows.keys)
        tokens = unit_tokens(lengths, settings, steps)
        prompts = examples * len(eval_contexts(unit.mode))
        seconds = (tokens / throughput.train_tokens_per_s.value + prompts / throughput.prompts_per_s.value
                   + throughput.unit_overhead_s.value)
        units.append(UnitPlan(unit.name, unit.mode, unit.seed, len(rows.keys), steps, tokens, prompts, seconds,
                              unit.name in done))
    return StudyPlan(units, throughput, settings.parallel, device, notes)


def render_plan(plan: StudyPlan, settings: StudySettings, budget_s: float | None) -> str:
    """The plan as text: a table of units, the estimated wall time, what a budget admits, and each figure's source."""
    modes = len(settings.contexts)
    seeds = f"{settings.seeds} seed{'' if settings.seeds == 1 else 's'}"
    lines = [f"Plan of the study: {modes} modes x {seeds} and the base model "
             f"({', '.join(settings.contexts)}), on {plan.device}, {plan.parallel} side by side; in run order "
             "(seed 0 of every mode first, then the base model, then seed 1, ...)", "",
             f"| unit | rows | steps | training tokens | prompts | est. s | done |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for u in plan.units:
        lines.append(f"| {u.name} | {u.rows:,} | {u.steps:,} | {u.train_tokens:,} | {u.prompts:,} | "
                     f"{u.seconds:,.0f} | {'yes' if u.done else ''} |")
    left = [u for u in plan.units if not u.done]
    total = sum(u.seconds for u in left)
    lines += ["", f"Estimated time of what is left (training and generation, the generate-only part; scoring is not "
              f"counted): {plan.wall_seconds:,.0f} s ({plan.wall_seconds / 60:.1f} min) = {total:,.0f} s of units / "
              f"{plan.speedup:g} side by side; {len(left)} of {len(plan.units)} units left."]
    if budget_s is not None:
        fit = plan.fitting(budget_s)
        lines.append(f"Within --budget-s {budget_s:,.0f}: {len(fit)} unit(s) start ({', '.join(fit) or 'none'}); "
                     "the rest wait for a later run.")
    lines += ["", "Throughput figures (per model; a unit's seconds = training tokens / training + prompts / "
              "generation + overhead):"]
    lines += [f"- {name}: {text}" for name, text in plan.throughput.rows()]
    lines += [f"- note: {note}" for note in plan.notes]
    return "\n".join(lines) + "\n"


def require_splits(info, settings: StudySettings) -> None:
    """A ReleaseError unless every task of the study has its train and test splits in the release."""
    for task in settings.tasks:
        info.require(task, "train")
        info.require(task, "test")


def plan_for(settings: StudySettings, rows, info, out: Path | None, given: dict[str, float] | None = None) -> StudyPlan:
    """The plan of `settings` on this machine's device: figures measured in `out` where it has finished units on
    that device, else the stated ones; `given` figures on top."""
    from themisto.study.scores import BASE_SYSTEM
    from themisto.study.units import unit_record, unit_records, work_order

    device = _device(settings.device)
    records = unit_records(out) if out is not None and out.is_dir() else []
    throughput = measured_throughput(records, device) or \
        stated_throughput(device, _parameters(settings.model))
    throughput = with_given(throughput, given or {})
    done = set()
    if out is not None and out.is_dir():
        done = {unit.name if unit else BASE_SYSTEM for unit in work_order(settings) if unit_record(out, unit)}
    counts = {task: len(info.ids(task, "test")) for task in settings.tasks}
    return build_plan(settings, rows, counts, throughput, device, done)


def _device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _parameters(model: str) -> int:
    """The base model's parameters, from its config (a GGUF file's metadata; no weights are loaded)."""
    from transformers import AutoConfig

    from themisto.generation.backends.hf import split_model_path

    source, gguf_file = split_model_path(model, None)
    try:
        config = AutoConfig.from_pretrained(source, gguf_file=gguf_file)
    except (OSError, ValueError) as exc:
        raise StudyError(f"base model {model!r}: cannot read its config ({exc})") from exc
    return model_parameters(config)


def plan_study(settings: StudySettings, info, out: Path | None, given: dict[str, float] | None = None) -> StudyPlan:
    """The plan of a study of the release `info` (its handle) before it runs (nothing is written): the train rows
    as `out`/rows.json holds them, or chosen now as the study would choose them."""
    import json

    from themisto.generation.backends.hf import prompt_token_counter
    from themisto.study.rows import CommonRows, common_rows, load_tokenizer
    from themisto.study.units import ROWS_FILE

    require_splits(info, settings)
    path = out / ROWS_FILE if out is not None else None
    if path is not None and path.is_file():
        rows = CommonRows.from_dict(json.loads(path.read_text(encoding="utf-8")))
    else:
        tokenizer = load_tokenizer(settings.model)
        rows = common_rows(info, settings, tokenizer, prompt_token_counter(tokenizer))
    return plan_for(settings, rows, info, out, given)
