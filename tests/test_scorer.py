"""The scorer on a tiny release built here from a short trajectory replayed in a real kernel: text scores, execution
in the exact pre-cell state, nondeterminism, errors, hostile predictions, bad input and resume."""

import dataclasses
import itertools
import math

import pytest

from themisto.errors import InputError
from themisto.scoring import execution, judging, records
from themisto.scoring import scorer as sc
from themisto.gate import ExecutionRefused
from themisto.release.parquet import build_release
from themisto.replay.replay import ReplaySettings, replay_trajectory
from themisto.settings import settings as env_settings
from themisto.release.tasks import TaskSettings, trajectory_rows
from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory
from themisto.release.folder import open_release

KERNEL = "tiny-kernel"
# Step -> code. Step 7 reads the clock (nondeterministic), step 8 raises, a restart comes before step 9.
CELLS = [
    "data = [3, 1, 2]",
    "total = sum(data)",
    "print(total)",
    "label = 'x'",
    "data.sort()",
    "print(open('input.csv').read().splitlines()[0])",
    "average = total / len(data)\nprint(average)",
    "import time\nstamp = time.time()\nprint(stamp)",
    "del label\nmissing_name + 1",
    "data = [5]",
    "print(data)",
]
RESTART_BEFORE = 9
ids = [f"{KERNEL}/{step}" for step in range(5, len(CELLS))]


def _id(step: int) -> str:
    return f"{KERNEL}/{step}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scorer-ws")
    (folder / "input.csv").write_text("a,b\n1,2\n")
    return folder


@pytest.fixture(scope="module")
def release(tmp_path_factory, workspace):
    """A release of one trajectory, every next_cell target in `test`, replayed over `workspace`."""
    trajectory = Trajectory(id=KERNEL, notebook="task1.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                        for i, code in enumerate(CELLS)],
                            events=[KernelEvent("restart", before=RESTART_BEFORE)])
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20)))
    out = tmp_path_factory.mktemp("scorer-release") / "release"
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": "scorer-ws"}})
    return open_release(out)


def _targets(release, example_ids):
    return [release.task_rows("next_cell")[i]["target"] for i in example_ids]


# ---------------------------------------------------------------------------------------------------------------
# text only: no kernel, no gate


def test_text_scores_with_several_predictions_average_per_example():
    result = sc.score([["x = 1", "x = 2"], "y"], ["x = 1", "y"], ids=["a/1", "b/2"])
    assert result.scores["exact_match"] == pytest.approx((0.5 + 1.0) / 2)
    assert [(p.id, p.index, p.exact_match) for p in result.predictions] == [("a/1", 0, 1.0), ("a/1", 1, 0.0),
                                                                          ("b/2", 0, 1.0)]
    assert all(p.outcome is None and p.functional_match is None for p in result.predictions)
    assert "functional_match" not in result.scores


def test_output_prediction_reports_equivalence_beside_exact_match():
    result = sc.score(["0.30000000000000004", "KeyError: 'b'"], ["0.3", "KeyError: 'a'"],
                      settings=sc.ScoreSettings(task="output_prediction"))
    assert [p.exact_match for p in result.predictions] == [0.0, 0.0]
    assert [(p.output_equivalent, p.equivalence_rule) for p in result.predictions] == [(True, "numbers"),
                                                                                      (False, "error")]
    assert result.scores["output_equivalent"] == 0.5


@pytest.mark.parametrize("predictions, references, ids, message", [
    (["a", "b"], ["a"], None, "2 predictions for 1 references"),
    (["a", 3], ["a", "b"], ["k/1", "k/2"], "example k/2: the prediction is int"),
    ([["a", None]], ["a"], ["k/1"], "example k/1: prediction 1 is NoneType"),
    ([[]], ["a"], ["k/1"], "example k/1: the prediction is list"),
    (["a", "b"], ["a", "b"], ["k/1", "k/1"], "example k/1: the id appears more than once"),
    ("ab", ["a", "b"], None, "must be lists"),
])
def test_bad_input_names_the_example(predictions, references, ids, message):
    with pytest.raises(sc.ScoreError, match=message):
        sc.score(predictions, references, ids=ids)


