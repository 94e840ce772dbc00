"""Intervals that hold the training noise: a bootstrap over clusters of examples and over seeds at once.

A study has, per (trained with, evaluated with) cell, one score per test example for each of K seeds (greedy
decoding makes each seed's model answer one way). In each bootstrap replicate the clusters are drawn with the
scorer's resampling plan (`themisto.scoring.intervals`: whole trajectories or participants, or blocks of steps where
clusters are few) and, independently for every cell, K seeds with replacement; each example's value is the mean over
the drawn seeds, and the replicate's score is the cluster-weighted mean. A paired effect (`mode − none`) takes the
same cluster draw for both cells and its own seed draw for each, so a difference that one seed's luck makes vanishes
into the interval. With one seed this is the scorer's own interval (`mean_interval`, `paired_interval`).

>>> import numpy as np
>>> from themisto.scoring.intervals import IntervalSettings, plan_resamples
>>> plan = plan_resamples(["a"] * 4 + ["b"] * 4, list(range(8)), IntervalSettings(resamples=50))
>>> seeded_interval(np.array([[1, 0, 1, 0, 1, 0, 1, 0]] * 3, dtype=float), plan).mean
0.5
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from themisto.scoring.intervals import ResamplePlan


@dataclass(frozen=True)
class SeededInterval:
    """A mean over examples (each the mean over seeds) with its interval, and how the seeds' own means spread."""

    mean: float | None
    low: float | None
    high: float | None
    n: int  # examples with a value
    seeds: int
    seed_means: tuple[float | None, ...]  # each seed's mean over the examples
    seed_sd: float | None  # the standard deviation of the seed means (None with one seed)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "seeds": self.seeds,
                "seed_means": list(self.seed_means), "seed_sd": self.seed_sd}


def _as_array(values) -> np.ndarray:
    array = np.array([[np.nan if v is None else float(v) for v in row] for row in values], dtype=float)
    if array.ndim != 2 or array.shape[0] < 1:
        raise ValueError("values must be one row of example values per seed")
    return array


def _seed_draws(seeds: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """How often each replicate draws each seed: `seeds` draws with replacement, as counts of shape (B, K)."""
    drawn = rng.integers(0, seeds, size=(resamples, seeds))
    counts = np.zeros((resamples, seeds))
    np.add.at(counts, (np.arange(resamples)[:, None], drawn), 1.0)
    return counts


def _resampled_examples(array: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per replicate and example, the mean over the replicate's drawn seeds (NaN where none of them has a value)."""
    present = ~np.isnan(array)
    totals = counts @ np.where(present, array, 0.0)
    have = counts @ present.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(have > 0, totals / np.where(have > 0, have, 1.0), np.nan)


def _example_means(array: np.ndarray) -> np.ndarray:
    """Each example's mean over the seeds that have a value (NaN where none has)."""
    present = ~np.isnan(array)
    have = present.sum(axis=0)
    totals = np.where(present, array, 0.0).sum(axis=0)
    return np.where(have > 0, totals / np.maximum(have, 1), np.nan)


def _seed_means(array: np.ndarray) -> tuple[float | None, ...]:
    out = []
    for row in array:
        kept = row[~np.isnan(row)]
        out.append(float(kept.mean()) if kept.size else None)
    return tuple(out)


def _spread(means: tuple[float | None, ...]) -> float | None:
    kept = [m for m in means if m is not None]
    return float(np.std(kept, ddof=1)) if len(kept) > 1 else None


def _interval(per_example: np.ndarray, replicates: np.ndarray, plan: ResamplePlan) -> tuple[float | None, ...]:
    """The point estimate over examples with a value, and the percentile interval of the weighted replicates."""
    present = ~np.isnan(per_example)
    if not present.any():
        return None, None, None
    mean = float(per_example[present].mean())
    weights = plan.weights
    filled = np.where(np.isnan(replicates), 0.0, replicates)
    totals = np.einsum("bn,bn->b", weights, filled)
    counts = np.einsum("bn,bn->b", weights, (~np.isnan(replicates)).astype(float))
    means = totals[counts > 0] / counts[counts > 0]
    if means.size == 0:
        return mean, None, None
    alpha = (1 - plan.confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return mean, float(low), float(high)


def seeded_interval(values, plan: ResamplePlan, *, seed: int | None = None) -> SeededInterval:
    """The mean of `values` (one row of example values per seed; None/NaN: no value) with an interval over clusters
    and seeds."""
    array = _as_array(values)
    if array.shape[1] != plan.size:
        raise ValueError(f"got {array.shape[1]} examples for a plan of {plan.size}")
    rng = np.random.default_rng(plan.seed + 1 if seed is None else seed)
    replicates = _resampled_examples(array, _seed_draws(array.shape[0], plan.resamples, rng))
    per_example = _example_means(array)
    mean, low, high = _interval(per_example, replicates, plan)
    means = _seed_means(array)
    return SeededInterval(mean, low, high, int((~np.isnan(per_example)).sum()), array.shape[0], means, _spread(means))


def _seed_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each seed's differences: seed i with seed i, or every seed with the other side's only one (the base model
    has one; pairing by index would keep only the first trained seed and lose the spread)."""
    if a.shape[0] == 1 or b.shape[0] == 1:
        return a - b  # broadcast over the side with several seeds
    pairs = min(a.shape[0], b.shape[0])
    return a[:pairs] - b[:pairs]


def seeded_paired(treated, control, plan: ResamplePlan, *, seed: int | None = None) -> SeededInterval:
    """The mean of `treated − control` over the examples both have, each side averaged over its own seeds; one
    cluster draw for both sides, an independent seed draw for each. Its seed spread pairs seed i with seed i (each
    seed with the single control where one side has one)."""
    a, b = _as_array(treated), _as_array(control)
    if a.shape[1] != plan.size or b.shape[1] != plan.size:
        raise ValueError(f"got {a.shape[1]} and {b.shape[1]} examples for a plan of {plan.size}")
    rng = np.random.default_rng(plan.seed + 2 if seed is None else seed)
    ra = _resampled_examples(a, _seed_draws(a.shape[0], plan.resamples, rng))
    rb = _resampled_examples(b, _seed_draws(b.shape[0], plan.resamples, rng))
    ea, eb = _example_means(a), _example_means(b)
    both = ~np.isnan(ea) & ~np.isnan(eb)
    per_example = np.where(both, ea - eb, np.nan)
    replicates = np.where(both, ra - rb, np.nan)
    mean, low, high = _interval(per_example, replicates, plan)
    seed_effects = _seed_means(np.where(both, _seed_pairs(a, b), np.nan))
    return SeededInterval(mean, low, high, int(both.sum()), max(a.shape[0], b.shape[0]), seed_effects,
                          _spread(seed_effects))
