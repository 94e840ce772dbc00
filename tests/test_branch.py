"""Branch execution in a real sandboxed kernel: outputs, statuses and deltas of candidates in the exact pre-cell
state, the parent left as it was, and the fork path agreeing with the replay fallback."""

import shutil

import pytest

from themisto.runtime.branch import BranchError, BranchResult, ProbeBranches, run_branches, run_in_branch
from themisto.runtime.kernel import KernelSession
from themisto.runtime.snapshot import agent_call, take_snapshot

pytestmark = pytest.mark.slow

# The prefix of a task-2 trajectory, on the real features table.
PREFIX = [
    "import pandas as pd\nimport numpy as np",
    "features = pd.read_pickle('test_features.pkl')",
    "counts = features['cell_type'].value_counts()",
    "import random\nrandom.seed(5)\nseen = []",
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, june_dir):
    folder = tmp_path_factory.mktemp("branch-workspace")
    shutil.copy(june_dir / "test_features.pkl", folder / "test_features.pkl")  # a temp copy, never the repo
    return folder


def _start(workspace):
    session = KernelSession(workspace)
    session.start()
    for code in PREFIX:
        result = session.execute(code)
        assert result.status == "ok", result.traceback
    return session


@pytest.fixture(scope="module")
def session(workspace):
    session = _start(workspace)
    yield session
    session.close()


def _count(session) -> int:
    content = session.execute_silent("", user_expressions={"n": "get_ipython().execution_count"})
    return int(content["user_expressions"]["n"]["data"]["text/plain"])


def _texts(result) -> list[tuple]:
    """Outputs as comparable facts: kind, stream name, text or text/plain, error name (tracebacks differ)."""
    facts = []
    for output in result.outputs:
        kind = output["output_type"]
        if kind == "stream":
            facts.append((kind, output["name"], output["text"]))
        elif kind == "error":
            facts.append((kind, output["ename"], output["evalue"]))
        else:
            facts.append((kind, output["data"].get("text/plain")))
    return facts


def test_candidates_run_in_the_pre_cell_state_and_leave_it_unchanged(session):
    before = take_snapshot(session)
    count = _count(session)
    results = run_branches(session, [
        "features.shape",
        "print(features['filename'].nunique())\ntotal = int(counts.sum())",
        "del seen",
        "features.drop(columns=['filename'], inplace=True)\nfeatures.shape",
        "undefined_name",
        "%who_ls list",
        "x = 1;",
        "from IPython.display import display\ndisplay(features.head(2))",
    ], timeout_s=20)
    assert [r.index for r in results] == list(range(8))
    assert all(r.method == "fork" for r in results)
    shape, printed, deleted, dropped, undefined, magic, quiet, shown = results
    assert shape.status == "ok" and _texts(shape) == [("execute_result", "(1918, 21)")]
    assert shape.added == shape.changed == shape.deleted == {}
    assert shape.state_hash_after == before.state_hash
    assert _texts(printed) == [("stream", "stdout", "94\n")]
    assert list(printed.added) == ["total"]
    assert deleted.deleted == {"seen": before.variables["seen"].hash}
    assert _texts(dropped) == [("execute_result", "(1918, 20)")] and list(dropped.changed) == ["features"]
    assert undefined.status == "error" and undefined.ename == "NameError"
    assert "name 'undefined_name' is not defined" in undefined.evalue
    assert any("NameError" in line for line in undefined.traceback)
    assert all("\x1b[" not in line for line in undefined.traceback)
    assert magic.status == "ok" and "seen" in _texts(magic)[0][1]
    assert quiet.outputs == [] and list(quiet.added) == ["x"]
    assert shown.outputs[0]["output_type"] == "display_data" and "text/html" in shown.outputs[0]["data"]
    after = take_snapshot(session)
    assert after.state_hash == before.state_hash
    assert _count(session) == count


def test_identity_delta_trusts_large_unchanged_objects_and_sees_structure(session):
    session.execute("big = np.zeros(2_000_000)\nsmall = [1, 2]")
    try:
        codes = ["big[0] = 1.0", "big = big[:10]", "small.append(3)", "features['new'] = 1"]
        exact = run_branches(session, codes, delta="hash")
        fast = run_branches(session, codes, delta="identity")
        assert list(exact[0].changed) == ["big"] and exact[0].unverified == []
        assert fast[0].changed == {} and "big" in fast[0].unverified  # an in-place write it cannot see, said so
        for index in (1, 2, 3):
            assert exact[index].changed == fast[index].changed and exact[index].changed
            assert exact[index].state_hash_after == fast[index].state_hash_after
    finally:
        session.execute("del big, small")


