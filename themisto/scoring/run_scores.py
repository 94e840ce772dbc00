"""Score a run folder: every context mode of a model run beside the model-free baselines, with intervals that respect
trajectories, the paired runtime effect, the hard subset and breakdowns; writes RUN/results.json and RUN/results.md.

All predictions of a run (every context and sample) and the baselines' predictions go to the scorer together, each
distinct text once per example, so execution replays each trajectory once. An example is in the **hard subset** when
no model-free baseline gets it right: for next_cell an exact match (whitespace-normalised), or where executed a
functional match; for output_prediction an equivalent output (`themisto.scoring.equivalence`, which includes exact
match). A skipped or failed generation scores 0 on every metric, so all contexts keep the same examples; the paired
runtime effect (context − none) is given twice: over all examples (skips as 0), and over the examples where both
modes generated every sample (like with like), each mode's unanswered examples beside it; a mode that declares
other controls (`ContextModeSpec.compared_with`: `probe` and `delta` against `variables`) gets those effects too.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Callable

from themisto.generation.run_folder import Generation, RunFolder, RunFolderError, find_release, read_run
from themisto.modes import context_mode
from themisto.resume import hold_folder, write_text_atomic
from themisto.release.workspaces import SourceFolders
from themisto.scoring.intervals import IntervalSettings, mean_interval, paired_interval, plan_resamples
from themisto.scoring.probe_scores import probe_summary
from themisto.scoring.records import ScoreSettings
from themisto.vocabulary import BASELINE_CONTEXT, GENERATION_STATUSES, POSITIONS, TEXT_ONLY_REASONS

TEXT_METRICS: tuple[str, ...] = ("exact_match", "rouge_l", "chrf")
# continuation_match first: the headline (metrics/themisto/README.md says why).
EXECUTION_METRICS: tuple[str, ...] = ("continuation_match", "functional_match", "exec_ok", "output_match",
                                      "state_match")
RESULTS_FORMAT = 1
RESULTS_JSON, RESULTS_MD = "results.json", "results.md"
# The scorer's own per-prediction records of a run (beside them: SCORER_RECORDS.partial.jsonl while it runs, then
# SCORER_RECORDS.verdicts.jsonl, which a rerun with the same settings and predictions reuses instead of executing).
SCORER_RECORDS = "scorer_records.json"
HARD_RULES = {
    "next_cell": "no baseline's prediction is an exact match (whitespace-normalised)",
    "next_cell+executed": "no baseline's prediction is an exact match or, where executed, a functional match",
    "output_prediction": "no baseline's prediction is an equivalent output (exact, numbers, table, error or image "
                         "rule)",
}


def metrics_for(task: str, executed: bool) -> tuple[str, ...]:
    """The metrics a run's table shows, the headline first: functional match where next_cell was executed."""
    if task == "next_cell":
        return (EXECUTION_METRICS if executed else ()) + TEXT_METRICS
    return TEXT_METRICS + ("output_equivalent",)


