"""The release as a run reads it: its content hash, one task's test rows, checked for what the context modes need,
and joined with what the trajectories config knows (when each variable last changed; each cell's execution time)."""

from __future__ import annotations

from collections.abc import Iterable

from themisto.modes import ContextModeSpec, context_modes
from themisto.release.folder import TRAJECTORIES, ReleaseError, ReleaseInfo
from themisto.vocabulary import ALL_SPLITS, BASELINE_CONTEXT, BENCHMARK_SPLIT, SPLITS


def require_task(info: ReleaseInfo, task: str, split: str = BENCHMARK_SPLIT) -> None:
    """A ReleaseError unless the release has the task's split (test unless told; for `all`, test)."""
    info.require(task, BENCHMARK_SPLIT if split == ALL_SPLITS else split)


def splits_of(info: ReleaseInfo, task: str, split: str) -> list[str]:
    """The release splits a run's `split` reads, in order: that one, or for `all` each the task has (test first)."""
    return [s for s in SPLITS if info.has(task, s)] if split == ALL_SPLITS else [split]


def spread(rows: list[dict], limit: int | None) -> list[dict]:
    """`limit` rows evenly spaced over the file (so across trajectories and positions), or all of them."""
    if limit is None or limit >= len(rows):
        return rows
    return [rows[i * len(rows) // limit] for i in range(limit)]


def _change_steps(steps: list[dict], wanted: set[int]) -> dict[int, dict[str, int]]:
    """For each step in `wanted`, when each variable of its snapshot last changed: the latest step at or before it
    whose snapshot gave the name another hash than the step before (or first had it)."""
    last_hash: dict[str, str | None] = {}
    changed: dict[str, int] = {}
    out: dict[int, dict[str, int]] = {}
    for step in sorted(steps, key=lambda r: r["step"]):
        now = {v["name"]: v.get("hash") for v in step.get("variables") or []}
        for name in set(last_hash) - set(now):  # gone (a restart, a `del`): back later, it is new again
            del last_hash[name], changed[name]
        for name, digest in now.items():
            if name not in last_hash or last_hash[name] != digest:
                last_hash[name], changed[name] = digest, step["step"]
        if step["step"] in wanted:
            out[step["step"]] = dict(changed)
    return out


def _joined(info: ReleaseInfo, rows: list[dict], split: str, times: bool, trace: bool = False) -> list[dict]:
    """Rows with what the trajectories config knows and task rows do not carry: each snapshot variable's
    `changed_step` (the variable ranking's "most recently changed"), with `times` each history cell's
    `execution_time`, and with `trace` (a per-cell mode) each history cell's `state_after` (the variables after its
    step: name, type, hash, repr, shape, len, dtype, columns; None where the release has no snapshot of it),
    `ename` and `evalue`, and the row's `state_before_history` (the state the first history cell started from: empty
    before a trajectory's first step, None where the release has no snapshot of it). A release without the
    trajectories config gives the rows as they are."""
    if not info.has(TRAJECTORIES, split):
        return rows
    by_kernel: dict[str, list[dict]] = {}
    columns = ["kernel_id", "step", "execution_time", "variables"]
    columns += ["state_hash", "ename", "evalue"] if trace else []
    for step in info.rows(TRAJECTORIES, split, columns=columns):
        by_kernel.setdefault(step["kernel_id"], []).append(step)
    states = {(k, r["step"]): r for k, steps in by_kernel.items() for r in steps} if trace else {}
    wanted: dict[str, set[int]] = {}
    for row in rows:
        wanted.setdefault(row["kernel_id"], set()).add(row["step"] - 1)
    changes = {k: _change_steps(by_kernel.get(k, []), steps) for k, steps in wanted.items()}
    clock = {(k, r["step"]): r["execution_time"] for k, steps in by_kernel.items() for r in steps} if times else {}
    out = []
    for row in rows:
        changed = changes[row["kernel_id"]].get(row["step"] - 1, {})
        row = {**row, "variables_before": [{**v, "changed_step": changed.get(v["name"])}
                                           for v in row.get("variables_before") or []]}
        if times:
            row["history"] = [{**cell, "execution_time": clock.get((row["kernel_id"], cell["step"]))}
                              for cell in row.get("history") or []]
        if trace:
            row = _with_states(row, states)
        out.append(row)
    return out


# What a per-cell mode shows of each variable of a step's snapshot (trace: name, hash, repr; delta: all of them).
_STATE_FIELDS: tuple[str, ...] = ("name", "type", "hash", "repr", "shape", "len", "dtype", "columns")


def _state(step: dict | None) -> list[dict] | None:
    if step is None or step.get("state_hash") is None:
        return None
    return [{key: v.get(key) for key in _STATE_FIELDS} for v in step.get("variables") or []]


def _with_states(row: dict, states: dict[tuple[str, int], dict]) -> dict:
    history = row.get("history") or []
    kernel = row["kernel_id"]
    before: list[dict] | None = []  # before a trajectory's first step: nothing yet
    if history and history[0]["step"] > 0:
        before = _state(states.get((kernel, history[0]["step"] - 1)))
    cells = []
    for cell in history:
        step = states.get((kernel, cell["step"])) or {}
        cells.append({**cell, "state_after": _state(step or None), "ename": step.get("ename"),
                      "evalue": step.get("evalue")})
    return {**row, "state_before_history": before, "history": cells}


def load_task_rows(info: ReleaseInfo, task: str, contexts: Iterable[str | ContextModeSpec], *,
                   limit: int | None = None, split: str = BENCHMARK_SPLIT) -> list[dict]:
    """The task's rows of `split` (`all`: test, then train; `limit` of them, spread), checked for ids and for the
    snapshots the modes (names or `ContextModeSpec`s) need, joined with the execution times and states they show."""
    modes = context_modes(contexts)
    rows = spread([row for s in splits_of(info, task, split) for row in info.rows(task, s)], limit)
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise ReleaseError(f"{info.path}: {task} has two rows with id {row['id']!r}")
        seen.add(row["id"])
    runtime = [mode.name for mode in modes if mode.needs_snapshot]
    if runtime and rows and not any(row.get("variables_before") for row in rows):
        raise ReleaseError(f"{info.path}: context mode {runtime[0]} needs runtime snapshots, and no {task} row "
                           f"has any (variables_before is empty everywhere); use --context {BASELINE_CONTEXT}")
    if not runtime:
        return rows
    joined = []
    for part in splits_of(info, task, split):  # test rows come first, so the order stays the spread one
        ids = set(info.ids(task, part))
        joined += _joined(info, [r for r in rows if r["id"] in ids], part,
                          times=any(mode.needs_times for mode in modes),
                          trace=any(mode.per_cell for mode in modes))
    return joined
