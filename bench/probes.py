"""What a probe costs beyond its own run time, and probes per second, on the real task-1 trajectory.

The trajectory is replayed once, in a kernel with the probe mode's minimal view of the host, up to its median step
(`--point`); there the probes a model typically asks (a variable's value, its type and length, a frame's head and
dtypes, the names in the namespace) run one at a time, as a probe conversation runs them, through the probe mode's
own call (`themisto.generation.probing.unsafe_probe`: a fresh branch of the live state each, the output bounded),
`--rounds` times. Overhead per probe = its wall time − its own run time in the branch; median and spread printed,
and probes/s over every probe. Never asserted on: machines differ (the JSON carries the load average).

    python bench/probes.py [--point 0.5] [--rounds 5]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TASK1_LOG, arguments, median, prefix, report, workspace  # noqa: E402

# The probes here are this file's own, not a model's: the opt-in guards model-written code, so the bench grants it.
os.environ["HF_ALLOW_CODE_EVAL"] = "1"


def probes_for(names: dict[str, str]) -> list[str]:
    """Typical probes of the namespace `names` (name -> type): the names, then per variable its value and type, and
    for frames their head and dtypes."""
    asked = ["sorted(k for k in globals() if not k.startswith('_'))"]
    for name, kind in names.items():
        asked += [name, f"type({name}).__name__, len({name}) if hasattr({name}, '__len__') else None"]
        if kind.endswith("DataFrame"):
            asked += [f"{name}.head()", f"{name}.dtypes"]
    return asked


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--point", type=float, default=0.5, help="where to probe, as a fraction of the trajectory")
    parser.add_argument("--rounds", type=int, default=5, help="times the probe set runs")
    parser.add_argument("--variables", type=int, default=6, help="variables probed (the largest frames first)")
    args = parser.parse_args()

    from dataclasses import replace

    from themisto.gate import permit
    from themisto.generation.probe_protocol import ProbeSettings
    from themisto.generation.probing import unsafe_probe
    from themisto.ingest.june_log import read_june_log
    from themisto.replay.replay import ReplaySettings, kernel_limits, replay
    from themisto.runtime.kernel import KernelSession
    from themisto.runtime.snapshot import take_snapshot

    traj = read_june_log(args.log)
    n = len(traj.executions)
    step = min(n - 1, max(1, round(args.point * n)))
    settings = ReplaySettings(snapshots=False)
    probe = ProbeSettings()
    grant = permit(execute=True)
    keep, ws = workspace()
    found: dict = {}

    def at_step(_traj, i, session):
        if i != step:
            return
        snapshot = take_snapshot(session)
        ranked = sorted(snapshot.variables.values(), key=lambda v: (not v.type.endswith("DataFrame"), -(v.size or 0)))
        names = {v.name: v.type for v in ranked[:args.variables]}
        asked = probes_for(names)
        before = snapshot.state_hash
        overheads, own, walls, statuses = [], [], [], {}
        started = time.perf_counter()
        for _ in range(args.rounds):
            for code in asked:
                record, lost = unsafe_probe(grant, session, code, probe)
                assert not lost, record.output
                overheads.append(1000 * (record.wall_s - record.duration_s))
                own.append(1000 * record.duration_s)
                walls.append(1000 * record.wall_s)
                statuses[record.status] = statuses.get(record.status, 0) + 1
        elapsed = time.perf_counter() - started
        found.update(step=i, variables=len(snapshot.variables), probed=list(names), probes=len(overheads),
                     statuses=statuses, state_unchanged=take_snapshot(session).state_hash == before,
                     overhead_ms_median=round(median(overheads), 1),
                     overhead_ms_p10=round(sorted(overheads)[len(overheads) // 10], 1),
                     overhead_ms_p90=round(sorted(overheads)[9 * len(overheads) // 10], 1),
                     own_ms_median=round(median(own), 1), wall_ms_median=round(median(walls), 1),
                     probes_per_s=round(len(overheads) / elapsed, 2))

    with KernelSession(ws, replace(kernel_limits(settings), view="minimal")) as session:
        for _ in replay(prefix(traj, step + 1), session, settings, before_step=at_step):
            pass
    keep.cleanup()
    rows = [{"what": "overhead ms (median)", "value": found["overhead_ms_median"]},
            {"what": "overhead ms (p10..p90)", "value": f"{found['overhead_ms_p10']}..{found['overhead_ms_p90']}"},
            {"what": "own run ms (median)", "value": found["own_ms_median"]},
            {"what": "probes per second", "value": found["probes_per_s"]}]
    report("probes", {"trajectory": traj.id, "steps": n, "target_overhead_ms": 50, **found}, rows,
           [("what", "at the median step"), ("value", "value")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
