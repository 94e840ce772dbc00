"""Replay in real sandboxed kernels: snapshots after every step, logged restarts honoured, lost state rebuilt,
resumable output, and the fidelity report's arithmetic."""

import json

import pytest

from themisto.replay.fidelity import fidelity_report
from themisto.replay.replay import LoggedOutcome, ReplaySettings, Step, relogged, replay_trajectory
from themisto.replay.steps_file import read_steps, replay_to_file
from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory

FAST = ReplaySettings(cell_timeout_s=4.0, interrupted_timeout_s=2.0)


def _traj(codes, *, tid="t-1", restarts=(), statuses=None):
    statuses = statuses or {}
    executions = []
    for i, code in enumerate(codes):
        status, ename = statuses.get(i, ("ok", None))
        executions.append(Execution(cell_id=f"c{i}", code=code, status=status, ename=ename))
    events = [KernelEvent(kind="restart", before=b) for b in restarts]
    return Trajectory(id=tid, notebook="nb.ipynb", source="test", executions=executions, events=events)


@pytest.mark.slow
def test_replay_records_outputs_snapshots_and_honours_logged_restart(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    traj = _traj(
        ["x = 40 + 2", "print(open('in.txt').read().strip(), x)", "x", "!pip install nothing-at-all\ny = x + 1",
         "z = 1", "x"],
        restarts=[5],
        statuses={5: ("error", "NameError")},
    )
    steps = list(replay_trajectory(traj, tmp_path, FAST))
    assert [s.step for s in steps] == list(range(6))
    assert steps[1].output.strip() == "hello 42"
    assert steps[2].output_types == ["execute_result"] and steps[2].output.strip() == "42"
    # the install line was cleaned (no network in the sandbox) but the rest of the cell ran
    assert steps[3].replayed_code != steps[3].code and steps[3].status == "ok"
    assert {v["name"] for v in steps[3].variables} == {"x", "y"}
    # every step carries a snapshot; the state hash changes when the namespace does
    assert all(s.state_hash for s in steps)
    assert steps[0].state_hash != steps[3].state_hash
    assert steps[2].state_hash == steps[1].state_hash  # reading `x` changes nothing
    assert all(s.memory_bytes and s.memory_bytes > 10_000_000 for s in steps)
    # the logged restart before step 5 wiped the namespace, as it did for the developer
    assert steps[5].restarted_before and steps[5].status == "error" and steps[5].ename == "NameError"
    assert steps[5].variables == []


@pytest.mark.slow
def test_state_lost_to_an_uninterruptible_cell_is_rebuilt(tmp_path):
    # it computes (the replay's limit counts CPU seconds) and ignores the interrupt
    hang = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    traj = _traj(["a = 7", hang, "print(a * 6)"])
    steps = list(replay_trajectory(traj, tmp_path, FAST))
    assert steps[1].status == "timeout" and steps[1].kernel_restarted
    assert steps[1].rebuilt_steps == 1  # `a = 7` ran again; the hanging cell did not
    assert steps[2].status == "ok" and steps[2].output.strip() == "42"


def _fake_step(i, status, ename=None, logged=("ok", None), types=None, logged_types=None, code="x"):
    return Step(kernel_id="k", step=i, cell_id="c", code=code, replayed_code=code, cleaning=[],
                restarted_before=False, status=status, ename=ename, evalue=None, output="", outputs=[],
                output_types=types or [], execution_time=0.1, memory_bytes=1, state_hash="h", variables=[],
                snapshot_failures={}, kernel_restarted=False, rebuilt_steps=0,
                logged=LoggedOutcome(logged[0], logged[1], None, logged_types or []), notebook="nb")


def test_fidelity_shares_and_reasons():
    steps = [
        _fake_step(0, "ok"),
        _fake_step(1, "error", "KeyError", logged=("error", "KeyError"), types=["error"], logged_types=["error"]),
        _fake_step(2, "error", "KeyError", logged=("error", "NameError"), types=["error"], logged_types=["error"]),
        _fake_step(3, "ok", logged=("error", "ModuleNotFoundError"), logged_types=["error"]),
        _fake_step(4, "timeout", logged=("error", "KeyboardInterrupt"), types=["error"], logged_types=["error"]),
        _fake_step(5, "ok", logged=("unknown", None)),  # no finished event: not comparable
        _fake_step(6, "ok", logged=("error", None), code=""),  # code not logged: not comparable
    ]
    (report,) = fidelity_report(steps)
    assert report.executions_replayed == 7 and report.comparable == 5 and report.logged_errors == 4
    assert report.status_match == pytest.approx(4 / 5)
    assert report.ename_match == pytest.approx(2 / 4)  # steps 1 and 4 (a timeout reads as an interrupt)
    kinds = {(m.step, m.kind) for m in report.mismatches}
    assert kinds == {(2, "ename"), (3, "status")}
    assert "installed" in next(m.reason for m in report.mismatches if m.step == 3)
    assert [(m.step, m.cause) for m in report.mismatches] == [(2, "other_exception"), (3, "package_installed")]
    assert report.status_causes == {"package_installed": 1}
    causes = fidelity_report([
        _fake_step(0, "error", "NameError"), _fake_step(1, "error", "FileNotFoundError"), _fake_step(2, "timeout"),
        _fake_step(3, "error", "KeyError"), _fake_step(4, "ok", logged=("error", "KeyboardInterrupt")),
        _fake_step(5, "error", "NameError")])[0].status_causes
    assert causes == {"interrupted": 1, "missing_input": 1, "timeout": 1, "name_lost": 2, "replay_raised": 1}


@pytest.mark.slow
def test_replay_to_file_resumes_after_an_interruption(tmp_path):
    out = tmp_path / "not-yet" / "steps.jsonl"  # a missing folder is made
    trajs = [_traj(["a = 1", "a"], tid="first"), _traj(["b = 2", "b"], tid="second")]

    def stop_in_second(msg):
        if msg.startswith("second"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay_to_file(trajs, out, tmp_path, FAST, progress=stop_in_second)
    assert not out.exists()  # nothing half-written under the final name
    run = replay_to_file(trajs, out, tmp_path, FAST, progress=lambda msg: None)
    assert run.resumed == ["first"] and run.replayed == ["second"]
    steps = read_steps(out)
    assert [(s.kernel_id, s.step) for s in steps] == [("first", 0), ("first", 1), ("second", 0), ("second", 1)]
    assert not (out.parent / "steps.jsonl.partial").exists()


def test_a_replay_read_back_takes_the_logs_verdict_as_ingest_reads_it_now():
    """The replay observed the code; whether the log's text is damaged is ingest's reading, which can learn after
    the replay: a build from a steps file takes it from the logs, and refuses steps whose code the logs no longer
    hold."""
    steps = [_fake_step(0, "ok", code="x = 1"), _fake_step(1, "error", "SyntaxError", code="if i  break")]
    now = _traj(["x = 1", "if i  break"], tid="k", statuses={1: ("unknown", None)})
    now.executions[1].code_state = "damaged"
    got = relogged(steps, [now], "steps.jsonl")
    assert [(s.logged.status, s.logged.code_state) for s in got] == [("ok", "as_logged"), ("unknown", "damaged")]
    assert [s.status for s in got] == ["ok", "error"]  # what the replay saw stays
    with pytest.raises(ValueError, match=r"steps.jsonl: trajectory k step 1 was replayed from another reading"):
        relogged(steps, [_traj(["x = 1", "if i >= 1: break"], tid="k")], "steps.jsonl")


def test_read_steps_names_file_and_line(tmp_path):
    bad = tmp_path / "steps.jsonl"
    bad.write_text(json.dumps(_fake_step(0, "ok").to_dict()) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"steps.jsonl:2"):
        read_steps(bad)


@pytest.mark.slow
def test_snapshot_on_the_cells_request_equals_a_separate_snapshot(tmp_path):
    from themisto.runtime.kernel import KernelSession
    from themisto.runtime.snapshot import SNAPSHOT_EXPRESSIONS, snapshot_from_expressions, take_snapshot

    with KernelSession(tmp_path) as session:
        ok = session.execute("import pandas as pd\nframe = pd.DataFrame({'a': [1, 2]})",
                             user_expressions=SNAPSHOT_EXPRESSIONS)
        carried = snapshot_from_expressions(ok.user_expressions)
        separate = take_snapshot(session)
        assert carried is not None and carried.state_hash == separate.state_hash
        assert set(carried.variables) == {"frame"}
        # IPython evaluates user expressions only after a cell that succeeded; the kernel evaluates the snapshot
        # after a failed one too (no second request), and what the snapshot writes (a print in a __repr__) is no
        # step's output
        failed = session.execute("class Loud:\n    def __repr__(self):\n        print('from repr')\n"
                                 "        return 'Loud()'\nloud = Loud()\nframe['b'] = 1 / 0",
                                 user_expressions={**SNAPSHOT_EXPRESSIONS, "other": "1 + 1"})
        assert failed.status == "error" and "other" not in failed.user_expressions
        carried = snapshot_from_expressions(failed.user_expressions)
        assert carried is not None and carried.variables["loud"].repr == "Loud()"
        assert "from repr" not in json.dumps(failed.outputs)
        assert carried.state_hash == take_snapshot(session).state_hash


@pytest.mark.slow
def test_a_steps_execution_time_is_the_cells_own_whatever_its_snapshot_costs(tmp_path):
    # an object hashed by pickling a million strings makes every snapshot after it take a while; the sleeping cell's
    # time still ends where the cell did (it once had the snapshot's time taken off a second time)
    held = "class Held:\n    pass\nheld = Held()\nheld.data = [str(i) for i in range(1_000_000)]"
    steps = list(replay_trajectory(_traj([held, "import time\ntime.sleep(0.5)"]), tmp_path, FAST))
    assert steps[1].status == "ok" and 0.5 <= steps[1].execution_time < 5


@pytest.mark.slow
def test_a_package_the_log_shows_missing_stays_unimportable_until_its_install(tmp_path):
    from themisto.replay.missing_packages import hidden_modules

    missing = {"status": "error", "ename": "ModuleNotFoundError", "evalue": "No module named 'tabulate'"}
    executions = [Execution(cell_id="c0", code="import tabulate", **missing), Execution(cell_id="c1", code="x = 1"),
                  Execution(cell_id="c2", code="import tabulate.x", **missing),
                  Execution(cell_id="c3", code="import tabulate", **missing),
                  Execution(cell_id="c4", code="!pip install tabulate==0.9.0"),
                  Execution(cell_id="c5", code="import tabulate\ny = 1 if tabulate.tabulate else 0"),
                  Execution(cell_id="c6", code="y")]
    traj = Trajectory(id="t-missing", notebook="nb.ipynb", source="test", executions=executions,
                      events=[KernelEvent(kind="restart", before=3)])
    assert [sorted(h) for h in hidden_modules(executions)] == [["tabulate"]] * 4 + [[]] * 3
    steps = list(replay_trajectory(traj, tmp_path, FAST))
    # As in the log: missing before the install (in both kernel lives), there after it.
    assert [s.status for s in steps] == ["error", "ok", "error", "error", "ok", "ok", "ok"]
    assert {s.ename for s in steps[:4]} - {None} == {"ModuleNotFoundError"}
    assert steps[6].output.strip() == "1"
    # The finder binds nothing the snapshot sees.
    assert {v["name"] for v in steps[1].variables} == {"x"}


def test_a_missing_package_is_hidden_until_after_its_last_logged_error():
    from themisto.replay.missing_packages import hidden_modules

    def run(code, missing=None):
        if missing is None:
            return Execution(cell_id=code, code=code, status="ok")
        return Execution(cell_id=code, code=code, status="error", ename="ModuleNotFoundError",
                         evalue=f"No module named '{missing}'")

    # numpy missing twice; a restart after its last error (installed in a terminal) ends the hiding, so the pandas
    # import the log shows working works; a restart before that last error does not.
    executions = [run("import pandas", "numpy"), run("x = 1"), run("import pandas", "numpy"), run("y = 2"),
                  run("import pandas")]
    assert [sorted(h) for h in hidden_modules(executions, restarts={1, 3})] == [["numpy"]] * 3 + [[], []]
    assert [sorted(h) for h in hidden_modules(executions)] == [["numpy"]] * 5
    # Not a package the environment lacked: a submodule that is not one, the standard library.
    for evalue in ("No module named 'datetime.datetime'; 'datetime' is not a package", "No module named 'json'"):
        wrong = Execution(cell_id="w", code="import x", status="error", ename="ModuleNotFoundError", evalue=evalue)
        assert hidden_modules([wrong, run("y = 1")]) == [frozenset(), frozenset()]
    # An import the log shows working before the first error keeps it importable up to there.
    assert [sorted(h) for h in hidden_modules([run("import tqdm"), run("x = 1"), run("import tqdm", "tqdm")])] == [
        [], ["tqdm"], ["tqdm"]]
