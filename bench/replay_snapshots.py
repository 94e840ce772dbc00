"""Replay time with a runtime snapshot after every step versus without, and steps per second.

Replays the first N steps of the real task-1 trajectory alternately with and without snapshots (same workspace,
fresh kernel each time), `--rounds` times, and prints the medians, the ratio, and one JSON line. Never asserted on.

    python bench/replay_snapshots.py [--steps 150] [--rounds 2]
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
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from themisto.ingest.june_log import read_june_log
    from themisto.replay.replay import ReplaySettings, replay_trajectory

    traj = prefix(read_june_log(args.log), args.steps)
    keep, ws = workspace()
    times: dict[bool, list[float]] = {True: [], False: []}
    snapshot_bytes = []
    for round_ in range(args.rounds):
        # alternate which variant runs first, so a warming machine or page cache favours neither
        for snapshots in ((True, False) if round_ % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            for step in replay_trajectory(traj, ws, ReplaySettings(snapshots=snapshots)):
                if snapshots:
                    snapshot_bytes.append(len(json.dumps(step.variables)))
            times[snapshots].append(time.perf_counter() - t0)
            print(f"snapshots={snapshots}: {times[snapshots][-1]:.1f} s", file=sys.stderr, flush=True)
    with_s, without_s = statistics.median(times[True]), statistics.median(times[False])
    n = len(traj.executions)
    summary = {"bench": "replay_snapshots", "steps": n, "with_snapshots_s": round(with_s, 2),
               "without_snapshots_s": round(without_s, 2), "overhead": round(with_s / without_s - 1, 4),
               "steps_per_s_with": round(n / with_s, 2), "steps_per_s_without": round(n / without_s, 2),
               "median_snapshot_json_bytes": int(statistics.median(snapshot_bytes))}
    print(f"{n} steps: {with_s:.1f} s with snapshots, {without_s:.1f} s without "
          f"(+{100 * summary['overhead']:.1f} %); {summary['steps_per_s_with']:.1f} steps/s with snapshots")
    print(json.dumps(summary))
    keep.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
