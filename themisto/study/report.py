"""A study's results: each (trained with, evaluated with) cell with its seed-aware interval, the paired effects, the
table in Markdown (results.md, also the README's and the card's), and a plot of the effects (effects.png).

The effects, each on the same test examples:
- `runtime`: trained and evaluated with the mode − trained and evaluated with `none` (does runtime context help?);
- `reliance`: trained with the mode, evaluated with it − evaluated without it (does the model depend on it?);
- `transfer`: trained with the mode, evaluated without it − the `none` model (did training with it help anyway?);
- `untrained`: the base model with the mode − without it;
- `fine-tuning`: the `none` model − the base model, both without context.
"""

from __future__ import annotations

import platform
from pathlib import Path

from themisto.resume import write_json_atomic, write_text_atomic
from themisto.study.effects import seeded_interval, seeded_paired
from themisto.study.rows import CommonRows
from themisto.study.scores import TaskScores, system_name
from themisto.study.settings import PATH_CHECK_NOTE, StudySettings, is_path_check

RESULTS_JSON, RESULTS_MD, EFFECTS_PNG = "results.json", "results.md", "effects.png"
HEADLINE = {"next_cell": ("functional_match", "chrf"), "output_prediction": ("output_equivalent",)}


def headline(task: str, metrics: tuple[str, ...]) -> str:
    return next(m for m in HEADLINE[task] if m in metrics)