def test_pass_at_k_is_the_unbiased_estimator():
    # Brute force: the share of k-subsets of n samples that hold at least one of the c correct ones.
    for n, c, k in [(5, 2, 1), (5, 2, 3), (6, 1, 2), (4, 0, 2), (3, 3, 3)]:
        subsets = list(itertools.combinations(range(n), k))
        expected = sum(1 for s in subsets if any(i < c for i in s)) / len(subsets)
        assert math.isclose(records.pass_at_k(n, c, k), expected)
    with pytest.raises(ValueError):
        records.pass_at_k(2, 1, 3)


def _branch(status="ok", text="", added=None, changed=None, deleted=None, ename=None):
    from themisto.runtime.branch import BranchResult

    outputs = [{"output_type": "stream", "name": "stdout", "text": text}] if text else []
    return BranchResult(index=0, status=status, outputs=outputs, ename=ename, added=added or {},
                        changed=changed or {}, deleted=deleted or {})


def test_state_match_rules():
    reference = _branch(added={"model": "h1"}, changed={"df": "h2"}, deleted={"tmp": "h0"})
    same_plus_extra = _branch(added={"model": "h1", "i": "h9"}, changed={"df": "h2"}, deleted={"tmp": "h0"})
    assert judging._state_difference(reference, same_plus_extra) is None  # a new name of its own is allowed
    assert "`model` holds a different value" in judging._state_difference(
        reference, _branch(added={"model": "hX"}, changed={"df": "h2"}, deleted={"tmp": "h0"}))
    assert "`tmp` was deleted by the reference" in judging._state_difference(
        reference, _branch(added={"model": "h1"}, changed={"df": "h2"}))
    assert "`labels` was changed by the prediction only" in judging._state_difference(
        reference, _branch(added={"model": "h1"}, changed={"df": "h2", "labels": "h7"}, deleted={"tmp": "h0"}))


def test_reference_problems():
    settings = sc.ScoreSettings()
    ok = {"status": "ok", "ename": None}
    assert judging.reference_problem(_branch(text="1"), _branch(text="1"), ok, settings) is None
    status, reason = judging.reference_problem(_branch(added={"x": "a"}), _branch(added={"x": "b"}), ok, settings)
    assert status == "nondeterministic" and "x" in reason
    assert judging.reference_problem(_branch(text="1"), _branch(text="2"), ok, settings)[0] == "nondeterministic"
    assert judging.reference_problem(_branch("timeout"), _branch("timeout"), ok, settings)[0] == "reference_unfinished"
    # A reference that needs more memory than a branch gets ends otherwise than in the release's replay.
    status, reason = judging.reference_problem(_branch("error", ename="MemoryError"),
                                           _branch("error", ename="MemoryError"), ok, settings)
    assert status == "reference_diverged" and "MemoryError" in reason and "recorded ok" in reason
    assert judging.reference_problem(_branch("error", ename="KeyError"), _branch("error", ename="KeyError"),
                                 {"status": "error", "ename": "KeyError"}, settings) is None


# ---------------------------------------------------------------------------------------------------------------
# the gate


def test_execution_is_refused_without_the_environment_switch(monkeypatch):
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    env_settings.cache_clear()
    with pytest.raises(ExecutionRefused, match="HF_ALLOW_CODE_EVAL") as refused:
        sc.score(["x"], ["x"], ids=["k/1"], execute=True, release="/no/such/release")
    assert "not a security boundary" in str(refused.value) and "--execute" in str(refused.value)


def test_execution_is_refused_for_output_prediction(allow_execution):
    with pytest.raises(sc.ScoreError, match="next_cell only"):
        sc.score(["1"], ["1"], ids=["k/1"], execute=True, release="unused",
                 settings=sc.ScoreSettings(task="output_prediction"))


def test_forged_permit_is_rejected(tmp_path):
    from themisto.gate import ExecutionPermit

    examples = records.make_examples(["x"], ["y"], [_id(6)])
    by_id = {e.id: records.text_records([e], sc.ScoreSettings()) for e in examples}
    with pytest.raises(ExecutionRefused, match="not issued by"):
        execution.unsafe_execute_trajectory(ExecutionPermit(object()), None, KERNEL, examples, by_id, tmp_path,
                                            sc.ScoreSettings())


