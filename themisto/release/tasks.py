"""Benchmark rows from replayed trajectories: the `trajectories` config, the train/test split, and the two tasks.

Rows are plain dicts whose keys are the fields declared in `themisto_dataset.py`. Task construction follows the
paper (Grotov & Titov, 2025): a target needs at least five prior actions in its trajectory; empty targets and
targets longer than the 0.99 quantile of target length are dropped; the output-prediction test split is the
paper's sample of 200 (180 from the middle two quartiles of output length, 10 from the shortest quartile, 10
from the longest, fixed seed). Every rule is counted, and a task left empty names the rule that emptied it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from themisto.errors import InputError
from themisto.release.splits import SplitPlan, assign_splits
from themisto.runtime.outputs import mask_volatile
from themisto.vocabulary import SPLITS, TASKS, UNFINISHED_STATUSES

# A prompt shows at most this many prior cells, each output cut to this many characters (then a marker).
HISTORY_CELLS = 10
HISTORY_OUTPUT_CHARS = 2000
TRUNCATION_MARKER = "\n[... output truncated: {omitted} more characters]"
MIN_PRIOR_ACTIONS = 5
LENGTH_QUANTILE = 0.99
OUTPUT_SAMPLE_SIZE = 200
OUTPUT_SAMPLE_EXTREMES = 10  # drawn from each of the shortest and the longest quartile; the rest from the middle
TEST_FRACTION = 0.5
MIN_TEST_GROUPS = 2  # participants (or trajectories) each notebook task's `test` holds where it has that many

# The rules, in the order they are applied, with the sentence the card and error messages use.
RULES: dict[str, str] = {
    "min_prior_actions": f"the target has fewer than {MIN_PRIOR_ACTIONS} prior actions in its trajectory",
    "damaged_code": "the log damaged the target cell's code and nothing restores it (`code_state` damaged)",
    "empty_target": "the target is empty (or its code was not logged)",
    "unfinished_replay": "replay did not finish the cell (timeout or kernel died), so its output is not a target",
    "environment_failure": "the replay's environment failed the cell (a package, input file, network or GPU it "
                           "lacks: `replay_cause`), so its output is not a target",
    "length_quantile": f"the target is longer than the {LENGTH_QUANTILE} quantile of target length",
}


NO_ROWS = "no trajectory rows: nothing to build tasks from"


class TaskError(InputError):
    """Task rows cannot be built; the message names the trajectory/step or the rule concerned."""


@dataclass(frozen=True)
class TaskSettings:
    """How tasks and splits are made from trajectory rows."""

    seed: int = 0
    test_fraction: float = TEST_FRACTION  # share of steps (by whole groups) that go to `test`
    min_test_groups: int = MIN_TEST_GROUPS  # `themisto.release.splits`
    history_cells: int = HISTORY_CELLS
    history_output_chars: int = HISTORY_OUTPUT_CHARS
    min_prior_actions: int = MIN_PRIOR_ACTIONS
    length_quantile: float = LENGTH_QUANTILE
    # The output-prediction `test` split: the paper's sample of this size, or every eligible row when None.
    output_sample_size: int | None = OUTPUT_SAMPLE_SIZE
    output_sample_extremes: int = OUTPUT_SAMPLE_EXTREMES

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction must be in (0, 1], got {self.test_fraction}")
        if self.min_test_groups < 1:
            raise ValueError(f"min_test_groups must be at least 1, got {self.min_test_groups}")
        if self.output_sample_size is not None and self.output_sample_size < 2 * self.output_sample_extremes:
            raise ValueError("output_sample_size must hold the shortest and longest extremes")


@dataclass
class TaskReport:
    """What the rules did to one task: candidates, rows removed per rule (in order), rows kept per split."""

    task: str
    candidates: int
    removed: dict[str, int] = field(default_factory=dict)
    length_limit: float | None = None  # the quantile cut-off, in characters
    rows: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class TaskSet:
    """Rows of every config and split, the split (of each trajectory and group), and the reports of the task rules."""

    rows: dict[str, dict[str, list[dict]]]
    split: SplitPlan
    reports: dict[str, TaskReport]
    notes: list[str] = field(default_factory=list)

    @property
    def split_of(self) -> dict[str, str]:  # kernel_id -> split
        return self.split.split_of

    def sizes(self) -> dict[str, dict[str, int]]:
        return {config: {split: len(rows) for split, rows in splits.items()} for config, splits in self.rows.items()}


# ---------------------------------------------------------------------------------------------------------------
# trajectories rows


def variable_row(info: Mapping) -> dict:
    """One variable as the release stores it, from a `VariableInfo` dict (missing facts become None)."""
    shape = info.get("shape")
    columns = info.get("columns")
    size = info.get("size")
    length = info.get("len")
    return {
        "name": str(info["name"]),
        "type": None if info.get("type") is None else str(info["type"]),
        "size": None if size is None else int(size),
        "repr": None if info.get("repr") is None else mask_volatile(str(info["repr"])),
        "hash": None if info.get("hash") is None else str(info["hash"]),
        "shape": None if shape is None else [int(x) for x in shape],
        "dtype": None if info.get("dtype") is None else str(info["dtype"]),
        "len": None if length is None else int(length),
        "columns": None if columns is None else [str(c) for c in columns],
        "repr_error": None if info.get("repr_error") is None else str(info["repr_error"]),
        "stable": info.get("stable"),  # themisto.release.run_specific marks it, at the build
    }


def provenance_row(provenance: Mapping | None) -> dict | None:
    """A trajectory's provenance as the release stores it (themisto_dataset.PROVENANCE), or None."""
    if not provenance:
        return None
    cut = provenance.get("cut") or {}
    return {"kind": provenance.get("kind"), "repository": provenance.get("repository"),
            "commit": provenance.get("commit"), "path": provenance.get("path"),
            "session": provenance.get("session"), "date": provenance.get("date"),
            "licence": provenance.get("licence"), "environment": provenance.get("environment"),
            "notebook_inputs_matched": provenance.get("notebook_inputs_matched"),
            "inputs": provenance.get("inputs"), "cut_cause": cut.get("cause"), "cut_at": cut.get("at")}


