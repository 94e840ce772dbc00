"""The `delta` context mode on the sample's own steps (tests/_sample_release.py: one sample trajectory's first 16
steps replayed in real kernels, and a notebook that deletes a name): each history cell followed by what it changed
(added, removed, changed; old -> new), an error cell's message without its traceback, the budget's cut, the docs'
worked example, and the mode through every consumer (generate and score with the paired effects and prompt tokens
in the summary, the Inspect samples, sft-export)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _sample_release import NOTEBOOK_CELLS, SAMPLE_KERNEL

from themisto.cli import main
from themisto.generation.delta import TRACEBACK_LEFT_OUT, DeltaError, DeltaSettings
from themisto.generation.prompts import render_prompt
from themisto.generation.release_rows import load_task_rows
from themisto.release.folder import TRAJECTORIES, open_release
from themisto.release.folder import open_release

REPO = Path(__file__).resolve().parents[1]
CELL = re.compile(r"^# Cell (\d+)(?: \(([^\n]*)\))?\n```python\n(.*?)\n```\n(.*?)(?=^Output)", re.S | re.M)


@pytest.fixture(scope="module")
def rows(sample_steps_release) -> dict[tuple[str, int], dict]:
    """The release's next_cell rows as the delta mode reads them, by (kernel, step)."""
    info = open_release(sample_steps_release)
    return {(r["kernel_id"], r["step"]): r for r in load_task_rows(info, "next_cell", ["delta"])}


@pytest.fixture(scope="module")
def steps(sample_steps_release) -> dict[tuple[str, int], dict]:
    """The replayed steps (the trajectories config), by (kernel, step): what each change list must agree with."""
    return {(r["kernel_id"], r["step"]): r for r in open_release(sample_steps_release).rows(TRAJECTORIES, "test")}


def _cells(prompt) -> list[dict]:
    """Each shown history cell of a delta prompt: its header's note, code and change list (one string per change)."""
    text = prompt.messages[1]["content"]
    out = []
    for match in CELL.finditer(text):
        changes = match.group(4).rstrip("\n").split("\n")
        out.append({"number": int(match.group(1)), "note": match.group(2), "code": match.group(3),
                    "label": changes[0], "changes": [line for line in changes[1:] if not line.startswith("  ")]})
    return out


def _shape(variable: dict) -> str:
    return "(" + ", ".join(map(str, variable["shape"])) + ")"


def _variable(step: dict, name: str) -> dict:
    return next(v for v in step["variables"] if v["name"] == name)


def test_a_trajectorys_first_step_shows_its_whole_namespace(rows, steps):
    row = rows[(SAMPLE_KERNEL, 5)]
    assert row["history"][0]["step"] == 0 and row["state_before_history"] == []
    first = _cells(render_prompt(row, "next_cell", "delta"))[0]
    made = {v["name"] for v in steps[(SAMPLE_KERNEL, 0)]["variables"]}
    assert made and first["label"] == "Changed:"
    assert {line.split(":")[0] for line in first["changes"]} == {f"+ {name}" for name in made}


def test_a_rebinding_shows_the_frames_old_and_new_shape_and_columns(rows, steps):
    row = rows[(SAMPLE_KERNEL, 12)]
    cells = dict(zip((cell["step"] for cell in row["history"]), _cells(render_prompt(row, "next_cell", "delta"))))
    rebind = next(s for s, cell in zip(cells, row["history"]) if cell["code"].startswith("raw = pd.read_csv") and s > 5)
    old, new = (_variable(steps[(SAMPLE_KERNEL, s)], "raw") for s in (rebind - 1, rebind))
    assert old["hash"] != new["hash"] and old["shape"] != new["shape"]  # the sample rebinds it to a narrower frame
    lost = [c for c in old["columns"] if c not in new["columns"]]
    assert cells[rebind]["changes"] == [f"~ raw: DataFrame; shape {_shape(old)} -> {_shape(new)}; "
                                        f"columns -[{', '.join(lost)}]"]
    # The next cell adds a column in place: the same name, changed, its shape and columns moving the other way.
    grown = _variable(steps[(SAMPLE_KERNEL, rebind + 1)], "raw")
    gained = [c for c in grown["columns"] if c not in new["columns"]]
    assert gained and cells[rebind + 1]["changes"] == [
        f"~ raw: DataFrame; shape {_shape(new)} -> {_shape(grown)}; columns +[{', '.join(gained)}]"]