def _effects(modes: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    """(kind, mode, treated system, control system) of every paired effect a study reports."""
    out = [("fine-tuning", "none", system_name("trained", "none", "none"), system_name("base", None, "none"))]
    for mode in modes:
        own, none_eval = system_name("trained", mode, mode), system_name("trained", mode, "none")
        out += [("runtime", mode, own, system_name("trained", "none", "none")),
                ("reliance", mode, own, none_eval),
                ("transfer", mode, none_eval, system_name("trained", "none", "none")),
                ("untrained", mode, system_name("base", None, mode), system_name("base", None, "none"))]
    return out


def analyse(scores: TaskScores, settings: StudySettings) -> dict:
    """One task's cells and effects on every metric, from one resampling plan."""
    from themisto.scoring.intervals import IntervalSettings, plan_resamples

    plan = plan_resamples(scores.clusters, scores.order,
                          IntervalSettings(cluster=settings.cluster, resamples=settings.resamples))
    cells = []
    for system, by_metric in scores.values.items():
        kind = system.split(":")[0].split("@")[0]
        for metric, values in by_metric.items():
            cells.append({"system": system, "kind": kind, "metric": metric,
                          **seeded_interval(values, plan).to_dict()})
    effects = []
    for kind, mode, treated, control in _effects(settings.runtime_modes):
        if treated not in scores.values or control not in scores.values:
            continue
        for metric in scores.metrics:
            interval = seeded_paired(scores.values[treated][metric], scores.values[control][metric], plan)
            effects.append({"effect": kind, "mode": mode, "treated": treated, "control": control, "metric": metric,
                            **interval.to_dict()})
    return {"examples": len(scores.ids), "executed": sum(scores.executed), "metrics": list(scores.metrics),
            "headline": headline(scores.task, scores.metrics), "interval": plan.describe(), "cells": cells,
            "effects": effects, "notes": scores.notes}


def _hardware(records: list[dict]) -> dict:
    devices = sorted({r["device"] for r in records if r})
    info = {"device": ", ".join(devices), "precision": ", ".join(sorted({r["precision"] for r in records if r}))}
    try:
        import torch

        if "cuda" in devices and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover - torch is in the requirements
        pass
    info["cpu"] = _cpu_model()
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _fmt(cell: dict, signed: bool = False) -> str:
    """`mean [low, high] ±seed sd` of a cell or effect as results.json holds it."""
    if cell["mean"] is None:
        return "—"
    f = "{:+.3f}" if signed else "{:.3f}"
    text = f.format(cell["mean"])
    if cell["low"] is not None:
        text += f" [{f.format(cell['low'])}, {f.format(cell['high'])}]"
    if cell.get("seed_sd") is not None:
        text += f" ±{cell['seed_sd']:.3f}"
    return text


def _label(system: str) -> str:
    if system.startswith("trained:"):
        trained, evaluated = system.removeprefix("trained:").split("@")
        return f"fine-tuned with `{trained}`, evaluated with `{evaluated}`"
    if system.startswith("base@"):
        return f"base model, `{system.removeprefix('base@')}`"
    return f"baseline {system.removeprefix('baseline:')}"


def render_markdown(results: dict) -> str:
    """The study's tables: settings, rows per mode, each task's cells on its headline metrics, and the effects."""
    s = results["settings"]
    lines = ["# Fine-tuning study", ""]
    if results.get("path_check"):
        lines += [f"**{results['path_check']}.**", ""]
    hw = results["hardware"]
    seeds = results.get("seeds") or {mode: s["seeds"] for mode in s["contexts"]}
    per_mode = ", ".join(f"`{mode}` {n}" for mode, n in seeds.items())
    if results.get("units_left"):
        lines += [f"**A partial study: {len(results['units_left'])} of its units are not run yet "
                  f"({', '.join(results['units_left'])}); each cell gives its seeds.**", ""]
    lines += [f"Base model `{Path(s['model']).name}`, fine-tuned ({s['method']}, lr {s['learning_rate']}, batch "
              f"{s['batch_size'] * s['grad_accum']}, {results['steps']} steps) on the same {results['rows']['rows']} "
              f"train rows in each mode; seeds per mode: {per_mode}; greedy generation, prompts within "
              f"{s['max_prompt_tokens']} tokens of the base model's tokenizer, {s['max_new_tokens']} new tokens. "
              f"Hardware: {hw.get('gpu') or hw['cpu']} ({hw['device']}, {hw['precision']}).", "",
              "| mode | rows | prompt tokens (mean) | completion tokens (mean) |", "| --- | ---: | ---: | ---: |"]
    for mode, t in results["rows"]["tokens"].items():
        lines.append(f"| `{mode}` | {results['rows']['rows']} | {t['prompt_mean']:.0f} | {t['completion_mean']:.0f} |")
    lines += ["", "Each cell: mean over seeds of the mean over examples [95 % interval over clusters and seeds] "
              "±the standard deviation between seeds.", ""]
    for task, r in results["tasks"].items():
        shown = [m for m in (r["headline"], "chrf", "rouge_l") if m in r["metrics"]]
        shown = list(dict.fromkeys(shown))
        executed = f", {r['executed']} executed" if r["executed"] else ""
        lines += [f"## {task} ({r['examples']} test examples{executed})", "",
                  "| system | seeds | " + " | ".join(shown) + " |", "| --- | ---: |" + " ---: |" * len(shown)]
        by = {(c["system"], c["metric"]): c for c in r["cells"]}
        for system in dict.fromkeys(c["system"] for c in r["cells"]):
            cells = [by[(system, m)] for m in shown if (system, m) in by]
            lines.append(f"| {_label(system)} | {cells[0]['seeds'] if cells else '—'} | "
                         + " | ".join(_fmt(by[(system, m)]) if (system, m) in by else "—" for m in shown) + " |")
        lines += ["", f"Paired effects on {r['headline']} (same examples):", "",
                  "| effect | mode | difference | n |", "| --- | --- | ---: | ---: |"]
        for e in r["effects"]:
            if e["metric"] == r["headline"]:
                lines.append(f"| {e['effect']} | `{e['mode']}` | {_fmt(e, signed=True)} | {e['n']} |")
        plan = r["interval"]
        lines += ["", f"Intervals: {plan['method']} over {plan['clusters']} {plan['unit']}(s), {plan['resamples']} "
                  "resamples, seeds drawn with replacement in each." + (f" {plan['warning']}." if plan["warning"]
                                                                         else ""), ""]
    return "\n".join(lines).rstrip() + "\n"


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results["tasks"].items())
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 3.5), squeeze=False)
    for ax, (task, r) in zip(axes[0], tasks):
        effects = [e for e in r["effects"] if e["metric"] == r["headline"] and e["mean"] is not None]
        labels = [f"{e['effect']} {e['mode']}" for e in effects]
        for y, e in enumerate(effects):
            low = e["low"] if e["low"] is not None else e["mean"]
            high = e["high"] if e["high"] is not None else e["mean"]
            ax.errorbar(e["mean"], y, xerr=[[e["mean"] - low], [high - e["mean"]]], fmt="o", capsize=3,
                        color="#4c72b0" if e["effect"] == "runtime" else "#888888")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(effects)), labels)
        ax.set_title(f"{task}: {r['headline']} (difference, 95 % interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out: Path, settings: StudySettings, rows: CommonRows, records: list[dict],
                 scores: list[TaskScores], *, seconds: float, left: list[str] = ()) -> dict:
    """results.json, results.md and effects.png of the finished units `records` (`left`: units not yet run)."""
    steps = sorted({r["steps"] for r in records if r})
    seeds = {mode: sum(1 for r in records if r and r["mode"] == mode) for mode in settings.contexts}
    results = {
        "format": 1, "settings": settings.to_dict(),
        "path_check": PATH_CHECK_NOTE.format(steps=settings.max_steps if settings.max_steps > 0 else "all",
                                             rows=len(rows.keys), tests=settings.test_limit)
        if is_path_check(settings) else None,
        "hardware": _hardware(records), "steps": steps[0] if len(steps) == 1 else steps,
        "rows": {"rows": len(rows.keys), "tokens": rows.tokens, "census": rows.census},
        "units": records, "seeds": seeds, "units_left": list(left),
        "tasks": {s.task: analyse(s, settings) for s in scores},
        "seconds": round(seconds, 1),
    }
    write_json_atomic(out / RESULTS_JSON, results)
    write_text_atomic(out / RESULTS_MD, render_markdown(results))
    _plot(results, out / EFFECTS_PNG)
    return results
