"""What replaying a trajectory costs, remembered from the last time: the order that keeps every worker busy.

Several trajectories replay at once (themisto.replay.workers, Ray) and none can be split, so the run ends when its
last-started long trajectory does; starting the costliest first keeps the tail short. A trajectory's step count says
little of its cost (a few model fits outweigh a hundred prints), and the logs' own timestamps less (idle time), so
each finished replay's wall time is kept, by the trajectory's digest, in the user's cache folder; a trajectory not
seen before is costed at its step count times the seconds per step of those that were. A hint for the order only:
nothing a replay writes depends on it.

>>> from themisto.ingest.trajectory import Execution, Trajectory
>>> short = Trajectory("short", "n.ipynb", "notebook", [Execution("c", "1")])
>>> long = Trajectory("long", "n.ipynb", "notebook", [Execution("c", "1")] * 4)
>>> sorted(estimated_costs([short, long]).items())  # nothing known: the step counts
[('long', 4.0), ('short', 1.0)]
"""

from __future__ import annotations

import json
import threading

from themisto.ingest.trajectory import Trajectory
from themisto.runtime.sandbox import read_cache, write_cache

_CACHE = "replay-costs.json"
_KEEP = 10_000  # trajectories remembered (the most recent); about 100 bytes each
_lock = threading.Lock()  # the workers of one run finish at once; a run beside this one may still lose a write


def _known() -> dict[str, float]:
    try:
        known = json.loads(read_cache(_CACHE) or "{}")
    except json.JSONDecodeError:
        return {}
    if not isinstance(known, dict):
        return {}
    return {k: float(v) for k, v in known.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and 0 <= v < float("inf")}


def known_costs(trajectories: list[Trajectory]) -> dict[str, float]:
    """The seconds the last replay of each trajectory took, by trajectory id, for those replayed before."""
    known = _known()
    return {t.id: known[digest] for t in trajectories if (digest := t.digest()) in known}


def estimated_costs(trajectories: list[Trajectory]) -> dict[str, float]:
    """Every trajectory's cost by id: its known one, else its step count at the known ones' seconds per step (one
    when none is known)."""
    known = known_costs(trajectories)
    seconds, steps = sum(known.values()), sum(len(t.executions) for t in trajectories if t.id in known)
    per_step = seconds / steps if steps and seconds > 0 else 1.0
    return {t.id: known.get(t.id, per_step * len(t.executions)) for t in trajectories}


def remember_cost(trajectory: Trajectory, seconds: float) -> None:
    """Keep `seconds` as what replaying `trajectory` costs."""
    digest = trajectory.digest()
    with _lock:
        known = _known()
        known.pop(digest, None)  # to the end: the most recent are kept
        known[digest] = round(seconds, 3)
        write_cache(_CACHE, json.dumps(dict(list(known.items())[-_KEEP:])))
