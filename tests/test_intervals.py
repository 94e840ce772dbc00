"""Bootstrap intervals: coverage on synthetic data with a known mean, pairing, determinism, degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest

from themisto.scoring.intervals import (
    IntervalSettings,
    block_length_for,
    mean_interval,
    paired_interval,
    plan_resamples,
)

REPEATS = 200  # datasets drawn per coverage check: a coverage of 0.95 then lies within ±0.04 with ~95 % chance


def _coverage(draw, plan_for, repeats: int = REPEATS) -> float:
    """How often the interval from one drawn dataset contains the true mean 0."""
    rng = np.random.default_rng(12345)
    hits = 0
    for r in range(repeats):
        values, clusters, order = draw(rng)
        interval = mean_interval(values, plan_for(clusters, order, r))
        hits += interval.low <= 0.0 <= interval.high
    return hits / repeats


def _clustered(rng):
    """40 trajectories of 8 steps; steps of one trajectory share a random shift (intra-class correlation 0.5)."""
    shift = np.repeat(rng.normal(size=40), 8)
    return shift + rng.normal(size=320), np.repeat(np.arange(40), 8), np.tile(np.arange(8), 40)


def _autocorrelated(rng):
    """One trajectory of 400 steps, AR(1) with coefficient 0.7 around a mean of 0."""
    noise = rng.normal(size=400)
    values = np.empty(400)
    values[0] = noise[0] / np.sqrt(1 - 0.49)
    for t in range(1, 400):
        values[t] = 0.7 * values[t - 1] + noise[t]
    return values, np.zeros(400, dtype=int), np.arange(400)


def _settings(seed: int) -> IntervalSettings:
    return IntervalSettings(resamples=400, seed=seed)


def test_cluster_bootstrap_covers_the_true_mean_where_an_iid_bootstrap_does_not():
    clustered = _coverage(_clustered, lambda c, o, r: plan_resamples(c, o, _settings(r)))
    iid = _coverage(_clustered, lambda c, o, r: plan_resamples(np.arange(len(c)), o, _settings(r)))
    assert plan_resamples(*_clustered(np.random.default_rng(0))[1:], _settings(0)).method == "cluster_bootstrap"
    assert 0.88 <= clustered <= 0.99, clustered
    assert iid <= 0.75, iid  # steps treated as independent: the interval is about half as wide as it should be


def test_block_bootstrap_covers_an_autocorrelated_trajectory_better_than_an_iid_one():
    blocks = _coverage(_autocorrelated, lambda c, o, r: plan_resamples(c, o, _settings(r)))
    iid = _coverage(_autocorrelated, lambda c, o, r: plan_resamples(np.arange(len(c)), o, _settings(r)))
    plan = plan_resamples(np.zeros(400, dtype=int), np.arange(400), _settings(0))
    assert (plan.method, plan.clusters, plan.block_length, plan.blocks) == ("block_bootstrap", 1, 7, 58)
    assert blocks >= 0.80 and blocks >= iid + 0.15, (blocks, iid)


def test_all_equal_values_give_a_zero_width_interval():
    plan = plan_resamples(["a"] * 5 + ["b"] * 7, list(range(5)) + list(range(7)))
    for value in (0.0, 0.3, 1.0):
        interval = mean_interval([value] * 12, plan)
        assert (interval.mean, interval.low, interval.high, interval.n) == (value, value, value, 12)
    same = paired_interval([0.7] * 12, [0.7] * 12, plan)
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)


def test_pairing_narrows_the_interval_on_correlated_scores():
    rng = np.random.default_rng(7)
    clusters = np.repeat(np.arange(20), 10)
    control = np.repeat(rng.normal(size=20), 10) + rng.normal(size=200)  # examples differ a lot in difficulty
    treated = control + 0.1 + 0.1 * rng.normal(size=200)  # context helps a little, on the same examples
    plan = plan_resamples(clusters, np.tile(np.arange(10), 20))
    paired = paired_interval(treated, control, plan)
    a, b = mean_interval(treated, plan), mean_interval(control, plan)
    unpaired_width = np.hypot(a.high - a.low, b.high - b.low)
    assert paired.mean == pytest.approx(float(np.mean(treated - control)))
    assert paired.high - paired.low < 0.2 * unpaired_width
    assert 0 < paired.low < paired.mean < paired.high  # the small effect is resolved only when paired


def test_same_seed_same_intervals_and_another_seed_other_resamples():
    values, clusters, order = _clustered(np.random.default_rng(1))
    first = mean_interval(values, plan_resamples(clusters, order, IntervalSettings(seed=3)))
    again = mean_interval(values, plan_resamples(clusters, order, IntervalSettings(seed=3)))
    other = mean_interval(values, plan_resamples(clusters, order, IntervalSettings(seed=4)))
    assert first == again and first != other and first.mean == other.mean


def test_missing_values_and_masks_leave_examples_out():
    plan = plan_resamples(np.repeat(np.arange(12), 3), np.tile(np.arange(3), 12))
    values = [v for c in range(12) for v in (float(c % 2), None, 0.0)]
    interval = mean_interval(values, plan)
    assert (interval.mean, interval.n) == (0.25, 24) and interval.low < 0.25 < interval.high
    only_last = mean_interval(values, plan, mask=[False, False, True] * 12)
    assert (only_last.mean, only_last.low, only_last.high, only_last.n) == (0.0, 0.0, 0.0, 12)
    assert mean_interval([None] * 36, plan) == mean_interval([1.0] * 36, plan, mask=[False] * 36)
    assert mean_interval([None] * 36, plan).n == 0
    # Pairs count only where both sides have a value.
    assert paired_interval([1.0] * 36, values, plan).n == 24


def test_the_plan_records_its_method_counts_and_warnings():
    many = plan_resamples(np.repeat(np.arange(40), 2), np.tile(np.arange(2), 40), IntervalSettings(resamples=50))
    assert many.describe() == {"method": "cluster_bootstrap", "unit": "trajectory", "clusters": 40, "blocks": None,
                               "block_length": None, "resamples": 50, "confidence": 0.95, "seed": 0, "warning": None}
    assert many.weights.shape == (50, 80) and np.all(many.weights.sum(axis=1) % 2 == 0)  # whole trajectories
    twelve = plan_resamples(np.repeat(np.arange(12), 2), np.tile(np.arange(2), 12))
    assert twelve.method == "cluster_bootstrap" and "too narrow" in twelve.warning
    few = plan_resamples(["k"] * 6, range(6))
    assert few.method == "block_bootstrap" and few.blocks == 3 and few.block_length == 2
    assert "not between developers" in few.warning and "only 3 blocks" in few.warning
    assert np.all(few.weights.sum(axis=1) == 6)  # a trajectory keeps its size in every resample
    assert block_length_for([530]) == 8 and block_length_for([]) == 1


def test_participants_are_drawn_whole_however_few_and_the_warning_says_it_runs_narrow():
    # Six participants, two trajectories each: by trajectory, 12 clusters; by participant, 6, never split apart.
    participant = np.repeat(np.arange(6), 20)
    trajectory = np.repeat(np.arange(12), 10)
    by_trajectory = plan_resamples(trajectory, np.tile(np.arange(10), 12))
    assert by_trajectory.method == "cluster_bootstrap" and by_trajectory.clusters == 12
    plan = plan_resamples(participant, np.tile(np.arange(20), 6), IntervalSettings(cluster="participant"))
    assert (plan.method, plan.unit, plan.clusters) == ("cluster_bootstrap", "participant", 6)
    assert "6 participants (< 10)" in plan.warning and "lower bound" in plan.warning
    for p in range(6):  # all of a participant's examples are drawn the same number of times in every resample
        drawn = plan.weights[:, participant == p]
        assert np.all(drawn == drawn[:, :1])
    assert (plan.weights[:, 0] >= 3).any()  # and a resample may draw one developer several times
    # Participants' trajectories are not independent: the participant interval of a participant effect is wider.
    values = np.repeat(np.linspace(0, 1, 6), 20)
    wide, narrow = mean_interval(values, plan), mean_interval(values, by_trajectory)
    assert narrow.high - narrow.low < wide.high - wide.low
    with pytest.raises(ValueError, match="cluster must be one of trajectory, participant"):
        IntervalSettings(cluster="step")


def test_block_resamples_draw_consecutive_steps_in_the_given_order():
    # Positions given out of order: blocks must follow `order`, not the input order.
    order = [3, 0, 2, 1, 5, 4, 7, 6]
    plan = plan_resamples(["k"] * 8, order, IntervalSettings(resamples=2000, min_blocks=1))
    assert plan.block_length == 2
    by_position = plan.weights[:, np.argsort(order)]
    # A block covers two neighbouring positions (circularly: 7 and 0 too), so how often a resample draws a position
    # goes with how often it draws its neighbours, and against the others.
    correlation = np.corrcoef(by_position.T)[0]
    assert correlation[1] > 0.2 and correlation[7] > 0.2
    assert all(correlation[k] < 0 for k in (2, 3, 4, 5, 6))


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="cluster labels"):
        plan_resamples(["a", "b"], [0])
    plan = plan_resamples(["a", "b"], [0, 0])
    with pytest.raises(ValueError, match="values for a plan of 2"):
        mean_interval([1.0], plan)
    with pytest.raises(ValueError, match="confidence"):
        IntervalSettings(confidence=1.0)