def trajectory_row(step, participant: str | None = None, source: str | None = None,
                   provenance: Mapping | None = None, rebuild: Mapping | None = None) -> dict:
    """The `trajectories` row of one replayed `themisto.replay.replay.Step`; what drifts between two replays (object
    addresses, the kernel's execution counter in a traceback) is masked in its output, error message and variable
    reprs (`themisto.runtime.outputs.mask_volatile`), so targets and history built from it are the same in every
    build."""
    return {
        "kernel_id": step.kernel_id,
        "step": int(step.step),
        "cell_id": step.cell_id,
        "notebook": step.notebook,
        "task": step.task,
        "participant": participant,
        "source": source,
        "provenance": provenance_row(provenance),
        "code": step.code,
        "replayed_code": step.replayed_code,
        "restarted_before": bool(step.restarted_before),
        "status": step.status,
        "ename": step.ename,
        "evalue": None if step.evalue is None else mask_volatile(step.evalue),
        "output": mask_volatile(step.output),
        "output_types": list(step.output_types),
        "execution_time": float(step.execution_time),
        "memory_bytes": step.memory_bytes,
        "state_hash": step.state_hash,
        "variables": [variable_row(v) for v in step.variables],
        "snapshot_failures": [{"name": k, "reason": v} for k, v in sorted(step.snapshot_failures.items())],
        "kernel_restarted": bool(step.kernel_restarted),
        "rebuilt_steps": int(step.rebuilt_steps),
        "logged_status": step.logged.status,
        "logged_ename": step.logged.ename,
        "logged_evalue": step.logged.evalue,
        "logged_output_types": list(step.logged.output_types),
        "code_state": step.logged.code_state,
        "stored_values": _stored_values(getattr(step, "values", None)),
        "replay_cause": None,  # themisto.replay.health sets it
        "rebuild": None if rebuild is None else dict(rebuild),  # themisto.release.workspaces.rebuild_record
    }


