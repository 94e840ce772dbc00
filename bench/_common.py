"""What the benchmarks share: where the real JuNE logs lie and a look-alike workspace made once per run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JUNE_DIR = Path(os.environ.get("THEMISTO_JUNE_DIR", REPO.parent / "shared" / "data" / "june"))
TASK1_LOG = JUNE_DIR / "bc147b33-fa74-4bff-9f48-c88809c5bdcd.log"
TASK2_LOG = JUNE_DIR / "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"


def workspace(seed: int = 0, size: str = "small") -> tuple[tempfile.TemporaryDirectory, Path]:
    """A temporary look-alike workspace; keep the returned TemporaryDirectory alive while it is used."""
    from themisto.ingest.workspace import write_workspace

    tmp = tempfile.TemporaryDirectory(prefix="themisto-bench-")
    return tmp, write_workspace(Path(tmp.name) / "ws", seed=seed, size=size).root


def prefix(trajectory, end: int):
    """The trajectory cut before step `end` (its restarts included), as a new Trajectory."""
    from dataclasses import replace

    return replace(trajectory, executions=trajectory.executions[:end],
                   events=[ev for ev in trajectory.events if ev.before < end])
