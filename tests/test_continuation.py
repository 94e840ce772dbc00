"""continuation_match: predictions judged by the developer's next logged cells, run after them in their branch.

One short trajectory replayed in a real kernel; a prediction that leaves a variable no later cell reads behind fails
state_match but passes continuation_match, one that consumes the random stream matches every variable but changes
what the developer's next cells print, and the continuation stops before a logged restart."""

import pytest

from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings, trajectory_rows
from themisto.replay.replay import ReplaySettings, replay_trajectory
from themisto.runtime.branch import run_branches
from themisto.runtime.kernel import KernelSession, Limits
from themisto.scoring import scorer as sc
from themisto.scoring.continuation import cell_names, continuation_rows, own_alarms, state_names
from themisto.settings import settings as env_settings
from themisto.release.folder import open_release

KERNEL = "cont-kernel"
CELLS = [
    "data = [3, 1, 2]",
    "x = 'label'",
    "import random",
    "print(len(data))",
    "total = 0",
    "squares = [v * v for v in data]",  # 5: the target
    "print(sum(squares))",
    "print(random.randint(0, 10**6))",
    "data.append(4)\nprint(data)",
    "print(x)",  # 9: reads x, but a logged restart comes before it
]
RESTART_BEFORE = 9
TARGET = 5
# Leaves `x` changed (a loop variable) though no continuation cell reads it; matches every output that follows.
LEFTOVER = "squares = []\nfor x in data:\n    squares.append(x * x)"
# Matches every variable, but draws from the random stream the developer's next cells use.
RANDOM_DRAW = "random.random()\nsquares = [v * v for v in data]"


def test_cell_names_are_a_superset_or_unknown():
    assert cell_names("for i in range(n):\n    total += f(i)") == {"i", "n", "range", "total", "f"}
    assert {"np", "df", "col"} <= cell_names("import numpy as np\ndf[col] = np.log(df[col])")
    assert cell_names("%matplotlib inline\nplt.plot(xs)") == {"plt", "xs"}
    assert cell_names("%time model = fit(X)") >= {"model", "fit", "X"}
    for unknowable in ("from pandas import *", "exec(code)", "globals()['a'] = 1", "%run other.py", "%%capture out",
                       "def f(:"):
        assert cell_names(unknowable) is None, unknowable


def test_state_names_follow_functions_the_cells_call():
    earlier = ["def helper():\n    return scale * base", "def run():\n    return helper() + offset"]
    names = state_names("result = run()", ["print(result)"], earlier)
    assert {"result", "run", "helper", "scale", "base", "offset"} <= set(names)
    assert "unrelated" not in names
    assert state_names("result = run()", ["exec(s)"], earlier) is None


def test_continuation_stops_before_a_restart_or_a_lost_state():
    rows = [{"step": i, "restarted_before": i == 4, "kernel_restarted": i == 2, "ename": None} for i in range(6)]
    assert [r["step"] for r in continuation_rows(rows, 0, 3)] == [1]
    assert [r["step"] for r in continuation_rows(rows, 2, 3)] == [3]
    assert continuation_rows(rows, 5, 3) == []


def test_branch_runs_a_list_of_cells_in_sequence(tmp_path):
    with KernelSession(tmp_path, Limits(cell_timeout_s=20)) as session:
        session.execute("data = [3, 1, 2]\nx = 'label'")
        plain, leftover, broken = run_branches(
            session, ["squares = [v * v for v in data]", [LEFTOVER, "print(sum(squares))", "print(x)"],
                      ["del data", "print(len(data))", "print('still runs')"]],
            timeout_s=10, state_names=["squares", "data"])
        after = session.execute("print('squares' in dir(), x, data)")
        [replayed] = run_branches(session, [[LEFTOVER, "print(sum(squares))", "print(x)"]], timeout_s=10,
                                  use_fork=False, prefix=["data = [3, 1, 2]\nx = 'label'"], state_names=["squares"])
    assert plain.continuation == [] and plain.continuation_state is None
    assert [c["outputs"][0]["text"] for c in leftover.continuation] == ["14\n", "2\n"]  # x is the loop's last value
    assert set(leftover.continuation_state) == {"squares", "data"} and "x" in leftover.changed
    assert [c["status"] for c in broken.continuation] == ["error", "ok"]  # a failing cell does not stop the rest
    assert broken.continuation[0]["ename"] == "NameError" and set(broken.continuation_state) == set()
    assert after.outputs[0]["text"] == "False label [3, 1, 2]\n"  # the kernel's own state is untouched
    # The replay fallback (no fork) runs the same sequence and reports the same way.
    assert [c["outputs"][0]["text"] for c in replayed.continuation] == ["14\n", "2\n"]
    assert replayed.continuation_state == {"squares": leftover.continuation_state["squares"]}


