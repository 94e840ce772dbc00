"""The release's `eval.yaml`: its tasks declared the Hub's way, so model repos can report results against them.

Schema from hub-docs `docs/hub/eval-results.md` (a beta): `name`, `description`, `evaluation_framework`, and
`tasks: [{id, config, split}]`. The framework is `inspect-ai`, one of the ids the Hub's validator knows (and the one
whose runs in HF Jobs earn the "verified" badge): each declared task is one Inspect task the package registers,
one per (config with a `test` split, context mode), its id the registered name (`themisto/<id>`, `task_id`), so a
model's `.eval_results/*.yaml` entry names the task and the mode it was run in.
"""

from __future__ import annotations

from pathlib import Path

from themisto.errors import InputError
from themisto.release.folder import EVAL_FILE, read_eval_file
from themisto.resume import write_text_atomic
from themisto.vocabulary import BENCHMARK_SPLIT, CONTEXT_MODES, TASKS

NAME = "Themisto"
FRAMEWORK = "inspect-ai"
# The `evaluation_framework` ids the Hub accepts in a dataset's eval.yaml: the keys of EVALUATION_FRAMEWORKS in
# huggingface.js `packages/tasks/src/eval.ts` (read at commit 0589d130abd3393e9a68066f4e90ca2e7397b4ec, 19 ids).
# The one copy of that list here; `themisto check` refuses a framework outside it.
HUB_EVALUATION_FRAMEWORKS: tuple[str, ...] = (
    "exgentic", "inspect-ai", "math-arena", "mteb", "olmocr-bench", "harbor", "archipelago", "apex-evals",
    "screenspot-pro", "swe-bench", "swe-bench-pro", "nemo-evaluator", "yc-bench", "open-asr-leaderboard", "mdpbench",
    "parsebench", "video-mme-v2", "claw-eval", "wildclawbench")
DESCRIPTION = (
    "Themisto measures how well code models use runtime information from Jupyter notebooks: real development "
    "trajectories replayed in sandboxed kernels. next_cell asks for the code of the cell the developer ran next; "
    "output_prediction asks for the output of a given cell. Each task is declared once per context mode: none (no "
    "runtime information), variables, full, trace, delta (what each cell changed), and probe (the model may query "
    "the live kernel state). Run "
    "with Inspect: inspect eval themisto/<task id> -T release=<this dataset> --model <provider/model>.")


class EvalYamlError(InputError):
    """An eval.yaml that does not follow the documented schema; the message names the file and the field."""


def task_id(config: str, context: str) -> str:
    """The declared id of a (task, context mode), which is also the Inspect task's name (`themisto/<id>`)."""
    return f"{config}_{context}"


def eval_spec(configs_with_test: list[str] | tuple[str, ...] = TASKS) -> dict:
    """The eval.yaml mapping for a release whose `test` split exists for `configs_with_test`: one task per config
    and context mode."""
    tasks = [{"id": task_id(config, context), "config": config, "split": BENCHMARK_SPLIT}
             for config in TASKS if config in configs_with_test for context in CONTEXT_MODES]
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
    if data["evaluation_framework"] not in HUB_EVALUATION_FRAMEWORKS:
        raise EvalYamlError(f"{path}: evaluation_framework {data['evaluation_framework']!r} is not one the Hub "
                            f"accepts ({', '.join(HUB_EVALUATION_FRAMEWORKS)}); Themisto's is {FRAMEWORK!r}")
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
        if data["evaluation_framework"] == FRAMEWORK and task["id"] not in {
                task_id(task["config"], context) for context in CONTEXT_MODES}:
            raise EvalYamlError(f"{path}: task {number} id {task['id']!r} is not an Inspect task of the package "
                                f"(expected {task['config']}_<context mode>, one of {', '.join(CONTEXT_MODES)})")
        seen.add(task["id"])
    return data


def declared_task_ids(folder: str | Path) -> list[str]:
    """The task ids the release's eval.yaml declares, in order."""
    return [task["id"] for task in read_eval_yaml(folder)["tasks"]]
