"""The release's `eval.yaml`: its tasks declared the Hub's way, so model repos can report results against them.

Schema from hub-docs `docs/hub/eval-results.md` (a beta): `name`, `description`, `evaluation_framework`, and
`tasks: [{id, config, split}]`. One task per config with a `test` split; a model's `.eval_results/*.yaml` entry names
one of these ids as its `task_id`. The Hub checks `evaluation_framework` against a closed list (huggingface.js
`packages/tasks/src/eval.ts`) that does not name Themisto yet; the README says what registering takes.
"""

from __future__ import annotations

from pathlib import Path

from themisto.errors import InputError
from themisto.release.folder import EVAL_FILE, read_eval_file
from themisto.resume import write_text_atomic
from themisto.vocabulary import BENCHMARK_SPLIT, TASKS

NAME = "Themisto"
FRAMEWORK = "themisto"
DESCRIPTION = (
    "Themisto measures how well code models use runtime information from Jupyter notebooks: real development "
    "trajectories replayed in sandboxed kernels. next_cell asks for the code of the cell the developer ran next; "
    "output_prediction asks for the output of a given cell. Each is scored with and without runtime context "
    "(variables, full).")


class EvalYamlError(InputError):
    """An eval.yaml that does not follow the documented schema; the message names the file and the field."""


def eval_spec(configs_with_test: list[str] | tuple[str, ...] = TASKS) -> dict:
    """The eval.yaml mapping for a release whose `test` split exists for `configs_with_test`."""
    tasks = [{"id": config, "config": config, "split": BENCHMARK_SPLIT}
             for config in TASKS if config in configs_with_test]
    return {"name": NAME, "description": DESCRIPTION, "evaluation_framework": FRAMEWORK, "tasks": tasks}


def write_eval_yaml(folder: str | Path, configs_with_test: list[str] | tuple[str, ...] = TASKS) -> Path:
    """Write `folder/eval.yaml` whole (temp file, then rename); returns its path."""
    import yaml

    path = Path(folder) / EVAL_FILE
    write_text_atomic(path, yaml.safe_dump(eval_spec(configs_with_test), sort_keys=False, allow_unicode=True,
                                           width=100))
    return path


def read_eval_yaml(folder: str | Path) -> dict:
    """Read (within bounds, anchors refused) and check `folder/eval.yaml` against the documented schema;
    EvalYamlError names what is wrong."""
    path = Path(folder) / EVAL_FILE
    if not path.is_file():
        raise EvalYamlError(f"{path}: missing (the release declares its tasks for the Hub there)")
    try:
        data = read_eval_file(folder)
    except InputError as exc:
        raise EvalYamlError(str(exc)) from None
    if not isinstance(data, dict):
        raise EvalYamlError(f"{path}: expected a mapping at the top")
    for key in ("name", "description", "evaluation_framework"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise EvalYamlError(f"{path}: `{key}` must be a non-empty string")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise EvalYamlError(f"{path}: `tasks` must be a non-empty list")
    seen: set[str] = set()
    for number, task in enumerate(tasks, start=1):
        if not isinstance(task, dict) or not all(isinstance(task.get(k), str) and task[k] for k in
                                                 ("id", "config", "split")):
            raise EvalYamlError(f"{path}: task {number} needs string `id`, `config` and `split`")
        if task["id"] in seen:
            raise EvalYamlError(f"{path}: task id {task['id']!r} is declared twice")
        seen.add(task["id"])
    return data


def declared_task_ids(folder: str | Path) -> list[str]:
    """The task ids the release's eval.yaml declares, in order."""
    return [task["id"] for task in read_eval_yaml(folder)["tasks"]]
