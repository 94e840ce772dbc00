"""Restoring a step from its stored values versus replaying its prefix, on the real task-1 trajectory; and the size of
its release with and without the values.

The trajectory is replayed once with values stored after every step (its own time printed). At the step (default:
the median one) the state is restored from the values (themisto.replay.restore: the plan, the load, any cells it
re-runs, then the state hash checked against the replay's) in two kinds of kernel, `--repeats` times each:
- warm: a kernel that restored another step first (the step halfway there), so the step's modules (pandas,
  matplotlib, ...) are imported already and the restore replaces its namespace. This is the scorer's case
  (`score --restore`): one kernel per trajectory restores the state before each scored step whose gap costs more to
  replay (themisto.release.states.pre_step_states), so only its first restore imports the modules;
- cold: a fresh kernel each time (the modules imported by the restore): a trajectory's first restore.
Another fresh kernel replays the prefix up to the same step (what a branch needs without a restore; it imports the
modules too). Kernel start is outside every timing. `speedup` is prefix replay over the warm restore;
`speedup_cold` over the cold one; `speedup_both_warm` takes the cold restore's import time off the prefix replay as
well (an estimate: that replay imports the same modules). Then the release is built from the replay twice, with and
without values, and both folders' sizes printed; `--scorer` also scores the examples at the halfway step and at the
step with execution, replaying and restoring (`themisto score --execute [--restore]`'s path, kernel start included).
Never asserted on (the JSON line carries the load average).

    python bench/restore.py [--point 0.5 | --step N] [--repeats 3] [--upto N] [--keep FILE | --steps FILE] [--scorer]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TASK1_LOG, arguments, median, prefix, report, workspace  # noqa: E402


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def score_both_ways(release: Path, ws: Path, kernel_id: str, steps: list[int]) -> dict:
    """The scorer's wall time for the examples at (or next after) `steps`, each reference as its prediction,
    replaying the prefix and restoring from the release's values (ScoreSettings.restore: one kernel, a restore
    before each step whose gap costs more to replay)."""
    import os

    from themisto.release.folder import open_release
    from themisto.scoring import scorer as sc
    from themisto.settings import settings as env_settings

    os.environ["HF_ALLOW_CODE_EVAL"] = "1"  # the bench runs the developer's own cells, nothing model-written
    env_settings.cache_clear()
    loaded = open_release(release)
    own = sorted((r for r in loaded.task_rows("next_cell").values() if r["kernel_id"] == kernel_id), key=lambda r: r["step"])
    # the first example at or after each step (the task's rules leave some steps without one)
    rows = list({row["id"]: row for row in (next((r for r in own if r["step"] >= step), None) for step in steps)
                 if row is not None}.values())
    if not rows:
        return {}
    found = {}
    for restore in (False, True):
        trajectories = []
        began = time.perf_counter()
        sc.score([[row["target"]] for row in rows], [row["target"] for row in rows], ids=[row["id"] for row in rows],
                 execute=True, release=loaded, workspace=ws,
                 settings=sc.ScoreSettings(restore=restore, continuation_cells=0), on_trajectory=trajectories.append)
        found["scorer_restored_s" if restore else "scorer_replayed_s"] = round(time.perf_counter() - began, 2)
        if restore:
            done = trajectories[0]
            found.update(scorer_examples=[row["id"] for row in rows], scorer_restores=done.restores,
                         scorer_restores_total_s=done.restore_s, scorer_restore_note=done.restore_note)
    return found


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--point", type=float, default=0.5, help="where to restore, as a fraction of the trajectory")
    parser.add_argument("--step", type=int, help="the step to restore (instead of --point)")
    parser.add_argument("--repeats", type=int, default=3, help="restores at the step (median taken)")
    parser.add_argument("--upto", type=int, help="replay only this many steps (a quick run; the release is smaller)")
    parser.add_argument("--steps", type=Path, help="an earlier run's steps (its values beside it): replay nothing")
    parser.add_argument("--keep", type=Path, help="write the replay's steps (and values) here, for --steps")
    parser.add_argument("--scorer", action="store_true",
                        help="also score the next step's example with execution, with and without --restore")
    args = parser.parse_args()

    from themisto.ingest.june_log import read_june_log
    from themisto.release.parquet import build_release
    from themisto.release.tasks import TaskSettings, trajectory_rows
    from themisto.replay.replay import ReplaySettings, kernel_limits, replay, replay_trajectory
    from themisto.replay.steps_file import read_steps
    from themisto.replay.restore import FolderValues, plan_restore, restore_step
    from themisto.replay.values import ValueFolder, values_folder
    from themisto.runtime.kernel import KernelSession

    traj = read_june_log(args.log)
    step = args.step if args.step is not None else min(len(traj.executions) - 1,
                                                       max(1, round(args.point * len(traj.executions))))
    if args.upto:
        traj = prefix(traj, max(args.upto, step + 1))
    n = len(traj.executions)
    keep, ws = workspace()
    tmp = Path(tempfile.mkdtemp(prefix="themisto-bench-restore-"))
    settings = ReplaySettings()
    replay_s = None
    if args.steps:
        store = ValueFolder(values_folder(args.steps))
        steps = [s for s in read_steps(args.steps) if s.step < n]
    else:
        kept = args.keep or tmp / "steps.jsonl"
        store = ValueFolder(values_folder(kept))
        began = time.perf_counter()
        steps = list(replay_trajectory(traj, ws, settings, values=store))
        replay_s = round(time.perf_counter() - began, 1)
        kept.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in steps), encoding="utf-8")
        print(f"replayed {n} steps with values in {replay_s:.1f} s", file=sys.stderr, flush=True)
    rows = trajectory_rows(steps)
    source = FolderValues(store)
    plan = plan_restore(rows, step, source)
    print(f"step {step}: load {len(plan.load)} values, re-run {plan.rerun}, missing {sorted(plan.missing)}",
          file=sys.stderr, flush=True)

    restores: dict[str, list] = {"cold": [], "warm": []}

    def restore_in(session, kind: str) -> None:
        result = restore_step(session, rows, plan, source, cell_timeout_s=settings.cell_timeout_s)
        restores[kind].append(result)
        print(f"restore ({kind}): {result.seconds:.2f} s ({result.parts_s}), matched {result.matched}, differing "
              f"{result.differing[:5]}", file=sys.stderr, flush=True)

    def restore_cold() -> None:
        with KernelSession(ws, kernel_limits(settings)) as session:
            restore_in(session, "cold")

    halfway = max(1, step // 2)
    earlier = plan_restore(rows, halfway, source)

    def restore_warm() -> None:
        # each time from another step's state, as the scorer's kernel restores after serving an earlier step
        first = restore_step(warm, rows, earlier, source, cell_timeout_s=settings.cell_timeout_s)
        print(f"  warm kernel: step {halfway} restored first in {first.seconds:.2f} s, matched {first.matched}",
              file=sys.stderr, flush=True)
        restore_in(warm, "warm")

    with KernelSession(ws, kernel_limits(settings)) as warm:
        # half of each kind before the prefix replay and half after: a machine whose load changes favours neither
        for _ in range((args.repeats + 1) // 2):
            restore_warm()
            restore_cold()
        without = ReplaySettings(snapshots=False)
        with KernelSession(ws, kernel_limits(without)) as session:
            began = time.perf_counter()
            for _ in replay(prefix(traj, step + 1), session, without):
                pass
            prefix_s = time.perf_counter() - began
        print(f"prefix replay of steps 0..{step}: {prefix_s:.1f} s", file=sys.stderr, flush=True)
        for _ in range(args.repeats // 2):
            restore_cold()
            restore_warm()

    sizes = {}
    for name, values in (("with_values", store.path), ("without_values", None)):
        out = tmp / name
        build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                      source={"kind": "bench"}, values=values)
        sizes[name] = folder_bytes(out)
    scorer = score_both_ways(tmp / "with_values", ws, traj.id, [halfway, step]) if args.scorer else {}
    keep.cleanup()
    shutil.rmtree(tmp, ignore_errors=True)
    cold_s = median([r.seconds for r in restores["cold"]])
    warm_s = median([r.seconds for r in restores["warm"]])
    imports_s = median([r.parts_s.get("imports", 0.0) for r in restores["cold"]])
    middle = {kind: found[len(found) // 2].parts_s for kind, found in restores.items()}
    figures = {"trajectory": traj.id, "steps": n, "step": step, "loaded": len(plan.load), "reran": plan.rerun,
               "missing": sorted(plan.missing),
               "matched": all(r.matched for found in restores.values() for r in found),
               "restore_warm_s": round(warm_s, 3), "restore_cold_s": round(cold_s, 3),
               "prefix_replay_s": round(prefix_s, 2),
               "speedup": round(prefix_s / warm_s, 1) if warm_s else None,
               "speedup_cold": round(prefix_s / cold_s, 1) if cold_s else None,
               # importing the step's modules: what the cold restore spent on it, the prefix replay spends too
               "imports_cold_s": round(imports_s, 3),
               "speedup_both_warm": round((prefix_s - imports_s) / warm_s, 1) if warm_s else None, **scorer,
               "restore_warm_parts_s": middle["warm"], "restore_cold_parts_s": middle["cold"],
               "replay_with_values_s": replay_s, "values_folder_bytes": folder_bytes(store.path),
               "release_bytes_with_values": sizes["with_values"],
               "release_bytes_without_values": sizes["without_values"]}
    rows_out = [{"what": "restore, warm kernel (median)", "seconds": figures["restore_warm_s"]},
                {"what": "restore, fresh kernel (median)", "seconds": figures["restore_cold_s"]},
                {"what": "  of which importing the step's modules", "seconds": figures["imports_cold_s"]},
                {"what": "prefix replay, fresh kernel", "seconds": figures["prefix_replay_s"]},
                {"what": "speedup (prefix replay / warm restore)", "seconds": figures["speedup"]},
                {"what": "speedup (prefix replay / fresh-kernel restore)", "seconds": figures["speedup_cold"]},
                {"what": "speedup (both without the imports)", "seconds": figures["speedup_both_warm"]}]
    rows_out += [{"what": f"scorer, {len(scorer['scorer_examples'])} examples, "
                          f"{key[len('scorer_'):-2].replace('_', ' ')}", "seconds": value}
                 for key, value in scorer.items() if key.endswith("_s")]
    report("restore", figures, rows_out, [("what", "what"), ("seconds", "seconds")], args=args)
    print(f"release: {sizes['with_values']:,} bytes with values, {sizes['without_values']:,} without")
    return 0


if __name__ == "__main__":
    sys.exit(main())
