"""The text track run the Hub's way: Inspect's own Hub task builder (`inspect_ai._eval/task/hf.py`) reads the sample
release's eval.yaml and its `<task>_prompts` configs from a local folder, a model answers, and the log holds Inspect's
built-in scores at the values the answers call for. The stand-in provider `themisto-standin` runs the full tasks with
no model and no download, and the Inspect Evals register entry names the registered tasks.

Only the Hub is stood in for: `huggingface_hub.hf_hub_download` returns the local eval.yaml (`hub_download_stand_in`),
and the dataset id is a local folder named like one, which `datasets` reads in the Hub's place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from themisto.generation.prompts import SYSTEM, TEXT_TRACK_CHARS, text_track_prompt
from themisto.modes import STATIC_CONTEXT_MODES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def hub_tasks(small_release, tmp_path, monkeypatch):
    """Inspect's Hub builder over the small release as the local dataset `local/themisto`: task id -> Task."""
    import huggingface_hub

    def hub_download_stand_in(repo_id, filename, repo_type=None, revision=None, **kwargs):
        assert (repo_id, filename, repo_type) == ("local/themisto", "eval.yaml", "dataset")
        return str(tmp_path / repo_id / filename)

    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "themisto").symlink_to(small_release)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # Inspect keeps its dataset copies there
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub_download_stand_in)
    from inspect_ai._eval.task.hf import task_create_from_hf

    def build(task_id):
        [task] = task_create_from_hf(f"hf/local/themisto/{task_id}")
        return task

    return build


def _prompt_rows(release, task):
    import datasets

    return {row["id"]: row for row in datasets.load_dataset(str(release), f"{task}_prompts", split="test")}


def _answering(rows, mode, fence):
    """A mock model that answers the target, fenced, for every other prompt and something else for the rest (the
    synthetic trajectories repeat their cells, so rows of two of them can share a prompt, and then their target); its
    usage is given, so Inspect's mock counts nothing with tiktoken."""
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    by_prompt = {row[f"prompt_{mode}"]: row for row in rows.values()}
    right = set(sorted(by_prompt)[::2])

    def answer(messages, tools, tool_choice, config):
        assert [m.role for m in messages] == ["system", "user"] and messages[0].text == SYSTEM
        text = by_prompt[messages[1].text]["target"] if messages[1].text in right else "not the answer"
        output = ModelOutput.from_content("mockllm", f"{fence}\n{text}\n```")
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    return get_model("mockllm/model", custom_outputs=answer), right


@pytest.mark.parametrize("task,mode,fence,scores", [
    ("next_cell", "full", "```python", ("pattern", "f1")),
    ("output_prediction", "none", "```", ("match", "exact")),
])
def test_the_text_track_runs_through_inspects_hub_builder_with_its_builtin_scorers(
        hub_tasks, small_release, tmp_path, task, mode, fence, scores):
    from inspect_ai import eval as inspect_eval
    from inspect_ai.log import read_eval_log
    from inspect_ai.scorer import value_to_float

    as_float = value_to_float()  # Inspect's own reading of a score (C / I are 1 / 0)
    rows = _prompt_rows(small_release, task)
    model, right = _answering(rows, mode, fence)
    [log] = inspect_eval(hub_tasks(f"{task}_{mode}"), model=model, limit=6, display="none",
                         log_dir=str(tmp_path / "logs"))
    log = read_eval_log(log.location)
    assert log.status == "success", log.error
    results = {score.name: score for score in log.results.scores}
    assert tuple(results) == scores
    first = scores[0]  # the exact match: right exactly where the answer was the target
    expected = [1.0 if sample.input in right else 0.0 for sample in log.samples]
    assert [as_float(sample.scores[first].value) for sample in log.samples] == expected
    assert results[first].metrics["accuracy"].value == pytest.approx(sum(expected) / 6) and 0 < sum(expected) < 6
    second = [as_float(sample.scores[scores[1]].value) for sample in log.samples]  # f1, or the lenient exact match
    assert min(s for s, e in zip(second, expected) if e) > max(s for s, e in zip(second, expected) if not e)
    for sample in log.samples:  # what Inspect sent is the release's prompt column and target, row by row
        row = rows[sample.metadata["id"]]
        assert (sample.input, sample.target) == (row[f"prompt_{mode}"], row["target"])
        assert (sample.metadata["kernel_id"], sample.metadata["step"]) == (row["kernel_id"], row["step"])


