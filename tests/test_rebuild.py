"""The one state rebuild, in a real sandboxed kernel: the cells run again in a fresh kernel, a cell that loses the
state again is left out (or, strict, stops the rebuild), and replay's recipe rebuilds the state before a step."""

import pytest

from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory
from themisto.replay.replay import ReplaySettings, life_cells, rebuild_before
from themisto.runtime.kernel import KernelSession, Limits
from themisto.runtime.rebuild import RerunCell, StateLost, rebuild_state
from themisto.runtime.snapshot import take_snapshot

pytestmark = pytest.mark.slow

# Only a cell that ends the kernel loses the state.
DIES = "import os\nos._exit(1)"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with KernelSession(tmp_path_factory.mktemp("rebuild"), Limits(cell_timeout_s=20)) as session:
        yield session


def _names(session) -> dict[str, str]:
    return {name: info.repr for name, info in take_snapshot(session).variables.items()}


def test_a_cell_that_loses_the_state_is_left_out_and_the_rebuild_starts_over(session):
    session.execute("stale = 1")
    cells = [RerunCell(0, "a = 1"), RerunCell(1, "a += 1"), RerunCell(2, DIES), RerunCell(3, "b = a * 10"),
             RerunCell(4, "gone = 1"), RerunCell(5, "c = 3")]
    done = rebuild_state(session, cells, lost={4})
    assert done.lost == frozenset({2, 4})
    assert done.ran == 3 + 4  # 0, 1, 2 (it died), then 0, 1, 3, 5 in the fresh kernel
    assert _names(session) == {"a": "2", "b": "20", "c": "3"}  # restarted: `stale` is gone, `gone` never ran


def test_a_strict_rebuild_stops_at_the_cell_that_lost_the_state(session):
    with pytest.raises(StateLost, match="step 7 ended kernel_died") as caught:
        rebuild_state(session, [RerunCell(6, "x = 1"), RerunCell(7, DIES), RerunCell(8, "y = 2")], strict=True)
    assert caught.value.step == 7
    assert _names(session) == {}


def test_replay_rebuilds_the_state_before_a_step_from_its_kernel_life(session):
    executions = [Execution(cell_id=f"c{i}", code=code, status="ok") for i, code in
                  enumerate(["before = 1", "x = 1", "!pip install nothing\nx += 1", "x *= 10", "target"])]
    trajectory = Trajectory(id="t", notebook="nb.ipynb", source="test", executions=executions,
                            events=[KernelEvent(kind="restart", before=1)])
    settings = ReplaySettings(cell_timeout_s=20)
    cells = life_cells(trajectory, 1, 4, settings)
    assert [c.step for c in cells] == [1, 2, 3] and "pip" not in cells[1].code  # cleaned as replay ran it
    done = rebuild_before(session, trajectory, 4, settings, lost={3})
    assert (done.ran, done.lost) == (2, frozenset({3}))
    assert _names(session) == {"x": "2"}  # the restart before step 1 is honoured: `before` is not rebuilt