# ---------------------------------------------------------------------------------------------------------------
# the state server every execution goes through


@pytest.mark.slow
def test_the_state_server_hands_each_asked_state_in_step_order_across_a_restart(release, workspace):
    from themisto.release.states import pre_step_states
    from themisto.runtime.outputs import output_text

    look = "print(sorted(k for k in ('data', 'total', 'label') if k in globals()), globals().get('data'))"
    seen, starts = {}, {}
    with pre_step_states(release, KERNEL, [10, 2, 5, RESTART_BEFORE, 5], workspace) as walk:
        for state in walk:
            seen[state.step] = output_text(state.session.execute(look).outputs).strip()
            starts[state.step] = state.session.kernel_starts
    assert list(seen) == [2, 5, RESTART_BEFORE, 10]  # in step order, each once
    assert seen[2] == "['data', 'total'] [3, 1, 2]"
    assert seen[5] == "['data', 'label', 'total'] [1, 2, 3]"  # step 4 sorted it; step 5 has not run
    assert seen[RESTART_BEFORE] == "[] None"  # the log's restart came before it: a fresh namespace
    assert seen[10] == "['data'] [5]"
    # Going on from the state before the restart point does not restart the kernel again.
    assert starts[10] == starts[RESTART_BEFORE] == starts[5] + 1 and walk.restored.restores == 0


# bad input against the release (caught before any kernel starts)


@pytest.mark.slow
def test_unknown_id_and_wrong_reference_name_the_example(allow_execution, release, workspace):
    with pytest.raises(sc.ScoreError, match=f"example {KERNEL}/99: no such id"):
        sc.score(["x"], ["x"], ids=[f"{KERNEL}/99"], execute=True, release=release, workspace=workspace)
    with pytest.raises(sc.ScoreError, match=f"example {_id(6)}: the reference is not the release's target"):
        sc.score(["x"], ["x"], ids=[_id(6)], execute=True, release=release, workspace=workspace)


@pytest.mark.slow
def test_missing_trajectory_rows_and_workspace_name_the_problem(allow_execution, release):
    broken = open_release(release.path)  # a handle of its own, its trajectory without step 3
    broken.trajectories_by_kernel()[KERNEL][:] = [r for r in release.trajectory(KERNEL) if r["step"] != 3]
    with pytest.raises(sc.ScoreError, match=f"example {_id(6)}: .* do not hold steps 0..6"):
        sc.score(_targets(release, [_id(6)]), _targets(release, [_id(6)]), ids=[_id(6)], execute=True,
                 release=broken)
    with pytest.raises(sc.ScoreError, match="given workspace .*scorer-ws"):
        sc.score(_targets(release, [_id(6)]), _targets(release, [_id(6)]), ids=[_id(6)], execute=True,
                 release=release)


# ---------------------------------------------------------------------------------------------------------------
# execution (one scoring run, ~20 s with the release build, shared by the tests below)


@pytest.fixture(scope="module")
def executed(release, workspace):
    """One scoring run over every example: the reference, the previous cell and, at step 6, hostile predictions."""
    env = pytest.MonkeyPatch()
    env.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    hostile = ["while True:\n    pass", "import os\nos._exit(1)", "import os, signal\nos.kill(os.getppid(), 9)",
               "import os\nos.remove('input.csv')\naverage = total / len(data)\nprint(average)",
               "block = bytearray(50 * 2**30)", "import os\nos.kill(-1, 9)"]
    predictions, references, trajectories = [], [], []
    for example_id in ids:
        step = release.task_rows("next_cell")[example_id]["step"]
        target = release.task_rows("next_cell")[example_id]["target"]
        extra = hostile if step == 6 else []
        predictions.append([target, CELLS[step - 1], *extra])
        references.append(target)
    try:
        result = sc.score(predictions, references, ids=ids, execute=True, release=release, workspace=workspace,
                          settings=sc.ScoreSettings(k=(1, 2), timeout_s=3, memory_bytes=512 * 2**20),
                          on_trajectory=trajectories.append)
    finally:
        env.undo()
        env_settings.cache_clear()
    return result, trajectories, predictions, references


