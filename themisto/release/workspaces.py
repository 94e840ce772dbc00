"""The input files each trajectory of a release replays over, recorded by the build and found again by whoever
rebuilds its states (scoring's execution, the probe mode, the Inspect probe tool).

A build records, on every `trajectories` row, what rebuilding its trajectory's states needs (`rebuild_record`:
themisto_dataset.REBUILD): the kind of its input files and their content hash, the folder its kernel started in, its
kernel environment, its untimed-cell limit and the modules its log shows missing. Look-alike inputs are made again
from the build's recipe; a repository's files (a session from a public repository) are found in the folders the
build read, which it notes beside the release (`<release>.sources.json`: host paths, never inside the release,
which is published), or in folders the user names where they moved (`SourceFolders.sources`, `--sources`): each
corpus folder's repositories are known by their hashed ids, and their files are used only when they hash as they did.

    inputs = ReleaseInputs(release, SourceFolders(sources=(Path("corpus"),)), tmp)
    placement = inputs.place(kernel_id)     # or SourcesUnavailable: that trajectory is scored by text only
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from themisto.release.folder import ReleaseError, ReleaseInfo
from themisto.runtime.agent.hashing import HASH_SCHEME

# How a trajectory's input files are made again (REBUILD's `workspace_kind`).
WORKSPACE_KINDS = ("look_alike", "repository", "given", "empty")
SOURCES_SUFFIX = ".sources.json"  # `<release folder>.sources.json`: where this host's build read its sources


class SourcesUnavailable(Exception):
    """One trajectory's input files or kernel environment are not here, so its examples are scored by text only;
    `reason` is one of `themisto.vocabulary.TEXT_ONLY_REASONS`."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def rebuild_record(trajectory: Any, recipe: Mapping | None) -> dict | None:
    """A trajectory's REBUILD record from the build's workspace recipe (`themisto.replay.workspace_recipe`); where
    none was recorded (a steps file made before they recorded it, rows replayed by the caller) the folder is one to
    be given, its hash unknown."""
    from themisto.replay.missing_packages import hidden_modules
    from themisto.replay.workspace_recipe import JUNE_FOLDER

    recipe = recipe or {}
    restarts = {event.before for event in trajectory.events if event.kind == "restart"}
    hidden = sorted(set().union(*hidden_modules(trajectory.executions, restarts)))
    composed = recipe.get("composed")
    sub = (trajectory.workspace or JUNE_FOLDER) if composed is not None else ""
    if composed is not None and sub == JUNE_FOLDER:
        kind, files = "look_alike", None
    elif composed is not None:
        files = (composed.get("folders") or {}).get(sub)
        kind = "repository" if files else "empty"
    elif "look_alike_seed" in recipe:
        kind, files = "look_alike", None
    elif recipe.get("empty"):
        kind, files = "empty", None
    else:
        kind, files = "given", recipe.get("files_sha256")
    return {"workspace_kind": kind, "workspace": sub, "files_sha256": files, "start_dir": trajectory.start_dir,
            "environment": (trajectory.provenance or {}).get("environment"),
            "cell_timeout_s": trajectory.cell_timeout_s, "hidden_modules": hidden, "state_hashes": HASH_SCHEME}


def trajectory_from_rows(rows: Sequence[dict]):
    """A Trajectory that replays a release's `trajectories` rows: the developer's code, logged outcomes, restarts."""
    from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory

    executions = [Execution(cell_id=r["cell_id"], code=r["code"], status=r.get("logged_status") or "unknown",
                            ename=r.get("logged_ename"), evalue=r.get("logged_evalue")) for r in rows]
    events = [KernelEvent("restart", before=r["step"]) for r in rows if r["restarted_before"] and r["step"] > 0]
    first = rows[0]
    rebuild = first.get("rebuild") or {}
    return Trajectory(id=first["kernel_id"], notebook=first.get("notebook") or "", source="release",
                      executions=executions, events=events, task=first.get("task"),
                      start_dir=rebuild.get("start_dir"), cell_timeout_s=rebuild.get("cell_timeout_s"))


def with_rebuild_records(rows: list[dict], recipe: Mapping | None) -> list[dict]:
    """The rows, each trajectory's without a REBUILD record given the one its rows and the build's workspace `recipe`
    say (rows replayed by the caller with the defaults: its top folder, the default environment)."""
    by_kernel: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("rebuild") is None:
            by_kernel.setdefault(row["kernel_id"], []).append(row)
    records = {kernel_id: rebuild_record(trajectory_from_rows(sorted(own, key=lambda r: r["step"])), recipe)
               for kernel_id, own in by_kernel.items()}
    return [dict(row, rebuild=records[row["kernel_id"]]) if row.get("rebuild") is None else row for row in rows]


