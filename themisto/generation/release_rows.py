"""The release as a run reads it: its content hash, one task's test rows, checked for what the context modes need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from themisto.release.parquet import BUILD_FILE, ReleaseError, content_hash, parquet_name, sha256_file

SPLIT = "test"


@dataclass(frozen=True)
class ReleaseInfo:
    """A release folder, its content hash (as its build recorded it) and its Parquet files with their sha256."""

    path: Path
    content_hash: str
    files: dict[str, str]


def release_info(release: str | Path, task: str, split: str = SPLIT) -> ReleaseInfo:
    """Read the build record; the task's split (test unless told) must exist and be the file the build wrote."""
    path = Path(release)
    build_file = path / BUILD_FILE
    if not build_file.is_file():
        raise ReleaseError(f"{path}: not a release folder (no {BUILD_FILE}); build one with `themisto build`")
    try:
        build = json.loads(build_file.read_text(encoding="utf-8"))
        files = dict(build["files"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ReleaseError(f"{build_file}: not a build record ({exc})") from None
    rel = parquet_name(task, split)
    if rel not in files or not (path / rel).is_file():
        have = sorted({name.split("/")[0] for name in files if name.endswith(f"{split}-00000-of-00001.parquet")})
        raise ReleaseError(f"{path}: the release has no {task} {split} split (it has: {', '.join(have) or 'none'})")
    recorded = build.get("content_sha256") or content_hash(files)
    return ReleaseInfo(path, recorded, files)


def _read(info: ReleaseInfo, rel: str) -> list[dict]:
    import pyarrow.parquet as pq

    path = info.path / rel
    if sha256_file(path) != info.files.get(rel):
        raise ReleaseError(f"{path}: changed since the release was built (its sha256 differs from {BUILD_FILE})")
    return pq.read_table(path).to_pylist()


def spread(rows: list[dict], limit: int | None) -> list[dict]:
    """`limit` rows evenly spaced over the file (so across trajectories and positions), or all of them."""
    if limit is None or limit >= len(rows):
        return rows
    return [rows[i * len(rows) // limit] for i in range(limit)]


def read_rows(info: ReleaseInfo, config: str, split: str = SPLIT) -> list[dict]:
    """All rows of one config's split, from the file the build wrote (a changed file is an error)."""
    return _read(info, parquet_name(config, split))


def _with_execution_times(info: ReleaseInfo, rows: list[dict], split: str = SPLIT) -> list[dict]:
    """History cells gain their execution time from the trajectories config (task rows do not carry it)."""
    rel = parquet_name("trajectories", split)
    if rel not in info.files:
        return rows
    times = {(r["kernel_id"], r["step"]): r["execution_time"] for r in _read(info, rel)}
    return [{**row, "history": [{**cell, "execution_time": times.get((row["kernel_id"], cell["step"]))}
                                for cell in row["history"] or []]} for row in rows]


def load_task_rows(info: ReleaseInfo, task: str, contexts: tuple[str, ...], *, limit: int | None = None,
                   split: str = SPLIT) -> list[dict]:
    """The task's rows of `split` (`limit` of them, spread), checked for ids and for the snapshots the modes need."""
    rows = spread(_read(info, parquet_name(task, split)), limit)
    seen: set[str] = set()
    for row in rows:
        if row["id"] in seen:
            raise ReleaseError(f"{info.path}: {task} has two rows with id {row['id']!r}")
        seen.add(row["id"])
    runtime = [c for c in contexts if c != "none"]
    if runtime and rows and not any(row.get("variables_before") for row in rows):
        raise ReleaseError(f"{info.path}: context mode {runtime[0]} needs runtime snapshots, and no {task} row "
                           f"has any (variables_before is empty everywhere); use --context none")
    return _with_execution_times(info, rows, split) if "full" in contexts else rows
