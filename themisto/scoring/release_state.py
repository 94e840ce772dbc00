"""What execution needs of a release beyond its handle (`themisto.release.folder.ReleaseInfo`): the check of examples
against it, and the workspace its states are rebuilt over (the states themselves: `themisto.release.states`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from themisto.release.folder import ReleaseError, ReleaseInfo
from themisto.release.workspaces import ReleaseInputs, SourceFolders, open_inputs
from themisto.scoring.records import Example, ScoreError


def task_rows(release: ReleaseInfo, task: str) -> dict[str, dict]:
    """The task's rows of every split by id; a ScoreError when the release has no such config."""
    if not release.splits(task):
        raise ScoreError(f"{release.path}: the release has no {task!r} config")
    return release.task_rows(task)


def check_against_release(examples: Sequence[Example], release: ReleaseInfo, task: str) -> None:
    """Every id is in the release, its reference is the release's target, and its state can be rebuilt."""
    rows = task_rows(release, task)
    unknown = [e.id for e in examples if e.id not in rows]
    if unknown:
        raise ScoreError(f"example {unknown[0]}: no such id in {release.path}"
                         + (f" (and {len(unknown) - 1} more unknown ids)" if len(unknown) > 1 else ""))
    trajectories = release.trajectories_by_kernel()
    for example in examples:
        row = rows[example.id]
        if example.reference != row["target"]:
            raise ScoreError(f"example {example.id}: the reference is not the release's target for this id")
        steps = trajectories.get(row["kernel_id"], [])
        if [r["step"] for r in steps[: row["step"] + 1]] != list(range(row["step"] + 1)):
            raise ScoreError(f"example {example.id}: the release's `trajectories` rows of {row['kernel_id']} do not "
                             f"hold steps 0..{row['step']}, so the state before step {row['step']} cannot be rebuilt")


def release_inputs(release: ReleaseInfo, workspace: ReleaseInputs | SourceFolders | str | Path | None,
                   tmp: Path) -> ReleaseInputs:
    """The release's input files found for rebuilding its states (`themisto.release.workspaces`): look-alike inputs
    made again under `tmp`, a given workspace (`workspace`, checked against the hash the build recorded), the
    repositories' files in the folders the build noted or `workspace.sources` names; a ScoreError when the release
    cannot say how (built before its trajectories recorded it) or a given workspace is needed and missing."""
    from themisto.replay.workspace_recipe import RecipeError

    if isinstance(workspace, ReleaseInputs):  # found already, by the caller, for this release
        return workspace
    try:
        return open_inputs(release, workspace, tmp)
    except (RecipeError, ReleaseError) as error:
        raise ScoreError(str(error)) from None