def test_a_scalar_change_and_a_deletion(rows):
    row = rows[("deletes", 6)]
    cells = {c["code"]: c for c in _cells(render_prompt(row, "next_cell", "delta"))}
    assert cells["del items"]["changes"] == ["- items: list"]
    assert cells["total += 1"]["changes"] == ["~ total: int = 6 -> 7"]
    assert cells["items = [3, 1, 2]"]["changes"] == ["+ items: list; len 3 = [3, 1, 2]"]
    assert cells[NOTEBOOK_CELLS[5]]["label"] == "Changed: nothing"
    assert "items" not in {v["name"] for v in row["variables_before"]}
    restarted = render_prompt(dict(row, restarted_before=True), "next_cell", "delta").messages[1]["content"]
    assert "\n\n(the kernel was restarted before the next cell: none of the variables above is left)\n\n" in restarted


def test_a_missing_snapshot_and_a_restart_say_what_the_list_is_compared_with(rows):
    """The sample has neither in these steps: the notebook's row with one cell's snapshot taken out, then a restart."""
    row = rows[("deletes", 6)]
    history = [dict(cell) for cell in row["history"]]
    history[2]["state_after"] = None
    lost = _cells(render_prompt(dict(row, history=history), "next_cell", "delta"))
    assert lost[2]["label"] == "Changed: (not recorded: the release has no snapshot of this step)"
    assert lost[3]["label"] == "Changed (no snapshot of the state before it: every name it left is listed):"
    assert lost[3]["changes"] == ["+ ratio: float = 2.0", "+ total: int = 6"]  # the deletion is not seen
    history[2] = dict(row["history"][2])
    history[4]["restarted_before"] = True
    restarted = _cells(render_prompt(dict(row, history=history), "next_cell", "delta"))[4]
    assert restarted["label"] == "Changed (the kernel was restarted before it: every name is new):"
    assert restarted["changes"] == ["+ ratio: float = 2.0", "+ total: int = 7"]


def test_an_error_cell_names_its_error_and_leaves_its_traceback_out(rows, steps):
    row = rows[(SAMPLE_KERNEL, 15)]
    text = render_prompt(row, "next_cell", "delta").messages[1]["content"]
    errors = [cell for cell in row["history"] if cell["status"] == "error"]
    assert len(errors) == 2 and all(steps[(SAMPLE_KERNEL, c["step"])]["ename"] == "ValueError" for c in errors)
    failed = [c for c in _cells(render_prompt(row, "next_cell", "delta")) if c["note"]]
    assert [c["note"] for c in failed] == ["raised ValueError"] * 2
    assert all(c["label"] == "Changed: nothing" for c in failed)  # the failing assignment bound nothing
    for cell in errors:
        assert "Traceback (most recent call last)" in cell["output"]  # in the release, and in the other modes
        message = f"{cell['ename']}: {cell['evalue']}"
        assert f"{message}\n{TRACEBACK_LEFT_OUT}\n```" in text
    assert "Traceback (most recent call last)" not in text
    assert "Traceback (most recent call last)" in render_prompt(row, "next_cell", "none").messages[1]["content"]


def test_the_budget_cuts_reprs_then_the_lowest_ranked_changes_then_cells(rows):
    row = rows[(SAMPLE_KERNEL, 12)]  # ten cells, three names whose frames change with long reprs
    whole = render_prompt(row, "next_cell", "delta", count_tokens=len)
    assert whole.kept.variables_total == 3 and whole.kept.repr_chars is None
    floor = render_prompt(dict(row, history=[]), "next_cell", "delta", count_tokens=len).tokens
    seen_cut = seen_dropped = False
    for budget in range(whole.tokens, floor - 100, -50):
        prompt = render_prompt(row, "next_cell", "delta", count_tokens=len, max_prompt_tokens=budget)
        assert (prompt.skipped_reason is None) == (budget >= floor), budget
        if prompt.kept is None:
            continue
        kept, text = prompt.kept, prompt.messages[1]["content"]
        assert prompt.tokens <= budget and (kept.history_shown > 0 or kept.variables_shown == 0)
        seen_cut |= kept.repr_chars is not None and kept.variables_shown == 3
        if kept.history_shown and kept.variables_shown < 3:  # names go only once every repr is cut to nothing
            seen_dropped = True
            assert kept.repr_chars == 0 and "to variables ranked lower)" in text
    assert seen_cut and seen_dropped