def _records(result, example_id):
    return [p for p in result.predictions if p.id == example_id]


def _example(result, example_id):
    return next(e for e in result.examples if e.id == example_id)


@pytest.mark.slow
def test_reference_cells_match_on_every_deterministic_example(executed):
    result = executed[0]
    for example in result.examples:
        if example.status == "scored":
            reference = _records(result, example.id)[0]
            assert reference.functional_match and reference.exec_ok, (example.id, reference.reason)
    assert result.scores["scored_examples"] == len(ids) - 1


@pytest.mark.slow
def test_clock_reading_cell_is_flagged_nondeterministic_and_excluded(executed):
    result = executed[0]
    example = _example(result, _id(7))
    assert example.status == "nondeterministic"
    assert "different outputs" in example.reason or "stamp" in example.reason
    assert all(p.functional_match is None for p in _records(result, _id(7)))
    assert result.scores["nondeterministic_examples"] == 1


@pytest.mark.slow
def test_errored_reference_counts_the_same_error_as_ok(executed):
    result = executed[0]
    example = _example(result, _id(8))
    assert example.status == "scored" and example.reference_status == "error"
    reference, previous = _records(result, _id(8))[:2]
    assert reference.outcome == "error" and reference.exec_ok and reference.functional_match
    # The previous cell (the clock reading) runs fine but neither prints the NameError nor deletes `label`.
    assert previous.outcome == "ok" and previous.exec_ok and not previous.functional_match
    assert "label" in previous.reason


@pytest.mark.slow
def test_previous_cell_scores_lower_with_reasons(executed):
    result = executed[0]
    previous = [_records(result, example_id)[1] for example_id in ids]
    assert not any(p.functional_match for p in previous if p.functional_match is not None)
    # print(total) before `average = ...`: same output? No: 6 vs 2.0, and `average` is missing.
    at6 = _records(result, _id(6))[1]
    assert at6.output_match is False and at6.state_match is False and "`average`" in at6.reason
    assert result.scores["functional_match"] < 1.0


@pytest.mark.slow
def test_restart_gives_a_fresh_state(executed):
    result = executed[0]
    # At step 10, after the restart, `data = [5]` is the whole state: the reference prints [5], not [1, 2, 3]. The
    # previous cell re-binds the same value (no state change, as the reference) but prints nothing.
    example = _example(result, _id(10))
    assert example.status == "scored"
    reference, previous = _records(result, _id(10))
    assert reference.functional_match and previous.state_match and not previous.output_match


@pytest.mark.slow
def test_hostile_predictions_cost_one_outcome_each(executed):
    result = executed[0]
    records = _records(result, _id(6))
    reference, previous, loop, exit_, kill, remove, alloc, kill_all = records
    assert loop.outcome == "timeout" and not loop.exec_ok
    assert exit_.outcome == "kernel_died" and "exited with status 1" in exit_.reason
    # The prediction's parent is the branch's monitor, not the kernel: the kill ends that branch only.
    assert kill.outcome in ("kernel_died", "ok") and not kill.functional_match
    assert alloc.outcome == "error" and "MemoryError" in alloc.reason
    # kill(-1) reaches only the prediction's own pid namespace, where nothing else runs: the kernel lives on.
    assert kill_all.outcome == "error" and "ProcessLookupError" in kill_all.reason
    # Deleting a workspace file is an ordinary side effect in a branch: the arithmetic still matches.
    assert remove.outcome == "ok" and remove.functional_match
    assert reference.functional_match
    # The workspace file came back: step 7 onwards replayed, and the reference at step 10 still matches.
    assert _example(result, _id(10)).status == "scored"
    assert result.scores["outcomes"]["timeout"] == 1
    example = _example(result, _id(6))
    assert example.correct == 2 and example.pass_at_k["pass@1"] == pytest.approx(2 / 8)