# ---------------------------------------------------------------------------------------------------------------
# Where the build read its sources (beside the release, never in it)


def sources_note(release_folder: Path) -> Path:
    return release_folder.parent / f"{release_folder.name}{SOURCES_SUFFIX}"


def write_sources_note(release_folder: Path, corpora: Iterable[Path], workspace: Path | None) -> Path:
    """Note beside the release the folders this host's build read: the corpus folders and a given workspace."""
    from themisto.resume import write_text_atomic

    note = {"corpora": sorted(str(Path(c).resolve()) for c in corpora),
            "workspace": None if workspace is None else str(Path(workspace).resolve())}
    path = sources_note(release_folder)
    write_text_atomic(path, json.dumps(note, indent=1) + "\n")
    return path


def read_sources_note(release_folder: Path) -> dict:
    """The note `write_sources_note` left: {"corpora": [folder, ...], "workspace": folder or None}; what is not
    there or does not read as one is no folder."""
    from themisto.bounded import BoundError, Bounds, loads_json

    path = sources_note(release_folder)
    try:
        note = loads_json(path.read_text(encoding="utf-8"), Bounds(file_bytes=1 << 20, depth=4, items=10_000),
                          path=str(path))
    except (OSError, UnicodeDecodeError, ValueError, BoundError):
        note = {}
    note = note if isinstance(note, dict) else {}
    corpora, workspace = note.get("corpora"), note.get("workspace")
    return {"corpora": [c for c in corpora if isinstance(c, str)] if isinstance(corpora, list) else [],
            "workspace": workspace if isinstance(workspace, str) else None}


# ---------------------------------------------------------------------------------------------------------------
# Finding them again


@dataclass(frozen=True)
class SourceFolders:
    """Where to look for a release's input files besides what its build noted: the folder the whole release was
    replayed over (`--workspace`, for a build given one) and folders that hold its sources (`--sources`: corpus
    folders or repository folders, where they moved)."""

    workspace: Path | None = None
    sources: tuple[Path, ...] = ()

    @classmethod
    def of(cls, value: "SourceFolders | str | Path | None") -> "SourceFolders":
        """`value` as SourceFolders: a path is the workspace folder."""
        if isinstance(value, SourceFolders):
            return value
        return cls(workspace=None if value is None else Path(value))


@dataclass(frozen=True)
class Placement:
    """Where one trajectory's kernel runs: over a copy of `folder`, started in `start_dir`, in `environment`, its
    untimed cells limited to `cell_timeout_s` (None: the replay's default)."""

    folder: Path
    start_dir: str | None
    environment: str | None
    cell_timeout_s: float | None