def test_each_prompt_is_the_renderers_under_the_character_budget(small_release):
    import datasets

    task_rows = {row["id"]: row for row in datasets.load_dataset(str(small_release), "next_cell", split="test")}
    prompts = datasets.load_dataset(str(small_release), "next_cell_prompts", split="test")
    assert len(prompts) == len(task_rows)
    for row in prompts:
        text, fits = text_track_prompt(task_rows[row["id"]], "next_cell", "variables")
        assert row["prompt_variables"] == text and fits
        assert len(SYSTEM) + 1 + len(text) <= TEXT_TRACK_CHARS


def test_a_smaller_budget_cuts_the_history_oldest_first(small_release):
    import datasets

    row = max(datasets.load_dataset(str(small_release), "next_cell", split="test"), key=lambda r: len(r["history"]))
    whole, _ = text_track_prompt(row, "next_cell", "none", budget_chars=10**6)
    cut, fits = text_track_prompt(row, "next_cell", "none", budget_chars=len(SYSTEM) + len(whole) - 1)
    assert fits and len(cut) < len(whole)
    assert row["history"][-1]["code"] in cut and "# Cell 1\n" in whole and "# Cell 1\n" not in cut
    smallest, fits = text_track_prompt(row, "next_cell", "none", budget_chars=10)
    assert not fits and "# Cell" not in smallest  # over the budget even with no history: its smallest prompt


def test_the_build_writes_the_test_split_and_notes_prompts_over_the_budget(small_release):
    import datasets

    from themisto.generation.prompts import text_track_renderer
    from themisto.release.text_track import prompt_rows

    rows = list(datasets.load_dataset(str(small_release), "next_cell", split="test"))[:3]
    out, notes = prompt_rows({"next_cell": {"test": rows, "train": rows[:2]}}, text_track_renderer(budget_chars=10))
    assert list(out) == ["next_cell_prompts"] and list(out["next_cell_prompts"]) == ["test"]  # a Hub run reads test
    assert [line["id"] for line in out["next_cell_prompts"]["test"]] == [row["id"] for row in rows]
    assert notes == [f"next_cell_prompts: {3 * len(STATIC_CONTEXT_MODES)} prompt(s) over the 10-character budget "
                     "even with no history cell shown (the instruction and the cell alone exceed it); each keeps its smallest prompt (no history "
                     "cell, no variable)"]


def test_the_stand_in_provider_runs_a_full_task_with_no_download(small_release, tmp_path, monkeypatch):
    import tiktoken
    from inspect_ai import eval as inspect_eval

    from themisto.harness.tasks import next_cell

    def no_download(*args, **kwargs):
        raise AssertionError("tiktoken asked for an encoding (a download on first use)")

    monkeypatch.setattr(tiktoken, "get_encoding", no_download)
    [log] = inspect_eval(next_cell, task_args={"release": str(small_release)}, limit=8, display="none",
                         model="themisto-standin/fixed", model_args={"reply": "```python\nx = 1\n```"},
                         log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    assert len(log.samples) == 8 and {s.scores["themisto"].answer for s in log.samples} == {"x = 1"}
    [usage] = log.stats.model_usage.values()
    assert usage.output_tokens == 8 * (len("```python\nx = 1\n```") // 3 + 1)  # the stated estimate, bytes / 3


def test_the_inspect_evals_register_entry_names_the_registered_tasks():
    from inspect_ai._util.registry import registry_info

    import themisto.harness.tasks as tasks

    entry = yaml.safe_load((REPO / "integrations" / "inspect_evals" / "eval.yaml").read_text(encoding="utf-8"))
    assert entry["arxiv"] == "https://arxiv.org/abs/2504.12365"
    assert {"title", "description", "tasks", "source"} <= set(entry) and "id" not in entry
    for item in entry["tasks"]:  # each a task Inspect registers under that name, defined in that file
        assert registry_info(getattr(tasks, item["name"])).name.split("/")[-1] == item["name"]
        assert f"@task\ndef {item['name']}(" in (REPO / item["task_path"]).read_text(encoding="utf-8")
    assert {item["name"] for item in entry["tasks"]} == {"next_cell", "output_prediction"}
    assert set(entry["source"]) == {"repository_url", "repository_commit", "maintainers"}
    assert 'pip install -e ".[inspect]"' in entry["description"]  # how to install: the `inspect` extra
