"""What a run's `probe` mode did, from the transcripts on its generation lines (nothing is probed again): probes used
per generation (mean and distribution), why its conversations stopped, how its probes ended, and each metric by the
number of probes a generation used, with the run's intervals.

>>> distribution([0, 2, 2, 1])
{'0': 1, '1': 1, '2': 2}
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean
from typing import Callable

from themisto.generation.run_folder import Generation, RunFolder
from themisto.scoring.intervals import ResamplePlan, mean_interval
from themisto.vocabulary import PROBE_CONTEXT


def distribution(counts: list[int]) -> dict[str, int]:
    """How many generations used each number of probes, in order (JSON keys are strings)."""
    return {str(k): n for k, n in sorted(Counter(counts).items())}


def _used(generation: Generation) -> int:
    return int((generation.probes or {}).get("used") or 0)


def probe_summary(run: RunFolder, value: Callable[[Generation, str], float | None], plan: ResamplePlan,
                  metrics: tuple[str, ...]) -> list[dict]:
    """One entry per probe-mode context of the run (none without one). `value(generation, metric)` is a
    generation's score (0 for one skipped or failed, None where a metric does not apply)."""
    if PROBE_CONTEXT not in run.contexts:
        return []
    lines = [g for i in run.ids for g in run.samples_of(i, PROBE_CONTEXT)]
    probes = [p for g in lines for p in (g.probes or {}).get("probes", [])]
    used = [_used(g) for g in lines]
    by_probes = []
    for k in sorted(set(used)):
        for metric in metrics:
            values = []
            for example_id in run.ids:
                kept = [value(g, metric) for g in run.samples_of(example_id, PROBE_CONTEXT) if _used(g) == k]
                kept = [v for v in kept if v is not None]
                values.append(fmean(kept) if kept else None)
            interval = mean_interval(values, plan)
            by_probes.append({"metric": metric, "probes": k, "mean": interval.mean, "low": interval.low,
                              "high": interval.high, "n": interval.n})
    return [{
        "context": PROBE_CONTEXT, "settings": {k: v for k, v in (run.meta.get("probe") or {}).items()
                                               if k not in ("tool", "rule")}, "generations": len(lines),
        "used": {"mean": round(fmean(used), 4) if used else None, "distribution": distribution(used)},
        "stops": dict(Counter((g.probes or {}).get("stop", "none") for g in lines)),
        "probe_statuses": dict(Counter(p.get("status") for p in probes)),
        "changed_state": sum(1 for p in probes if p.get("changed_state")),
        "suspicious": sum(1 for p in probes if p.get("suspicious")),
        "probe_s": round(fmean(float(p.get("wall_s") or 0.0) for p in probes), 4) if probes else None,
        "by_probes": by_probes}]
