"""Every prediction of a study scored at once, per task: each distinct text once per example, one replay per
trajectory when executing; then each system's score per example (a system: a (mode, seed) model in one evaluation
mode, the base model in one mode, or a baseline).

Text scores cover every generated test example; execution covers `execute_limit` of next_cell's (evenly spread),
a setting of its own because execution is the slow part on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from themisto.modes import BASELINE_CONTEXT, context_mode
from themisto.study.settings import StudyError, StudySettings

BASE_SYSTEM = "base"


@dataclass
class TaskScores:
    """One task's examples (ids in run order, their clusters and positions) and every system's values per metric."""

    task: str
    ids: list[str]
    clusters: list[str]
    order: list[tuple[str, int]]
    metrics: tuple[str, ...]
    executed: list[bool]  # which examples were executed (all False when the task was not)
    # system -> metric -> one list of per-example values per seed (None: no value)
    values: dict[str, dict[str, list[list[float | None]]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def system_name(kind: str, trained: str | None, evaluated: str) -> str:
    """`trained:<mode>@<eval>` for fine-tuned models, `base@<eval>`, or `baseline:<name>`."""
    if kind == "trained":
        return f"trained:{trained}@{evaluated}"
    if kind == "base":
        return f"base@{evaluated}"
    return f"baseline:{evaluated}"


def eval_contexts(mode: str) -> tuple[str, ...]:
    """Where a model trained with `mode` is evaluated: its own mode, and the baseline's `none` (does it rely on the
    context?)."""
    return (mode,) if context_mode(mode).is_baseline else (mode, BASELINE_CONTEXT)


def _read_runs(out: Path, settings: StudySettings, units, task: str):
    """Each system's generations of `task` (sample 0), per seed, and the examples' ids (the same in every run)."""
    from themisto.generation.run_folder import read_run

    base = read_run(out / "runs" / BASE_SYSTEM / task)
    ids = base.ids
    systems: dict[str, list[dict]] = {}
    for context in settings.contexts:
        systems[system_name("base", None, context)] = [{i: base.generations.get((i, context, 0)) for i in ids}]
    for unit in units:
        run = read_run(out / "runs" / unit.name / task)
        if run.ids != ids:
            raise StudyError(f"{run.folder}: its examples differ from the base model's run ({len(run.ids)} vs "
                             f"{len(ids)}): generated with other settings?")
        for context in eval_contexts(unit.mode):
            seeds = systems.setdefault(system_name("trained", unit.mode, context), [])
            seeds.append({i: run.generations.get((i, context, 0)) for i in ids})
    return ids, systems


def _score(info, task: str, ids: list[str], systems: dict, baselines: dict, execute: bool, path: Path, say):
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.scorer import score_texts_to_file

    candidates = []
    for i in ids:
        texts = [g.prediction for seeds in systems.values() for run in seeds
                 if (g := run.get(i)) is not None and g.status == "ok"]
        texts += [predictions[i] for predictions in baselines.values()]
        candidates.append(list(dict.fromkeys(texts)))
    scored = score_texts_to_file(info, ids, candidates, path, ScoreSettings(task=task), execute=execute,
                                 progress=say).result
    records: dict[str, dict] = {}
    for record in scored.predictions:
        records.setdefault(record.id, {})[record.prediction] = record
    return records, {e.id: e for e in scored.examples}, scored.notes


def score_task(out: Path, settings: StudySettings, info, units, task: str, say: Callable[[str], None]) -> TaskScores:
    from themisto.generation.baselines import baseline_prediction, baselines_for
    from themisto.generation.release_rows import spread
    from themisto.scoring.release_state import task_rows
    from themisto.scoring.run_scores import (EXECUTION_METRICS, clusters_of, generation_value, metric_value,
                                             metrics_for)

    ids, systems = _read_runs(out, settings, units, task)
    by_id = task_rows(info, task)
    rows = [by_id[i] for i in ids]
    baselines = {name: {r["id"]: baseline_prediction(name, r, task) for r in rows} for name in baselines_for(task)}
    folder = out / "scored"
    say(f"{task}: scoring {len(ids)} examples x {len(systems)} systems and {len(baselines)} baselines by text")
    text_records, text_examples, notes = _score(info, task, ids, systems, baselines, False,
                                                folder / f"{task}.text.json", say)
    executed_ids: list[str] = []
    exec_records, exec_examples = {}, {}
    if settings.execute and task == "next_cell":
        executed_ids = spread(ids, settings.execute_limit)
        say(f"{task}: executing {len(executed_ids)} of {len(ids)} examples in their exact pre-cell state")
        chosen = set(executed_ids)
        exec_records, exec_examples, exec_notes = _score(
            info, task, executed_ids, {s: [{i: g for i, g in run.items() if i in chosen} for run in seeds]
                                       for s, seeds in systems.items()},
            {n: {i: p for i, p in b.items() if i in chosen} for n, b in baselines.items()}, True,
            folder / f"{task}.executed.json", say)
        notes += exec_notes
    metrics = metrics_for(task, bool(executed_ids))
    text_value = generation_value(text_records, text_examples)
    exec_value = generation_value(exec_records, exec_examples)

    def value(g, i: str, metric: str) -> float | None:
        if metric in EXECUTION_METRICS:
            if i not in exec_examples:
                return None
            return exec_value(g, metric) if g is not None else None
        return text_value(g, metric) if g is not None else 0.0

    scores = TaskScores(task, ids, clusters_of(rows, info, settings.cluster), [(r["kernel_id"], r["step"]) for r in rows],
                        metrics, [i in set(executed_ids) for i in ids], notes=list(dict.fromkeys(notes)))
    for system, seeds in systems.items():
        scores.values[system] = {m: [[value(run.get(i), i, m) for i in ids] for run in seeds] for m in metrics}
    for name, predictions in baselines.items():
        table = scores.values[system_name("baseline", None, name)] = {}
        for metric in metrics:
            records, examples = (exec_records, exec_examples) if metric in EXECUTION_METRICS else \
                (text_records, text_examples)
            table[metric] = [[metric_value(records[i][predictions[i]], examples[i], metric)
                              if i in examples else None for i in ids]]
    return scores


def score_study(out: Path, settings: StudySettings, info, units, say: Callable[[str], None]) -> list[TaskScores]:
    """Every task's scores (with execution where the settings ask and the task is next_cell); `info`: the release,
    opened once by the study."""
    return [score_task(out, settings, info, units, task, say) for task in settings.tasks]
