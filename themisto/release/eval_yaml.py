"""The release's `eval.yaml`: its tasks declared the Hub's way, so that Inspect's Hub loader runs them
(`inspect eval hf/<dataset>`) and model repos report results against them.

Two schemas meet here. The Hub's (hub-docs `docs/hub/eval-results.md`, a beta): `name`, `description`,
`evaluation_framework` (one of the ids the Hub's validator knows) and `tasks`. Inspect's, for the framework
`inspect-ai`, whose runs in HF Jobs earn the "verified" badge (inspect_ai 0.3.285 `_eval/task/hf.py`, model `HFTask`,
extra keys forbidden): per task `id`, `config`, `split`, a `field_spec` (the input and target columns), at least one
of Inspect's built-in solvers and one of its built-in scorers. `read_eval_yaml` checks the first and the names below;
`themisto check` checks the second with Inspect's own model where inspect_ai is installed
(`themisto.harness.hub_schema`).

The tasks are the text track (`themisto.release.text_track`): one per (task, context mode with a fixed prompt), its id
the name of the Themisto Inspect task of the same task and mode (`task_id`; `inspect eval themisto/<id>` runs the full
one), its input that mode's prompt column of `<task>_prompts`, its target the reference, sent with the renderer's
system message and scored by the built-in scorers of `SCORERS`. HF Jobs have no Docker and no code sandbox, so
execution can never be part of a Hub run: the card says what only the full tasks measure.
"""

from __future__ import annotations

import copy
from pathlib import Path

from themisto.errors import InputError
from themisto.modes import STATIC_CONTEXT_MODES
from themisto.release.folder import EVAL_FILE, read_eval_file, schema_module
from themisto.resume import write_text_atomic
from themisto.vocabulary import BENCHMARK_SPLIT, TASKS

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
    "output_prediction asks for the output of a given cell. This file declares the text track: one task per task and "
    "context mode with a fixed prompt (none: no runtime information; variables; full; trace; delta: what each cell "
    "changed), its prompt stored as "
    "text in the <task>_prompts config, scored by Inspect's built-in text scorers (inspect eval hf/<this dataset>). "
    "Execution in the exact pre-cell state, intervals over trajectories and the probe mode are measured only by the "
    "full tasks: install the themisto package with its inspect extra, then inspect eval themisto/<task id> "
    "-T release=<this dataset>.")

# The first fenced block of a reply (an unclosed one runs to the end), read as the prompts ask for the answer and as
# `themisto.generation.prompts.extract_answer` reads it: blank lines at its edges dropped, indentation kept.
FENCED_ANSWER = r"(?ms)^[ \t]*(?:`{3,}|~{3,})[^\n]*\n\n*(.*?)\s*(?:^[ \t]*(?:`{3,}|~{3,})[ \t]*$|\Z)"
# The closest of Inspect's built-in scorers, per task. next_cell: `pattern` over FENCED_ANSWER, case-sensitive, is
# Themisto's exact match (the fenced code equals the target; Themisto also drops trailing spaces inside lines), and
# `f1` the bag-of-words overlap of the whole reply with the target (punctuation dropped: a rough stand-in for ROUGE-L
# and chrF; the fence's language tag costs it a little). `exact` cannot serve next_cell: it keeps the fence's
# `python` as a word. output_prediction: `match` at location `exact`, case-sensitive, is exact match of the whole
# reply with the target once whitespace and punctuation at both edges (the fence) are stripped, so an empty output
# predicted empty counts; `exact` is a lenient match (case, punctuation and spacing folded), nearer output
# equivalence. None of them runs code.
SCORERS: dict[str, list[dict]] = {
    "next_cell": [{"name": "pattern", "args": {"pattern": FENCED_ANSWER, "ignore_case": False}}, {"name": "f1"}],
    "output_prediction": [{"name": "match", "args": {"location": "exact", "ignore_case": False}}, {"name": "exact"}],
}
# What each Inspect sample carries besides its input and target: where the example lies (trajectory and step).
SAMPLE_METADATA = ["id", "kernel_id", "step"]


