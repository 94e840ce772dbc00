"""Each replayed cell's limit from what its developer's run took (themisto.replay.cell_limits): a cell the log saw
finish gets its logged seconds times a factor and ends as it ended for the developer, whatever the default limit; a
cell the log never saw finish keeps the default; the fidelity report lists each stopped cell beside the developer's
seconds. The replay's limits count the kernel's CPU seconds, so that a cell ends the same on a busy host."""

import subprocess
import sys

import pytest

from themisto.ingest.trajectory import Damage, Execution, Trajectory
from themisto.replay.cell_limits import cell_limit
from themisto.replay.fidelity import fidelity_report
from themisto.replay.replay import ReplaySettings, cell_limits, replay_trajectory

# A tiny default limit, so that a cell computing for 2 CPU seconds is longer than it.
TINY = ReplaySettings(cell_timeout_s=1.0, logged_time_factor=2.0, cell_timeout_ceiling_s=30.0, snapshots=False,
                      values=False)
SLEEP_2S = "import time\ntime.sleep(2)\nprint('slept')"


def _spin(seconds: float) -> str:
    """A cell that computes for `seconds` of its own CPU time, however long that takes on the clock."""
    return (f"import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}:\n    pass\n"
            "print('spun')")


def _execution(i: int, code: str, started: str | None, finished: str | None, status: str = "ok") -> Execution:
    return Execution(cell_id=f"c{i}", code=code, status=status, started_at=started, finished_at=finished)


def _trajectory(*executions: Execution) -> Trajectory:
    return Trajectory(id="t-limits", notebook="nb.ipynb", source="june-log", executions=list(executions))


def test_logged_seconds_count_a_queued_cell_from_the_end_of_the_one_before():
    trajectory = _trajectory(
        _execution(0, "a", "2023-05-06T10:00:00.000Z", "2023-05-06T10:04:48.400Z"),
        # queued with the first ("run all"): its own time starts when the first finished
        _execution(1, "b", "2023-05-06T10:00:00.500Z", "2023-05-06T10:04:50.400Z"),
        _execution(2, "c", "2023-05-06T10:05:00.000Z", None, status="unknown"),  # never seen finishing
        _execution(3, "d", None, "2023-05-06T10:06:00.000Z", status="error"),  # no execute event logged
        _execution(4, "e", "2023-05-06T10:07:00Z", "2023-05-06T10:06:00Z"),  # finish before start: not a duration
    )
    assert trajectory.logged_seconds() == [288.4, 2.0, None, None, None]
    limits = cell_limits(trajectory, ReplaySettings())
    assert limits == [2307.2, 120.0, 120.0, 120.0, 120.0]
    # the ceiling caps a lying log; the default is the floor even under a lower ceiling; factor None: fixed
    assert cell_limit(10_000.0, default_s=120.0, factor=4.0, ceiling_s=3600.0) == 3600.0
    assert cell_limit(300.0, default_s=120.0, factor=4.0, ceiling_s=60.0) == 120.0
    assert cell_limits(trajectory, ReplaySettings(logged_time_factor=None)) == [120.0] * 5


def test_interrupted_cells_keep_the_short_limit_whatever_their_logged_time():
    interrupted = Execution(cell_id="c0", code="x", status="error", ename="KeyboardInterrupt",
                            started_at="2023-05-06T10:00:00Z", finished_at="2023-05-06T10:10:00Z")
    assert cell_limits(_trajectory(interrupted), ReplaySettings(interrupted_timeout_s=10.0)) == [10.0]


