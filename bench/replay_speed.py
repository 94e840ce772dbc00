"""Replay's wall time against the cells' own run times, sequential and with one worker per core, in one run.

Reads every real JuNE log under the data folder (../shared/data/june and its subfolders; THEMISTO_JUNE_DIR moves
it) through the one ingest door, and replays all its trajectories into a steps file twice over the same look-alike
workspace: one trajectory after the other (`--workers 1`), then one worker per core
(`themisto.replay.workers`), alternating which goes first over `--rounds`. For each run it prints the wall time,
the sum of the cells' own run times (each step's `execution_time`), their ratio, and the load average before and
after; then the speed-up of the parallel run, beside the most the trajectories' lengths allow (no trajectory can be
split: the longest one's cells bound the parallel run's wall time). The parallel run starts the costliest
trajectories first by what their last replay took (themisto.replay.costs; the sequential run before it records
them), else by step count: each run says for how many the cost was known. Never asserted on; one JSON line at the
end.

    python bench/replay_speed.py [--limit STEPS] [--rounds 1] [--workers N] [--keep DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import JUNE_DIR, arguments, load, report, workspace  # noqa: E402


def real_trajectories(limit: int | None) -> tuple[list, int]:
    """Every trajectory of the real logs, read through the one ingest door (a participant's kernels on one notebook
    joined), and how many log files it read."""
    from themisto.ingest.inputs import read_inputs

    ingested = read_inputs([JUNE_DIR])
    trajectories = [t for t in ingested.trajectories if t.executions]
    if limit:
        trajectories = [replace(t, executions=t.executions[:limit], events=[e for e in t.events if e.before < limit])
                        for t in trajectories]
    return trajectories, len(ingested.files)


def one_run(trajectories: list, ws: Path, out: Path, workers: int) -> dict:
    """Replay everything into `out` with `workers` at once: wall time, the cells' own time, per-trajectory cells."""
    from themisto.replay.costs import known_costs
    from themisto.replay.replay import ReplaySettings
    from themisto.replay.steps_file import read_steps, replay_to_file
    from themisto.replay.workers import workers_runner

    out.unlink(missing_ok=True)
    costs_known = len(known_costs(trajectories))
    before = load()
    started = time.perf_counter()
    run = replay_to_file(trajectories, out, ws, ReplaySettings(), resume=False, runner=workers_runner(workers),
                         progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True))
    wall = time.perf_counter() - started
    cells: dict[str, float] = {}
    for step in read_steps(out):
        cells[step.kernel_id] = cells.get(step.kernel_id, 0.0) + step.execution_time
    total = sum(cells.values())
    return {"workers": workers, "steps": run.steps, "wall_s": round(wall, 1), "cells_s": round(total, 1),
            "wall_over_cells": round(wall / total, 3) if total else None, "load_before": before, "load_after": load(),
            "costs_known": costs_known,
            "longest_cells_s": round(max(cells.values(), default=0.0), 1)}


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--limit", type=int, help="replay only the first STEPS executions of each trajectory")
    parser.add_argument("--rounds", type=int, default=1, help="sequential/parallel pairs, alternating the order")
    parser.add_argument("--workers", type=int, help="workers of the parallel run (default: one per core)")
    parser.add_argument("--keep", type=Path, help="write the steps files into DIR (default: a temporary folder)")
    args = parser.parse_args()
    from themisto.settings import usable_cores

    workers = args.workers or usable_cores()
    trajectories, logs = real_trajectories(args.limit)
    if not trajectories:
        raise SystemExit(f"bench: no JuNE log under {JUNE_DIR}")
    print(f"{len(trajectories)} trajectories, {sum(len(t.executions) for t in trajectories)} executions from {logs} "
          f"logs under {JUNE_DIR}; {workers} workers on {os.cpu_count()} cores", file=sys.stderr)
    keep, ws = workspace()
    runs = []
    with tempfile.TemporaryDirectory(prefix="themisto-bench-replay-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for round_ in range(args.rounds):
            order = (1, workers) if round_ % 2 == 0 else (workers, 1)
            for count in order:
                print(f"round {round_ + 1}: {count} worker(s)", file=sys.stderr, flush=True)
                runs.append({"round": round_ + 1, **one_run(trajectories, ws, folder / f"steps-{count}.jsonl", count)})
    keep.cleanup()

    def median_wall(count: int) -> float:
        import statistics

        return statistics.median(r["wall_s"] for r in runs if r["workers"] == count)

    sequential, parallel = median_wall(1), median_wall(workers)
    cells = runs[0]["cells_s"]
    # the parallel run cannot end before its longest trajectory has run, nor beat `workers` times
    bound = min(workers, cells / runs[0]["longest_cells_s"]) if runs[0]["longest_cells_s"] else None
    figures = {"trajectories": len(trajectories), "executions": sum(len(t.executions) for t in trajectories),
               "logs": logs, "workers": workers, "sequential_wall_s": sequential,
               "parallel_wall_s": parallel, "speedup": round(sequential / parallel, 3),
               "speedup_bound": None if bound is None else round(bound, 2),
               "sequential_wall_over_cells": next(r["wall_over_cells"] for r in runs if r["workers"] == 1),
               "runs": runs}
    print(f"sequential: {sequential:.1f} s wall for {cells:.1f} s of the cells' own time "
          f"({figures['sequential_wall_over_cells']}x; target <= 1.2x)")
    print(f"{workers} workers: {parallel:.1f} s wall, {figures['speedup']}x faster than sequential (target >= 1.8x; "
          f"the trajectories' lengths allow at most {figures['speedup_bound']}x)")
    report("replay_speed", figures, runs, [("round", "round"), ("workers", "workers"), ("steps", "steps"),
                                           ("wall_s", "wall s"), ("cells_s", "cells s"),
                                           ("wall_over_cells", "wall/cells"), ("load_before", "load before"),
                                           ("load_after", "load after"), ("costs_known", "costs known")],
           args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
