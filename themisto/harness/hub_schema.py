"""A release's eval.yaml checked by Inspect's own rules: each declared task validated with `HFTask`, the model
Inspect's Hub loader (`inspect eval hf/<dataset>`, inspect_ai `_eval/task/hf.py`) reads it with, so that a release
`themisto check` passes is one that loader can build. `themisto check` calls it where inspect_ai is installed; the
Hub's own schema and the release's names are `themisto.release.eval_yaml`'s.
"""

from __future__ import annotations

from pathlib import Path

from themisto.release.eval_yaml import EvalYamlError, read_eval_yaml
from themisto.release.folder import EVAL_FILE


def inspect_version() -> str:
    """The installed inspect_ai's version (the loader whose rules were applied)."""
    from importlib.metadata import version

    return version("inspect_ai")


def hub_schema_problems(folder: str | Path) -> list[str]:
    """One problem per field of a declared task that Inspect's `HFTask` refuses, naming the task (its number and
    id) and the field; [] for a release without eval.yaml, or one whose eval.yaml the release check already refused
    (that check names it)."""
    from inspect_ai._eval.task.hf import HFTask
    from pydantic import ValidationError

    if not (Path(folder) / EVAL_FILE).is_file():
        return []
    try:
        tasks = read_eval_yaml(folder)["tasks"]
    except EvalYamlError:
        return []
    problems = []
    for number, task in enumerate(tasks, start=1):
        try:
            HFTask.model_validate(task)
        except ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(part) for part in error["loc"]) or "(the task)"
                problems.append(f"{EVAL_FILE}: task {number} ({task.get('id')}): {where}: {error['msg']} "
                                f"(Inspect's HFTask, inspect_ai {inspect_version()})")
    return problems
