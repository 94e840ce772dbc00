"""A short trajectory replayed in a real sandboxed kernel and built into a release, for the `probe` mode's tests: its
states hold a list, a number, a dict and a pandas frame, and its workspace a data file."""

from __future__ import annotations

from pathlib import Path

KERNEL = "probe-kernel"
CELLS = ["words = ['a', 'b']", "total = sum(range(10))", "print(len(words))", "scores = {w: len(w) for w in words}",
         "words.append('c')", "print(words, total)", "import pandas as pd\nframe = pd.DataFrame({'n': range(4)})",
         "half = total // 2", "print(half, scores)", "frame['m'] = frame['n'] * half", "print(frame.shape)",
         "x = half + 1", "print(x, len(frame))"]
NOTES = "private notes of this workspace\n"


def build_probe_release(root: Path) -> tuple[Path, Path]:
    """Replay CELLS over a workspace holding notes.txt and build a release whose every example is in `test`; the
    release folder and the workspace."""
    from themisto.ingest.trajectory import Execution, Trajectory
    from themisto.release.parquet import build_release
    from themisto.release.tasks import TaskSettings, trajectory_rows
    from themisto.replay.replay import ReplaySettings, replay_trajectory

    workspace = root / "ws"
    workspace.mkdir(parents=True)
    (workspace / "notes.txt").write_text(NOTES)
    trajectory = Trajectory(id=KERNEL, notebook="task1.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                        for i, code in enumerate(CELLS)])
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=30)))
    assert all(s.status == "ok" for s in steps), [(s.step, s.ename, s.evalue) for s in steps if s.status != "ok"]
    release = root / "release"
    build_release(trajectory_rows(steps), release, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": "ws"}})
    return release, workspace
