"""The scorer runs trajectories at once (one kernel each) and gives the same records as one at a time."""

import dataclasses

import pytest

from themisto.ingest.trajectory import Execution, Trajectory
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings, trajectory_rows
from themisto.replay.replay import ReplaySettings, replay_trajectory
from themisto.scoring import scorer as sc
from themisto.settings import settings as env_settings
from themisto.release.folder import open_release

pytestmark = pytest.mark.slow

# Two trajectories, so that two kernels work at once; each step's state depends on the steps before it (a target
# needs five earlier steps).
CELLS = {
    "first-kernel": ["a = 1", "b = a + 1", "c = [a, b]", "d = len(c)", "e = d * 2", "data = [3, 1, 2]",
                     "total = sum(data)", "print(total)", "data.sort()\nprint(data)",
                     "import random\nrandom.seed(1)\npick = random.random()"],
    "second-kernel": ["x = 'a'", "y = x * 3", "z = {x: y}", "w = sorted(z)", "v = w + [y]",
                      "import numpy as np\nvalues = np.arange(6)", "values[2] = 9\nvalues.sum()", "print(values)",
                      "half = values[:3]\nhalf.tolist()", "values = values * 2"],
}
# Fields that measure time, not behaviour: they differ between any two runs.
TIMING = {"duration_s", "continuation_s", "branch_wall_s", "reference_durations_s", "reference_continuation_s",
          "replay_s"}


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("parallel-ws")
    rows = []
    for kernel_id, cells in CELLS.items():
        trajectory = Trajectory(id=kernel_id, notebook="task1.ipynb", source="test", task="task1",
                                executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                            for i, code in enumerate(cells)])
        rows += trajectory_rows(list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20))))
    out = tmp_path_factory.mktemp("parallel-release") / "release"
    build_release(rows, out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": "parallel-ws"}})
    return open_release(out), workspace


def _plain(record) -> dict:
    return {k: v for k, v in dataclasses.asdict(record).items() if k not in TIMING}


def test_two_workers_give_the_records_of_one(release, monkeypatch):
    loaded, workspace = release
    ids = sorted(loaded.task_rows("next_cell"), key=lambda i: (loaded.task_rows("next_cell")[i]["kernel_id"], loaded.task_rows("next_cell")[i]["step"]))
    ids = [i for i in ids if loaded.task_rows("next_cell")[i]["step"] >= 7]  # three steps of each trajectory
    assert {loaded.task_rows("next_cell")[i]["kernel_id"] for i in ids} == set(CELLS)
    references = [loaded.task_rows("next_cell")[i]["target"] for i in ids]
    predictions = [[target, "values = None", "print(data)"] for target in references]
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        runs = [sc.score(predictions, references, ids=ids, execute=True, release=loaded, workspace=workspace,
                         settings=sc.ScoreSettings(timeout_s=10), workers=workers, progress=lambda _: None)
                for workers in (1, 2)]
    finally:
        monkeypatch.undo()
        env_settings.cache_clear()
    one, two = runs
    assert [_plain(e) for e in one.examples] == [_plain(e) for e in two.examples]
    assert [_plain(p) for p in one.predictions] == [_plain(p) for p in two.predictions]
    assert {k: v for k, v in one.scores.items()} == {k: v for k, v in two.scores.items()}
    assert all(e.status == "scored" for e in one.examples)
    assert any(p.functional_match for p in one.predictions) and not all(p.functional_match for p in one.predictions)
