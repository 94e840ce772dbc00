"""Task construction on real `Step` records: the paper's rules, the snapshot before a target, history, splits."""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import numpy as np
import pytest

from themisto.replay.replay import LoggedOutcome, Step
from themisto.release.folder import schema_module
from themisto.runtime.snapshot import VariableInfo
from themisto.release.tasks import (
    HISTORY_OUTPUT_CHARS,
    TaskError,
    TaskSettings,
    assign_splits,
    build_tasks,
    group_by_kernel,
    paper_sample,
    quantile,
    trajectory_rows,
)

# themisto_dataset.py lies at the repository root, which is not on sys.path under every test runner.
themisto_dataset = schema_module()

# A data-analysis session as developers write it: load, look, fix a typo, aggregate, plot, print.
CELLS = [
    ("import pandas as pd\nimport numpy as np", "", [], "ok"),
    ("df = pd.read_csv('data/task1/jetnet_logs/jetnet_logs.txt', sep='|', header=None)", "", [], "ok"),
    ("df.head()", "            0         1\n0  user_12  2019-09-20 13:44:16\n1  user_7   2019-09-20 13:45:02", ["execute_result"], "ok"),
    ("df.shpe", "AttributeError: 'DataFrame' object has no attribute 'shpe'", ["error"], "error"),
    ("df.shape", "(48213, 2)", ["execute_result"], "ok"),
    ("users = df[0].nunique()\nprint(users)", "143\n", ["stream"], "ok"),
    ("df.columns = ['user', 'time']", "", [], "ok"),
    ("counts = df.groupby('user').size()\ncounts.describe()", "count    143.0\nmean     337.2\nmax     2210.0", ["execute_result"], "ok"),
    ("", "", [], "ok"),  # code the log did not record
    ("   \n", "", [], "ok"),
    ("print(counts.mean())", "337.15384615384613\n", ["stream"], "ok"),
    ("for u in counts.index[:40]:\n    print(u, counts[u])", "".join(f"user_{i} {i * 7}\n" for i in range(40)), ["stream"], "ok"),
]


def _variables(i: int, kernel_id: str) -> list[dict]:
    names = ["pd", "np", "df", "users", "counts"][: 1 + min(i, 4)]
    out = []
    for name in names:
        digest = hashlib.sha256(f"{kernel_id}/{name}/{i}".encode()).hexdigest()[:16]
        if name == "df":
            info = VariableInfo(name="df", type="pandas.core.frame.DataFrame", size=2_314_000 + i,
                                repr="      user   time\n0  user_12 ...", hash=digest, shape=(48213, 2),
                                columns=("user", "time"), len=48213)
        elif name == "counts":
            info = VariableInfo(name="counts", type="pandas.core.series.Series", size=9_480, repr="user\nuser_0 ...",
                                hash=digest, shape=(143,), dtype="int64", len=143)
        else:
            info = VariableInfo(name=name, type="builtins.module" if name in ("pd", "np") else "builtins.int",
                                size=72, repr=f"<{name}>", hash=digest)
        out.append(asdict(info))
    return out


def make_steps(kernel_id: str, n: int, *, task: str = "task1", restarts: tuple[int, ...] = (),
               output_scale: int = 1) -> list[Step]:
    """`n` replayed steps cycling through CELLS, with realistic snapshots (as replay writes them)."""
    steps = []
    for i in range(n):
        code, output, types, status = CELLS[i % len(CELLS)]
        output = output * (1 + (i * output_scale) % 7) if output else ""
        steps.append(Step(
            kernel_id=kernel_id, step=i, cell_id=f"cell-{i % len(CELLS)}", code=code, replayed_code=code,
            cleaning=[], restarted_before=i in restarts, status=status,
            ename="AttributeError" if status == "error" else None,
            evalue="'DataFrame' object has no attribute 'shpe'" if status == "error" else None,
            output=output, outputs=[], output_types=types, execution_time=0.002 + i / 1000,
            memory_bytes=75_000_000 + 1_000 * i, state_hash=hashlib.sha256(f"{kernel_id}:{i}".encode()).hexdigest(),
            variables=_variables(i, kernel_id), snapshot_failures={"gen": "TypeError: cannot pickle"} if i == 2 else {},
            kernel_restarted=False, rebuilt_steps=0,
            logged=LoggedOutcome(status, "AttributeError" if status == "error" else None, None, types),
            notebook=f"{task}.ipynb", task=task))
    return steps


def rows_of(*trajectories: list[Step], participants: dict | None = None) -> list[dict]:
    return trajectory_rows([s for t in trajectories for s in t], participants)


