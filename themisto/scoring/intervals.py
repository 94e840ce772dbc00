"""Bootstrap confidence intervals for scores whose examples hang together: steps of one trajectory are not independent.

One resampling plan serves every score of a run, so intervals of different metrics, subsets and context modes come
from the same resamples, and a paired difference (context − none on the same examples) keeps its pairing:

- `cluster_bootstrap` when there are at least `min_clusters` trajectories: whole trajectories are drawn with
  replacement (Miller 2024, "Adding Error Bars to Evals", clustered errors; the bootstrap form of inspect_ai's and
  lmms-eval's clustered standard error). Below ~10 clusters a cluster bootstrap has few distinct resamples and its
  intervals are far too narrow (Cameron, Gelbach & Miller 2008), so it is not used there.
- `block_bootstrap` otherwise: a circular block bootstrap within each trajectory (Politis & Romano 1992), blocks of
  `round(m ** (1/3))` consecutive examples, m the median examples per trajectory (the rate Hall, Horowitz & Jing
  1995 give for variance estimation); each trajectory keeps its size. It covers the variation between steps of
  these trajectories, not between developers, and the plan's warning says so.

The cluster is a trajectory unless the settings name the participant (`cluster="participant"`): a developer's
trajectories (task 1 and task 2, the same habits) are not independent draws, so the honest unit of a score that
speaks of developers is the developer. Whole participants are then always drawn with replacement, however few
(a block bootstrap within one would not resample developers at all), and below `min_clusters` the warning says that
the interval runs narrow and is a lower bound on the uncertainty.

A resample is stored as how often it draws each example, so a score over any subset is a weighted mean
(a ratio estimator) and percentile intervals cost one matrix-vector product.

>>> plan = plan_resamples(["a"] * 6 + ["b"] * 6, list(range(6)) * 2, IntervalSettings(resamples=200))
>>> plan.method, plan.clusters, plan.block_length, plan.blocks
('block_bootstrap', 2, 2, 6)
>>> by_person = plan_resamples(["p1"] * 6 + ["p2"] * 6, list(range(12)), IntervalSettings(cluster="participant"))
>>> by_person.method, by_person.unit, by_person.clusters
('cluster_bootstrap', 'participant', 2)
>>> mean_interval([0.5] * 12, plan)
Interval(mean=0.5, low=0.5, high=0.5, n=12)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Sequence

from themisto.scoring.results_table import units as count_of
from themisto.vocabulary import CLUSTER_UNITS

# numpy is imported inside the functions that compute: the command line reads IntervalSettings' defaults when it
# builds its parser, and building it loads no numpy.
if TYPE_CHECKING:
    import numpy as np

METHODS: tuple[str, ...] = ("cluster_bootstrap", "block_bootstrap")


@dataclass(frozen=True)
class IntervalSettings:
    """How intervals are computed: resamples, confidence, seed, and the thresholds that choose and warn."""

    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    min_clusters: int = 10  # a cluster bootstrap from this many trajectories up; a block bootstrap below
    few_clusters: int = 30  # a cluster bootstrap from fewer than this many is known to run narrow: warn
    min_blocks: int = 10  # fewer blocks than this in all: warn
    cluster: str = "trajectory"  # the unit resampled: `themisto.vocabulary.CLUSTER_UNITS`

    def __post_init__(self) -> None:
        if self.cluster not in CLUSTER_UNITS:
            raise ValueError(f"cluster must be one of {', '.join(CLUSTER_UNITS)}, got {self.cluster!r}")
        if self.resamples < 1:
            raise ValueError(f"resamples must be at least 1, got {self.resamples}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {self.confidence}")
        if self.min_clusters < 2:
            raise ValueError(f"min_clusters must be at least 2, got {self.min_clusters}")


@dataclass(frozen=True)
class ResamplePlan:
    """The resamples of one set of examples: `weights[b, i]` is how often resample b draws example i."""

    method: str
    unit: str  # what a cluster is: a trajectory or a participant
    clusters: int
    blocks: int | None
    block_length: int | None
    resamples: int
    confidence: float
    seed: int
    warning: str | None
    weights: np.ndarray = field(repr=False, compare=False)

    @property
    def size(self) -> int:
        return int(self.weights.shape[1])

    def describe(self) -> dict:
        """The plan as results.json records it (`interval`)."""
        return {"method": self.method, "unit": self.unit, "clusters": self.clusters, "blocks": self.blocks,
                "block_length": self.block_length, "resamples": self.resamples, "confidence": self.confidence,
                "seed": self.seed, "warning": self.warning}


@dataclass(frozen=True)
class Interval:
    """A mean over the examples that have a value, with its bootstrap interval; all None when there are none."""

    mean: float | None
    low: float | None
    high: float | None
    n: int


def block_length_for(sizes: Sequence[int]) -> int:
    """The block length: the cube root of the median trajectory size (examples), rounded, at least 1."""
    import numpy as np

    if not sizes:
        return 1
    return max(1, round(float(np.median(sizes)) ** (1 / 3)))


def _cluster_weights(members: list[np.ndarray], n: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    drawn = rng.integers(0, len(members), size=(resamples, len(members)))
    per_cluster = np.zeros((resamples, len(members)))
    np.add.at(per_cluster, (np.arange(resamples)[:, None], drawn), 1.0)
    weights = np.zeros((resamples, n))
    for c, idx in enumerate(members):
        weights[:, idx] = per_cluster[:, [c]]
    return weights


def _block_weights(members: list[np.ndarray], n: int, length: int, resamples: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, int]:
    import numpy as np

    weights = np.zeros((resamples, n))
    blocks = 0
    for idx in members:
        size = len(idx)
        span = min(length, size)
        count = math.ceil(size / span)
        blocks += count
        starts = rng.integers(0, size, size=(resamples, count))
        # Circular: a block that runs off the end continues at the trajectory's start, so every step is equally
        # likely to be drawn; the concatenated blocks are cut to the trajectory's own size.
        positions = ((starts[:, :, None] + np.arange(span)) % size).reshape(resamples, -1)[:, :size]
        flat = (np.arange(resamples)[:, None] * size + positions).ravel()
        weights[:, idx] = np.bincount(flat, minlength=resamples * size).reshape(resamples, size)
    return weights, blocks


def plan_resamples(clusters: Sequence[Hashable], order: Sequence,
                   settings: IntervalSettings = IntervalSettings()) -> ResamplePlan:
    """Plan the resamples of examples that belong to `clusters` (trajectories, or participants where the settings say
    so), ordered within each by `order` (any sortable keys, e.g. (trajectory, step))."""
    import numpy as np

    if len(clusters) != len(order):
        raise ValueError(f"got {len(clusters)} cluster labels for {len(order)} positions")
    n = len(clusters)
    groups: dict[Hashable, list[int]] = {}
    for i, label in enumerate(clusters):
        groups.setdefault(label, []).append(i)
    members = [np.array(sorted(idx, key=lambda i: (order[i], i)), dtype=np.int64) for idx in groups.values()]
    rng = np.random.default_rng(settings.seed)
    common = {"unit": settings.cluster, "clusters": len(members), "resamples": settings.resamples,
              "confidence": settings.confidence, "seed": settings.seed}
    by_participant = settings.cluster == "participant"
    if len(members) >= settings.min_clusters or (by_participant and len(members) >= 2):
        warning = None
        units = count_of(len(members), settings.cluster)
        if len(members) < settings.min_clusters:
            warning = (f"{units} (< {settings.min_clusters}): a cluster bootstrap over this few clusters has few "
                       "distinct resamples and runs narrow; read the interval as a lower bound on the uncertainty")
        elif len(members) < settings.few_clusters:
            warning = (f"{units} (< {settings.few_clusters}): cluster bootstrap intervals from this few clusters "
                       "tend to be too narrow")
        return ResamplePlan(method="cluster_bootstrap", blocks=None, block_length=None, warning=warning,
                            weights=_cluster_weights(members, n, settings.resamples, rng), **common)
    length = block_length_for([len(m) for m in members])
    weights, blocks = _block_weights(members, n, length, settings.resamples, rng)
    count = count_of(len(members), settings.cluster)
    warning = (f"{count} (< {settings.min_clusters}): blocks of {length} consecutive steps are "
               "resampled within each trajectory, so the interval covers variation between steps of these "
               "trajectories, not between developers")
    if blocks < settings.min_blocks:
        warning += f"; only {blocks} blocks in all (< {settings.min_blocks}): the interval is unreliable"
    return ResamplePlan(method="block_bootstrap", blocks=blocks, block_length=length, warning=warning,
                        weights=weights, **common)


def _as_values(values: Sequence[float | None], plan: ResamplePlan, mask: Sequence[bool] | None) -> np.ndarray:
    import numpy as np

    array = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    if array.shape != (plan.size,):
        raise ValueError(f"got {array.size} values for a plan of {plan.size} examples")
    if mask is not None:
        keep = np.asarray(mask, dtype=bool)
        if keep.shape != array.shape:
            raise ValueError(f"got a mask of {keep.size} for {array.size} values")
        array = np.where(keep, array, np.nan)
    return array


def mean_interval(values: Sequence[float | None], plan: ResamplePlan,
                  mask: Sequence[bool] | None = None) -> Interval:
    """The mean of `values` (None or NaN: no value) over the examples `mask` keeps, with the plan's interval."""
    import numpy as np

    array = _as_values(values, plan, mask)
    present = ~np.isnan(array)
    n = int(present.sum())
    if n == 0:
        return Interval(None, None, None, 0)
    kept = array[present]
    if np.all(kept == kept[0]):  # every resample gives the same mean; skip the rounding noise of the sums
        return Interval(float(kept[0]), float(kept[0]), float(kept[0]), n)
    mean = float(kept.mean())
    weights = plan.weights
    totals = weights @ np.where(present, array, 0.0)
    counts = weights @ present.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = totals / counts
    means = means[counts > 0]  # a resample that drew none of these examples says nothing about their mean
    alpha = (1 - plan.confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Interval(mean, float(low), float(high), n)


def paired_interval(treated: Sequence[float | None], control: Sequence[float | None], plan: ResamplePlan,
                    mask: Sequence[bool] | None = None) -> Interval:
    """The mean of `treated − control` over examples that have both, resampled jointly so the pairing is kept."""
    a = _as_values(treated, plan, mask)
    b = _as_values(control, plan, mask)
    return mean_interval(a - b, plan)