def position_of(step: int, length: int) -> str:
    """Which third of its trajectory (by step, of `length` steps) a target lies in."""
    return POSITIONS[min(2, max(0, 3 * step // max(1, length)))]


def output_type(row: dict) -> str:
    """A closed set of kinds for an output_prediction target: error, display (plots/images), stream, result, mixed,
    none."""
    types = set(row.get("output_types") or [])
    if row.get("status") == "error" or "error" in types:
        return "error"
    if "display_data" in types:
        return "display"
    if types == {"stream"}:
        return "stream"
    if types == {"execute_result"}:
        return "result"
    return "mixed" if types else "none"


def _candidates(run: RunFolder, baselines: dict[str, list[str]]) -> list[list[str]]:
    """Per example, each distinct text to score once: the model's ok generations, then the baselines'."""
    out = []
    for i, example_id in enumerate(run.ids):
        texts = [g.prediction for c in run.contexts for g in run.samples_of(example_id, c) if g.status == "ok"]
        texts += [predictions[i] for predictions in baselines.values()]
        out.append(list(dict.fromkeys(texts)))
    return out


def _run_scorer(run: RunFolder, release, candidates: list[list[str]], execute: bool,
                progress: Callable[[str], None], runner=None, workspace: SourceFolders | str | Path | None = None,
                scoring: ScoreSettings | None = None, resume: bool = True):
    """Score every candidate with the scorer (resumable per trajectory when executing); records by id and text."""
    from themisto.scoring.scorer import score_texts_to_file

    scored = score_texts_to_file(release, run.ids, candidates, run.folder / SCORER_RECORDS,
                                 replace(scoring or ScoreSettings(), task=run.task), execute=execute,
                                 workspace=workspace, resume=resume,
                                 progress=progress, runner=runner).result
    records: dict[str, dict[str, object]] = {}
    for record in scored.predictions:
        records.setdefault(record.id, {})[record.prediction] = record
    return records, {e.id: e for e in scored.examples}, scored.notes


def metric_value(record, example, metric: str) -> float | None:
    """A scored prediction's value on `metric` (an execution metric is None where its example was not scored)."""
    if metric in EXECUTION_METRICS:  # None where not judged (continuation_match of an undefined continuation)
        value = getattr(record, metric) if example.status == "scored" else None
        return None if value is None else float(bool(value))
    return float(getattr(record, metric))


def generation_value(records: dict, examples: dict) -> Callable[[Generation, str], float | None]:
    """A generation's score on a metric: its record's, 0 where it was skipped or failed (None where the metric does
    not apply to its example)."""
    def value(g: Generation, metric: str) -> float | None:
        example = examples[g.id]
        if g.status == "ok":
            return metric_value(records[g.id][g.prediction], example, metric)
        return 0.0 if metric not in EXECUTION_METRICS or example.status == "scored" else None

    return value


def _per_example(run: RunFolder, baselines: dict[str, list[str]], records: dict, examples: dict,
                 metrics: tuple[str, ...]) -> dict[str, dict[str, list[float | None]]]:
    """Per system (context, or `baseline:<name>`) and metric, each example's score (mean over samples)."""
    systems: dict[str, dict[str, list[float | None]]] = {}
    value = generation_value(records, examples)
    for context in run.contexts:
        table = systems[context] = {m: [] for m in metrics}
        for example_id in run.ids:
            for metric in metrics:
                values = [value(g, metric) for g in run.samples_of(example_id, context)]
                kept = [v for v in values if v is not None]
                table[metric].append(fmean(kept) if kept else None)
    for name, predictions in baselines.items():
        systems[f"baseline:{name}"] = {
            metric: [metric_value(records[i][text], examples[i], metric) for i, text in zip(run.ids, predictions)]
            for metric in metrics}
    return systems


def _solved(task: str, record, example) -> bool:
    if task == "output_prediction":
        return bool(record.output_equivalent)
    return record.exact_match == 1.0 or (example.status == "scored" and bool(record.functional_match))


def _entry(interval, **keys) -> dict:
    return {**keys, "mean": interval.mean, "low": interval.low, "high": interval.high, "n": interval.n}


def clusters_of(rows: list[dict], release, unit: str) -> list[str]:
    """Each row's bootstrap cluster: its trajectory, or (unit `participant`) its participant (the release's
    `trajectories` rows say it); a trajectory whose participant is unknown is its own cluster."""
    if unit == "participant":
        trajectories = release.trajectories_by_kernel()
        return [trajectories[r["kernel_id"]][0].get("participant") or r["kernel_id"] for r in rows]
    return [r["kernel_id"] for r in rows]


def generated(run: RunFolder) -> dict[str, list[bool]]:
    """Per context, per example: whether every sample of it was generated (none skipped over the budget or failed)."""
    return {context: [all(g.status == "ok" for g in run.samples_of(i, context)) for i in run.ids]
            for context in run.contexts}


def _paired(task: str, metric: str, subset: str, context: str, versus: str, examples: str, effect,
            **extra) -> dict:
    return {"task": task, "metric": metric, "subset": subset, "context": context, "versus": versus,
            "examples": examples, "diff": effect.mean, "low": effect.low, "high": effect.high, "n": effect.n, **extra}


def _tables(run: RunFolder, systems: dict, hard: list[bool], rows: list[dict], lengths: dict[str, int],
            metrics: tuple[str, ...], settings: IntervalSettings, clusters: list[str], splits: list[str],
            value: Callable[[Generation, str], float | None]) -> dict:
    """The scores, paired effects, baselines, breakdowns and the probe mode's figures with their intervals, all from
    one resampling plan over `clusters` (each row's trajectory or participant); `splits` gives each row's split."""
    plan = plan_resamples(clusters, [(r["kernel_id"], r["step"]) for r in rows], settings)
    subsets = {"all": None, "hard": hard}
    task = run.task
    made = generated(run)
    scores, paired, baseline_rows = [], [], []
    for system, table in systems.items():
        for metric in metrics:
            for subset, mask in subsets.items():
                interval = mean_interval(table[metric], plan, mask)
                if system.startswith("baseline:"):
                    baseline_rows.append(_entry(interval, baseline=system.split(":", 1)[1], task=task, metric=metric,
                                                subset=subset))
                else:
                    scores.append(_entry(interval, task=task, context=system, metric=metric, subset=subset))
                for versus in _versus(system, run.contexts):
                    control = systems[versus][metric]
                    # Every example, a skipped or failed generation scored 0: what a user of the prompts gets.
                    paired.append(_paired(task, metric, subset, system, versus, "all",
                                          paired_interval(table[metric], control, plan, mask)))
                    # Like with like: only where both modes generated, so the budget's skips are not the effect.
                    inside = mask if mask is not None else [True] * len(run.ids)
                    both = [k and a and b for k, a, b in zip(inside, made[system], made[versus])]
                    unanswered = {c: sum(k and not ok for k, ok in zip(inside, made[c])) for c in (system, versus)}
                    paired.append(_paired(task, metric, subset, system, versus, "both_generated",
                                          paired_interval(table[metric], control, plan, both),
                                          unanswered=unanswered))
    positions = [position_of(r["step"], lengths[r["kernel_id"]]) for r in rows]
    kinds = [output_type(r) for r in rows] if task == "output_prediction" else []
    by_position, by_type = [], []
    for context in run.contexts:
        for metric in metrics:
            values = systems[context][metric]
            for position in POSITIONS:
                mask = [p == position for p in positions]
                by_position.append(_entry(mean_interval(values, plan, mask), task=task, context=context,
                                          metric=metric, position=position))
            for kind in sorted(set(kinds)):
                mask = [k == kind for k in kinds]
                by_type.append(_entry(mean_interval(values, plan, mask), task=task, context=context, metric=metric,
                                      output_type=kind))
    # A run over every split, a release of several sources: each group's figures beside the whole, from one plan
    by_split = _by_group(systems, metrics, plan, task, "split", splits)
    by_source = _by_group(systems, metrics, plan, task, "source", [r.get("source") or "unknown" for r in rows])
    return {"interval": plan.describe(), "scores": scores, "paired": paired, "baselines": baseline_rows,
            "breakdown": {"position": by_position, "output_type": by_type, "split": by_split, "source": by_source},
            "probing": probe_summary(run, value, plan, metrics)}


def _by_group(systems: dict, metrics: tuple[str, ...], plan, task: str, key: str, labels: list[str]) -> list[dict]:
    """Each system's scores within each group of `labels` (one per example; none where there is one group)."""
    out: list[dict] = []
    if len(set(labels)) < 2:
        return out
    for system, table in systems.items():
        who = {"baseline": system.split(":", 1)[1]} if system.startswith("baseline:") else {"context": system}
        for metric in metrics:
            for group in sorted(set(labels)):
                mask = [label == group for label in labels]
                out.append(_entry(mean_interval(table[metric], plan, mask), task=task, **who, metric=metric,
                                  **{key: group}))
    return out


def _versus(system: str, contexts: list[str]) -> list[str]:
    """The contexts of the run a system's paired effects are taken against: `none` for every runtime mode, then the
    controls its mode declares (`compared_with`: what asking, or showing the changes, adds to the variables)."""
    if system not in contexts:  # a model-free baseline, not a mode
        return []
    mode = context_mode(system)
    if mode.is_baseline:
        return []
    return [c for c in dict.fromkeys((BASELINE_CONTEXT, *mode.compared_with)) if c in contexts]


def _counts(run: RunFolder, examples: dict, rows: list[dict]) -> dict:
    lines = list(run.generations.values())
    by_context = {c: {status: sum(1 for g in lines if g.context == c and g.status == status)
                      for status in GENERATION_STATUSES} for c in run.contexts}
    by_source: dict[str, Counter] = {}
    for example_id, row in zip(run.ids, rows):
        by_source.setdefault(row.get("source") or "unknown", Counter())[examples[example_id].status] += 1
    return {"examples": len(run.ids), "generations": len(lines),
            "skipped": dict(Counter(g.reason or "unknown" for g in lines if g.status == "skipped")),
            "failed": dict(Counter(g.reason or "unknown" for g in lines if g.status == "failed")),
            "by_context": by_context,
            "execution": dict(Counter(e.status for e in examples.values())),
            "execution_by_source": {source: dict(counts) for source, counts in sorted(by_source.items())},
            "text_only": {reason: sum(1 for e in examples.values() if e.text_only_reason == reason)
                          for reason in TEXT_ONLY_REASONS},
            "state_mismatches": sum(1 for e in examples.values() if e.state_verified is False)}


def _share(parts: list[tuple[int | None, int | None]]) -> float | None:
    shares = [shown / total for shown, total in parts if shown is not None and total]
    return round(fmean(shares), 4) if shares else None


def prompt_kept(run: RunFolder) -> list[dict]:
    """Per context, what its prompts showed the model: the mean share of history cells and of variables shown (of
    the row's), the mean count of reprs the budget cut, over the prompts sent; the mean prompt tokens as the backend
    counted them (None where it counts none: a baseline); the prompts skipped beside them. A run written before
    lines recorded `kept` gives None."""
    out = []
    for context in run.contexts:
        first = [run.generations[(i, context, 0)] for i in run.ids]
        sent = [g.kept for g in first if g.status != "skipped" and g.kept is not None]
        tokens = [g.tokens_in for g in first if g.status != "skipped" and g.tokens_in]  # a baseline's: 0 or null
        recorded = any(g.kept is not None for g in first)
        out.append({
            "context": context, "prompts": len(first), "skipped": sum(g.status == "skipped" for g in first),
            "history_shown": _share([(k.get("history_shown"), k.get("history_total")) for k in sent]),
            "variables_shown": _share([(k.get("variables_shown"), k.get("variables_total")) for k in sent]),
            "reprs_cut": round(fmean(k.get("reprs_cut") or 0 for k in sent), 2) if sent else None,
            "prompt_tokens": round(fmean(tokens), 1) if tokens else None, "recorded": recorded})
    return out


def score_run(run_dir: str | Path, *, release=None, execute: bool = False,
              out: str | Path | None = None, settings: IntervalSettings = IntervalSettings(),
              progress: Callable[[str], None] | None = None, runner=None,
              workspace: SourceFolders | str | Path | None = None, scoring: ScoreSettings | None = None,
              resume: bool = True) -> dict:
    """Score every context of a run folder and the baselines, and write results.json and results.md (to `out`'s
    folder, by default the run folder); returns the results. `release`: the opened release (`ReleaseInfo`), by
    default the one run.json names, opened once here. Execution needs the gate's opt-in (next_cell only);
    `runner` runs its trajectories elsewhere (themisto.distributed.ray_scoring: on Ray); `workspace` is the folder
    the release was replayed over, where its build names a given one; `scoring`: how execution runs (timeouts, the
    slowest reference, continuation cells, restore; its task is the run's and its `k` is not used: a run folder's
    pass@k follows its samples)."""
    from themisto.gate import permit

    if execute:
        permit(execute=True)  # refuse before reading anything
    if not Path(run_dir).is_dir():
        raise RunFolderError(f"{run_dir}: no such run folder")
    # It writes into the run folder (the scorer's records, results): one writer at a time, and a folder that
    # `generate` is still writing is refused with that process's pid rather than read half-written.
    with hold_folder(run_dir, "run folder", create=False):
        return _score_held(run_dir, release, execute, out, settings, progress, runner, workspace, scoring, resume)


def _score_held(run_dir: str | Path, release, execute: bool, out: str | Path | None,
                settings: IntervalSettings, progress: Callable[[str], None] | None, runner,
                workspace: SourceFolders | str | Path | None, scoring: ScoreSettings | None, resume: bool) -> dict:
    from themisto.generation.baselines import baseline_prediction, baselines_for
    from themisto.scoring.results_table import render_markdown
    from themisto.scoring.release_state import task_rows

    started = time.perf_counter()
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    run = read_run(run_dir)
    info = find_release(run, release)
    by_id = task_rows(info, run.task)
    unknown = [i for i in run.ids if i not in by_id]
    if unknown:
        raise RunFolderError(f"{run.folder}: example {unknown[0]} is not in the release {info.path}"
                       + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    rows = [by_id[i] for i in run.ids]
    names = baselines_for(run.task)
    baselines = {name: [baseline_prediction(name, row, run.task) for row in rows] for name in names}
    executed = execute and run.task == "next_cell"
    notes = [] if executed or not execute else ["execution scores exist for next_cell only; output_prediction is "
                                                "scored by text and output equivalence"]
    say(f"scoring {len(run.ids)} example(s) x {len(run.contexts)} context(s) x {run.samples} sample(s) and "
        f"{len(names)} baseline(s)" + (" with execution" if executed else ""))
    records, examples, scorer_notes = _run_scorer(run, info, _candidates(run, baselines), executed, say, runner,
                                                  workspace, scoring, resume)
    metrics = metrics_for(run.task, executed)
    systems = _per_example(run, baselines, records, examples, metrics)
    solved = {name: [_solved(run.task, records[i][t], examples[i]) for i, t in zip(run.ids, baselines[name])]
              for name in names}
    hard = [not any(solved[name][k] for name in names) for k in range(len(run.ids))]
    lengths = {k: max(r["step"] for r in steps) + 1 for k, steps in info.trajectories_by_kernel().items()}
    clusters = clusters_of(rows, info, settings.cluster)
    split_of = {i: s for s in info.splits(run.task) for i in info.ids(run.task, s)}
    meta = run.meta
    results = {
        "format": RESULTS_FORMAT,
        "run": {"model": meta.get("model"), "backend": meta.get("backend"), "task": run.task,
                "contexts": run.contexts, "sampling": meta.get("sampling"), "n": len(run.ids),
                "limit": meta.get("limit"), "split": meta.get("split")},
        "release_hash": info.content_hash, "executed": executed, "metrics": list(metrics),
        **_tables(run, systems, hard, rows, lengths, metrics, settings, clusters, [split_of[i] for i in run.ids],
                  generation_value(records, examples)),
        "hard_subset": {"rule": HARD_RULES[run.task + ("+executed" if executed else "")], "examples": sum(hard),
                        "solved_by": {name: sum(v) for name, v in solved.items()}},
        "counts": _counts(run, examples, rows), "kept": prompt_kept(run), "notes": notes + scorer_notes,
        "seconds": round(time.perf_counter() - started, 2)}
    out_path = Path(out) if out is not None else run.folder / RESULTS_JSON
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_path, json.dumps(results, ensure_ascii=False, indent=1) + "\n")
    write_text_atomic(out_path.with_name(RESULTS_MD if out is None else out_path.stem + ".md"),
                      render_markdown(results))
    return results