def test_trajectory_rows_have_exactly_the_declared_fields():
    rows = rows_of(make_steps("k1", 8))
    declared = set(themisto_dataset.TRAJECTORIES)
    assert all(set(r) == declared for r in rows)
    df = next(v for v in rows[5]["variables"] if v["name"] == "df")
    assert set(df) == set(themisto_dataset.VARIABLE)
    assert df["shape"] == [48213, 2] and df["columns"] == ["user", "time"] and df["dtype"] is None
    assert rows[2]["snapshot_failures"] == [{"name": "gen", "reason": "TypeError: cannot pickle"}]
    assert rows[3]["logged_ename"] == "AttributeError" and rows[3]["status"] == "error"


def test_targets_need_five_prior_actions_and_are_not_empty():
    tasks = build_tasks(rows_of(make_steps("k1", 24), make_steps("k2", 24)), TaskSettings(test_fraction=1.0))
    for config in ("next_cell", "output_prediction"):
        rows = tasks.rows[config]["test"]
        assert rows and min(r["step"] for r in rows) >= 5
        assert all(r["target"].strip() for r in rows)
    next_steps = {r["step"] for r in tasks.rows["next_cell"]["test"] if r["kernel_id"] == "k1"}
    assert 8 not in next_steps and 9 not in next_steps and 5 in next_steps  # "" and whitespace code
    output_steps = {r["step"] for r in tasks.rows["output_prediction"]["test"] if r["kernel_id"] == "k1"}
    assert 6 not in output_steps and 7 in output_steps  # step 6 printed nothing
    report = tasks.reports["next_cell"]
    # Five early steps per trajectory; steps 8, 9, 20 and 21 have "" or whitespace code in each.
    assert report.removed["min_prior_actions"] == 10 and report.removed["empty_target"] == 8
    assert report.candidates == 48 and sum(report.removed.values()) + report.rows["test"] == 48


def test_longest_targets_above_the_quantile_are_dropped():
    rows = rows_of(make_steps("k1", 60, output_scale=3))
    tasks = build_tasks(rows, TaskSettings(test_fraction=1.0, output_sample_size=None))
    report = tasks.reports["output_prediction"]
    eligible = [len(r["output"]) for r in rows if r["step"] >= 5 and r["output"].strip()]
    assert report.length_limit == pytest.approx(float(np.quantile(eligible, 0.99)))
    kept = [len(r["target"]) for r in tasks.rows["output_prediction"]["test"]]
    assert max(kept) <= report.length_limit < max(eligible)
    assert report.removed["length_quantile"] == sum(1 for n in eligible if n > report.length_limit) > 0


def test_quantile_matches_numpy():
    values = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for q in (0.0, 0.25, 0.5, 0.99, 1.0):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


def test_snapshot_before_is_the_previous_step_or_empty_after_a_restart():
    steps = make_steps("k1", 24, restarts=(7,))
    tasks = build_tasks(rows_of(steps), TaskSettings(test_fraction=1.0))
    by_step = {r["step"]: r for r in tasks.rows["next_cell"]["test"]}
    row = by_step[6]
    assert row["memory_bytes_before"] == steps[5].memory_bytes
    assert row["state_hash_before"] == steps[5].state_hash
    assert [v["name"] for v in row["variables_before"]] == [v["name"] for v in steps[5].variables]
    fresh = by_step[7]
    assert fresh["restarted_before"] is True
    assert fresh["variables_before"] == [] and fresh["memory_bytes_before"] is None and fresh["state_hash_before"] is None
    assert by_step[10]["history"][-3]["restarted_before"] is True  # the restart shows in later prompts' history


def test_history_is_the_last_ten_cells_with_outputs_cut():
    steps = make_steps("k1", 40)
    long_output = "x" * (HISTORY_OUTPUT_CHARS + 500)
    steps[21].output = long_output
    tasks = build_tasks(rows_of(steps), TaskSettings(test_fraction=1.0))
    row = next(r for r in tasks.rows["next_cell"]["test"] if r["step"] == 22)
    assert [c["step"] for c in row["history"]] == list(range(12, 22))
    assert [c["code"] for c in row["history"]] == [s.code for s in steps[12:22]]
    last = row["history"][-1]
    assert last["output_truncated"] is True and last["output"].startswith("x" * HISTORY_OUTPUT_CHARS)
    assert "500 more characters" in last["output"]
    assert row["target"] == steps[22].code and row["id"] == "k1/22"
    early = next(r for r in tasks.rows["next_cell"]["test"] if r["step"] == 5)
    assert [c["step"] for c in early["history"]] == [0, 1, 2, 3, 4]


