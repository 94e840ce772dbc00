"""The Markdown table of a run's results.json: per metric, each context and baseline with its 95 % interval, the hard
subset beside all examples; the paired runtime effect (context − none on the same examples, and against each other
control a mode declares, such as delta − variables) over all examples and over those both modes generated, with each
mode's unanswered examples; what the prompts kept and their mean tokens. And its short summary for a terminal: the
headline metric, model against the best baseline with each mode's mean prompt tokens, the paired effects, where the
tables are.

>>> print(cell({"mean": 0.25, "low": 0.1, "high": 0.4, "n": 8}), cell({"diff": 0.05, "low": -0.02, "high": 0.1},
...       signed=True), cell({"mean": None}))
0.250 [0.100, 0.400] +0.050 [-0.020, +0.100] –
"""

from __future__ import annotations

from pathlib import PurePath

from themisto.vocabulary import BASELINE_CONTEXT, POSITIONS, PROBE_BASE_CONTEXT, SUBSETS


def cell(entry: dict | None, *, signed: bool = False) -> str:
    """`mean [low, high]` (a paired entry: `diff [low, high]`) with three decimals, `–` where there is no value."""
    value = None if not entry else entry.get("diff", entry.get("mean"))
    if value is None:
        return "–"
    form = "{:+.3f}" if signed else "{:.3f}"
    return f"{form.format(value)} [{form.format(entry['low'])}, {form.format(entry['high'])}]"


def _index(entries: list[dict], *keys: str) -> dict[tuple, dict]:
    return {tuple(e[k] for k in keys): e for e in entries}


def units(n: int, unit: str = "trajectory") -> str:
    """`n` clusters of a unit, in words: `1 trajectory`, `12 trajectories`, `6 participants`."""
    return f"{n} {unit}" if n == 1 else f"{n} {'trajectories' if unit == 'trajectory' else unit + 's'}"


def _interval_line(interval: dict) -> str:
    method = interval["method"].replace("_", " ")
    clusters = units(interval["clusters"], interval.get("unit", "trajectory"))
    shape = (f"{clusters} resampled whole" if interval["method"] == "cluster_bootstrap"
             else f"{clusters}, {interval['blocks']} blocks of {interval['block_length']} consecutive steps")
    line = (f"Intervals: {round(interval['confidence'] * 100)} % percentile {method} ({shape}; "
            f"{interval['resamples']} resamples, seed {interval['seed']}).")
    return line + (f" **Warning:** {interval['warning']}." if interval.get("warning") else "")


def _model_name(model: object) -> str:
    """A model file is named by its file name (the folder is the machine's); a Hub id or a name stays whole."""
    text = str(model)
    return PurePath(text).name if text.endswith(".gguf") or PurePath(text).is_absolute() else text


def _header(results: dict) -> list[str]:
    run, counts, hard = results["run"], results["counts"], results["hard_subset"]
    sampling = run.get("sampling") or {}
    skipped = sum(counts["skipped"].values()) + sum(counts["failed"].values())
    limited = f" (--limit {run['limit']})" if run.get("limit") else ""
    return [
        f"### {run['task']} · {_model_name(run.get('model'))} ({run.get('backend')})", "",
        f"{counts['examples']} examples{limited}, {sampling.get('n', 1)} sample(s) each at temperature "
        f"{sampling.get('temperature', '?')}; contexts: {', '.join(run['contexts'])}; release "
        f"{results['release_hash'][:12]}; {'with' if results['executed'] else 'without'} execution"
        + (f"; {skipped} generation(s) skipped or failed, scored 0" if skipped else "") + ".",
        f"Hard subset: {hard['examples']} examples where {hard['rule']}.",
        _interval_line(results["interval"]), ""]


def _main_table(results: dict) -> list[str]:
    run = results["run"]
    scores = _index(results["scores"], "context", "metric", "subset")
    baselines = _index(results["baselines"], "baseline", "metric", "subset")
    names = list(dict.fromkeys(b["baseline"] for b in results["baselines"]))
    n_all = results["counts"]["examples"]
    lines = [f"| metric | system | all (n={n_all}) | hard (n={results['hard_subset']['examples']}) |",
             "| --- | --- | --- | --- |"]
    for metric in results["metrics"]:
        for context in run["contexts"]:
            lines.append(f"| {metric} | model · {context} | {cell(scores.get((context, metric, 'all')))} | "
                         f"{cell(scores.get((context, metric, 'hard')))} |")
        for name in names:
            lines.append(f"| {metric} | baseline · {name} | {cell(baselines.get((name, metric, 'all')))} | "
                         f"{cell(baselines.get((name, metric, 'hard')))} |")
    return lines