_TIMINGS = {"duration_s", "continuation_s", "branch_wall_s", "reference_durations_s", "reference_continuation_s",
            "replay_s"}


def _without_timings(items) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(item).items() if k not in _TIMINGS} for item in items]


@pytest.mark.slow
def test_the_page_check_and_the_full_rehash_score_alike(executed, release, workspace, monkeypatch):
    # The same predictions (the references, the previous cells, the hostile ones) with every name rehashed in every
    # branch: the same outcomes, reasons and state verdicts as with the page check.
    result, _, predictions, references = executed
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        hashed = sc.score(predictions, references, ids=ids, execute=True, release=release, workspace=workspace,
                          settings=sc.ScoreSettings(k=(1, 2), timeout_s=3, memory_bytes=512 * 2**20,
                                                    branch_delta="hash"))
    finally:
        env_settings.cache_clear()
    # A clock-reading reference prints another time in each run: its reasons quote them (it is excluded anyway).
    clock = {e.id for e in result.examples if e.status != "scored"}
    paged, rehashed = _without_timings(result.predictions), _without_timings(hashed.predictions)
    for record in (*paged, *rehashed):
        if record["id"] in clock:
            record.pop("reason")
    assert rehashed == paged
    assert _without_timings(hashed.examples) == _without_timings(result.examples)
    assert any(p.state_match is False for p in result.predictions)  # state verdicts that could differ, do not


@pytest.mark.slow
def test_pass_at_k_aggregates_over_scored_examples(executed):
    result = executed[0]
    scored = [e for e in result.examples if e.status == "scored"]
    assert result.scores["pass@1"] == pytest.approx(sum(e.correct / e.predictions for e in scored) / len(scored))
    assert result.scores["pass@2"] == pytest.approx(sum(e.pass_at_k["pass@2"] for e in scored) / len(scored))


@pytest.mark.slow
def test_rebuilt_state_is_checked_against_the_release(executed):
    result = executed[0]
    verified = {e.step: (e.state_verified, e.state_differences, e.state_run_specific) for e in result.examples}
    # Before step 8 the state holds the clock reading of step 7, which replay cannot reproduce: the build marked it
    # run-specific, so the check leaves it out and counts it apart (never as matched); step 9 follows a restart (a
    # fresh kernel, nothing to check).
    assert verified[8] == (True, [], ["stamp"])
    assert verified[9] == (None, [], [])
    assert all(verified[s] == (True, [], []) for s in (5, 6, 7, 10)), verified
    assert result.scores["state_mismatch_examples"] == 0 and result.scores["state_run_specific_examples"] == 1
    assert any("run-specific values" in note and "/8" in note for note in result.notes)


@pytest.mark.slow
def test_resume_keeps_finished_trajectories(executed, release, workspace, allow_execution):
    result, trajectories, predictions, references = executed
    messages = []
    again = sc.score(predictions, references, ids=ids, execute=True, release=release, workspace=workspace,
                     settings=result.settings, done={t.kernel_id: t for t in trajectories},
                     progress=messages.append)
    assert any("kept from the earlier run" in m for m in messages)
    assert again.scores == result.scores


# ---------------------------------------------------------------------------------------------------------------
# files and the CLI


def _write_predictions(path, release, steps):
    lines = [{"id": _id(s), "prediction": release.task_rows("next_cell")[_id(s)]["target"]} for s in steps]
    path.write_text("".join(sc.json.dumps(line) + "\n" for line in lines))
    return path


def test_bad_predictions_file_names_file_and_line(tmp_path):
    path = tmp_path / "preds.jsonl"
    path.write_text('{"id": "k/5", "prediction": "x"}\n{"id": "k/6", "prediction": 7}\n')
    with pytest.raises(sc.ScoreError, match=r"preds.jsonl:2: example k/6: `prediction` must be a string"):
        sc.read_predictions(path)
    path.write_text('{"id": "k/5", "prediction": "x"}\n\n{"id": "k/5", "prediction": ["y"]}\n')
    with pytest.raises(sc.ScoreError, match=r"preds.jsonl:3: example k/5 was already given on line 1"):
        sc.read_predictions(path)
    path.write_text('{"id": "k/5", "prediction": "x"\n')
    with pytest.raises(InputError, match=r"preds.jsonl:1: not JSON"):
        sc.read_predictions(path)


