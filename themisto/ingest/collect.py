"""`themisto collect`: a pointer list (`themisto.ingest.pointers`) or a list of repositories in, the corpus layout
`themisto build` reads out (`themisto.ingest.ipython_corpus`: `repos/<owner>+<name>/` with `repo.json`, `history/`,
`logs/`, `files/`), then checked against the pointers: each pointed session read again under the same trajectory id
with the same inputs hash.

Each repository is fetched at its commit with git (`themisto.ingest.git_fetch`, from the base URL the user gives and
nowhere else). A pointer names its commit; a repository listed without one is read at its newest commit, or, when no
history database or log is there any more, at the commit before the newest one that deleted one. What is taken and
refused there is `themisto.ingest.collect_files`'. A repository on the opt-out list (`themisto.ingest.removals`) is
never fetched, and one collected before is removed. Each repository's folder is written whole, so a stopped
collection resumes with the next repository; one process at a time holds the output folder.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from themisto.errors import InputError
from themisto.ingest.collect_files import FileBounds
from themisto.ingest.removals import Removals

_LISTED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+)(?:@([0-9a-f]{40}))?$")
TREE_RECORDED = 5_000  # tree entries repo.json lists (the reader's `listed`), as the corpus's first collection did


class CollectError(InputError):
    """A repository list or output folder that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class CollectSettings:
    """Where from and within which bounds a collection fetches."""

    base_url: str = "https://github.com"  # repositories are fetched from BASE/owner/name (https:// or file://)
    timeout_s: float = 300.0  # one git command
    fetch_bytes: int = 1 << 30  # what one repository's fetch may bring
    tree_entries: int = 200_000  # tree entries of a commit looked at
    files: FileBounds = FileBounds()
    removals: Removals = Removals()


@dataclass(frozen=True)
class Target:
    """One repository to collect: at a commit (None: its newest) and, from pointers, the session files named."""

    repo: str
    commit: str | None = None
    paths: tuple[str, ...] = ()


@dataclass
class CollectReport:
    """What a collection did, by repository and file; `refusals` one line each."""

    repositories: int = 0
    collected: int = 0
    resumed: int = 0  # already collected by an earlier run
    removed: int = 0  # on the opt-out list (never fetched; a folder collected before, removed)
    failed: int = 0  # could not be fetched or read
    histories: int = 0
    logs: int = 0
    taken_before_deletion: int = 0  # repositories read at the commit before their session files were deleted
    files_kept: int = 0
    files_omitted: int = 0
    redactions: dict[str, int] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    pointers: dict | None = None  # the check against the pointers (`check_rebuilt`)

    def to_dict(self) -> dict:
        return asdict(self)


def targets_from_pointers(pointers: Sequence) -> tuple[list[Target], int]:
    """(targets, pointers that name no repository): one target per repository and commit, with its session files."""
    grouped: dict[tuple[str, str], set[str]] = {}
    for pointer in pointers:
        if pointer.fetchable:
            grouped.setdefault((pointer.repository, pointer.commit), set()).add(pointer.path)
    targets = [Target(repo, commit, tuple(sorted(paths))) for (repo, commit), paths in sorted(grouped.items())]
    return targets, sum(not p.fetchable for p in pointers)


