"""Prompts with and without runtime context, the token budget, answer extraction and the model-free baselines,
on rows of a real release as `datasets` loads them."""

from __future__ import annotations

import hashlib

import datasets
import pytest

from themisto.generation.baselines import BASELINES, baseline_prediction, baselines_for, last_repr
from themisto.generation.budget import Kept
from themisto.generation.prompts import (
    CONTEXT_MODES,
    PROMPT_TEMPLATES,
    PromptError,
    extract_answer,
    messages_text,
    render_prompt,
    template_sha256,
)


@pytest.fixture(scope="module")
def rows(small_release) -> dict[str, list[dict]]:
    return {config: list(datasets.load_dataset(str(small_release), config, split="test"))
            for config in ("next_cell", "output_prediction")}


def _words(text: str) -> int:
    return len(text.split())


def _user(prompt) -> str:
    return prompt.messages[-1]["content"]


def test_context_modes_add_runtime_facts_step_by_step(rows):
    row = next(r for r in rows["next_cell"] if any(v["name"] == "df" for v in r["variables_before"]))
    none, variables, full = (_user(render_prompt(row, "next_cell", c)) for c in ("none", "variables", "full"))
    last = row["history"][-1]
    for text in (none, variables, full):
        assert last["code"] in text and "next cell" in text
    assert "pandas.core.frame.DataFrame" not in none and "Runtime state" not in none
    assert "pandas.core.frame.DataFrame" in variables and "shape (48213, 2)" in variables
    assert "columns [user, time]" in variables and "memory in use" not in variables
    assert f"memory in use: {row['memory_bytes_before'] / 2**20:.1f} MB" in full
    assert "# Cell 1 (status ok)" in full and "# Cell 1\n" in variables  # cell headers: status in full only
    assert "MB" in full and "MB" not in variables.split("Runtime state")[1]  # sizes only in full
    # execution times are not in task rows; runs join them from the trajectories config when the release has it
    timed = {**row, "history": [{**c, "execution_time": 0.25} for c in row["history"]]}
    assert "# Cell 1 (status ok, 0.250 s)" in _user(render_prompt(timed, "next_cell", "full"))
    assert "0.250 s" not in _user(render_prompt(timed, "next_cell", "variables"))


def test_full_shows_errors_and_restarts(rows):
    row = next(r for r in rows["next_cell"]
               if any(c["status"] == "error" for c in r["history"]) and any(c["restarted_before"] for c in r["history"]))
    full = _user(render_prompt(row, "next_cell", "full"))
    assert "status error" in full and "the kernel was restarted before it" in full
    assert "status error" not in _user(render_prompt(row, "next_cell", "variables"))


def test_a_cell_the_log_damaged_is_marked_in_every_mode(rows):
    row = next(r for r in rows["next_cell"] if len(r["history"]) >= 3)
    history = [dict(c) for c in row["history"]]
    history[1]["code_state"] = "damaged"  # as the release marks a cell whose logged source lost text
    history[2]["code_state"] = "repaired"
    for context in CONTEXT_MODES:
        text = _user(render_prompt({**row, "history": history}, "next_cell", context))
        assert text.count("the log lost part of this cell's code") == 1
        assert "# Cell 2 (" in text and ("# Cell 3\n" in text or "# Cell 3 (status" in text)
        assert "lost part" not in _user(render_prompt(row, "next_cell", context))


def test_output_prediction_shows_the_target_cell_and_never_the_answer(rows):
    for row in rows["output_prediction"][:10]:
        text = _user(render_prompt(row, "output_prediction", "variables"))
        assert f"```python\n{row['code']}\n```" in text.split("The cell to run next:")[1]
        if len(row["target"]) > 10:
            assert row["target"] not in text.split("The cell to run next:")[1]


def test_templates_are_recorded_with_their_sha256():
    assert set(PROMPT_TEMPLATES) == {(t, c) for t in ("next_cell", "output_prediction") for c in CONTEXT_MODES}
    for (task, context), text in PROMPT_TEMPLATES.items():
        assert template_sha256(task, context) == hashlib.sha256(text.encode()).hexdigest()
    assert len({template_sha256(t, c) for t, c in PROMPT_TEMPLATES}) == 2 * len(CONTEXT_MODES)
    with pytest.raises(PromptError, match="unknown context mode 'vars'"):
        template_sha256("next_cell", "vars")
    with pytest.raises(PromptError, match="unknown task"):
        render_prompt({}, "next_code", "none")