@pytest.mark.slow
def test_a_cell_logged_longer_than_the_default_ends_ok_and_an_unfinished_one_keeps_the_default(tmp_path):
    trajectory = _trajectory(
        _execution(0, _spin(2), "2023-05-06T10:00:00.000Z", "2023-05-06T10:00:02.000Z"),
        _execution(1, _spin(2), "2023-05-06T10:01:00.000Z", None, status="unknown"),
        # waits without computing: its 1 CPU s limit is never reached, and 2 s is within 4 x 1 s of the clock
        _execution(2, SLEEP_2S, "2023-05-06T10:02:00.000Z", None, status="unknown"),
        # hangs without computing: stopped after 4 x 1 s of the clock all the same
        _execution(3, "import time\ntime.sleep(60)", "2023-05-06T10:03:00.000Z", None, status="unknown"),
    )
    trajectory.executions[1].damage.append(Damage("no_finish", "x.log:9", None, "the log ends first"))
    steps = list(replay_trajectory(trajectory, tmp_path, TINY))
    # 2 s logged, times 2: 4 s, more than the 1 s default, so the cell ends as it did for the developer
    assert (steps[0].status, steps[0].output.strip(), steps[0].time_limit_s) == ("ok", "spun", 4.0)
    assert steps[0].logged.seconds == 2.0 and steps[0].execution_time >= 2.0
    # never seen finishing: the default, and the same cell is stopped there, in CPU seconds
    assert (steps[1].status, steps[1].time_limit_s, steps[1].logged.seconds) == ("timeout", 1.0, None)
    assert "1 CPU s timeout" in steps[1].evalue
    assert (steps[2].status, steps[2].output.strip()) == ("ok", "slept")
    assert steps[3].status == "timeout" and 4.0 <= steps[3].execution_time < 30.0
    [report] = fidelity_report(steps)
    assert [(t.step, t.limit_s, t.developer_s, t.logged) for t in report.timeouts] == [(1, 1.0, None, "unknown"),
                                                                                       (3, 1.0, None, "unknown")]


@pytest.mark.slow
def test_a_fixed_limit_stops_the_long_cell_and_says_what_the_developer_took(tmp_path):
    trajectory = _trajectory(_execution(0, SLEEP_2S, "2023-05-06T10:00:00.000Z", "2023-05-06T10:00:02.000Z"))
    [step] = replay_trajectory(trajectory, tmp_path, ReplaySettings(cell_timeout_s=1.0, logged_time_factor=None,
                                                                    cell_clock="wall", snapshots=False, values=False))
    assert (step.status, step.time_limit_s) == ("timeout", 1.0)
    [report] = fidelity_report([step])
    assert report.status_causes == {"timeout": 1}
    [mismatch] = report.mismatches
    assert "limit of 1 s" in mismatch.reason and "the developer's run took 2.0 s" in mismatch.reason
    assert [(t.step, t.developer_s, t.logged) for t in report.timeouts] == [(0, 2.0, "ok")]


def test_a_release_walked_again_gives_each_cell_the_rule_over_the_builds_own_seconds():
    from themisto.release.states import release_limits

    rows = [{"status": "ok", "execution_time": 300.0, "logged_status": "ok"},  # a long search the build finished
            {"status": "ok", "execution_time": 0.5, "logged_status": "ok"},
            {"status": "timeout", "execution_time": 1153.6, "logged_status": "ok"},  # stopped there: stopped here too
            {"status": "timeout", "execution_time": 10.0, "logged_status": "error", "logged_ename": "KeyboardInterrupt"}]
    assert release_limits(rows, ReplaySettings()) == [2400.0, 120.0, 1153.6, 60.0]
    assert release_limits(rows, ReplaySettings(logged_time_factor=None, interrupted_timeout_s=10.0)) == [120.0, 120.0, 1153.6, 10.0]


@pytest.mark.slow
def test_on_a_busy_core_a_cell_ends_by_its_cpu_seconds_where_the_wall_clock_would_stop_it(tmp_path):
    """Two processes outside the kernel spin on the kernel's own core, so it gets a third of it: a cell of 1 CPU s
    takes about 3 s. Timed by the clock, a 2 s limit stops it (the host's load decides); timed by the kernel's CPU,
    it ends as on an idle host."""
    from themisto.runtime.kernel import KernelSession, Limits

    with KernelSession(tmp_path, Limits(cell_timeout_s=2.0, cell_clock="cpu")) as kernel:
        cores = kernel.execute("import os\nprint(sorted(os.sched_getaffinity(0)))").outputs[0]["text"].strip()
        # each in a session of its own: with the scheduler's autogroups, two in one group would share one half
        busy = [subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {cores})\nwhile True: pass"],
                                 start_new_session=True) for _ in range(2)]
        try:
            by_clock = kernel.execute(_spin(1.0), clock="wall")
            by_cpu = kernel.execute(_spin(1.0))
        finally:
            for process in busy:
                process.kill()
                process.wait()
    assert (by_clock.status, by_clock.ename) == ("timeout", "CellTimeout")
    assert "2 s timeout" in by_clock.evalue
    assert (by_cpu.status, by_cpu.outputs[0]["text"].strip()) == ("ok", "spun")
    assert by_cpu.duration_s > 2.0  # it did take longer than the limit on the clock