@pytest.mark.slow
def test_cli_score_refuses_then_scores_and_resumes(release, workspace, tmp_path, monkeypatch, capsys):
    from themisto.cli import main

    predictions = _write_predictions(tmp_path / "preds.jsonl", release, [5, 6])
    out = tmp_path / "results.json"
    argv = ["score", "--release", str(release.path), "--predictions", str(predictions), "--workspace", str(workspace),
            "-o", str(out), "--json"]
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    env_settings.cache_clear()
    assert main(argv + ["--execute"]) == 2
    assert "HF_ALLOW_CODE_EVAL" in capsys.readouterr().err and not out.exists()
    assert main(argv) == 0  # text scores need no switch
    printed = sc.json.loads(capsys.readouterr().out)
    assert printed["scores"]["exact_match"] == 1.0 and "functional_match" not in printed["scores"]

    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()

    class Stop(Exception):
        pass

    def stop_after_first(message):
        raise Stop(message)  # progress is reported after the trajectory was written: an interruption here

    with pytest.raises(Stop):
        sc.score_to_file(release, predictions, out, execute=True, workspace=workspace,
                         progress=stop_after_first)
    partial = out.with_name(out.name + ".partial.jsonl")
    assert len(partial.read_text().splitlines()) == 2  # the settings header and the one trajectory
    assert main(argv + ["--execute"]) == 0
    captured = capsys.readouterr()
    printed = sc.json.loads(captured.out)
    assert printed["resumed"] == [KERNEL] and "kept from the earlier run" in captured.err
    assert printed["scores"]["functional_match"] == 1.0 and not partial.exists()
    written = sc.json.loads(out.read_text())
    assert [p["id"] for p in written["predictions"]] == [_id(5), _id(6)]
    assert all(p["outcome"] == "ok" for p in written["predictions"])
    # A finished run's verdicts are kept: the same scoring again (another table over the same records, as
    # `--cluster participant` is) executes nothing and gives the same records; other predictions start over.
    verdicts = out.with_name(out.name + ".verdicts.jsonl")
    assert len(verdicts.read_text().splitlines()) == 2
    assert main(argv + ["--execute"]) == 0
    again = sc.json.loads(capsys.readouterr().out)
    assert again["resumed"] == [KERNEL] and sc.json.loads(out.read_text())["predictions"] == written["predictions"]
    _write_predictions(predictions, release, [5])
    assert main(argv + ["--execute"]) == 0
    assert sc.json.loads(capsys.readouterr().out)["resumed"] == []
    env_settings.cache_clear()


def test_a_reference_slower_than_the_scorers_budget_is_refused_unrun_and_continuations_stop_before_slow_cells(
        release, workspace, allow_execution):
    from themisto.scoring.continuation import continuation_rows

    rows = release.trajectory(KERNEL)
    slow = dict(rows[2], execution_time=45.0)  # a cell the build's replay took 45 s over
    assert [r["step"] for r in continuation_rows([rows[0], rows[1], slow, rows[3]], 0, 3)] == [1, 2, 3]
    assert [r["step"] for r in continuation_rows([rows[0], rows[1], slow, rows[3]], 0, 3, max_s=30.0)] == [1]
    chosen = [_id(5), _id(6)]
    result = sc.score(_targets(release, chosen), _targets(release, chosen), ids=chosen, execute=True, release=release,
                      workspace=workspace, settings=records.ScoreSettings(max_reference_s=1e-6), workers=1)
    assert [(e.status, e.branch_wall_s) for e in result.examples] == [("refused", None)] * 2
    assert all("over the 0 s the scorer gives a reference (max_reference_s)" in e.reason for e in result.examples)
    assert [p.outcome for p in result.predictions] == ["refused"] * 2
    with pytest.raises(records.ScoreError, match="max_reference_s must be positive"):
        records.ScoreSettings(max_reference_s=0)
