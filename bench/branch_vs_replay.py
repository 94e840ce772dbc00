"""Per-candidate cost of branch execution (fork of the live kernel) versus prefix replay, on the real task-1 trajectory.

At steps spread across the trajectory, one candidate (the developer's own cell) is scored both ways in the same run:
- branch: the trajectory is replayed once; at the step, the candidate runs in a forked child of the kernel;
- prefix replay: a fresh kernel replays every earlier step, then runs the candidate (what notebook benchmarks do).
Prints the figures per step and the ratio, then one JSON line. Never asserted on: machines differ.

    python bench/branch_vs_replay.py [--points 0.25 0.5 0.75] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TASK1_LOG, prefix, workspace  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--points", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                        help="where to score, as fractions of the trajectory (0.5 = the median step)")
    parser.add_argument("--repeats", type=int, default=3, help="branch runs per step (median taken)")
    args = parser.parse_args()

    from themisto.runtime.branch import run_branches
    from themisto.ingest.cleaning import clean_for_replay
    from themisto.ingest.june import read_june_log
    from themisto.runtime.kernel import KernelSession
    from themisto.replay.replay import ReplaySettings, kernel_limits, replay

    traj = read_june_log(args.log)
    n = len(traj.executions)
    steps = sorted({min(n - 1, max(1, round(p * n))) for p in args.points})
    settings = ReplaySettings(snapshots=False)
    keep, ws = workspace()
    branch_s: dict[int, float] = {}

    def at_step(_traj, i, session):
        if i in steps:
            code = clean_for_replay(traj.executions[i].code).code
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                run_branches(session, [code], timeout_s=settings.cell_timeout_s)
                times.append(time.perf_counter() - t0)
            branch_s[i] = statistics.median(times)
            print(f"step {i}: branch {branch_s[i] * 1000:.0f} ms per candidate", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    with KernelSession(ws, kernel_limits(settings)) as session:
        for _ in replay(prefix(traj, max(steps) + 1), session, settings, before_step=at_step):
            pass
    one_replay_s = time.perf_counter() - t0

    replay_s: dict[int, float] = {}
    for i in steps:
        code = clean_for_replay(traj.executions[i].code).code
        t0 = time.perf_counter()
        with KernelSession(ws, kernel_limits(settings)) as session:
            for _ in replay(prefix(traj, i), session, settings):
                pass
            session.execute(code, timeout=settings.cell_timeout_s)
        replay_s[i] = time.perf_counter() - t0
        print(f"step {i}: prefix replay {replay_s[i]:.1f} s per candidate", file=sys.stderr, flush=True)

    rows = []
    print(f"\n{'step':>6} {'branch ms':>10} {'prefix replay s':>16} {'ratio':>8}")
    for i in steps:
        ratio = replay_s[i] / branch_s[i]
        rows.append({"step": i, "branch_s": round(branch_s[i], 4), "prefix_replay_s": round(replay_s[i], 2),
                     "ratio": round(ratio, 1)})
        print(f"{i:>6} {branch_s[i] * 1000:>10.0f} {replay_s[i]:>16.1f} {ratio:>8.0f}x")
    median_step = steps[len(steps) // 2]
    summary = {"bench": "branch_vs_replay", "trajectory": traj.id, "steps": n, "points": rows,
               "median_step": median_step,
               "ratio_at_median_step": round(replay_s[median_step] / branch_s[median_step], 1),
               "one_replay_s": round(one_replay_s, 1)}
    print(f"at the median step ({median_step} of {n}) a branch is "
          f"{summary['ratio_at_median_step']:.0f}x cheaper than replaying the prefix")
    print(json.dumps(summary))
    keep.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
