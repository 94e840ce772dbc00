"""What execution needs from a release: its rows by trajectory, the check of examples against it, and the workspace
(the trajectory rebuilt from its rows and replayed lies in `themisto.replay.states`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from themisto.release.folder import ReleaseInfo, open_release
from themisto.scoring.records import Example, ScoreError
from themisto.vocabulary import TASKS


@dataclass
class Release:
    """What execution needs from a release: task rows by id, trajectory rows by kernel, workspace, replay settings."""

    name: str  # the folder, for messages
    task_rows: dict[str, dict]
    trajectories: dict[str, list[dict]]
    workspace: dict  # the build's record: {"look_alike_seed", "size", "tasks"} or {"given": name}; {} if unknown
    replay: dict  # the build's ReplaySettings as a dict; {} if unknown


def load_release(folder: str | Path | ReleaseInfo, task: str = TASKS[0]) -> Release:
    """Read a release (`themisto.release.folder`): the task's rows (all splits) and its trajectories."""
    info = folder if isinstance(folder, ReleaseInfo) else open_release(folder)
    if not info.splits(task):
        raise ScoreError(f"{info.path}: the release has no {task!r} config")
    task_rows = {row["id"]: row for split in info.splits(task) for row in info.rows(task, split)}
    trajectories = info.trajectories_by_kernel()
    return Release(name=str(info.path), task_rows=task_rows, trajectories=trajectories, workspace=info.workspace,
                   replay=info.replay)


def check_against_release(examples: Sequence[Example], release: Release) -> None:
    """Every id is in the release, its reference is the release's target, and its state can be rebuilt."""
    unknown = [e.id for e in examples if e.id not in release.task_rows]
    if unknown:
        raise ScoreError(f"example {unknown[0]}: no such id in {release.name}"
                         + (f" (and {len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else ""))
    for example in examples:
        row = release.task_rows[example.id]
        if example.reference != row["target"]:
            raise ScoreError(f"example {example.id}: the reference is not the release's target for this id")
        steps = release.trajectories.get(row["kernel_id"], [])
        if [r["step"] for r in steps[: row["step"] + 1]] != list(range(row["step"] + 1)):
            raise ScoreError(f"example {example.id}: the release's `trajectories` rows of {row['kernel_id']} do not "
                             f"hold steps 0..{row['step']}, so the state before step {row['step']} cannot be rebuilt")


def prepare_workspace(release: Release, workspace: str | Path | None, tmp: Path) -> Path:
    """The input files the release was replayed over: `workspace` if given (checked against the hash of a given
    folder the build recorded), else made again from the build's recipe (`source.workspace`) under `tmp`."""
    from themisto.replay.workspace_recipe import RecipeError, workspace_from_recipe

    try:
        return workspace_from_recipe(release.workspace, workspace, tmp / "ws", what=f"the release {release.name}")
    except RecipeError as error:
        raise ScoreError(str(error)) from None


# ---------------------------------------------------------------------------------------------------------------
# Execution
