"""The prompt budget on a namespace too large for it: which variables survive the cut (ranked by what the history
names, then by when they last changed, then by size), their fields cut before any goes, what the prompt says it left
out, what it records, and how few token counts the cut costs. The rows come from a real Parquet release read the way
a run reads it (`load_task_rows`, which joins when each variable last changed)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import asdict

import pytest
from test_tasks import make_steps, rows_of

from themisto.generation.budget import FIELD_CUTS, Cut, Fit, fit, least
from themisto.generation.prompts import render_prompt
from themisto.generation.release_rows import load_task_rows
from themisto.generation.variable_ranking import rank_variables
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings
from themisto.runtime.snapshot import VariableInfo
from themisto.release.folder import open_release

OLD = 40  # variables made by one early cell, long before the history window, never named since
TARGET_STEP = 16
# What the cells before the target run: the window of 10 history cells is steps 6..15.
CODES = {0: "import pandas as pd", 1: "for i in range(40): globals()[f'old_{i}'] = 'x' * (300 + i)",
         2: "df = pd.read_csv('logs.txt'); fresh = 1", 3: "tweaked = 3", 6: "df.head()",
         7: "counts = df.groupby('user').size()", 14: "df.describe()", 15: "model = fit(df)",
         TARGET_STEP: "old_0.upper()"}


def _variable(name: str, size: int, version: int, **facts) -> dict:
    digest = hashlib.sha256(f"{name}/{version}".encode()).hexdigest()[:16]
    return asdict(VariableInfo(name=name, type=facts.pop("type", "builtins.str"), size=size,
                               repr=facts.pop("repr", "'" + "x" * 300 + "'"), hash=digest, **facts))


def _namespace(step: int) -> list[dict]:
    """The snapshot after `step`: the old variables (larger the lower their number), then what later cells made."""
    out = [_variable(f"old_{i}", 400 - i, 0) for i in range(OLD)] if step >= 1 else []
    if step >= 2:
        out += [_variable("df", 2_000_000, 0, type="pandas.core.frame.DataFrame", shape=(48213, 2),
                          columns=("user", "time")), _variable("fresh", 28, 0, type="builtins.int", repr="1")]
    if step >= 1:  # made by cell 1's loop too, changed again by cell 3
        out.append(_variable("tweaked", 28, int(step >= 3), type="builtins.int", repr="3"))
    if step >= 7:
        out.append(_variable("counts", 9_480, 0, type="pandas.core.series.Series", shape=(143,), dtype="int64"))
    if step >= 15:
        out.append(_variable("model", 48, 0, type="sklearn.linear_model.LinearRegression", repr="LinearRegression()"))
    return out


# The rule's order: the history's names, the latest mention first (df and model both in cell 15: the smaller first),
# then the rest, the most recently changed first (tweaked at step 3, fresh at 2, the old ones at 1, smallest first).
EXPECTED = (["model", "df", "counts", "tweaked", "fresh"] + [f"old_{i}" for i in reversed(range(OLD))])


@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> dict[str, dict]:
    steps = [dataclasses.replace(s, code=CODES.get(s.step, "print('working')"),
                                 replayed_code=CODES.get(s.step, "print('working')"), status="ok", ename=None,
                                 evalue=None, output="done\n", output_types=["stream"], restarted_before=False,
                                 variables=_namespace(s.step), snapshot_failures={})
             for s in make_steps("crowded", TARGET_STEP + 1)]
    out = tmp_path_factory.mktemp("crowded") / "release"
    build_release(rows_of(steps), out, TaskSettings(seed=1, test_fraction=1.0), source={"kind": "test-rows"})
    rows = {}
    for task in ("next_cell", "output_prediction"):
        found = load_task_rows(open_release(out), task, ("variables", "full"))
        rows[task] = next(r for r in found if r["step"] == TARGET_STEP)
    return rows


def _words(text: str) -> int:
    return len(text.split())


def _shown(prompt) -> list[str]:
    runtime = prompt.messages[-1]["content"].split("Runtime state")[1]
    return [line[2:].split(":")[0] for line in runtime.splitlines() if line.startswith("- ")]


def test_variables_are_ranked_by_the_history_then_by_change_then_by_size(crowded):
    row = crowded["next_cell"]
    assert {v["name"]: v["changed_step"] for v in row["variables_before"]}["tweaked"] == 3  # the join's answer
    assert [v["name"] for v in rank_variables(row, "next_cell")] == EXPECTED
    # next_cell's target (it names old_0) is the answer, never a hint; output_prediction's cell is shown: it leads
    assert [v["name"] for v in rank_variables(crowded["output_prediction"], "output_prediction")] == (
        ["old_0"] + [n for n in EXPECTED if n != "old_0"])


def test_a_namespace_too_large_keeps_the_most_relevant_variables_with_their_fields_cut(crowded):
    row = crowded["next_cell"]
    whole = render_prompt(row, "next_cell", "variables", count_tokens=_words)
    history_only = render_prompt(row, "next_cell", "none", count_tokens=_words)
    assert whole.tokens > history_only.tokens + 40 * 3  # the namespace is most of the prompt
    counted = []
    budget = history_only.tokens + 80

    def count(text: str) -> int:
        counted.append(text)
        return _words(text)

    cut = render_prompt(row, "next_cell", "variables", count_tokens=count, max_prompt_tokens=budget)
    assert cut.skipped_reason is None and cut.tokens <= budget
    shown = _shown(cut)
    assert 5 < len(shown) < len(EXPECTED) and shown == EXPECTED[:len(shown)]  # the least relevant went first
    assert "'xxx" not in cut.messages[-1]["content"]  # every kept repr was cut before a variable was dropped
    hidden = len(EXPECTED) - len(shown)
    assert f"(and {hidden} more variables, ranked lower, not shown)" in cut.messages[-1]["content"]
    kept = cut.kept
    assert (kept.variables_shown, kept.variables_total, kept.repr_chars) == (len(shown), len(EXPECTED), 0)
    assert kept.reprs_cut == sum(1 for v in row["variables_before"] if v["name"] in shown and v["repr"])
    assert 0 < kept.history_shown <= kept.history_total == 10
    # token counting is the expensive part: a few binary searches, not one count per variable or cell
    levels = len(FIELD_CUTS) + len(EXPECTED) + 1
    assert len(counted) <= 3 + math.ceil(math.log2(11)) + 2 * math.ceil(math.log2(levels))
    # more room keeps more of the same order
    roomier = render_prompt(row, "next_cell", "variables", count_tokens=_words, max_prompt_tokens=budget + 60)
    assert len(shown) < len(_shown(roomier)) and _shown(roomier) == EXPECTED[:len(_shown(roomier))]


def test_the_prompt_is_sent_without_variables_and_history_before_it_is_skipped(crowded):
    row = crowded["output_prediction"]
    floor = render_prompt({**row, "history": [], "variables_before": []}, "output_prediction", "full",
                          count_tokens=_words)
    bare = render_prompt(row, "output_prediction", "full", count_tokens=_words, max_prompt_tokens=floor.tokens + 8)
    assert bare.skipped_reason is None and bare.kept.history_shown == 0 and bare.kept.variables_shown == 0
    assert f"(and {len(EXPECTED)} more variables, ranked lower, not shown)" in bare.messages[-1]["content"]
    assert row["code"] in bare.messages[-1]["content"]
    skipped = render_prompt(row, "output_prediction", "full", count_tokens=_words, max_prompt_tokens=floor.tokens - 2)
    assert skipped.kept is None and skipped.skipped_reason.startswith("prompt over budget: ")
    assert skipped.skipped_reason.endswith(
        f"tokens with no history cell and no variable shown (budget {floor.tokens - 2})")


def test_the_runtime_share_gives_way_to_a_short_history_and_takes_back_what_the_history_left():
    per_variable = {FIELD_CUTS[i]: cost for i, cost in enumerate((12, 9, 6, 3))}
    calls = []
    cell = 10

    def count(cut: Cut) -> int:  # 100 for the instruction, `cell` per history cell, 15 per whole variable, less cut
        calls.append(cut)
        return 100 + cell * cut.history + per_variable.get(cut.fields, 15) * cut.variables

    assert fit(count, 10**6, 10, 20) == Fit(Cut(10, 20), 500)
    # room 200 beside the instruction, the history needs 100: the runtime gets its half (every field cut)
    assert fit(count, 300, 10, 20) == Fit(Cut(10, 20, FIELD_CUTS[-1]), 260)
    # a short history needs 20: the runtime gets the other 180, keeping more of each variable
    assert fit(count, 300, 2, 20) == Fit(Cut(2, 20, FIELD_CUTS[1]), 300)
    # room 40 beside the instruction and the newest cell: the runtime's half keeps 6 bare variables, the history
    # then 3 cells in all
    calls.clear()
    assert fit(count, 150, 10, 20) == Fit(Cut(3, 6, FIELD_CUTS[-1]), 148)
    assert len(set(calls)) == len(calls) <= 3 + math.ceil(math.log2(11)) + 2 * math.ceil(math.log2(25))
    assert fit(count, 99, 10, 20) == Fit(None, 100)  # the instruction alone does not fit: skipped
    # cells of 60: a half-and-half split would leave no room for one (20 variables, no cell); the newest cell goes
    # in first, the runtime's half of the rest keeps 6 variables, and takes back what no second cell could use
    cell = 60
    assert fit(count, 200, 3, 20) == Fit(Cut(1, 13, FIELD_CUTS[-1]), 199)
    assert fit(lambda cut: 100 + 10 * cut.history, 155, 10, None) == Fit(Cut(5, 0), 150)  # no runtime section
    assert least(3, 9, lambda i: i >= 5) == 5 and least(0, 0, lambda i: False) == 0
