"""The release as a run reads it: its content hash, one task's test rows, checked for what the context modes need."""

from __future__ import annotations

from pathlib import Path

from themisto.release.folder import TRAJECTORIES, ReleaseError, ReleaseInfo, open_release
from themisto.vocabulary import BASELINE_CONTEXT, BENCHMARK_SPLIT


def release_info(release: str | Path, task: str, split: str = BENCHMARK_SPLIT) -> ReleaseInfo:
    """The release (`themisto.release.folder.open_release`), which must have the task's split (test unless told)."""
    info = open_release(release)
    info.require(task, split)
    return info


def spread(rows: list[dict], limit: int | None) -> list[dict]:
    """`limit` rows evenly spaced over the file (so across trajectories and positions), or all of them."""
    if limit is None or limit >= len(rows):
        return rows
    return [rows[i * len(rows) // limit] for i in range(limit)]


def _with_execution_times(info: ReleaseInfo, rows: list[dict], split: str = BENCHMARK_SPLIT) -> list[dict]:
    """History cells gain their execution time from the trajectories config (task rows do not carry it)."""
    if not info.has(TRAJECTORIES, split):
        return rows
    times = {(r["kernel_id"], r["step"]): r["execution_time"]
             for r in info.rows(TRAJECTORIES, split, columns=["kernel_id", "step", "execution_time"])}
    return [{**row, "history": [{**cell, "execution_time": times.get((row["kernel_id"], cell["step"]))}
                                for cell in row["history"] or []]} for row in rows]


def load_task_rows(info: ReleaseInfo, task: str, contexts: tuple[str, ...], *, limit: int | None = None,
                   split: str = BENCHMARK_SPLIT) -> list[dict]:
    """The task's rows of `split` (`limit` of them, spread), checked for ids and for the snapshots the modes need."""
    rows = spread(info.rows(task, split), limit)
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise ReleaseError(f"{info.path}: {task} has two rows with id {row['id']!r}")
        seen.add(row["id"])
    runtime = [c for c in contexts if c != BASELINE_CONTEXT]
    if runtime and rows and not any(row.get("variables_before") for row in rows):
        raise ReleaseError(f"{info.path}: context mode {runtime[0]} needs runtime snapshots, and no {task} row "
                           f"has any (variables_before is empty everywhere); use --context none")
    return _with_execution_times(info, rows, split) if "full" in contexts else rows
