"""Per-candidate cost of branch execution (fork of the live kernel) versus prefix replay on the real task-1
trajectory, and what a branch costs beyond the cell's own run time with the page check and with the full rehash.

At steps spread across the trajectory, the developer's own cell is the candidate:
- branch: the trajectory is replayed once; at the step, `--batch` copies of the candidate run in one branch call (as
  the scorer runs a step's references and predictions), `--repeats` times per delta mode ("pages", "hash");
  overhead per branch = (call wall time - the cells' own times) / batch, median over repeats. At the median step it
  is measured again with a 2-million-row frame (numeric and categorical columns) added to the kernel;
- prefix replay: a fresh kernel replays every earlier step, then runs the candidate (what notebook benchmarks do).
Prints a table per step and one JSON line. Never asserted on: machines differ (the JSON carries the load average).

    python bench/branch_vs_replay.py [--points 0.25 0.5 0.75] [--repeats 3] [--batch 4]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TASK1_LOG, arguments, median, prefix, report, workspace  # noqa: E402

MODES = ("pages", "hash")
BIG_FRAME = ("import numpy as np, pandas as pd\n"
             "bench_frame = pd.DataFrame({'n': np.arange(2_000_000), 'x': np.random.default_rng(0).random(2_000_000),"
             " 'k': np.random.default_rng(1).integers(0, 100, 2_000_000),"
             " 'c': pd.Categorical(np.random.default_rng(2).integers(0, 5, 2_000_000))})")


def measure(session, code: str, repeats: int, batch: int, timeout_s: float, modes: list[str]) -> dict:
    """Per delta mode: median overhead per branch (ms), median wall per candidate (ms), the cell's own time (ms)."""
    from themisto.runtime.branch import run_branches

    found: dict[str, dict[str, list[float]]] = {m: {"overhead": [], "wall": [], "own": []} for m in modes}
    for repeat in range(repeats):
        for mode in modes if repeat % 2 == 0 else modes[::-1]:
            started = time.perf_counter()
            results = run_branches(session, [code] * batch, timeout_s=timeout_s, delta=mode)
            wall = time.perf_counter() - started
            own = sum(r.duration_s for r in results)
            found[mode]["overhead"].append(1000 * (wall - own) / batch)
            found[mode]["wall"].append(1000 * wall / batch)
            found[mode]["own"].append(1000 * own / batch)
    return {f"{key}_ms_{mode}": round(median(values), 1) for mode in modes for key, values in found[mode].items()}


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--points", type=float, nargs="+", default=[0.25, 0.5, 0.75],
                        help="where to score, as fractions of the trajectory (0.5 = the median step)")
    parser.add_argument("--repeats", type=int, default=3, help="branch calls per step and delta mode (median taken)")
    parser.add_argument("--batch", type=int, default=4, help="candidates per branch call")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="delta modes to measure")
    args = parser.parse_args()

    from themisto.ingest.cleaning import clean_for_replay
    from themisto.ingest.june_log import read_june_log
    from themisto.replay.replay import ReplaySettings, kernel_limits, replay
    from themisto.runtime.kernel import KernelSession

    traj = read_june_log(args.log)
    n = len(traj.executions)
    steps = sorted({min(n - 1, max(1, round(p * n))) for p in args.points})
    median_step = steps[len(steps) // 2]
    settings = ReplaySettings(snapshots=False)
    keep, ws = workspace()
    branch: dict[int, dict] = {}
    big: dict = {}

    def at_step(i, session):
        code = clean_for_replay(traj.executions[i].code).code
        branch[i] = measure(session, code, args.repeats, args.batch, settings.cell_timeout_s, args.modes)
        print(f"step {i}: {branch[i]}", file=sys.stderr, flush=True)
        if i == median_step:
            assert session.execute(BIG_FRAME).status == "ok"
            big.update(measure(session, code, args.repeats, args.batch, settings.cell_timeout_s, args.modes))
            session.execute("del bench_frame")
            print(f"step {i} with a 2M-row frame: {big}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    with KernelSession(ws, kernel_limits(settings)) as session:
        start = 0  # each step's state in turn, from where the last one stopped
        for i in sorted(steps):
            for _ in replay(prefix(traj, max(steps) + 1), session, settings, start=start, stop_before=i):
                pass
            at_step(i, session)
            start = i
    one_replay_s = time.perf_counter() - started

    replay_s: dict[int, float] = {}
    for i in steps:
        code = clean_for_replay(traj.executions[i].code).code
        started = time.perf_counter()
        with KernelSession(ws, kernel_limits(settings)) as session:
            for _ in replay(prefix(traj, i), session, settings):
                pass
            session.execute(code, timeout=settings.cell_timeout_s)
        replay_s[i] = time.perf_counter() - started
        print(f"step {i}: prefix replay {replay_s[i]:.1f} s per candidate", file=sys.stderr, flush=True)
    keep.cleanup()

    rows = [{"step": i, **branch[i], "prefix_replay_s": round(replay_s[i], 2),
             "ratio": round(1000 * replay_s[i] / branch[i][f"wall_ms_{args.modes[0]}"], 1)} for i in steps]
    rows.append({"step": f"{median_step}+2M rows", **big})
    columns = [("step", "step"), (f"own_ms_{args.modes[0]}", "own ms")]
    columns += [(f"overhead_ms_{m}", f"overhead ms ({m})") for m in args.modes]
    columns += [(f"wall_ms_{m}", f"branch ms ({m})") for m in args.modes]
    columns += [("prefix_replay_s", "prefix replay s"), ("ratio", "replay/branch")]
    figures = {"trajectory": traj.id, "steps": n, "median_step": median_step, "batch": args.batch,
               "repeats": args.repeats, "points": rows,
               "overhead_ms_median_step": {m: branch[median_step][f"overhead_ms_{m}"] for m in args.modes},
               "overhead_ms_with_2m_rows": {m: big.get(f"overhead_ms_{m}") for m in args.modes},
               "ratio_at_median_step": rows[steps.index(median_step)]["ratio"], "one_replay_s": round(one_replay_s, 1)}
    report("branch_vs_replay", figures, rows, columns, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
