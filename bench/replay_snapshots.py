"""Replay time with a runtime snapshot after every step versus without, and with the values stored as well (the
replay's default, themisto.replay.values), and steps per second.

Replays the first N steps of the real task-1 trajectory without snapshots, with them, and with them and their values
(same workspace, fresh kernel each time, the order rotated each round), `--rounds` times, and prints the medians, the
ratios, and one JSON line with the load average. Never asserted on.

    python bench/replay_snapshots.py [--steps 150] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TASK1_LOG, add_record_options, finish, prefix, workspace  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_options(parser)
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from themisto.ingest.june_log import read_june_log
    from themisto.replay.replay import ReplaySettings, replay_trajectory
    from themisto.replay.values import ValueFolder

    traj = prefix(read_june_log(args.log), args.steps)
    keep, ws = workspace()
    variants = ("without", "snapshots", "values")
    times: dict[str, list[float]] = {v: [] for v in variants}
    snapshot_bytes, values_bytes = [], []
    for round_ in range(args.rounds):
        # rotate which variant runs first, so a warming machine or page cache favours none
        for variant in variants[round_ % 3:] + variants[:round_ % 3]:
            with tempfile.TemporaryDirectory(prefix="themisto-bench-values-") as tmp:
                store = ValueFolder(Path(tmp)) if variant == "values" else None
                t0 = time.perf_counter()
                for step in replay_trajectory(traj, ws, ReplaySettings(snapshots=variant != "without"),
                                              values=store):
                    if variant == "snapshots":
                        snapshot_bytes.append(len(json.dumps(step.variables)))
                times[variant].append(time.perf_counter() - t0)
                if store is not None:
                    values_bytes.append(sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()))
            print(f"{variant}: {times[variant][-1]:.1f} s", file=sys.stderr, flush=True)
    with_s, without_s, values_s = (statistics.median(times[v]) for v in ("snapshots", "without", "values"))
    n = len(traj.executions)
    summary = {"bench": "replay_snapshots", "steps": n, "with_snapshots_s": round(with_s, 2),
               "without_snapshots_s": round(without_s, 2), "with_values_s": round(values_s, 2),
               "overhead": round(with_s / without_s - 1, 4), "values_overhead": round(values_s / with_s - 1, 4),
               "steps_per_s_with": round(n / with_s, 2), "steps_per_s_without": round(n / without_s, 2),
               "steps_per_s_with_values": round(n / values_s, 2),
               "median_snapshot_json_bytes": int(statistics.median(snapshot_bytes)) if snapshot_bytes else None,
               "values_folder_bytes": max(values_bytes, default=None), "load_average": os.getloadavg()}
    print(f"{n} steps: {with_s:.1f} s with snapshots, {without_s:.1f} s without "
          f"(+{100 * summary['overhead']:.1f} %), {values_s:.1f} s with snapshots and values "
          f"(+{100 * summary['values_overhead']:.1f} % over snapshots alone); "
          f"{summary['steps_per_s_with']:.1f} steps/s with snapshots")
    print(json.dumps(summary))
    finish("replay_snapshots", {k: v for k, v in summary.items() if k != "bench"}, args)
    keep.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