def test_the_last_n_cells_setting(rows):
    row = rows[(SAMPLE_KERNEL, 15)]
    prompt = render_prompt(row, "next_cell", "delta", delta=DeltaSettings(cells=3))
    assert [c["number"] for c in _cells(prompt)] == [8, 9, 10] and prompt.kept.history_shown == 3
    assert prompt.kept.history_total == len(row["history"]) == 10
    with pytest.raises(DeltaError, match="--delta-cells 0: must be a whole number of at least 1"):
        DeltaSettings(cells=0)


def _docs_example() -> tuple[str, str]:
    """The worked example of docs/model-runs.md: the row id it names and its text block."""
    text = (REPO / "docs" / "model-runs.md").read_text(encoding="utf-8")
    section = text.split("### A worked example of `delta`", 1)[1]
    row_id = re.search(r"next_cell row `([^`]+)`", section).group(1)
    block = re.search(r"\n````text\n(.*?)\n````\n", section, re.S).group(1)
    return row_id, block


def test_the_docs_worked_example_is_what_the_mode_renders(rows):
    row_id, block = _docs_example()
    row = next(r for r in rows.values() if r["id"] == row_id)
    text = render_prompt(row, "next_cell", "delta", delta=DeltaSettings(cells=3)).messages[1]["content"]
    assert block in text and block.startswith("# Cell ")


def test_generate_score_and_summary_show_three_modes_and_both_effects(sample_steps_release, tiny_model_dir,
                                                                       tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["generate", "--release", str(sample_steps_release), "--task", "next_cell", "--context", "none",
                 "variables", "delta", "--backend", "transformers", "--model", str(tiny_model_dir), "--device",
                 "cpu", "--limit", "4", "--max-new-tokens", "4", "--max-prompt-tokens", "900", "--delta-cells", "6",
                 "-o", str(run), "--json"]) == 0
    assert json.loads((run / "run.json").read_text())["delta"] == {"cells": 6}
    assert main(["score", str(run), "--json"]) == 0
    results = json.loads((run / "results.json").read_text())
    tokens = {k["context"]: k["prompt_tokens"] for k in results["kept"]}
    assert all(isinstance(tokens[c], float) and 0 < tokens[c] <= 900 for c in ("none", "variables", "delta"))
    capsys.readouterr()
    assert main(["summary", str(run)]) == 0
    printed = capsys.readouterr().out
    effects = re.findall(r"runtime effect (\w+) − (\w+):", printed)
    assert effects == [("variables", "none"), ("delta", "none"), ("delta", "variables")]
    for context in ("none", "variables", "delta"):
        assert f"model · {context}" in printed and f"mean prompt {tokens[context]:,.0f} tokens" in printed
    assert "Paired effect, context − variables" in (run / "results.md").read_text()


def test_the_inspect_samples_and_the_sft_export_render_the_mode(sample_steps_release, tmp_path):
    from themisto.generation.example_spec import ExampleSpec
    from themisto.harness.samples import HarnessSettings, task_samples
    from themisto.training.export import ExportSettings, export_sft

    _, samples = task_samples(HarnessSettings(
        ExampleSpec(tasks=("next_cell",), contexts=("delta",), limit=3, delta=DeltaSettings(cells=2)),
        release=str(sample_steps_release)))
    texts = [sample.input[1].content for sample in samples]
    assert len(texts) == 3 and all(text.count("\n# Cell ") == 2 and "Changed" in text for text in texts)
    export_sft(open_release(sample_steps_release), tmp_path / "sft", ExportSettings(split="test", contexts=("delta",), verify=False))
    lines = (tmp_path / "sft" / "examples.jsonl").read_text().splitlines()
    assert lines and all("\nChanged" in json.loads(line)["prompt"][1]["content"] for line in lines)
