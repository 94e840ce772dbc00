"""The release's eval.yaml (hub-docs eval-results schema): written by the build, every declared task resolves to a
config and split that `datasets` loads, and `themisto check` names a broken one."""

import shutil

import datasets
import pytest
import yaml

from themisto.release.check import check_release
from themisto.release.eval_yaml import EVAL_FILE, EvalYamlError, declared_task_ids, read_eval_yaml


def test_the_build_declares_each_task_with_a_loadable_config_and_split(small_release):
    data = yaml.safe_load((small_release / EVAL_FILE).read_text())
    assert list(data) == ["name", "description", "evaluation_framework", "tasks"]
    assert data["evaluation_framework"] == "inspect-ai"
    assert declared_task_ids(small_release) == [f"{task}_{mode}" for task in ("next_cell", "output_prediction")
                                                for mode in ("none", "variables", "full", "trace", "delta", "probe")]
    for task in data["tasks"]:
        rows = datasets.load_dataset(str(small_release), task["config"], split=task["split"])
        assert len(rows) > 0 and "target" in rows.column_names


@pytest.fixture
def copy(tmp_path, small_release):
    return shutil.copytree(small_release, tmp_path / "release")


def test_check_names_a_task_whose_config_the_release_lacks(copy):
    data = read_eval_yaml(copy)
    data["tasks"].append({"id": "output_prediction_full", "config": "output_prediction", "split": "validation"})
    data["tasks"] = [t for t in data["tasks"] if t["id"] != "output_prediction_full" or t["split"] != "test"]
    (copy / EVAL_FILE).write_text(yaml.safe_dump(data))
    assert check_release(copy).problems == [
        "eval.yaml: task 'output_prediction_full' names output_prediction/validation, which the release does not have"]


def test_the_declared_tasks_are_the_registered_inspect_tasks(small_release):
    from inspect_ai._util.registry import registry_info

    import themisto.harness.tasks as tasks

    names = {registry_info(getattr(tasks, name)).name.split("/")[-1] for name in dir(tasks)
             if name.startswith(("next_cell", "output_prediction"))}
    assert set(declared_task_ids(small_release)) <= names


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("evaluation_framework"), "`evaluation_framework` must be a non-empty string"),
    (lambda d: d["tasks"][0].pop("split"), "task 1 needs string `id`, `config` and `split`"),
    (lambda d: d["tasks"].append(dict(d["tasks"][0])), "task id 'next_cell_none' is declared twice"),
    # The Hub's validator knows a closed list of frameworks; `themisto` is not on it.
    (lambda d: d.update(evaluation_framework="themisto"), "evaluation_framework 'themisto' is not one the Hub accepts"),
    (lambda d: d["tasks"][0].update(id="next_cell"), "task 1 id 'next_cell' is not an Inspect task of the package"),
])
def test_a_file_off_the_schema_is_refused(copy, change, message):
    data = read_eval_yaml(copy)
    change(data)
    (copy / EVAL_FILE).write_text(yaml.safe_dump(data))
    with pytest.raises(EvalYamlError, match=message):
        read_eval_yaml(copy)
