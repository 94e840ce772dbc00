"""The `trace` context mode: each history cell followed by the state it left as JSON (CWM's convention: a value the
cell did not change is written ".."), cut to the budget by the same rule as the runtime section."""

from __future__ import annotations

import json

from themisto.generation.budget import Cut, Fields
from themisto.generation.prompts import PROMPT_TEMPLATES, render_prompt, template_sha256
from themisto.generation.trace import UNCHANGED, state_lines, trace_names
from themisto.generation.variable_ranking import rank_variables


def _variable(name: str, digest: str, text: str) -> dict:
    return {"name": name, "type": "builtins.str", "hash": digest, "repr": text, "size": len(text)}


def _row() -> dict:
    """Four history cells: `a` made, `b` made while `a` stays, `a` changed and `b` removed, a restart, then `c`."""
    cells = [
        {"step": 1, "code": "a = 'x'", "output": "", "status": "ok",
         "state_after": [_variable("a", "h1", "'x'")]},
        {"step": 2, "code": "b = 'y' * 50", "output": "", "status": "ok",
         "state_after": [_variable("a", "h1", "'x'"), _variable("b", "h2", "'" + "y" * 50 + "'")]},
        {"step": 3, "code": "a = 'z'\ndel b", "output": "", "status": "ok",
         "state_after": [_variable("a", "h3", "'z'")]},
        {"step": 4, "code": "c = 'w'", "output": "w", "status": "ok", "restarted_before": True,
         "state_after": [_variable("c", "h4", "'w'")]},
    ]
    return {"id": "k/5", "kernel_id": "k", "step": 5, "history": cells, "target": "print(c)",
            "state_before_history": [], "variables_before": [_variable("c", "h4", "'w'")]}


def _states(prompt) -> list[dict]:
    text = prompt.messages[1]["content"]
    return [json.loads(line.split("State after it: ", 1)[1]) for line in text.splitlines()
            if line.startswith("State after it: {")]


def test_each_cell_shows_what_it_changed_and_elides_the_rest():
    prompt = render_prompt(_row(), "next_cell", "trace")
    assert _states(prompt) == [{"a": "'x'"}, {"a": UNCHANGED, "b": "'" + "y" * 50 + "'"}, {"a": "'z'"},
                               {"c": "'w'"}]  # after a restart everything is new; a removed variable is gone
    text = prompt.messages[1]["content"]
    assert text.index("a = 'x'") < text.index("State after it:") < text.index("Output:")
    assert prompt.kept.variables_shown == prompt.kept.variables_total == 3  # c, then those only earlier states held
    assert template_sha256("next_cell", "trace") != template_sha256("next_cell", "variables")
    assert "\"..\"" in PROMPT_TEMPLATES[("next_cell", "trace")]


def test_the_budget_cuts_values_then_variables_as_it_cuts_the_runtime_section():
    row = _row()
    long = "'" + "y" * 1500 + "'"
    for cell in row["history"][1:]:
        cell["state_after"] = [*cell["state_after"], _variable("big", "h9", long)]
    row["variables_before"] = [*row["variables_before"], _variable("big", "h9", long)]
    size = render_prompt(row, "next_cell", "trace", count_tokens=len).tokens
    cut = render_prompt(row, "next_cell", "trace", count_tokens=len, max_prompt_tokens=size - 800)
    assert cut.skipped_reason is None and cut.tokens <= size - 800
    assert cut.kept.history_shown >= 1 and cut.kept.repr_chars is not None  # the long value is cut, not dropped
    assert "y" * 1500 not in cut.messages[1]["content"] and "big" in cut.messages[1]["content"]
    floor = render_prompt(dict(row, history=[]), "next_cell", "trace", count_tokens=len).tokens
    for budget in range(size, floor - 50, -25):  # every budget the instruction fits in gives a prompt within it
        prompt = render_prompt(row, "next_cell", "trace", count_tokens=len, max_prompt_tokens=budget)
        assert (prompt.skipped_reason is None) == (budget >= floor), budget
        assert prompt.skipped_reason is not None or prompt.tokens <= budget
        if prompt.kept is not None and prompt.kept.history_shown == 0:
            assert prompt.kept.variables_shown == 0  # no cell shown, so no state line either


def test_the_lowest_ranked_variables_leave_every_state_line_first():
    row = _row()
    names = trace_names(row, rank_variables(row, "next_cell"))
    assert names == ["c", "a", "b"]  # the target's snapshot first, then those only earlier states held
    lines = state_lines(row, row["history"], names, Cut(history=4, variables=2))
    assert [json.loads(line) for line in lines] == [{"a": "'x'"}, {"a": UNCHANGED}, {"a": "'z'"}, {"c": "'w'"}]
    short = state_lines(row, row["history"][-2:], names, Cut(4, 3, Fields(repr_chars=0, columns=0)))
    assert [json.loads(line) for line in short] == [{"a": "<builtins.str>"}, {"c": "<builtins.str>"}]


def test_a_cell_without_a_snapshot_says_so():
    row = _row()
    row["history"][1]["state_after"] = None
    assert "State after it: (not recorded)" in render_prompt(row, "next_cell", "trace").messages[1]["content"]
    # the next cell's state is compared with nothing: every variable it holds is shown
    assert _states(render_prompt(row, "next_cell", "trace"))[1] == {"a": "'z'"}
