"""Task construction on real `Step` records: the paper's rules, the snapshot before a target, history, splits."""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import numpy as np
import pytest

from themisto.replay.replay import LoggedOutcome, Step
from themisto.release.folder import schema_module
from themisto.runtime.snapshot import VariableInfo
from themisto.release.splits import assign_splits
from themisto.release.tasks import (
    HISTORY_OUTPUT_CHARS,
    TaskError,
    Candidate,
    TaskSettings,
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
    plan = assign_splits(kernels, seed=0, test_fraction=0.5, min_test_groups=2)
    assert plan.split_of == {"only": "test"} and "train` is empty" in plan.notes[-1]
    assert "notebook task task1: `test` holds 1 group(s), fewer than 2" in plan.notes[0]


def _participants_of(sizes: dict[str, dict[str, int]]) -> tuple[list[dict], dict[str, str]]:
    """Rows of trajectories of the given sizes per participant and notebook task, and kernel -> participant."""
    trajectories, owner = [], {}
    for participant, tasks in sizes.items():
        for task, n in tasks.items():
            kernel = f"{participant}-{task}"
            trajectories.append(make_steps(kernel, n, task=task))
            owner[kernel] = participant
    return rows_of(*trajectories, participants=owner), owner


# Six participants as uneven as the real ones: one holds almost a third of the steps, two did only task 1.
SIX = {"p-a": {"task1": 300, "task2": 40}, "p-b": {"task1": 90}, "p-c": {"task1": 140, "task2": 45},
       "p-d": {"task1": 100, "task2": 40}, "p-e": {"task1": 170}, "p-f": {"task1": 210, "task2": 70}}


@pytest.mark.parametrize("seed", range(8))
def test_each_notebook_tasks_test_split_holds_two_participants_and_none_is_on_both_sides(seed):
    rows, owner = _participants_of(SIX)
    tasks = build_tasks(rows, TaskSettings(seed=seed))
    sides = {p: {tasks.split_of[k] for k, q in owner.items() if q == p} for p in SIX}
    assert all(len(s) == 1 for s in sides.values())  # a participant is on one side only
    for notebook_task in ("task1", "task2"):
        test = {p for p, s in sides.items() if s == {"test"} and notebook_task in SIX[p]}
        train = {p for p, s in sides.items() if s == {"train"} and notebook_task in SIX[p]}
        assert len(test) >= 2 and train, (notebook_task, test, train)
    for config in ("next_cell", "output_prediction"):
        held = {owner[r["kernel_id"]] for r in tasks.rows[config]["test"]}
        assert len(held) >= 2 and all(sides[p] == {"test"} for p in held)
    # the card's figures: each participant's side, steps per notebook task and rows per config and split
    by_group = {g.group: g for g in tasks.split.groups}
    for participant, sizes in SIX.items():
        group = by_group[f"participant:{participant}"]
        assert group.tasks == sizes and group.steps == sum(sizes.values()) and {group.split} == sides[participant]
        assert group.rows["trajectories"] == {group.split: group.steps}
    assert sum(g.rows["next_cell"].get("test", 0) for g in tasks.split.groups) == len(tasks.rows["next_cell"]["test"])
    assert tasks.split.to_dict()["test_groups"]["task2"] >= 2 and tasks.notes == []


def test_the_rule_moves_the_next_task2_participant_to_test_when_the_steps_leave_fewer_than_two():
    # Two big task-1-only participants fill `test` by steps (seed 1's order: p-a, p-b, p-e, p-c, p-d); the rule then
    # adds task-2 participants in the same order until `test` holds two, and keeps one in `train`.
    sizes = {"p-a": {"task1": 500}, "p-b": {"task1": 400}, "p-c": {"task1": 100, "task2": 50},
             "p-d": {"task1": 100, "task2": 50}, "p-e": {"task1": 100, "task2": 50}}
    rows, owner = _participants_of(sizes)
    sides = {}
    for wanted in (1, 2):
        split_of = build_tasks(rows, TaskSettings(seed=1, min_test_groups=wanted)).split_of
        sides[wanted] = {p for k, p in owner.items() if split_of[k] == "test"}
    assert sides[1] == {"p-a", "p-b", "p-e"} and sides[2] == {"p-a", "p-b", "p-e", "p-c"}


def test_the_output_sample_takes_each_bands_share_and_one_candidate_less_moves_only_the_margin():
    """The paper's 200: 10 shortest, 180 middle, 10 longest. A build in which one step replayed otherwise (a target
    gone) must not draw another sample: the draw follows a hash of each candidate, not positions in a shuffle."""
    pool = [Candidate(f"k{i % 7}", i, "x" * (1 + (i * 37) % 500)) for i in range(800)]
    settings = TaskSettings(seed=3)
    chosen, notes = paper_sample(pool, settings)
    bands = [band for _, band in chosen]
    assert (len(chosen), bands.count("shortest"), bands.count("middle"), bands.count("longest")) == (200, 10, 180, 10)
    assert notes == [] and len({(c.kernel_id, c.index) for c, _ in chosen}) == 200
    ranked = sorted(pool, key=lambda c: (len(c.target), c.kernel_id, c.index))
    assert all(len(c.target) <= len(ranked[199].target) for c, band in chosen if band == "shortest")
    gone = chosen[100][0]
    again, _ = paper_sample([c for c in pool if c is not gone], settings)
    before, after = {(c.kernel_id, c.index) for c, _ in chosen}, {(c.kernel_id, c.index) for c, _ in again}
    assert len(after) == 200 and len(before - after) <= 3, before ^ after  # the one gone, and a band's margin
    assert paper_sample(pool, TaskSettings(seed=4))[0] != chosen  # the seed still draws