def paired_examples(entry: dict) -> str:
    """Which examples a paired entry compares; results written before the both-generated figure mean all of them."""
    return entry.get("examples", "all")


def _with_n(entry: dict | None) -> str:
    return "–" if not entry or entry.get("diff") is None else f"{cell(entry, signed=True)} (n={entry['n']})"


def _paired_table(results: dict) -> list[str]:
    """One table per control: context − none first, then each other control a mode declares (delta − variables)."""
    lines = []
    for versus in sorted(dict.fromkeys(e["versus"] for e in results["paired"]), key=lambda v: v != BASELINE_CONTEXT):
        lines += _paired_block([e for e in results["paired"] if e["versus"] == versus], versus)
    return lines


def _paired_block(entries: list[dict], versus: str) -> list[str]:
    index = {(e["context"], e["metric"], e["subset"], paired_examples(e)): e for e in entries}
    title = (f"Runtime effect, context − {BASELINE_CONTEXT} on the same examples" if versus == BASELINE_CONTEXT else
             f"Paired effect, context − {versus} on the same examples (the modes that name {versus} as a control)")
    lines = ["", f"{title}: over every example (a skipped or failed generation scored 0), and over the examples "
             "where both modes generated (like with like):", "",
             "| metric | context | Δ all examples, skips as 0 | Δ both generated | Δ hard, both generated "
             f"| not generated: context / {versus} |", "| --- | --- | --- | --- | --- | --- |"]
    for context, metric in dict.fromkeys((e["context"], e["metric"]) for e in entries):
        both = index.get((context, metric, "all", "both_generated"))
        missing = (both or {}).get("unanswered") or {}
        lines.append(f"| {metric} | {context} | {_with_n(index.get((context, metric, 'all', 'all')))} | "
                     f"{_with_n(both)} | {_with_n(index.get((context, metric, 'hard', 'both_generated')))} | "
                     f"{missing.get(context, '–')} / {missing.get(versus, '–')} |")
    return lines


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _kept_table(results: dict) -> list[str]:
    kept = [k for k in results.get("kept") or [] if k.get("recorded")]
    if not kept:
        return []
    lines = ["", "What the prompts kept of their rows' history cells and variables (mean shares over the prompts "
             "sent), and their mean tokens as the backend counted them (– where it counts none):", "",
             "| context | prompts | skipped | history cells shown | variables shown | reprs cut per prompt "
             "| prompt tokens (mean) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for k in kept:
        cut = "–" if k["reprs_cut"] is None else f"{k['reprs_cut']:.1f}"
        lines.append(f"| {k['context']} | {k['prompts']} | {k['skipped']} | {_percent(k['history_shown'])} | "
                     f"{_percent(k['variables_shown'])} | {cut} | {_tokens(k.get('prompt_tokens'))} |")
    return lines


def _tokens(mean: float | None) -> str:
    return "–" if mean is None else f"{mean:,.0f}"


def _group_table(entries: list[dict], key: str, title: str) -> list[str]:
    """Each group's scores beside each other (`key`: each split of a run over every split, each source of a release
    of several), the model's contexts and the baselines."""
    if not entries:
        return []
    groups = sorted({e[key] for e in entries})
    counts = {v: max(e["n"] for e in entries if e[key] == v) for v in groups}
    system = lambda e: f"model · {e['context']}" if "context" in e else f"baseline · {e['baseline']}"  # noqa: E731
    index = {(system(e), e["metric"], e[key]): e for e in entries}
    lines = ["", title, "", "| metric | system | " + " | ".join(f"{v} (n={counts[v]})" for v in groups) + " |",
             "| --- | --- |" + " --- |" * len(groups)]
    for name, metric in dict.fromkeys((system(e), e["metric"]) for e in entries):
        lines.append(f"| {metric} | {name} | " + " | ".join(cell(index.get((name, metric, v))) for v in groups) + " |")
    return lines


def _breakdown(entries: list[dict], key: str, values: list[str], title: str) -> list[str]:
    if not entries:
        return []
    counts = {v: next((e["n"] for e in entries if e[key] == v), 0) for v in values}
    index = _index(entries, "context", "metric", key)
    lines = ["", title, "", "| metric | context | " + " | ".join(f"{v} (n={counts[v]})" for v in values) + " |",
             "| --- | --- |" + " --- |" * len(values)]
    for context, metric in dict.fromkeys((e["context"], e["metric"]) for e in entries):
        lines.append(f"| {metric} | {context} | " + " | ".join(cell(index.get((context, metric, v))) for v in values)
                     + " |")
    return lines


def _probing(results: dict) -> list[str]:
    """The probe mode's section: probes used and why its conversations stopped, its paired effects against both the
    modes it builds on, and each metric by the number of probes a generation used."""
    lines = []
    paired = _index([e for e in results["paired"] if paired_examples(e) == "all"], "context", "metric", "subset",
                    "versus")
    for entry in results.get("probing") or []:
        context, settings = entry["context"], entry.get("settings") or {}
        used = entry["used"]
        spread = ", ".join(f"{k}: {n}" for k, n in used["distribution"].items())
        statuses = ", ".join(f"{k} {n}" for k, n in entry["probe_statuses"].items()) or "none run"
        stops = ", ".join(f"{k} {n}" for k, n in entry["stops"].items())
        lines += ["", f"Probe mode `{context}` (up to {settings.get('max_probes', '?')} probes per answer, "
                      f"{settings.get('protocol', '?')} protocol): probes used per generation, mean "
                      f"{used['mean'] if used['mean'] is not None else '–'} (by count: {spread}); conversations "
                      f"stopped: {stops}; probes: {statuses}; {entry['changed_state']} changed their own branch's "
                      "state (never the kernel's).", "",
                  f"| metric | {context} − none, all | {context} − none, hard | {context} − variables, all | "
                  f"{context} − variables, hard |", "| --- | --- | --- | --- | --- |"]
        for metric in results["metrics"]:
            effects = [cell(paired.get((context, metric, subset, versus)), signed=True)
                       for versus in (BASELINE_CONTEXT, PROBE_BASE_CONTEXT) for subset in SUBSETS]
            lines.append(f"| {metric} | " + " | ".join(effects) + " |")
        counts = sorted({e["probes"] for e in entry["by_probes"]})
        index = _index(entry["by_probes"], "metric", "probes")
        sizes = {k: max(e["n"] for e in entry["by_probes"] if e["probes"] == k) for k in counts}
        lines += ["", f"By probes used ({context}; examples whose generations used that many):", "",
                  "| metric | " + " | ".join(f"{k} probe{'s' if k != 1 else ''} (n={sizes[k]})" for k in counts)
                  + " |", "| --- |" + " --- |" * len(counts)]
        for metric in results["metrics"]:
            lines.append(f"| {metric} | " + " | ".join(cell(index.get((metric, k))) for k in counts) + " |")
    return lines


# The metric a task's summary leads with, the first of these a run has: for next_cell with execution the
# continuation match (the scorer's headline, metrics/themisto/README.md says why: text scores barely separate a
# model from repeating the previous cell), without it chrF; for output_prediction output equivalence.
HEADLINE_METRICS: dict[str, tuple[str, ...]] = {"next_cell": ("continuation_match", "functional_match", "chrf"),
                                                "output_prediction": ("output_equivalent", "chrf")}


def headline_metric(results: dict) -> str:
    """The metric a run's summary leads with (HEADLINE_METRICS), else the run's first metric."""
    wanted = HEADLINE_METRICS.get(results["run"]["task"], ())
    return next((m for m in wanted if m in results["metrics"]), results["metrics"][0])


def render_summary(results: dict, tables: str | PurePath = "results.md") -> str:
    """A run's results in a few lines: each context (with its mean prompt tokens, where the backend counted them) and
    the best baseline on the headline metric over all examples with its interval, each context's paired effects
    (against `none`, then against each other control its mode declares), and where the full tables (`tables`) are."""
    run, counts, interval = results["run"], results["counts"], results["interval"]
    metric = headline_metric(results)
    scores = _index(results["scores"], "context", "metric", "subset")
    baselines = [b for b in results["baselines"] if b["metric"] == metric and b["subset"] == "all"
                 and b.get("mean") is not None]
    best = max(baselines, key=lambda b: b["mean"], default=None)
    skipped = sum(counts["skipped"].values()) + sum(counts["failed"].values())
    method = interval["method"].replace("_", " ")
    lines = [f"{run['task']} · {_model_name(run.get('model'))} ({run.get('backend')}): {counts['examples']} examples, "
             f"{'with' if results['executed'] else 'without'} execution"
             + (f", {skipped} generation(s) skipped or failed (scored 0)" if skipped else "") + ".",
             f"  {metric} over all examples, 95 % {method} over "
             f"{units(interval['clusters'], interval.get('unit', 'trajectory'))}"
             + (" (read its warning in the tables)" if interval.get("warning") else "") + ":"]
    tokens = {k["context"]: k.get("prompt_tokens") for k in results.get("kept") or []}
    rows = [(f"model · {c}", cell(scores.get((c, metric, "all")))
             + (f"  mean prompt {tokens[c]:,.0f} tokens" if tokens.get(c) is not None else ""))
            for c in run["contexts"]]
    if best is not None:
        rows.append((f"best baseline · {best['baseline']}", cell(best)))
    width = max(len(name) for name, _ in rows)
    lines += [f"    {name.ljust(width)}  {value}" for name, value in rows]
    paired = [e for e in results["paired"] if e["metric"] == metric and e["subset"] == "all"
              and paired_examples(e) == "all"]
    for context in run["contexts"]:  # in the run's order, each against none first
        own = sorted((e for e in paired if e["context"] == context), key=lambda e: e["versus"] != BASELINE_CONTEXT)
        for entry in own:
            lines.append(f"    runtime effect {context} − {entry['versus']}: {_with_n(entry)}")
    execution = counts.get("execution") or {}
    if results["executed"] and execution:
        unexecuted = {k: n for k, n in (counts.get("text_only") or {}).items() if n}
        lines.append("  execution: " + ", ".join(f"{status} {n}" for status, n in sorted(execution.items()))
                     + (" (text only: " + ", ".join(f"{k} {n}" for k, n in unexecuted.items()) + ")"
                        if unexecuted else "")
                     + f"; state mismatches {counts.get('state_mismatches', 0)}")
    lines.append(f"  full tables: {tables}")
    return "\n".join(lines) + "\n"


def _execution_counts(results: dict) -> list[str]:
    """How the examples of an executing run fared, per source, and why some were scored by text only."""
    by_source = results["counts"].get("execution_by_source") or {}
    if not results["executed"] or not by_source:
        return []
    statuses = sorted({s for counts in by_source.values() for s in counts})
    lines = ["", "Execution, per source (examples by status; `scored` count in the functional scores):", "",
             "| source | " + " | ".join(statuses) + " |", "| --- |" + " --- |" * len(statuses)]
    for source, counts in sorted(by_source.items()):
        lines.append(f"| {source} | " + " | ".join(str(counts.get(s, 0)) for s in statuses) + " |")
    unexecuted = {k: n for k, n in (results["counts"].get("text_only") or {}).items() if n}
    if unexecuted:
        lines += ["", "Scored by text only for want of their trajectory's files or environment: "
                  + ", ".join(f"{reason} {n}" for reason, n in unexecuted.items()) + "."]
    return lines


def render_markdown(results: dict) -> str:
    """The whole Markdown report of one run's results."""
    lines = _header(results) + _main_table(results) + _paired_table(results) + _kept_table(results)
    breakdown = results["breakdown"]
    lines += _breakdown(breakdown["position"], "position", list(POSITIONS),
                        "By the target's position in its trajectory (all examples):")
    kinds = sorted({e["output_type"] for e in breakdown["output_type"]})
    lines += _breakdown(breakdown["output_type"], "output_type", kinds, "By output type (all examples):")
    lines += _group_table(breakdown.get("split") or [], "split",
                          "By split (the run covers every split; only `test` is the benchmark):")
    lines += _group_table(breakdown.get("source") or [], "source",
                          "By source (the trajectories' source; intervals from the same resamples):")
    lines += _execution_counts(results)
    lines += _probing(results)
    if results.get("notes"):
        lines += [""] + [f"- note: {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"
