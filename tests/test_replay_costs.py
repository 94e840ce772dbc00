"""The order parallel replay starts trajectories in: the cost the last replay of each took (kept in the user's cache
folder by the trajectory's digest), not its step count; a cache file that is not the user's own is not believed."""

import json
import os

import pytest

from themisto.ingest.trajectory import Execution, Trajectory
from themisto.replay.costs import known_costs, remember_cost
from themisto.replay.replay import ReplaySettings
from themisto.replay.steps_file import longest_first, replay_to_file


def _trajectory(name: str, cells: int) -> Trajectory:
    return Trajectory(name, "n.ipynb", "notebook", [Execution(f"c{i}", f"x = {i}") for i in range(cells)])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "themisto" / "replay-costs.json"


def test_known_costs_order_the_run_and_the_rest_go_by_steps(cache):
    many_prints, few_fits, unseen = _trajectory("prints", 40), _trajectory("fits", 4), _trajectory("unseen", 20)
    assert [t.id for t in longest_first([few_fits, unseen, many_prints])] == ["prints", "unseen", "fits"]
    remember_cost(many_prints, 2.0)  # 0.05 s a step
    remember_cost(few_fits, 30.0)  # 7.5 s a step
    # the unseen one is costed at the known ones' 32 s / 44 steps: 20 steps, 14.5 s
    assert [t.id for t in longest_first([many_prints, unseen, few_fits])] == ["fits", "unseen", "prints"]
    assert known_costs([many_prints, unseen, few_fits]) == {"prints": 2.0, "fits": 30.0}
    # the cost belongs to the content: a trajectory changed under the same id is unseen again
    assert known_costs([_trajectory("fits", 5)]) == {}


def test_a_cache_file_others_may_write_or_that_is_not_costs_is_ignored(cache):
    fits = _trajectory("fits", 4)
    remember_cost(fits, 30.0)
    os.chmod(cache, 0o666)
    assert known_costs([fits]) == {}
    cache.write_text("[1, 2")
    os.chmod(cache, 0o644)
    assert known_costs([fits]) == {}
    cache.write_text(json.dumps({fits.digest(): "30", "x": float("nan")}))
    assert known_costs([fits]) == {}
    remember_cost(fits, 12.5)  # a bad file is replaced, not read from
    assert known_costs([fits]) == {"fits": 12.5}


@pytest.mark.slow
def test_a_replay_remembers_what_each_trajectory_cost(cache, tmp_path):
    trajectories = [_trajectory("a", 2), _trajectory("b", 3)]
    replay_to_file(trajectories, tmp_path / "steps.jsonl", None, ReplaySettings(values=False),
                   progress=lambda message: None)
    costs = known_costs(trajectories)
    assert sorted(costs) == ["a", "b"] and all(seconds > 0 for seconds in costs.values())