def _stored_values(values: Mapping | None) -> dict | None:
    """What a step's replay stored besides the values themselves (themisto_dataset.STORED_VALUES), or None."""
    if values is None:
        return None
    return {"unstored": [{"name": name, "reason": mask_volatile(str(reason))}
                         for name, reason in sorted(values.get("unstored", {}).items())],
            "modules": [{"name": name, "module": str(module)}
                        for name, module in sorted(values.get("modules", {}).items())],
            "aliases": [[str(name) for name in group] for group in values.get("aliases", [])]}


def trajectory_rows(steps: Iterable, participants: Mapping[str, str | None] | None = None,
                    trajectories: Mapping | None = None, rebuild: Mapping[str, Mapping | None] | None = None
                    ) -> list[dict]:
    """`trajectories` rows of replayed steps, ordered by (kernel_id, step); `participants` maps kernel ids,
    `trajectories` (kernel id -> `Trajectory`) gives each its source and provenance, and `rebuild` its REBUILD
    record (`themisto.release.workspaces.rebuild_record`)."""
    participants, trajectories, rebuild = participants or {}, trajectories or {}, rebuild or {}

    def row(step) -> dict:
        known = trajectories.get(step.kernel_id)
        return trajectory_row(step, participants.get(step.kernel_id), known.source if known else step.source,
                              known.provenance if known else None, rebuild.get(step.kernel_id))

    rows = [row(s) for s in steps]
    return sorted(rows, key=lambda r: (r["kernel_id"], r["step"]))


