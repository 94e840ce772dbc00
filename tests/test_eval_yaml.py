"""The release's eval.yaml (the Hub's eval-results schema and Inspect's Hub loader's): written by the build with the
text track, every declared task reads a config, split and columns that `datasets` loads, and `themisto check` names
a task that the Hub's schema, the release or Inspect's own `HFTask` refuses, by task and field."""

import copy
import shutil

import datasets
import pytest
import yaml

from themisto.modes import STATIC_CONTEXT_MODES
from themisto.release.check import check_release
from themisto.release.eval_yaml import EVAL_FILE, EvalYamlError, declared_task_ids, read_eval_yaml


def test_the_build_declares_a_text_track_task_per_task_and_mode_with_a_fixed_prompt(small_release):
    data = yaml.safe_load((small_release / EVAL_FILE).read_text())
    assert list(data) == ["name", "description", "evaluation_framework", "tasks"]
    assert data["evaluation_framework"] == "inspect-ai"
    assert "probe" not in STATIC_CONTEXT_MODES  # its prompt grows with the model's probes: no column can hold it
    assert declared_task_ids(small_release) == [f"{task}_{mode}" for task in ("next_cell", "output_prediction")
                                                for mode in STATIC_CONTEXT_MODES]
    for task in data["tasks"]:
        rows = datasets.load_dataset(str(small_release), task["config"], split=task["split"])
        spec = task["field_spec"]
        assert {spec["input"], spec["target"], *spec["metadata"]} <= set(rows.column_names)
        assert len(rows) > 0 and all(rows[spec["input"]])
        assert [s["name"] for s in task["solvers"]] == ["system_message", "generate"]


@pytest.fixture
def release_copy(tmp_path, small_release):
    return shutil.copytree(small_release, tmp_path / "release")


def _plant(folder, change):
    data = read_eval_yaml(folder)
    change(data)
    (folder / EVAL_FILE).write_text(yaml.safe_dump(data))


def _task(data, identifier):
    """The declared task `identifier` (found by id: a mode added to the table moves the others)."""
    return next(task for task in data["tasks"] if task["id"] == identifier)


def _number(identifier):
    """The position (from 1) eval.yaml gives the task `identifier`, as the messages count."""
    return [f"{t}_{m}" for t in ("next_cell", "output_prediction") for m in STATIC_CONTEXT_MODES].index(identifier) + 1


def test_check_names_a_task_whose_config_the_release_lacks(release_copy):
    _plant(release_copy, lambda d: _task(d, "output_prediction_trace").update(split="validation"))
    assert check_release(release_copy).problems == [
        "eval.yaml: task 'output_prediction_trace' names output_prediction_prompts/validation, which the release "
        "does not have"]


def test_check_names_a_field_spec_column_the_config_lacks(release_copy):
    _plant(release_copy, lambda d: d["tasks"][0]["field_spec"].update(target="answer"))
    assert check_release(release_copy).problems == [
        "eval.yaml: task 'next_cell_none' field_spec.target names column 'answer', which next_cell_prompts does not "
        "have"]


def test_the_declared_tasks_are_the_registered_inspect_tasks(small_release):
    from inspect_ai._util.registry import registry_info

    import themisto.harness.tasks as tasks

    names = {registry_info(getattr(tasks, name)).name.split("/")[-1] for name in dir(tasks)
             if name.startswith(("next_cell", "output_prediction"))}
    assert set(declared_task_ids(small_release)) <= names


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("evaluation_framework"), "`evaluation_framework` must be a non-empty string"),
    (lambda d: d["tasks"][0].pop("split"), "task 1 needs string `id`, `config` and `split`"),
    (lambda d: d["tasks"].append(copy.deepcopy(d["tasks"][0])), "task id 'next_cell_none' is declared twice"),
    # The Hub's validator knows a closed list of frameworks; `themisto` is not on it.
    (lambda d: d.update(evaluation_framework="themisto"), "evaluation_framework 'themisto' is not one the Hub accepts"),
    (lambda d: d["tasks"][0].update(id="next_cell"),
     "task 1 id 'next_cell' is not an Inspect task of the package's text track"),
    (lambda d: d["tasks"][0].update(id="next_cell_probe"), "task 1 id 'next_cell_probe' is not an Inspect task"),
    (lambda d: d["tasks"][0].update(config="next_cell"),
     r"task 1 \(next_cell_none\) reads config 'next_cell'; its prompts are in 'next_cell_prompts'"),
    (lambda d: _task(d, "next_cell_variables")["field_spec"].update(input="prompt_none"),
     rf"task {_number('next_cell_variables')} \(next_cell_variables\) field_spec.input is 'prompt_none'; its prompt "
     r"is the column 'prompt_variables'"),
])
def test_a_file_off_the_schema_is_refused(release_copy, change, message):
    _plant(release_copy, change)
    with pytest.raises(EvalYamlError, match=message):
        read_eval_yaml(release_copy)


def _check_lines(folder, capsys):
    from themisto.cli import main

    code = main(["check", str(folder)])
    return code, [line for line in capsys.readouterr().out.splitlines() if line.startswith(("problem:", "eval.yaml:"))]


def test_themisto_check_applies_inspects_own_hftask_model_to_the_sample_release(small_release, capsys):
    from themisto.harness.hub_schema import inspect_version

    code, lines = _check_lines(small_release, capsys)
    assert code == 0 and lines == [f"eval.yaml: the Hub's schema and Inspect's HFTask (inspect_ai {inspect_version()})"]


@pytest.mark.parametrize("change,expected", [
    # Inspect's loader knows its built-in scorers only: Themisto's own cannot run on the Hub.
    (lambda d: _task(d, "next_cell_full")["scorers"].append({"name": "themisto"}),
     f"eval.yaml: task {_number('next_cell_full')} (next_cell_full): scorers.2.name: Input should be 'includes', "
     "'match', 'pattern', 'answer', 'exact', 'f1', 'model_graded_qa', 'model_graded_fact', 'choice' or 'math'"),
    (lambda d: _task(d, "output_prediction_none").pop("field_spec"),
     f"eval.yaml: task {_number('output_prediction_none')} (output_prediction_none): field_spec: Field required"),
    (lambda d: d["tasks"][0].update(context="none"),
     "eval.yaml: task 1 (next_cell_none): context: Extra inputs are not permitted"),
])
def test_themisto_check_names_the_task_and_field_inspects_loader_refuses(release_copy, capsys, change, expected):
    from themisto.harness.hub_schema import inspect_version

    _plant(release_copy, change)
    code, lines = _check_lines(release_copy, capsys)
    assert code == 1
    [problem] = [line for line in lines if line.startswith("problem:")]
    assert problem == f"problem: {expected} (Inspect's HFTask, inspect_ai {inspect_version()})"
