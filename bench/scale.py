"""Scaling out: replay steps/s per kernel and per core here, the sample on 1 and 2 local Ray workers, and what
100k trajectories of 50 cells would take on a cluster.

1. Replays the shipped sample (data/sample, 6 trajectories) one kernel at a time in this process: steps/s per kernel.
2. Replays it through `themisto.distributed` on a local Ray with 1 CPU, then with 2 (one kernel per CPU), timing
   from the first task submitted to the last result written (Ray's own start is reported apart): the ratio.
3. Projects from the 2-worker figure: per-core throughput × the measured parallel efficiency, for nodes of
   `--node-cores` cores, the wall time of `--trajectories` × `--cells` steps, and the nodes needed for `--hours`.

Never asserted on; prints a table and one JSON line. On a shared or busy machine the ratio drops: say so when you
quote it (`load` in the JSON is the 1-minute load average before and after).

    python bench/scale.py [--limit 0] [--rounds 1] [--node-cores 32] [--hours 24]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, add_record_options, finish, workspace  # noqa: E402


def sample_trajectories(limit: int) -> list:
    from themisto.ingest.june_log import read_june_logs

    trajectories = read_june_logs(sorted((REPO / "data" / "sample").glob("*.log")))
    if limit:
        trajectories = [replace(t, executions=t.executions[:limit], events=[e for e in t.events if e.before < limit])
                        for t in trajectories]
    return trajectories


def local_run(trajectories, ws: Path, out: Path) -> dict:
    """One kernel at a time, in this process: per-kernel throughput, and the steps' size and peak memory."""
    from themisto.replay.replay import ReplaySettings
    from themisto.replay.steps_file import read_steps, replay_to_file

    t0 = time.perf_counter()
    run = replay_to_file(trajectories, out, ws, ReplaySettings(), resume=False, progress=lambda msg: None)
    wall = time.perf_counter() - t0
    steps = read_steps(out)
    return {"steps": run.steps, "wall_s": round(wall, 2), "steps_per_s": round(run.steps / wall, 3),
            "bytes_per_step": round(out.stat().st_size / run.steps),
            "peak_kernel_memory_mb": round(max(s.memory_bytes or 0 for s in steps) / 2**20)}


def ray_run(trajectories, ws: Path, out: Path, cpus: int) -> dict:
    """The same replay on a fresh local Ray with `cpus` CPUs; replay wall time excludes Ray's start and stop."""
    from themisto.distributed.cluster import RayTarget
    from themisto.distributed.ray_runner import replay_runner
    from themisto.replay.replay import ReplaySettings
    from themisto.replay.steps_file import replay_to_file

    marks: dict[str, float] = {}

    def progress(msg: str) -> None:
        if msg.startswith("Ray:"):  # said right before the first task is submitted
            marks["first_submit"] = time.perf_counter()
        marks["last_result"] = time.perf_counter()

    temp_dir = tempfile.mkdtemp(prefix="ray-bench-", dir="/tmp")
    try:
        t0 = time.perf_counter()
        run = replay_to_file(trajectories, out, ws, ReplaySettings(), resume=False, progress=progress,
                             runner=replay_runner(RayTarget(num_cpus=cpus, temp_dir=temp_dir)))
        total = time.perf_counter() - t0
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    replay_wall = marks["last_result"] - marks["first_submit"]
    return {"cpus": cpus, "steps": run.steps, "replay_wall_s": round(replay_wall, 2), "total_s": round(total, 2),
            "ray_overhead_s": round(total - replay_wall, 2), "steps_per_s": round(run.steps / replay_wall, 3)}


def projection(steps_per_s_per_core: float, *, trajectories: int, cells: int, node_cores: int, hours: float) -> dict:
    """Wall time and node counts for `trajectories` × `cells` steps at a per-core rate measured with every core busy
    (so it already carries the contention of full nodes; tasks are independent, so nodes add linearly)."""
    steps = trajectories * cells
    core_hours = steps / steps_per_s_per_core / 3600
    node_rate = steps_per_s_per_core * node_cores  # steps/s of one node
    table = {nodes: round(steps / (node_rate * nodes) / 3600, 2) for nodes in (1, 4, 16, 64)}
    return {"steps": steps, "core_hours": round(core_hours, 1), "node_cores": node_cores,
            "wall_hours_by_nodes": table, "hours": hours,
            "nodes_for_hours": math.ceil(steps / (node_rate * hours * 3600))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_record_options(parser)
    parser.add_argument("--limit", type=int, default=0, help="replay only each trajectory's first N steps (0: all)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the 1- and 2-worker runs, alternating order")
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--cells", type=int, default=50)
    parser.add_argument("--node-cores", type=int, default=32)
    parser.add_argument("--hours", type=float, default=24.0, help="the projection's target wall time")
    args = parser.parse_args()

    trajectories = sample_trajectories(args.limit)
    keep, ws = workspace()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="themisto-scale-") as tmp:
        local = local_run(trajectories, ws, Path(tmp) / "local.jsonl")
        print(f"local, one kernel: {local['steps']} steps in {local['wall_s']} s = {local['steps_per_s']} steps/s "
              f"per kernel", file=sys.stderr, flush=True)
        runs: dict[int, list[dict]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            for cpus in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                result = ray_run(trajectories, ws, Path(tmp) / f"ray{cpus}.jsonl", cpus)
                runs[cpus].append(result)
                print(f"Ray, {cpus} worker(s): {result['replay_wall_s']} s replay (+{result['ray_overhead_s']} s Ray "
                      f"start/stop) = {result['steps_per_s']} steps/s", file=sys.stderr, flush=True)
    keep.cleanup()
    one = statistics.median(r["replay_wall_s"] for r in runs[1])
    two = statistics.median(r["replay_wall_s"] for r in runs[2])
    ratio = one / two
    per_core = local["steps"] / two / 2
    project = projection(per_core, trajectories=args.trajectories, cells=args.cells,
                         node_cores=args.node_cores, hours=args.hours)
    summary = {"bench": "scale", "cores_here": os.cpu_count(), "load": [round(load_before, 2),
                                                                        round(os.getloadavg()[0], 2)],
               "local": local, "ray": runs, "ratio_2_vs_1": round(ratio, 3), "efficiency_2": round(ratio / 2, 3),
               "steps_per_s_per_core": round(per_core, 3), "projection": project}
    print(f"\nper kernel (local, one at a time): {local['steps_per_s']} steps/s; "
          f"per core with 2 Ray workers: {per_core:.3f} steps/s")
    print(f"1 worker {one:.1f} s, 2 workers {two:.1f} s: ratio {ratio:.2f}x (target >= 1.7x on 2 cores; "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"projection, {args.trajectories:,} trajectories x {args.cells} cells = {project['steps']:,} steps: "
          f"{project['core_hours']:,} core-hours at the per-core rate measured with 2 workers")
    for nodes, hours in project["wall_hours_by_nodes"].items():
        print(f"  {nodes:>3} node(s) of {args.node_cores} cores: {hours:,} h")
    print(f"  {project['nodes_for_hours']} node(s) of {args.node_cores} cores finish in {args.hours:g} h; "
          f"steps file ~{local['bytes_per_step'] * project['steps'] / 2**30:.0f} GiB; "
          f"kernel peak here {local['peak_kernel_memory_mb']} MB -> ~{local['peak_kernel_memory_mb'] * args.node_cores / 1024:.0f} GiB "
          f"RAM per node for kernels")
    print(json.dumps(summary))
    finish("scale", {k: v for k, v in summary.items() if k != "bench"}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