def test_budget_drops_the_oldest_history_first(rows):
    row = max(rows["next_cell"], key=lambda r: len(r["history"]))
    total = len(row["history"])
    whole = render_prompt(row, "next_cell", "none", count_tokens=_words, max_prompt_tokens=10_000)
    assert whole.kept == Kept(total, total, None, None, None, 0) and whole.skipped_reason is None
    budget = whole.tokens - 15
    cut = render_prompt(row, "next_cell", "none", count_tokens=_words, max_prompt_tokens=budget)
    shown = cut.kept.history_shown
    assert cut.skipped_reason is None and cut.tokens <= budget and 1 <= shown < total
    text = _user(cut)
    assert all(c["code"] in text for c in row["history"][-shown:] if c["code"])
    assert f"# Cell {total - shown + 1}\n" in text and "# Cell 1\n" not in text
    # the fewest cells go: one more cell would not fit
    one_more = {**row, "history": row["history"][-(shown + 1):]}
    assert _words(messages_text(render_prompt(one_more, "next_cell", "none").messages)) > budget


def test_budget_cuts_reprs_first_and_skips_only_when_the_cell_alone_is_too_long(rows):
    row = next(r for r in rows["output_prediction"] if len(r["variables_before"]) >= 3)
    total = len(row["variables_before"])
    no_history = {**row, "history": []}
    base = render_prompt(no_history, "output_prediction", "variables", count_tokens=len, max_prompt_tokens=10**6)
    trimmed = render_prompt(row, "output_prediction", "variables", count_tokens=len,
                            max_prompt_tokens=base.tokens - 20)
    assert trimmed.skipped_reason is None and trimmed.tokens <= base.tokens - 20
    assert trimmed.kept.variables_shown == total and trimmed.kept.repr_chars is not None
    assert trimmed.kept.reprs_cut >= 1 and trimmed.kept.variables_total == total
    tiny = render_prompt(row, "output_prediction", "full", count_tokens=len, max_prompt_tokens=50)
    assert tiny.skipped_reason and "over budget" in tiny.skipped_reason and "(budget 50)" in tiny.skipped_reason
    assert tiny.kept is None
    # the instruction and the target's own cell are never trimmed
    assert row["code"] in _user(tiny) and "Predict the exact output" in _user(tiny)


@pytest.mark.parametrize("raw, task, expected", [
    ("Here it is:\n```python\ndf.head()\n```\nThis shows rows.", "next_cell", "df.head()"),
    ("```\nprint(1)\n```\n```python\nprint(2)\n```", "next_cell", "print(1)"),
    ("```python\ndf.groupby('user').size()", "next_cell", "df.groupby('user').size()"),  # cut by max tokens
    ("  df.shape  \n", "next_cell", "df.shape"),
    ("<think>maybe df.info()</think>\n```py\ndf.describe()\n```", "next_cell", "df.describe()"),
    ("```\n      user   time\n0  user_12  \n```", "output_prediction", "      user   time\n0  user_12"),
    ("````\n```inner```\n````", "output_prediction", "```inner```"),
    ("(48213, 2)", "output_prediction", "(48213, 2)"),
    ("", "next_cell", ""),
])
def test_extract_answer(raw, task, expected):
    assert extract_answer(raw, task) == expected


def test_baselines_on_release_rows(rows):
    row = next(r for r in rows["next_cell"] if len(r["history"]) >= 5)
    codes = [c["code"] for c in row["history"] if c["code"].strip()]
    assert baseline_prediction("previous-cell", row, "next_cell") == codes[-1]
    assert baseline_prediction("common-cell", row, "next_cell") in codes
    repeated = {**row, "history": row["history"] + [{**row["history"][0]}]}
    assert baseline_prediction("common-cell", repeated, "next_cell") == row["history"][0]["code"]
    out = next(r for r in rows["output_prediction"] if r["history"])
    assert baseline_prediction("previous-output", out, "output_prediction") == out["history"][-1]["output"]
    assert baselines_for("next_cell") + baselines_for("output_prediction") == BASELINES
    with pytest.raises(ValueError, match="does not apply to next_cell"):
        baseline_prediction("last-repr", row, "next_cell")
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline_prediction("oracle", row, "next_cell")


def test_last_repr_takes_the_variable_the_cell_names_last(rows):
    row = next(r for r in rows["output_prediction"] if {"df", "counts"} <= {v["name"] for v in r["variables_before"]})
    reprs = {v["name"]: v["repr"] for v in row["variables_before"]}
    assert last_repr({**row, "code": "counts.describe()\ndf.head()"}) == reprs["df"]
    assert last_repr({**row, "code": "df.head(\ncounts"}) == reprs["counts"]  # does not parse: tokens
    assert last_repr({**row, "code": "print('no variable')"}) == ""
