"""The recipe of the input files a replay ran over, so that a later stage can make them again without being told.

Three kinds: the look-alike inputs (`look_alike_seed`, `size`, `tasks`: any stage regenerates the same bytes), a
folder someone gave (`given`: its name, and `files_sha256`, the content hash `themisto.resume.folder_fingerprint`
takes, so a folder handed in later can be checked), and no folder at all (`empty`). Replay writes the recipe in the
steps file's header (`themisto.replay.steps_file.replay_to_file`), the build copies it into themisto_build.json
(`source.workspace`), and scoring turns it back into a folder (`workspace_from_recipe`; a composed workspace's
trajectories each find their own: `themisto.release.workspaces`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from themisto.errors import InputError


class RecipeError(InputError):
    """The recipe cannot give the folder: it names a given folder (which must be passed again) or none is recorded,
    or the folder passed is not the one the recipe names."""


def look_alike(tasks: Sequence[str], seed: int, size: str) -> dict:
    """The recipe of the look-alike inputs of `tasks`, generated from `seed` at `size`."""
    return {"look_alike_seed": int(seed), "size": str(size), "tasks": sorted(tasks)}


def given(folder: str | Path | None, *, output: Path | None = None) -> dict:
    """The recipe of a folder someone gave (None: no folder): its name and content hash (`output`: the run's own
    files inside it, left out of the hash)."""
    from themisto.resume import folder_fingerprint

    if folder is None:
        return {"empty": True}
    return {"given": Path(folder).name, **(folder_fingerprint(folder, output=output) or {})}


def workspace_from_recipe(recipe: dict, workspace: str | Path | None, dest: Path, *, what: str) -> Path:
    """The input folder `recipe` names: `workspace` when one is passed (checked against a given folder's hash), else
    the look-alike inputs regenerated into `dest` (a folder that does not exist yet), or `dest` made empty for
    `empty`; RecipeError, naming `what` (the release or steps file the recipe comes from), when it cannot."""
    from themisto.resume import folder_fingerprint

    if workspace is not None:
        if not Path(workspace).is_dir():
            raise RecipeError(f"{workspace}: no such workspace directory")
        expected = recipe.get("files_sha256")
        if expected is not None and (folder_fingerprint(workspace) or {}).get("files_sha256") != expected:
            raise RecipeError(f"{workspace}: its files differ from those {what} was replayed over "
                              f"({recipe.get('given')!r}, files_sha256 {expected[:12]}…)")
        return Path(workspace)
    if "look_alike_seed" in recipe:
        from themisto.ingest.workspace import TASKS, write_workspace

        return write_workspace(dest, recipe.get("tasks") or TASKS, seed=int(recipe["look_alike_seed"]),
                               size=recipe.get("size", "small")).root
    if recipe.get("empty"):
        dest.mkdir(parents=True, exist_ok=True)
        return dest
    if "composed" in recipe:  # each trajectory's own files: `themisto.release.workspaces` finds them one by one
        raise RecipeError(f"{what}: its trajectories replayed each in its own source's files (a composed workspace): "
                          "there is no one folder to make; each trajectory's is found by its release's records")
    if "given" in recipe:
        raise RecipeError(f"{what}: it was replayed over a given workspace ({recipe['given']!r}); pass that folder "
                          "as the workspace to rebuild the states")
    raise RecipeError(f"{what}: it does not record the workspace it was replayed over (a steps file made before "
                      "steps files recorded it, or a build without source.workspace); pass the workspace folder")


def compose(dest: Path, folders: dict[str, Path | None], look_alike_recipe: dict | None) -> dict:
    """Lay out at `dest` (a folder that does not exist yet) a workspace for trajectories of several sources: each
    `folders` entry (a trajectory's `workspace` subfolder -> the source folder of its files, None: none kept) as a
    link to that folder, which a kernel session copies; and the look-alike inputs under `june/` when
    `look_alike_recipe` names them. Returns the recipe: {"composed": {"june": recipe or None, "folders": {subfolder:
    files_sha256}}} (the hashes let a later stage check the folders it is handed again)."""
    from themisto.resume import folder_fingerprint

    dest.mkdir(parents=True)
    hashes: dict[str, str | None] = {}
    for sub, source in sorted(folders.items()):
        target = dest / sub
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is None or not Path(source).is_dir():
            target.mkdir()
            hashes[sub] = None
        else:
            target.symlink_to(Path(source).resolve(), target_is_directory=True)
            hashes[sub] = (folder_fingerprint(source, whole=True) or {}).get("files_sha256")
    if look_alike_recipe is not None:
        from themisto.ingest.workspace import TASKS, write_workspace

        write_workspace(dest / JUNE_FOLDER, look_alike_recipe.get("tasks") or TASKS,
                        seed=int(look_alike_recipe["look_alike_seed"]), size=look_alike_recipe.get("size", "small"))
    return {"composed": {"june": look_alike_recipe, "folders": hashes}}


JUNE_FOLDER = "june"  # the look-alike inputs' folder in a composed workspace
