"""What the benchmarks share: where the real JuNE logs lie, a look-alike workspace made once per run, and the
harness (arguments, the human table and one JSON line of figures)."""

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


def arguments(doc: str):
    """The bench's argument parser: its description is the first line of the bench's docstring."""
    import argparse

    return argparse.ArgumentParser(description=doc.strip().splitlines()[0])


def load() -> float:
    """The 1-minute load average (figures from a busy machine are quoted with it)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def median(values) -> float | None:
    import statistics

    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A plain-text table: `columns` are (key, header) pairs; floats get three significant decimals."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
        return "-" if value is None else str(value)

    body = [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max([len(header)] + [len(line[i]) for line in body]) for i, (_, header) in enumerate(columns)]
    lines = ["  ".join(header.rjust(w) for (_, header), w in zip(columns, widths))]
    lines += ["  ".join(value.rjust(w) for value, w in zip(line, widths)) for line in body]
    return "\n".join(lines)


def report(bench: str, figures: dict, rows: list[dict] | None = None,
           columns: list[tuple[str, str]] | None = None) -> None:
    """Print the human table (when rows are given), then the figures as one JSON line tagged with the bench's name
    and the machine's load."""
    import json

    if rows and columns:
        print(table(rows, columns))
    print(json.dumps({"bench": bench, **figures, "load": load()}, default=str))
