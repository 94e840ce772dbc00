"""What the benchmarks share: where the real JuNE logs lie, a look-alike workspace made once per run, and the
harness (arguments, the human table, one JSON line of figures, and the entry of docs/measurements.md the run makes:
printed always, appended with --record)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASUREMENTS = REPO / "docs" / "measurements.md"
# New entries go right below this line of docs/measurements.md (the record is kept newest first).
RECORD_MARKER = "<!-- record: newest first; bench --record inserts below this line -->"
_LOAD_AT_START: list[float] = []
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
    """The bench's argument parser: its description is the first line of the bench's docstring; it takes --record
    and --changed (add_record_options)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    add_record_options(parser)
    return parser


def add_record_options(parser) -> None:
    """--record (append this run's entry to docs/measurements.md) and --changed TEXT (the entry's "what changed");
    notes the load as the bench starts, for the entry."""
    _LOAD_AT_START[:] = [load()]
    parser.add_argument("--record", action="store_true",
                        help="append this run's entry to docs/measurements.md (newest first)")
    parser.add_argument("--changed", default="", metavar="TEXT",
                        help="what changed since the last entry of this bench, for the recorded entry")


def host() -> dict:
    """The machine an entry was measured on: CPU model, cores, and whether it computes in bfloat16 natively
    (AVX512-BF16 or AMX, read from /proc/cpuinfo's flags; elsewhere torch emulates it)."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"})}


def _command(argv: list[str]) -> str:
    import shlex

    kept, skip = [], False
    for word in argv[1:]:
        if skip:
            skip = False
        elif word == "--changed":
            skip = True
        elif word != "--record" and not word.startswith("--changed="):
            kept.append(word)
    return " ".join(["python", f"bench/{Path(argv[0]).name}", *map(shlex.quote, kept)])


def _figure(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, default=str, separators=(", ", ": "))


def entry(bench: str, figures: dict, *, changed: str = "", argv: list[str] | None = None,
          today: str | None = None, machine: dict | None = None, loads: tuple | None = None) -> str:
    """The Markdown entry of docs/measurements.md for one run: a dated heading, the command, the host, the load
    (1-minute average at the start and at the end), every figure, and what changed."""
    import datetime
    import subprocess
    import sys

    today = today or datetime.date.today().isoformat()
    machine = machine or host()
    start, end = loads or ((_LOAD_AT_START or [None])[0], load())
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    lines = [f"### {today}: {bench}", "",
             f"- **Command**: `{_command(argv or sys.argv)}` (commit {commit})",
             f"- **Host**: {machine['cpu']}, {machine['cores']} cores, native bf16: "
             f"{'yes' if machine['native_bf16'] else 'no'}",
             f"- **Load**: {start if start is not None else '?'} at the start, {end} at the end (1-minute average)",
             "- **Figures**:", *(f"  - {key}: {_figure(value)}" for key, value in figures.items()),
             f"- **What changed**: {changed or 'not said (--changed TEXT)'}"]
    return "\n".join(lines) + "\n"


def record(text: str, page: Path = MEASUREMENTS) -> None:
    """Insert an entry right below the record's marker of `page` (newest first), the rest of the page kept."""
    from themisto.resume import write_text_atomic

    current = page.read_text(encoding="utf-8")
    at = current.find(RECORD_MARKER)
    if at < 0:
        raise SystemExit(f"{page}: no record marker ({RECORD_MARKER}); the entry is not recorded")
    at += len(RECORD_MARKER)
    write_text_atomic(page, current[:at] + "\n\n" + text.rstrip("\n") + current[at:])


def finish(bench: str, figures: dict, args=None, *, quiet: bool = False) -> None:
    """Print the run's entry of docs/measurements.md (not when `quiet`: a --json run prints only its JSON); with
    --record, append it there."""
    text = entry(bench, figures, changed=getattr(args, "changed", "") or "")
    recording = bool(getattr(args, "record", False))
    if not quiet:
        print("\nThe entry of docs/measurements.md for this run"
              + (" (recorded):" if recording else " (--record appends it):"))
        print(text, end="")
    if recording:
        record(text)


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
           columns: list[tuple[str, str]] | None = None, args=None) -> None:
    """Print the human table (when rows are given), then the figures as one JSON line tagged with the bench's name
    and the machine's load, then the run's entry of docs/measurements.md (appended there with --record)."""
    import json

    if rows and columns:
        print(table(rows, columns))
    print(json.dumps({"bench": bench, **figures, "load": load()}, default=str))
    finish(bench, figures, args)
