"""Fixtures shared by the leaderboard tests: a tiny release replayed in a real kernel (built once per session), and
run folders written per the run-folder contract (the previous cell / previous output as predictions)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from themisto.ingest.trajectory import Execution, Trajectory
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings, trajectory_rows
from themisto.replay.replay import ReplaySettings, replay_trajectory

KERNEL = "lb-kernel"
CELLS = [
    "numbers = [4, 2, 9]",
    "print(len(numbers))",
    "numbers.append(1)",
    "print(sorted(numbers))",
    "total = sum(numbers)",
    "print(total)",
    "mean = total / len(numbers)",
    "print(round(mean, 2))",
    "numbers = [n * 2 for n in numbers]",
    "print(numbers)",
    "print(max(numbers))",
]


def tiny_release(tmp_path_factory) -> Path:
    """A release of one short trajectory with every eligible row in `test`; built once per test session."""
    out = tmp_path_factory.getbasetemp() / "leaderboard-release"
    if (out / "themisto_build.json").is_file():
        return out
    workspace = tmp_path_factory.mktemp("leaderboard-ws")
    trajectory = Trajectory(id=KERNEL, notebook="task1.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                        for i, code in enumerate(CELLS)])
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20)))
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0,
                                                            output_sample_size=None),
                  source={"kind": "test", "workspace": {"given": "leaderboard-ws"}})
    return out


def task_rows(release: Path, task: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(release / task / "test-00000-of-00001.parquet").to_pylist()


def previous(row: dict, task: str) -> str:
    """The model-free answer: the previous cell's code (next_cell) or its output (output_prediction)."""
    if not row["history"]:
        return ""
    return row["history"][-1]["code" if task == "next_cell" else "output"] or ""


def write_run(folder: Path, release: Path, *, task: str = "next_cell", model: str = "test/previous",
              contexts: tuple[str, ...] = ("none", "variables"), predict=None, finished: str = "2026-12-01T00:00:00Z",
              n: int = 1) -> Path:
    """A run folder per the contract; `predict(row, context, sample)` gives each prediction (default: previous)."""
    build = json.loads((release / "themisto_build.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    templates = {c: {"text": f"template {c}", "sha256": hashlib.sha256(c.encode()).hexdigest()} for c in contexts}
    run = {"format": 1, "task": task, "contexts": list(contexts), "backend": "baseline", "backend_version": "1",
           "model": model, "model_revision": None, "sampling": {"n": n, "temperature": 0.0, "top_p": 1.0,
                                                                "max_new_tokens": 64, "seed": 0},
           "templates": templates, "release": {"path": str(release), "content_hash": build["content_sha256"]},
           "split": "test", "limit": None, "packages": {}, "git_commit": None, "started": finished,
           "finished": finished, "tokens_in": 0, "tokens_out": 0, "generations_per_s": None}
    (folder / "run.json").write_text(json.dumps(run, indent=2))
    lines = []
    for context in contexts:
        for sample in range(n):
            for row in task_rows(release, task):
                text = predict(row, context, sample) if predict else previous(row, task)
                lines.append(json.dumps({"id": row["id"], "task": task, "context": context, "sample": sample,
                                         "prediction": text, "raw": text, "status": "ok", "reason": None,
                                         "tokens_in": None, "tokens_out": None}))
    (folder / "generations.jsonl").write_text("\n".join(lines) + "\n")
    return folder