def read_repository_list(path: Path) -> list[Target]:
    """A list of repositories, `owner/name` or `owner/name@COMMIT` a line (`#` comments); CollectError naming the
    line that is neither."""
    from themisto.bounded import Bounds, read_text

    targets = []
    for number, raw in enumerate(read_text(path, Bounds(file_bytes=16 << 20)).splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LISTED.match(line)
        if match is None:
            raise CollectError(f"{path}:{number}: expected `owner/name` or `owner/name@<40-hex commit>`")
        targets.append(Target(match.group(1), match.group(2)))
    return targets


def folder_name(repo: str) -> str:
    return repo.replace("/", "+")


def collect(targets: Sequence[Target], out: Path, settings: CollectSettings = CollectSettings(), *,
            progress: Callable[[str], None] | None = None) -> CollectReport:
    """Collect each target into `out/repos/` (resuming: a repository collected before is kept), within bounds; a
    repository that fails costs only itself, in one line of the report."""
    from themisto.ingest.git_fetch import GitRefused
    from themisto.resume import hold_folder

    say = progress or (lambda line: print(line, file=sys.stderr))
    report = CollectReport(repositories=len(targets))
    seen: Counter = Counter()
    with hold_folder(out, "corpus folder"):
        for number, target in enumerate(targets, 1):
            seen[target.repo.lower()] += 1
            again = seen[target.repo.lower()] > 1  # the same repository at another commit: a folder of its own
            name = folder_name(target.repo) + (f"+{(target.commit or 'head')[:12]}" if again else "")
            dest = out / "repos" / name
            if settings.removals.removes(target.repo):
                report.removed += 1
                shutil.rmtree(dest, ignore_errors=True)
                say(f"[{number}/{len(targets)}] {target.repo}: removed (opt-out list)")
                continue
            if (dest / "repo.json").is_file():
                report.resumed += 1
                continue
            try:
                line = _collect_one(target, dest, settings, report)
            except GitRefused as exc:
                report.failed += 1
                report.refusals.append(f"{target.repo}: {exc}")
                line = f"failed: {exc}"
            say(f"[{number}/{len(targets)}] {target.repo}: {line}")
    return report


def _collect_one(target: Target, dest: Path, settings: CollectSettings, report: CollectReport) -> str:
    """Fetch one repository, take what it gives into `dest` (written whole) and count it; a progress line."""
    from themisto.ingest.collect_files import SESSION_FILES, Taken, take_session_file
    from themisto.ingest.git_fetch import opened
    from themisto.resume import folder_written_whole

    with opened(settings.base_url, target.repo, settings.timeout_s) as git:
        commit = git.fetch(target.commit, max_bytes=settings.fetch_bytes)
        tree = git.tree(commit, settings.tree_entries)
        wanted = set(target.paths)
        sessions = [e for e in tree if SESSION_FILES.search(e.path) and (not wanted or e.path in wanted)]
        before_deletion = False
        if target.commit is None and not sessions:
            deleted = git.deletions(commit, SESSION_FILES)
            parent = git.parent(deleted[0][0]) if deleted else None
            if parent is not None:
                commit, tree, before_deletion = parent, git.tree(parent, settings.tree_entries), True
                sessions = [e for e in tree if SESSION_FILES.search(e.path)]
        taken = Taken()
        taken.refusals += [f"{path}: refused: not in the tree of {commit[:12]}"
                           for path in sorted(wanted - {e.path for e in sessions})]
        with folder_written_whole(dest) as tmp:
            for entry in sessions:
                take_session_file(git, entry, tmp, settings.files, taken)
            licence = _take_files(git, tree, tmp / "files", settings.files, taken)
            _write_record(tmp, target.repo, commit, tree, taken, licence, before_deletion)
    report.collected += 1
    report.histories += len(taken.histories)
    report.logs += len(taken.logs)
    report.taken_before_deletion += before_deletion
    report.files_kept += len(taken.kept)
    report.files_omitted += len(taken.omitted)
    for kind, n in taken.redactions.items():
        report.redactions[kind] = report.redactions.get(kind, 0) + n
    report.refusals += [f"{target.repo}: {line}" for line in taken.refusals]
    return (f"{len(taken.histories)} history database(s), {len(taken.logs)} log(s), {len(taken.kept)} file(s) kept, "
            f"{len(taken.refusals)} refused" + (" (read at the commit before their deletion)" if before_deletion
                                                 else ""))


def _take_files(git, tree: list, files: Path, bounds: FileBounds, taken) -> object:
    """Keep the files the sessions read, the licence file and the notebooks (in that order, within the budget); the
    repository's licence (`themisto.ingest.licences.Licence`) read from its kept licence file, or None."""
    from themisto.ingest.collect_files import matching_entries, read_paths, take_file
    from themisto.ingest.licences import identify_licence, is_licence_file

    chosen: dict[str, tuple[object, str]] = {}
    for literal in read_paths(taken.codes):
        for entry in matching_entries(literal, tree):
            chosen.setdefault(entry.path, (entry, "read"))
    licence_entries = sorted((e for e in tree if is_licence_file(e.path)), key=lambda e: (len(e.path), e.path))
    for entry in licence_entries[:1]:
        chosen.setdefault(entry.path, (entry, "licence"))
    for entry in sorted((e for e in tree if e.path.lower().endswith(".ipynb")), key=lambda e: e.path):
        chosen.setdefault(entry.path, (entry, "notebook"))
    for entry, why in chosen.values():
        take_file(git, entry, why, files, bounds, taken)
    for entry in licence_entries[:1]:
        path = files / entry.path
        if path.is_file():
            return identify_licence(path.read_text(encoding="utf-8", errors="replace"), entry.path)
    return None


def _write_record(folder: Path, repo: str, commit: str, tree: list, taken, licence, before_deletion: bool) -> None:
    """repo.json, as `themisto.ingest.ipython_corpus.read_repository` reads it."""
    from themisto.resume import write_json_atomic

    write_json_atomic(folder / "repo.json", {
        "repo": repo, "commit": commit, "collected_by": "themisto collect",
        "licence": f"{licence.file}:{licence.spdx}" if licence is not None else None,
        "licence_score": licence.score if licence is not None else None,
        "histories": taken.histories, "logs": taken.logs, "kept": taken.kept, "omitted": taken.omitted,
        "refused": taken.refusals, "read_before_deletion": before_deletion,
        "bytes": taken.kept_bytes, "tree": [[e.path, e.size] for e in tree[:TREE_RECORDED]],
        "tree_entries": len(tree), "scrubbed": dict(taken.redactions)})


def check_rebuilt(corpus: Path, pointers: Sequence) -> dict:
    """How many of the pointed sessions a collected corpus gives again: `rebuilt` (the same trajectory id and inputs
    hash), `changed` (the id, other inputs), `missing`, and `not_fetchable` (pointers that name no repository: JuNE
    logs); the ids of the changed and missing (hashes: no names)."""
    from themisto.ingest.ipython_corpus import (read_repository, repository_folders, session_files,
                                                trajectory_id)
    from themisto.ingest.ipython_history import HistoryRefused, read_history
    from themisto.ingest.ipython_log import read_logstart
    from themisto.ingest.trajectory import inputs_sha256

    index: dict[str, str] = {}
    for folder in repository_folders(corpus) if (corpus / "repos").is_dir() else []:
        repo = read_repository(folder)
        for kind, file in session_files(repo):
            try:
                read = read_history(file) if kind == "history" else read_logstart(file)
            except HistoryRefused:
                continue
            for session in read.sessions:
                index[trajectory_id(repo, file, session.session)] = inputs_sha256([i.code for i in session.inputs])
    fetchable = [p for p in pointers if p.fetchable]
    changed = sorted(p.id for p in fetchable if p.id in index and index[p.id] != p.inputs_sha256)
    missing = sorted(p.id for p in fetchable if p.id not in index)
    return {"pointed": len(pointers), "rebuilt": len(fetchable) - len(changed) - len(missing), "changed": changed,
            "missing": missing, "not_fetchable": len(pointers) - len(fetchable)}