def test_alarms_of_the_developers_own_next_cells_are_not_the_predictions(tmp_path):
    walk = "import gc\nlen(gc.get_referents(data))"  # the developer's next cell walks referents (a library might)
    with KernelSession(tmp_path, Limits(cell_timeout_s=20)) as session:
        session.execute("data = [3, 1, 2]")
        first, second, plain, walking = run_branches(
            session, [["total = sum(data)", walk]] * 2 + [["total = 6", walk],
                                                          ["import gc\ngc.get_referents(data)\ntotal = 6", walk]],
            timeout_s=10, state_names=["total", "data"])
    assert first.suspicious and all(a.startswith("continuation: ") for a in first.suspicious)
    assert own_alarms(plain, [first, second]) == []
    assert own_alarms(walking, [first, second]) == ["gc.get_referents"]  # the prediction's own walk still counts


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    trajectory = Trajectory(id=KERNEL, notebook="nb.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                        for i, code in enumerate(CELLS)],
                            events=[KernelEvent("restart", before=RESTART_BEFORE)])
    workspace = tmp_path_factory.mktemp("cont-ws")
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20)))
    out = tmp_path_factory.mktemp("cont-release") / "release"
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": "cont-ws"}})
    return open_release(out), workspace


def _score(release, predictions, k):
    loaded, workspace = release
    ids = [f"{KERNEL}/{step}" for step in predictions]
    env = pytest.MonkeyPatch()
    env.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        return sc.score([predictions[s] for s in predictions], [loaded.task_rows("next_cell")[i]["target"] for i in ids], ids=ids,
                        execute=True, release=loaded, workspace=workspace,
                        settings=sc.ScoreSettings(timeout_s=10, continuation_cells=k), progress=lambda msg: None)
    finally:
        env.undo()
        env_settings.cache_clear()


@pytest.mark.slow
def test_continuation_match_judges_by_the_next_cells(release):
    result = _score(release, {TARGET: [CELLS[TARGET], LEFTOVER, RANDOM_DRAW, "squares = data"],
                              8: [CELLS[8], "data.append(4)"]}, k=3)
    reference, leftover, random_draw, wrong = [p for p in result.predictions if p.id == f"{KERNEL}/{TARGET}"]
    assert reference.continuation_match and reference.functional_match
    assert not leftover.state_match and leftover.continuation_match  # `x` changed, but nothing after reads it
    assert random_draw.functional_match and not random_draw.continuation_match  # state equal, the future is not
    assert "continuation cell +2" in random_draw.reason and "output differs" in random_draw.reason
    assert not wrong.continuation_match and "continuation cell +1" in wrong.reason
    target, near_restart = (next(e for e in result.examples if e.id == f"{KERNEL}/{s}") for s in (TARGET, 8))
    assert target.continuation_cells == 3 and target.continuation_problem == ""
    assert near_restart.continuation_cells == 0  # the next cell comes after a logged restart
    silent = [p for p in result.predictions if p.id == f"{KERNEL}/8"][1]
    assert not silent.continuation_match and "output differs" in silent.reason  # its own output is part of it
    assert result.scores["continuation_match"] == pytest.approx((2 / 4 + 1 / 2) / 2)
    assert result.settings.continuation_cells == 3


@pytest.mark.slow
def test_continuation_off_runs_no_extra_cell(release):
    result = _score(release, {TARGET: [RANDOM_DRAW]}, k=0)
    [record], [example] = result.predictions, result.examples
    assert record.continuation_match is None and record.functional_match
    assert example.continuation_cells is None and result.scores["continuation_match"] is None