def group_by_kernel(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """Rows per kernel id, each list ordered by step; a repeated or missing step is an error naming it."""
    kernels: dict[str, list[dict]] = {}
    for row in rows:
        kernels.setdefault(row["kernel_id"], []).append(row)
    for kernel_id, steps in kernels.items():
        steps.sort(key=lambda r: r["step"])
        for expected, row in enumerate(steps):
            if row["step"] != expected:
                what = "repeated" if row["step"] < expected else "missing"
                raise TaskError(f"trajectory {kernel_id}: step {expected} is {what} "
                                f"(steps must run 0..{len(steps) - 1} without gaps; is the replay complete?)")
    return dict(sorted(kernels.items()))


# ---------------------------------------------------------------------------------------------------------------
# task rows


def _truncate(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + TRUNCATION_MARKER.format(omitted=len(text) - limit), True


def _history(steps: Sequence[dict], index: int, settings: TaskSettings) -> list[dict]:
    window = steps[max(0, index - settings.history_cells):index]
    cells = []
    for row in window:
        output, truncated = _truncate(row["output"] or "", settings.history_output_chars)
        cells.append({"step": row["step"], "cell_id": row["cell_id"], "code": row["code"], "output": output,
                      "output_truncated": truncated, "status": row["status"],
                      "restarted_before": row["restarted_before"], "code_state": _code_state(row)})
    return cells


def _code_state(row: Mapping) -> str:
    """A row's code state; rows written before the field existed (and the paper's) hold the code as logged."""
    return row.get("code_state") or "as_logged"


def _common(steps: Sequence[dict], index: int, settings: TaskSettings) -> dict:
    target = steps[index]
    # The state before the target is the snapshot after the previous step, unless the kernel was fresh:
    # at the start of the trajectory or right after a logged restart.
    fresh = index == 0 or target["restarted_before"]
    before = None if fresh else steps[index - 1]
    return {
        "id": f"{target['kernel_id']}/{target['step']}",
        "kernel_id": target["kernel_id"],
        "step": target["step"],
        "notebook": target["notebook"],
        "task": target["task"],
        "source": target.get("source"),
        "history": _history(steps, index, settings),
        "restarted_before": bool(target["restarted_before"]),
        "variables_before": [] if before is None else [dict(v) for v in before["variables"]],
        "memory_bytes_before": None if before is None else before["memory_bytes"],
        "state_hash_before": None if before is None else before["state_hash"],
    }


def next_cell_row(steps: Sequence[dict], index: int, settings: TaskSettings = TaskSettings()) -> dict:
    """The next-cell row whose target is the code of `steps[index]`."""
    return {**_common(steps, index, settings), "target": steps[index]["code"]}


def output_prediction_row(steps: Sequence[dict], index: int, settings: TaskSettings = TaskSettings(),
                          band: str = "all") -> dict:
    """The output-prediction row whose target is the output text of `steps[index]`."""
    target = steps[index]
    return {**_common(steps, index, settings), "cell_id": target["cell_id"], "code": target["code"],
            "target": target["output"], "status": target["status"], "ename": target["ename"],
            "output_types": list(target["output_types"]), "sample_band": band}


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile with linear interpolation between order statistics (numpy's default method)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class Candidate:
    kernel_id: str
    index: int
    target: str


def _eligible(kernels: Mapping[str, list[dict]], task: str, settings: TaskSettings) -> tuple[list[Candidate], TaskReport]:
    """Apply the rules in order; raise TaskError naming the rule that left nothing."""
    candidates = [Candidate(k, i, row["code"] if task == "next_cell" else (row["output"] or ""))
                  for k, steps in kernels.items() for i, row in enumerate(steps)]
    report = TaskReport(task=task, candidates=len(candidates))
    checks = {
        "min_prior_actions": lambda c: c.index >= settings.min_prior_actions,
        # Damaged code is no developer's code: neither its text nor its replayed output is a target.
        "damaged_code": lambda c: _code_state(kernels[c.kernel_id][c.index]) != "damaged",
        "empty_target": lambda c: c.target.strip() != "",
        "unfinished_replay": lambda c: task == "next_cell" or kernels[c.kernel_id][c.index]["status"] not in UNFINISHED_STATUSES,
        "environment_failure": lambda c: task == "next_cell" or not kernels[c.kernel_id][c.index].get("replay_cause"),
    }
    left = candidates
    for rule, keep in checks.items():
        kept = [c for c in left if keep(c)]
        report.removed[rule] = len(left) - len(kept)
        _raise_if_emptied(task, rule, left, kept)
        left = kept
    limit = quantile([len(c.target) for c in left], settings.length_quantile)
    kept = [c for c in left if len(c.target) <= limit]
    report.removed["length_quantile"] = len(left) - len(kept)
    report.length_limit = limit
    _raise_if_emptied(task, "length_quantile", left, kept)
    return kept, report


def _raise_if_emptied(task: str, rule: str, before: list, after: list) -> None:
    if not after:
        raise TaskError(f"{task}: no target left after rule {rule!r} ({RULES[rule]}); "
                        f"it removed all {len(before)} remaining candidates")


def paper_sample(candidates: Sequence[Candidate], settings: TaskSettings) -> tuple[list[tuple[Candidate, str]], list[str]]:
    """The paper's output-prediction sample, each candidate with its band; all of them when too few.

    Candidates are ranked by (output length, id); the bottom and top quarters by rank are the shortest and
    longest quartiles, the rest the middle two. A band too small to give its share is taken whole and the
    shortfall drawn from the remaining candidates; the notes say so. Each draw takes the candidates first in the
    order of a hash of (seed, trajectory, step), not positions in a seeded shuffle: a candidate more or fewer (one
    step that replayed otherwise) moves itself and the band boundaries, never the rest of the sample.
    """
    size, extremes = settings.output_sample_size, settings.output_sample_extremes
    ranked = sorted(candidates, key=lambda c: (len(c.target), c.kernel_id, c.index))
    if size is None:
        return [(c, "all") for c in ranked], []
    if len(ranked) <= size:
        return [(c, "all") for c in ranked], [
            f"output_prediction: only {len(ranked)} eligible test targets (the paper's sample takes {size}); "
            f"all of them are in `test`"]
    quarter = len(ranked) // 4
    bands = {"shortest": ranked[:quarter], "middle": ranked[quarter:len(ranked) - quarter],
             "longest": ranked[len(ranked) - quarter:]}
    wanted = {"shortest": extremes, "middle": size - 2 * extremes, "longest": extremes}
    def draw_order(candidate: Candidate) -> str:
        return hashlib.sha256(f"{settings.seed}/{candidate.kernel_id}/{candidate.index}".encode()).hexdigest()

    chosen: list[tuple[Candidate, str]] = []
    notes = []
    leftovers: list[tuple[Candidate, str]] = []
    for band, pool in bands.items():
        take = min(wanted[band], len(pool))
        picked = {id(c) for c in sorted(pool, key=draw_order)[:take]}
        chosen += [(c, band) for c in pool if id(c) in picked]
        leftovers += [(c, band) for c in pool if id(c) not in picked]
        if take < wanted[band]:
            notes.append(f"output_prediction: the {band} band held {len(pool)} targets, fewer than "
                         f"{wanted[band]}; the rest were drawn from the other bands")
    missing = size - len(chosen)
    if missing > 0:
        chosen += sorted(leftovers, key=lambda pair: draw_order(pair[0]))[:missing]
    return chosen, notes


def build_tasks(rows: Iterable[dict], settings: TaskSettings = TaskSettings()) -> TaskSet:
    """Split trajectory rows by group (`themisto.release.splits`) and build both tasks; deterministic for the same
    rows and seed."""
    kernels = group_by_kernel(rows)
    if not kernels:
        raise TaskError(NO_ROWS)
    plan = assign_splits(kernels, settings.seed, settings.test_fraction, settings.min_test_groups)
    split_of, notes = plan.split_of, list(plan.notes)
    out: dict[str, dict[str, list[dict]]] = {
        "trajectories": {s: [r for k, steps in kernels.items() if split_of[k] == s for r in steps]
                         for s in SPLITS},
    }
    reports = {}
    for task in TASKS:
        eligible, report = _eligible(kernels, task, settings)
        by_split = {s: [c for c in eligible if split_of[c.kernel_id] == s] for s in SPLITS}
        if not by_split["test"]:
            raise TaskError(f"{task}: no eligible target falls in a `test` trajectory "
                            f"({len(eligible)} eligible, all in `train`)")
        if task == "next_cell":
            made = {s: [next_cell_row(kernels[c.kernel_id], c.index, settings) for c in cs]
                    for s, cs in by_split.items()}
        else:
            sample, sample_notes = paper_sample(by_split["test"], settings)
            report.notes += sample_notes
            made = {"test": [output_prediction_row(kernels[c.kernel_id], c.index, settings, band)
                             for c, band in sample],
                    "train": [output_prediction_row(kernels[c.kernel_id], c.index, settings)
                              for c in by_split["train"]]}
        for split, task_rows in made.items():
            task_rows.sort(key=lambda r: (r["kernel_id"], r["step"]))
            report.rows[split] = len(task_rows)
        out[task] = made
        reports[task] = report
    group_of = {k: g for g in plan.groups for k in g.trajectories}
    for config, splits in out.items():
        for split, config_rows in splits.items():
            for row in config_rows:
                counts = group_of[row["kernel_id"]].rows.setdefault(config, {})
                counts[split] = counts.get(split, 0) + 1
    for task in TASKS:
        held = {group_of[r["kernel_id"]].group for r in out[task]["test"]}
        if len(held) < settings.min_test_groups and len(plan.groups) > settings.min_test_groups:
            notes.append(f"{task}: the `test` rows come from {len(held)} group(s), fewer than "
                         f"{settings.min_test_groups}")
    return TaskSet(rows=out, split=plan, reports=reports, notes=notes)