def test_splits_keep_trajectories_and_participants_on_one_side():
    trajectories = [make_steps(f"k{i}", 20) for i in range(8)]
    participants = {f"k{i}": f"p-{i // 2}" for i in range(8)}  # two trajectories per participant
    rows = rows_of(*trajectories, participants=participants)
    first = build_tasks(rows, TaskSettings(seed=3))
    assert first.rows["trajectories"]["test"] and first.rows["trajectories"]["train"]
    for participant in set(participants.values()):
        kernels = [k for k, p in participants.items() if p == participant]
        assert len({first.split_of[k] for k in kernels}) == 1
    for config in ("next_cell", "output_prediction"):
        for split in ("test", "train"):
            assert {first.split_of[r["kernel_id"]] for r in first.rows[config][split]} <= {split}
    again = build_tasks(rows, TaskSettings(seed=3))
    assert again.split_of == first.split_of and again.rows == first.rows
    seeds = {tuple(sorted(build_tasks(rows, TaskSettings(seed=s)).split_of.items())) for s in range(6)}
    assert len(seeds) > 1  # the seed matters


def test_one_trajectory_goes_to_test_and_says_train_is_empty():
    kernels = group_by_kernel(rows_of(make_steps("only", 12)))
    split_of, notes = assign_splits(kernels, TaskSettings())
    assert split_of == {"only": "test"} and "train` is empty" in notes[0]


def test_paper_sample_takes_ten_shortest_ten_longest_and_180_middle():
    trajectories = [make_steps(f"k{i}", 120, output_scale=i + 1) for i in range(6)]
    tasks = build_tasks(rows_of(*trajectories), TaskSettings(seed=11, test_fraction=1.0))
    sample = tasks.rows["output_prediction"]["test"]
    bands = {b: [len(r["target"]) for r in sample if r["sample_band"] == b] for b in ("shortest", "middle", "longest")}
    assert len(sample) == 200 and {b: len(v) for b, v in bands.items()} == {"shortest": 10, "middle": 180, "longest": 10}
    assert max(bands["shortest"]) <= min(bands["middle"]) and max(bands["middle"]) <= min(bands["longest"])
    assert len({r["id"] for r in sample}) == 200
    again = build_tasks(rows_of(*trajectories), TaskSettings(seed=11, test_fraction=1.0))
    assert [r["id"] for r in again.rows["output_prediction"]["test"]] == [r["id"] for r in sample]
    other = build_tasks(rows_of(*trajectories), TaskSettings(seed=12, test_fraction=1.0))
    assert [r["id"] for r in other.rows["output_prediction"]["test"]] != [r["id"] for r in sample]
    everything = build_tasks(rows_of(*trajectories), TaskSettings(test_fraction=1.0, output_sample_size=None))
    assert len(everything.rows["output_prediction"]["test"]) == tasks.reports["output_prediction"].candidates - sum(
        tasks.reports["output_prediction"].removed.values())


def test_fewer_than_200_eligible_takes_all_and_says_so():
    tasks = build_tasks(rows_of(make_steps("k1", 40)), TaskSettings(test_fraction=1.0))
    rows = tasks.rows["output_prediction"]["test"]
    assert {r["sample_band"] for r in rows} == {"all"}
    assert any("only" in n and "all of them" in n for n in tasks.reports["output_prediction"].notes)


def test_band_shortfall_is_filled_and_noted():
    candidates = []
    for i in range(210):
        candidates.append(type("C", (), {"kernel_id": "k", "index": i, "target": "y" * (1 + i)})())
    chosen, notes = paper_sample(candidates, TaskSettings(output_sample_size=200, output_sample_extremes=60))
    assert len(chosen) == 200 and len({c.index for c, _ in chosen}) == 200
    assert any("shortest band held 52" in n for n in notes)


def test_an_empty_task_names_the_rule_that_emptied_it():
    short = rows_of(make_steps("k1", 4), make_steps("k2", 5))
    with pytest.raises(TaskError, match="min_prior_actions"):
        build_tasks(short)
    silent = make_steps("k1", 12)
    for s in silent:
        s.output = ""
    with pytest.raises(TaskError, match="output_prediction: no target left after rule 'empty_target'"):
        build_tasks(rows_of(silent))


def test_a_gap_in_the_steps_is_an_error_naming_the_trajectory():
    rows = [r for r in rows_of(make_steps("k1", 10)) if r["step"] != 4]
    with pytest.raises(TaskError, match="trajectory k1: step 4 is missing"):
        build_tasks(rows)
