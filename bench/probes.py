"""What a probe costs beyond its own run time, and probes per second, on the real task-1 trajectory.

The trajectory is replayed once, in a kernel with the probe mode's minimal view of the host, up to its median step
(`--point`); there the probes a model typically asks (a variable's value, its type and length, a frame's head and
dtypes, the names in the namespace) run one at a time through the probe mode's own calls, as a run makes them
(`themisto.generation.probing.StateProbes`: the state made ready when reached, a fresh branch of it per probe, the
output bounded, the state checks settled at the end), `--rounds` times, in two passes:

- as a conversation asks them: a pause of `--think-ms` after each answer stands for the model's turn. The next
  probe's branch is forked and set up, and the last one's state check and end collected, while the model thinks:
  that work is hidden from the latency, not saved; its CPU time is in the figure below.
- back to back, as the conversations of one step batched together ask theirs: nothing is hidden but what overlaps.

Overhead per probe = the wall time of its call − its own run time in the branch; median and spread per pass. CPU
per probe = the CPU time the kernel and every process it forked (monitors, candidates: reaped, so counted in the
kernel's children's times) and this process took over a pass, per probe: what a probe costs in all. Probes/s is the
back-to-back pass's. Never asserted on: machines differ (the JSON carries the load average).

    python bench/probes.py [--point 0.5] [--rounds 5] [--think-ms 250]
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


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its reaped children (utime, stime, cutime, cstime in /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _spread(values: list[float], prefix: str) -> dict:
    ordered = sorted(values)
    return {f"{prefix}_median": round(median(values), 1), f"{prefix}_p10": round(ordered[len(ordered) // 10], 1),
            f"{prefix}_p90": round(ordered[9 * len(ordered) // 10], 1)}


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--log", type=Path, default=TASK1_LOG)
    parser.add_argument("--point", type=float, default=0.5, help="where to probe, as a fraction of the trajectory")
    parser.add_argument("--rounds", type=int, default=5, help="times the probe set runs per pass")
    parser.add_argument("--variables", type=int, default=6, help="variables probed (the largest frames first)")
    parser.add_argument("--think-ms", type=float, default=250.0, help="the model's turn between two probes")
    args = parser.parse_args()

    from dataclasses import replace

    from themisto.gate import permit
    from themisto.generation.probe_protocol import ProbeSettings
    from themisto.generation.probing import StateProbes
    from themisto.ingest.june_log import read_june_log
    from themisto.replay.replay import ReplaySettings, kernel_limits, replay
    from themisto.runtime.kernel import KernelSession
    from themisto.runtime.snapshot import agent_call, take_snapshot

    traj = read_june_log(args.log)
    n = len(traj.executions)
    step = min(n - 1, max(1, round(args.point * n)))
    settings = ReplaySettings(snapshots=False)
    probe = ProbeSettings()
    grant = permit(execute=True)
    keep, ws = workspace()
    found: dict = {}

    def one_pass(session, asked: list[str], think_s: float) -> dict:
        probes = StateProbes(grant, session, probe)
        cpu = _cpu_s(session.kernel_pid) + time.process_time()
        probes.ahead()
        time.sleep(think_s)  # the model's first turn
        overheads, own, runs = [], [], []
        started = time.perf_counter()
        for _ in range(args.rounds):
            for code in asked:
                record, lost = probes.unsafe_probe(code)
                assert not lost, record.output
                overheads.append(1000 * (record.wall_s - record.duration_s))
                own.append(1000 * record.duration_s)
                runs.append(record)
                time.sleep(think_s)
        elapsed = time.perf_counter() - started - think_s * len(runs)
        probes.settle()
        agent_call(session, "process_count", timeout=60)  # the last monitors reaped: their CPU time counted
        cpu = _cpu_s(session.kernel_pid) + time.process_time() - cpu
        statuses: dict[str, int] = {}
        for record in runs:
            statuses[record.status] = statuses.get(record.status, 0) + 1
        return {**_spread(overheads, "overhead_ms"), "own_ms_median": round(median(own), 1),
                "cpu_ms_per_probe": round(1000 * cpu / len(runs), 1), "probes_per_s": round(len(runs) / elapsed, 2),
                "statuses": statuses, "changed_state": sum(1 for r in runs if r.changed_state is not False)}

    def at_step(i, session):
        snapshot = take_snapshot(session)
        ranked = sorted(snapshot.variables.values(), key=lambda v: (not v.type.endswith("DataFrame"), -(v.size or 0)))
        names = {v.name: v.type for v in ranked[:args.variables]}
        asked = probes_for(names)
        before = snapshot.state_hash
        thinking = one_pass(session, asked, args.think_ms / 1000)
        in_a_row = one_pass(session, asked, 0.0)
        found.update(step=i, variables=len(snapshot.variables), probed=list(names), probes=2 * args.rounds * len(asked),
                     state_unchanged=take_snapshot(session).state_hash == before, think_ms=args.think_ms,
                     thinking=thinking, in_a_row=in_a_row)

    with KernelSession(ws, replace(kernel_limits(settings), view="minimal")) as session:
        for _ in replay(prefix(traj, step + 1), session, settings, stop_before=step):
            pass
        at_step(step, session)
    keep.cleanup()
    thinking, in_a_row = found["thinking"], found["in_a_row"]
    rows = [{"what": "overhead ms (median)", "thinking": thinking["overhead_ms_median"],
             "row": in_a_row["overhead_ms_median"]},
            {"what": "overhead ms (p10..p90)",
             "thinking": f"{thinking['overhead_ms_p10']}..{thinking['overhead_ms_p90']}",
             "row": f"{in_a_row['overhead_ms_p10']}..{in_a_row['overhead_ms_p90']}"},
            {"what": "own run ms (median)", "thinking": thinking["own_ms_median"], "row": in_a_row["own_ms_median"]},
            {"what": "CPU ms per probe, in all", "thinking": thinking["cpu_ms_per_probe"],
             "row": in_a_row["cpu_ms_per_probe"]},
            {"what": "probes per second", "thinking": "-", "row": in_a_row["probes_per_s"]}]
    report("probes", {"trajectory": traj.id, "steps": n, "target_overhead_ms": 50, **found}, rows,
           [("what", "at the median step"), ("thinking", f"model thinks {args.think_ms:g} ms (work hidden)"),
            ("row", "back to back")], args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