class ReleaseInputs:
    """A release's input files found for one command (look-alike inputs made once under `tmp`); `place(kernel_id)`
    gives a trajectory's Placement. A ReleaseError when the release cannot say how to rebuild its states at all."""

    def __init__(self, release: ReleaseInfo, folders: "SourceFolders | str | Path | None", tmp: Path):
        folders = SourceFolders.of(folders)
        self.release, self.tmp = release, tmp
        note = read_sources_note(release.path)
        self.workspace = folders.workspace or (Path(note["workspace"]) if note["workspace"] else None)
        self.roots = [*folders.sources, *(Path(p) for p in note["corpora"])]
        self._look_alike: Path | None = None
        self._given: Path | None = None
        self._repositories: dict[str, Path] | None = None
        self._lock = threading.Lock()  # trajectories are placed from several threads; each folder is made once
        records = {kernel_id: rows[0].get("rebuild") for kernel_id, rows in release.trajectories_by_kernel().items()}
        missing = sorted(k for k, record in records.items() if not record)
        if missing:
            raise ReleaseError(
                f"{release.path}: its trajectories do not record how to rebuild their states ({missing[0]} and "
                f"{len(missing) - 1} more: a release built before Themisto recorded them, whose stored state hashes "
                "also predate the hashes that do not change between runs); rebuild it with `themisto build` from "
                "the same inputs to score it with execution")
        schemes = sorted({record.get("state_hashes") or "none recorded" for record in records.values()} - {HASH_SCHEME})
        if schemes:
            raise ReleaseError(
                f"{release.path}: its state hashes were made by an earlier way of hashing ({schemes[0]}; this "
                f"Themisto's is {HASH_SCHEME}), so no rebuilt state would match them; rebuild it with `themisto "
                "build` from the same inputs to score it with execution")
        self.records = records

    def place(self, kernel_id: str) -> Placement:
        """Where `kernel_id`'s kernel runs; SourcesUnavailable when its files or its environment are not here."""
        record = self.records.get(kernel_id)
        if record is None:
            raise ReleaseError(f"{self.release.path}: the release has no trajectories rows for {kernel_id}")
        kind = record["workspace_kind"]
        if kind == "look_alike":
            folder = self._made_look_alike()
        elif kind == "given":
            folder = self.given_folder()
        elif kind == "repository":
            folder = self._repository(kernel_id, record)
        else:
            folder = self.tmp / "empty"
            folder.mkdir(parents=True, exist_ok=True)
        environment = record.get("environment")
        _check_environment(kernel_id, environment)
        return Placement(folder, record.get("start_dir"), environment, record.get("cell_timeout_s"))

    def _made_look_alike(self) -> Path:
        from themisto.replay.workspace_recipe import JUNE_FOLDER, RecipeError, workspace_from_recipe

        with self._lock:
            if self._look_alike is None:
                recipe = self.release.workspace or {}
                recipe = (recipe.get("composed") or {}).get("june") or recipe
                if "look_alike_seed" not in recipe:
                    raise RecipeError(f"the release {self.release.path}: its build recorded no look-alike recipe")
                made = self.tmp / JUNE_FOLDER
                # made already in a folder this node keeps for the release (themisto.distributed.ray_scoring)
                self._look_alike = made if made.is_dir() else workspace_from_recipe(
                    recipe, None, made, what=f"the release {self.release.path}")
            return self._look_alike

    def prepare(self) -> "ReleaseInputs":
        """Make now what placing its trajectories would make (the look-alike inputs), so that the folder can be
        shared (on Ray, once per node)."""
        if any(record["workspace_kind"] == "look_alike" for record in self.records.values()):
            self._made_look_alike()
        return self

    def given_folder(self) -> Path:
        """The folder a build given one replayed every trajectory over (checked against its recorded hash); a
        RecipeError, saying to pass it, when it is neither given nor noted."""
        from themisto.replay.workspace_recipe import workspace_from_recipe

        with self._lock:
            if self._given is None:
                self._given = workspace_from_recipe(self.release.workspace or {}, self.workspace,
                                                    self.tmp / "given", what=f"the release {self.release.path}")
            return self._given

    def _repository(self, kernel_id: str, record: Mapping) -> Path:
        from themisto.resume import folder_fingerprint

        repository = str(record["workspace"]).rsplit("/", 1)[-1]
        found = self.repositories().get(repository)
        if found is None:
            where = ", ".join(str(p) for p in self.roots) or "none noted beside the release, none given"
            raise SourcesUnavailable("sources_missing", f"{kernel_id}: the files of its repository {repository} are "
                                     f"in no source folder ({where}); name the corpus folder with --sources")
        if (folder_fingerprint(found, whole=True) or {}).get("files_sha256") != record["files_sha256"]:
            raise SourcesUnavailable("sources_changed", f"{kernel_id}: the files of its repository {repository} "
                                     "differ from those the build replayed it over")
        return found

    def repositories(self) -> dict[str, Path]:
        """{repository id: its files folder} over the source folders (read once)."""
        with self._lock:
            if self._repositories is None:
                self._repositories = _index_repositories(self.roots)
            return self._repositories


def open_inputs(release: ReleaseInfo, folders: "SourceFolders | str | Path | None", tmp: Path) -> ReleaseInputs:
    """The release's ReleaseInputs, with what concerns the whole release checked at once: a ReleaseError when its
    trajectories do not say how to rebuild their states, a RecipeError when it was replayed over a given folder that
    is neither given nor noted (or is not the one it was replayed over)."""
    inputs = ReleaseInputs(release, folders, tmp)
    if "given" in (release.workspace or {}):
        inputs.given_folder()
    return inputs


def _index_repositories(roots: Iterable[Path]) -> dict[str, Path]:
    from themisto.ingest.ipython_corpus import CorpusError, is_corpus, read_repository, repository_folders

    found: dict[str, Path] = {}
    for root in roots:
        if not is_corpus(Path(root)):
            continue
        for folder in repository_folders(Path(root)):
            try:
                repository = read_repository(folder)
            except CorpusError:
                continue  # a record that does not read finds no trajectory; the build said so when it read it
            if repository.files.is_dir():
                found.setdefault(repository.id, repository.files)
    return found


def _check_environment(kernel_id: str, environment: str | None) -> None:
    from themisto.runtime.sandbox import KernelStartError, environment_python

    try:
        environment_python(environment)
    except KernelStartError as error:
        raise SourcesUnavailable("environment_missing", f"{kernel_id}: {error}") from None