def test_a_next_candidate_that_could_not_be_forked_early_runs_in_its_turn(session):
    # The next candidate is forked while the one before runs; when that fork fails (every process the uid may have
    # is taken), it is forked again in its turn. Made to fail here, in the kernel, for every second early fork.
    patch = ("import themisto.runtime.agent.candidate as _b\n_b._real_start, _b._calls = _b.start, [0]\n"
             "def _failing(*args):\n    _b._calls[0] += 1\n    if _b._calls[0] % 2 == 0:\n"
             "        raise BlockingIOError(11, 'Resource temporarily unavailable')\n    return _b._real_start(*args)\n"
             "_b.start = _failing")
    assert session.execute_silent(patch)["status"] == "ok"
    try:
        results = run_branches(session, ["print(1)", "print(2)", "print(3)", "print(4)"], timeout_s=10)
        calls = session.execute_silent("", user_expressions={"n": "_b._calls[0]"})["user_expressions"]["n"]
    finally:
        session.execute_silent("_b.start = _b._real_start")
    assert [r.outputs[0]["text"] for r in results] == ["1\n", "2\n", "3\n", "4\n"]
    assert calls["data"]["text/plain"] == "7"  # 1 + 3 early forks that failed + the 3 made again in their turn


def test_a_candidate_reaches_the_kernel_as_data_not_as_source(session):
    # Text that would end a string literal, a list and a call: it must arrive as the same string and run as itself,
    # and no expression the kernel evaluates may contain it (it rides in the request's metadata).
    code = "text = 'a\\'b\"c' + \"]), print('injected') #\"\nprint(len(text), text)"
    sent = []
    real = session.execute_silent

    def spy(*args, **kwargs):
        sent.append(kwargs)
        return real(*args, **kwargs)

    session.execute_silent = spy
    try:
        [result] = run_branches(session, [code], timeout_s=20)
    finally:
        del session.execute_silent
    assert result.status == "ok", result.evalue
    assert _texts(result) == [("stream", "stdout", "28 a'b\"c]), print('injected') #\n")]
    [request] = sent
    assert request["metadata"]["themisto_arguments"]["codes"] == [[code]]
    assert not any("injected" in expression for expression in request["user_expressions"].values())


def test_run_in_branch_gives_the_bounded_output_status_and_whether_the_state_changed(session):
    before = take_snapshot(session)
    looked = run_in_branch(session, "print(features.shape, len(seen))")
    assert (looked.status, _texts(looked), looked.changed_state) == ("ok", [("stream", "stdout", "(1918, 21) 0\n")],
                                                                     False)
    changed = run_in_branch(session, "seen.append(1)\nopen('probe.txt', 'w').write('x')")
    assert changed.status == "ok" and changed.changed_state is True and list(changed.changed) == ["seen"]
    assert changed.workdir_changes == {"added": ["probe.txt"]} and changed.workdir_restored
    flood = run_in_branch(session, "print('x' * 5000)", output_bytes=1000)
    assert flood.truncated and sum(len(o.get("text", "")) for o in flood.outputs) < 2000
    slow = run_in_branch(session, "import time\ntime.sleep(30)", timeout_s=0.5)
    # cut by its own timer, then hashed (False); or, on a loaded machine, killed before it could report (None)
    assert slow.status == "timeout" and slow.changed_state is not True
    gone = run_in_branch(session, "import os\nos._exit(3)")
    assert gone.status == "kernel_died" and gone.changed_state is None  # no state left to compare
    failed = run_in_branch(session, "1/0")
    assert failed.status == "error" and failed.ename == "ZeroDivisionError" and failed.changed_state is False
    assert take_snapshot(session).state_hash == before.state_hash
    assert not (session.workdir / "probe.txt").exists()


def test_a_state_is_hashed_once_for_its_branches_and_again_after_any_cell(session):
    # Probes ask for many branches of one state: the kernel keeps its hashes of the namespace until a cell runs. A
    # cell that changes a value in place (same object, same name) must not be taken for the same state.
    def branch(code):
        answer = agent_call(session, "branch", timeout=60, codes=[[code]], workdir=None)
        [result] = answer["results"]
        facts = (answer["before_kept"], result["outputs"][-1]["data"]["text/plain"] if result["outputs"] else None,
                 sorted(result["changed"]))
        assert answer["state_hash_before"] == take_snapshot(session).state_hash, code
        return facts

    assert session.execute("kept = [1, 2]").status == "ok"
    try:
        assert branch("len(kept)") == (False, "2", [])
        assert branch("kept.append(0)") == (True, None, ["kept"])  # only its branch changed
        assert branch("len(kept)") == (True, "2", [])
        assert session.execute("kept.append(3)").status == "ok"
        assert branch("len(kept)") == (False, "3", [])
        session.execute_silent("kept.append(4)")  # a silent cell runs code too (a restore's cells)
        assert branch("len(kept)") == (False, "4", [])
        # A cell that removes the kernel's count of cells: the next branch cannot trust what was kept.
        assert session.execute("events = get_ipython().events.callbacks['pre_execute']\n"
                               "events[:] = [e for e in events if type(e).__name__ != '_Count']\n"
                               "del events\nkept.append(5)").status == "ok"
        assert branch("len(kept)") == (False, "5", [])
        assert branch("len(kept)") == (True, "5", [])
        assert session.execute("kept.append(6)").status == "ok"  # counted again
        assert branch("len(kept)") == (False, "6", [])
    finally:
        session.execute("del kept")