class EvalYamlError(InputError):
    """An eval.yaml that does not follow the documented schema; the message names the file and the field."""


def task_id(config: str, context: str) -> str:
    """The declared id of a (task, context mode), which is also the Themisto Inspect task's name (`themisto/<id>`)."""
    return f"{config}_{context}"


def text_track_task(identifier: str) -> tuple[str, str] | None:
    """The (task, mode) a declared id names, or None where it names no text-track task."""
    found = [(task, mode) for task in TASKS for mode in STATIC_CONTEXT_MODES if task_id(task, mode) == identifier]
    return found[0] if found else None


def hub_task(task: str, mode: str, system: str) -> dict:
    """One task of the text track as Inspect's Hub loader reads it (`HFTask`)."""
    schema = schema_module()
    # Fresh objects for each task: a list shared between tasks would be written as a YAML alias, which readers
    # within bounds (themisto.bounded, and so `themisto check`) refuse.
    return {"id": task_id(task, mode), "config": schema.prompts_config(task), "split": BENCHMARK_SPLIT,
            "field_spec": {"input": schema.prompt_column(mode), "target": "target", "metadata": list(SAMPLE_METADATA)},
            "solvers": [{"name": "system_message", "args": {"template": system}}, {"name": "generate"}],
            "scorers": copy.deepcopy(SCORERS[task])}


def eval_spec(configs_with_test: list[str] | tuple[str, ...], system: str) -> dict:
    """The eval.yaml mapping for a release whose `test` split exists for `configs_with_test`: one task per task whose
    `<task>_prompts` config is there and per context mode with a fixed prompt, sent with the system message `system`."""
    schema = schema_module()
    tasks = [hub_task(task, mode, system) for task in TASKS if schema.prompts_config(task) in configs_with_test
             for mode in STATIC_CONTEXT_MODES]
    return {"name": NAME, "description": DESCRIPTION, "evaluation_framework": FRAMEWORK, "tasks": tasks}


def write_eval_yaml(folder: str | Path, configs_with_test: list[str] | tuple[str, ...], system: str) -> Path:
    """Write `folder/eval.yaml` whole (temp file, then rename); returns its path."""
    import yaml

    path = Path(folder) / EVAL_FILE
    write_text_atomic(path, yaml.safe_dump(eval_spec(configs_with_test, system), sort_keys=False,
                                           allow_unicode=True, width=100))
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
        if data["evaluation_framework"] == FRAMEWORK:
            _check_text_track_task(path, number, task)
        seen.add(task["id"])
    return data


def _check_text_track_task(path: Path, number: int, task: dict) -> None:
    """A task of the framework `inspect-ai` is a text-track task of the package: its id names a task and a mode
    with a fixed prompt, and it reads that task's prompts config and that mode's column."""
    schema = schema_module()
    found = text_track_task(task["id"])
    if found is None:
        ids = ", ".join(task_id(t, m) for t in TASKS for m in STATIC_CONTEXT_MODES)
        raise EvalYamlError(f"{path}: task {number} id {task['id']!r} is not an Inspect task of the package's text "
                            f"track (expected one of {ids})")
    config, column = schema.prompts_config(found[0]), schema.prompt_column(found[1])
    if task["config"] != config:
        raise EvalYamlError(f"{path}: task {number} ({task['id']}) reads config {task['config']!r}; its prompts are "
                            f"in {config!r}")
    spec = task.get("field_spec")
    if isinstance(spec, dict) and spec.get("input") != column:
        raise EvalYamlError(f"{path}: task {number} ({task['id']}) field_spec.input is {spec.get('input')!r}; its "
                            f"prompt is the column {column!r}")


def declared_task_ids(folder: str | Path) -> list[str]:
    """The task ids the release's eval.yaml declares, in order."""
    return [task["id"] for task in read_eval_yaml(folder)["tasks"]]