def test_bad_requests_are_refused_clearly(session):
    with pytest.raises(BranchError, match="prefix"):
        run_branches(session, ["1"], use_fork=False)
    with pytest.raises(ValueError, match="delta"):
        run_branches(session, ["1"], delta="fuzzy")
    assert run_branches(session, []) == []


def test_result_round_trips():
    result = BranchResult(index=2, status="error", outputs=[{"output_type": "error", "ename": "E", "evalue": "v",
                                                             "traceback": []}], ename="E", evalue="v")
    assert BranchResult.from_dict(result.to_dict()) == result


def test_fork_and_replay_agree(workspace):
    candidates = [
        "features.shape",
        "print(counts.head(3))\nseen.append(1)",
        "random.random()",
        "1/0",
        "import sys\nsys.exit()",
        "features['x'] = 1\nlen(features.columns)",
        "del counts\nimport os\nos.listdir('.')",
    ]
    session = _start(workspace)
    try:
        before = take_snapshot(session)
        forked = run_branches(session, candidates, timeout_s=20)
        replayed = run_branches(session, candidates, timeout_s=20, prefix=PREFIX, use_fork=False)
        assert take_snapshot(session).state_hash == before.state_hash  # replay leaves the prefix state behind too
    finally:
        session.close()
    assert [r.method for r in replayed] == ["replay"] * len(candidates)
    for fork, replay in zip(forked, replayed):
        assert (fork.status, fork.ename, fork.evalue) == (replay.status, replay.ename, replay.evalue), fork.index
        assert _texts(fork) == _texts(replay), fork.index
        assert (fork.added, fork.changed, fork.deleted) == (replay.added, replay.changed, replay.deleted), fork.index
        assert fork.state_hash_after == replay.state_hash_after, fork.index
    assert forked[4].ename == "SystemExit"


def test_a_previous_syntax_error_does_not_spoil_candidates_and_semicolons_are_the_candidates():
    # IPython tokenizes the newest history entry to decide whether to display the last expression; a branch
    # must look at the candidate, not at the kernel's last cell (which here does not even tokenize).
    with KernelSession() as session:
        assert session.execute("x = len([1]\ny = 2").ename == "SyntaxError"
        shown, hidden = run_branches(session, ["z = 3\nz", "z = 3\nz;"])
        assert shown.status == "ok" and _texts(shown) == [("execute_result", "3")]
        assert hidden.status == "ok" and _texts(hidden) == []


def test_probe_branches_answer_before_their_state_check_and_serve_no_state_gone(session):
    # The probe mode's branches (agent.ahead): each probe's answer comes back before its state check, which settle
    # fills in; the branch forked ahead for the next probe serves only the state it was forked in, not one a cell has
    # changed since (here in place: the same object under the same name).
    before = take_snapshot(session)
    probes = ProbeBranches(session, timeout_s=20)
    probes.ahead()
    looked = probes.run("print(features.shape, len(seen))")
    changed = probes.run("seen.append(1)\nopen('probe.txt', 'w').write('x')")
    assert probes.forked_ahead == 2  # both branches were ready before their probe came
    assert (looked.status, _texts(looked)) == ("ok", [("stream", "stdout", "(1918, 21) 0\n")])
    assert changed.status == "ok" and changed.changed_state is None  # not checked yet
    results = probes.settle()
    assert results[looked.index].changed_state is False and results[looked.index].outputs == looked.outputs
    assert results[changed.index].changed_state is True and list(results[changed.index].changed) == ["seen"]
    assert results[changed.index].workdir_changes == {"added": ["probe.txt"]}
    assert take_snapshot(session).state_hash == before.state_hash and not (session.workdir / "probe.txt").exists()

    probes = ProbeBranches(session, timeout_s=20)
    assert _texts(probes.run("print(seen)")) == [("stream", "stdout", "[]\n")]  # then the next one is forked ahead
    assert session.execute("seen.append(7)").status == "ok"
    try:
        assert _texts(probes.run("print(seen)")) == [("stream", "stdout", "[7]\n")]
        assert probes.forked_ahead == 0
        assert all(result.changed_state is False for result in probes.settle().values())
    finally:
        assert session.execute("seen.clear()").status == "ok"
