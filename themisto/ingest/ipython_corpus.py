"""IPython kernel histories from public repositories, read as trajectories that replay in their own repository's files.

A corpus is a folder with `repos/<folder>/` per repository (or one such repository folder): `repo.json` (`repo`:
owner/name, `commit`, `licence`, `tree`: [[path, bytes], …] of the repository, `omitted`: [{path, why}]), the
history databases under `history/`, IPython `%logstart` logs under `logs/`, and under `files/` the repository's files
that were kept (at their repository paths). Each session of a database or log is one trajectory (its inputs as
typed, in order; a kernel start is a session). Its kernel replays over a copy of the repository's kept files, started
in the folder from which its literal reads find kept files (`themisto.ingest.start_folder`); where no read tells
folders apart, in the folder of the repository notebook whose code cells its inputs match (at least `match_inputs`
inputs and `match_share` of them; the notebook is then the trajectory's notebook), else at the repository's top (a
terminal IPython session, or a notebook that was not committed: kept, and counted apart in the report).

Choosing before replaying: sessions under `min_inputs` inputs are left out; every session is cut at its first input
a replay here cannot run as its developer did (`themisto.ingest.session_checks`) and at `max_steps`; a session copied
into several repositories (course material, forks) is kept once; each developer (a repository's owner) keeps at most
`sessions_per_developer` sessions, chosen by a seeded hash. Nothing of a person leaves this module: the developer
is a pseudonym, the repository a hashed id, paths and code pass `mask_personal` and the secret scanner.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from themisto.bounded import Bounds
from themisto.errors import InputError
from themisto.ingest.trajectory import Execution, SourceFile, Trajectory, anonymize, inputs_sha256

REPOS_FOLDER = "repos"
REPO_FILE = "repo.json"
SOURCE_KINDS = {"history": "ipython-history", "logs": "ipython-log"}
WORKSPACE_FOLDER = "ipython"  # where a composed workspace holds each repository's files (`workspace_recipe.compose`)
# repo.json's bounds (a tree of 5,000 entries is about 300 KB)
_REPO_BOUNDS = Bounds(file_bytes=64 << 20, line_bytes=64 << 20, lines=1_000_000, depth=8, items=1_000_000)
_FILES_WALKED = 20_000  # files under one repository's files/ looked at, at most
_NOTEBOOK_BYTES = 2 << 20  # notebooks read for matching, at most this size each
_TREE_LISTED = 5000  # repo.json's `tree` lists a repository's first 5,000 files; `tree_entries` counts them all


class CorpusError(InputError):
    """A corpus folder or repository that cannot be read; the message names the file."""


@dataclass(frozen=True)
class CorpusSettings:
    """Which sessions of a corpus become trajectories, and how they replay."""

    min_inputs: int = 20
    max_steps: int = 120  # a longer session is cut here (replay time: a few seconds a step)
    min_steps: int = 10  # a session cut shorter than this by a blocker is left out
    sessions_per_developer: int = 5
    seed: int = 0
    environment: str = "wild"  # the kernel environment it replays in (`themisto.runtime.sandbox.KERNEL_ENVIRONMENTS`)
    licences: tuple[str, ...] | None = None  # licences kept ("none": no licence file); None: every one
    limit: int | None = None  # sessions kept in all, spread over developers (one each first, then a second, ...)
    match_inputs: int = 3
    match_share: float = 0.2
    # A history times no cell: each may run this many CPU seconds (and four times as many of the clock while it waits
    # on nothing: `themisto.runtime.kernel_requests`), not the 120 s a JuNE cell gets where its log did not time it.
    cell_timeout_s: float = 30.0
    removals: object = None  # an opt-out list (`themisto.ingest.removals.Removals`): its repositories are left out


@dataclass(frozen=True)
class Repository:
    """One repository of a corpus; `folder` is never written anywhere (its name holds the owner's)."""

    folder: Path
    id: str  # "r-" + hash of owner/name
    developer: str  # the owner's pseudonym (`anonymize`)
    commit: str | None
    licence: str | None  # the licence file's family as the corpus detected it ("MIT", "GPL-3.0", ...); None: none
    listed: frozenset[str]  # every path the repository holds (its tree, what was kept and omitted)
    kept: frozenset[str]  # paths under files/
    tree_complete: bool = True  # `listed` is the whole tree (the collector lists its first _TREE_LISTED files)

    @property
    def files(self) -> Path:
        return self.folder / "files"


@dataclass
class CorpusReport:
    """What a corpus gave: counts by stage and cause (never a name)."""

    repositories: int = 0
    removed: int = 0  # repositories left out by the opt-out list
    files_read: int = 0
    files_refused: dict[str, int] = field(default_factory=dict)  # reason -> files
    sessions_read: int = 0
    inputs_read: int = 0
    sessions_long_enough: int = 0
    left_out: dict[str, int] = field(default_factory=dict)  # cause -> sessions
    cut: dict[str, int] = field(default_factory=dict)  # cause -> kept sessions cut short by it
    matched_notebook: int = 0
    trajectories: int = 0
    steps: int = 0
    developers: int = 0
    redactions: dict[str, int] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)  # one line per refused file, names masked

    def to_dict(self) -> dict:
        return asdict(self)


def is_corpus(path: Path) -> bool:
    """Whether `path` is a corpus folder (it holds `repos/*/repo.json`) or one repository folder of one."""
    return path.is_dir() and ((path / REPO_FILE).is_file() or any((path / REPOS_FOLDER).glob(f"*/{REPO_FILE}")))


def repository_folders(path: Path) -> list[Path]:
    if (path / REPO_FILE).is_file():
        return [path]
    return sorted(p.parent for p in (path / REPOS_FOLDER).glob(f"*/{REPO_FILE}"))


def repository_record(folder: Path) -> dict:
    """A repository folder's `repo.json`, read within bounds; it names the repository, so only what collects or
    points at repositories reads it whole (`themisto.ingest.pointers`)."""
    from themisto.ingest.limits import parse_json

    path = folder / REPO_FILE
    try:
        if path.stat().st_size > _REPO_BOUNDS.file_bytes:
            raise CorpusError(f"{_masked(path)}: over {_REPO_BOUNDS.file_bytes:,} bytes")
        meta = parse_json(path.read_text(encoding="utf-8"), _REPO_BOUNDS, path=_masked(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise CorpusError(f"{_masked(path)}: not a repository record ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("repo"), str) or "/" not in meta["repo"]:
        raise CorpusError(f"{_masked(path)}: expected an object with repo: \"owner/name\"")
    return meta


def read_repository(folder: Path) -> Repository:
    """A repository's record from its `repo.json` (read within bounds) and its `files/` folder."""
    meta = repository_record(folder)
    listed = {str(entry[0]) for entry in meta.get("tree") or [] if isinstance(entry, list) and entry}
    entries = meta.get("tree_entries")
    complete = entries <= len(listed) if isinstance(entries, int) else len(listed) < _TREE_LISTED
    listed |= {str(e.get("path")) for key in ("kept", "omitted") for e in meta.get(key) or [] if isinstance(e, dict)}
    kept = set()
    files = folder / "files"
    if files.is_dir():
        for index, item in enumerate(files.rglob("*")):
            if index >= _FILES_WALKED:
                break
            if item.is_file() and not item.is_symlink():
                kept.add(item.relative_to(files).as_posix())
    owner = meta["repo"].split("/", 1)[0]
    licence = meta.get("licence")
    return Repository(folder=folder, id="r-" + hashlib.sha256(meta["repo"].encode()).hexdigest()[:12],
                      developer=anonymize("repository-owner:" + owner.lower()),
                      commit=str(meta["commit"]) if meta.get("commit") else None,
                      licence=str(licence).split(":")[-1] if licence else None,
                      listed=frozenset(listed | kept), kept=frozenset(kept), tree_complete=complete)


def _masked(path: Path) -> str:
    """A corpus path as a message may show it: the repository folder (owner+name) replaced by a hash."""
    parts = list(path.parts)
    if REPOS_FOLDER in parts:
        i = len(parts) - 1 - parts[::-1].index(REPOS_FOLDER)
        if i + 1 < len(parts):
            parts[i + 1] = "r-" + hashlib.sha256(parts[i + 1].encode()).hexdigest()[:12]
        parts = parts[i:]
    from themisto.ingest.personal import mask_personal

    return mask_personal("/".join(parts))


def session_files(repo: Repository) -> Iterator[tuple[str, Path]]:
    """(kind, file) of each history database and log of `repo`, sorted."""
    for folder in SOURCE_KINDS:
        base = repo.folder / folder
        if base.is_dir():
            for item in sorted(base.iterdir()):
                if item.is_file() and not item.is_symlink():
                    yield folder, item


def _normal(code: str) -> str:
    return re.sub(r"\s+", " ", code).strip()


def notebook_cells(repo: Repository) -> dict[str, set[str]]:
    """Per kept notebook (repository path), the normalised text of its code cells; unreadable ones left out."""
    from themisto.ingest.notebook import code_cells, load_notebook

    cells = {}
    for path in sorted(p for p in repo.kept if p.lower().endswith(".ipynb")):
        file = repo.files / path
        try:
            if file.stat().st_size > _NOTEBOOK_BYTES:
                continue
            cells[path] = {_normal(text) for _, text in code_cells(load_notebook(file)) if text.strip()}
        except Exception:  # noqa: BLE001 - a stranger's notebook that does not read is simply not matched
            continue
    return cells


def match_notebook(codes: list[str], cells: dict[str, set[str]], settings: CorpusSettings) -> tuple[str, int] | None:
    """The notebook whose code cells most of the session's inputs equal, and how many do; None under the bar."""
    normal = [_normal(c) for c in codes]
    best = max(((sum(n in texts for n in normal), path) for path, texts in cells.items()), default=(0, ""))
    if best[0] >= max(settings.match_inputs, settings.match_share * len(codes)):
        return best[1], best[0]
    return None


def session_key(codes: list[str]) -> str:
    """The key of a session's inputs: equal keys, one session copied into several repositories."""
    return hashlib.sha256("\x00".join(_normal(c) for c in codes).encode("utf-8")).hexdigest()


def stored_path(file: Path) -> str:
    """The repository path of a stored database or log (`history/a__b.sqlite` is `a/b.sqlite`), masked."""
    from themisto.ingest.personal import mask_personal

    return mask_personal(file.name.replace("__", "/"))


def trajectory_id(repo: Repository, file: Path, session: int) -> str:
    """The id of a session's trajectory: the same wherever the corpus was collected (`themisto collect`)."""
    return "ih-" + hashlib.sha256(f"{repo.id}/{stored_path(file)}/{session}".encode()).hexdigest()[:16]


def trajectory_of(repo: Repository, kind: str, file: Path, session, codes: list[str], settings: CorpusSettings,
                  match: tuple[str, int] | None, cut: dict | None, start: str = "") -> Trajectory:
    """One session as a trajectory (`codes` already masked and cut) that starts in the repository's folder `start`."""
    from themisto.ingest.personal import mask_personal

    rel = stored_path(file)
    times = [i.time for i in session.inputs[:len(codes)]]
    executions = [Execution(cell_id=f"{session.session}:{i.line}", code=code, started_at=time,
                            origin=f"{repo.id}/{rel}:{session.session}:{i.line}")
                  for i, code, time in zip(session.inputs, codes, times)]
    notebook = mask_personal(match[0]) if match is not None else ""
    provenance = {"kind": SOURCE_KINDS[kind], "repository": repo.id, "commit": repo.commit, "path": rel,
                  "session": int(session.session), "date": session.start, "licence": repo.licence,
                  "environment": settings.environment, "notebook_inputs_matched": match[1] if match else 0,
                  "inputs": len(session.inputs), "cut": cut,
                  "inputs_sha256": inputs_sha256([i.code for i in session.inputs])}
    return Trajectory(id=trajectory_id(repo, file, session.session), notebook=notebook, source=SOURCE_KINDS[kind],
                      executions=executions, participant=repo.developer,
                      sources=[SourceFile(file=f"{repo.id}/{rel}", sha256=_sha256(file))],
                      workspace=f"{WORKSPACE_FOLDER}/{repo.id}", start_dir=start or None, provenance=provenance,
                      cell_timeout_s=settings.cell_timeout_s)



def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class _Candidate:
    trajectory: Trajectory
    key: str  # session_key: the same session in another repository


@dataclass
class CorpusRead:
    """What a corpus gave: its trajectories, its report, and the folder of files behind each workspace subfolder
    its trajectories name (None: the repository kept none)."""

    trajectories: list[Trajectory]
    report: CorpusReport
    workspace_folders: dict[str, Path | None]


def read_corpus(path: Path, settings: CorpusSettings = CorpusSettings(), *,
                modules: frozenset[str] | None = None) -> CorpusRead:
    """The trajectories a corpus folder (or one repository folder) gives under `settings`, and its report; a file
    that cannot be read is refused in one line of the report and costs only itself. `modules`: what the kernel
    environment imports (default: asked of the environment's interpreter)."""
    from themisto.ingest.session_checks import importable_modules

    report = CorpusReport()
    if modules is None:
        from themisto.settings import DEFAULT_ENVIRONMENT, environment_interpreter, settings as host

        python = environment_interpreter(settings.environment)
        if settings.environment == DEFAULT_ENVIRONMENT or not python.exists():
            python = Path(host().kernel_python)  # the replay then says the environment is missing
        modules = importable_modules(str(python))
    candidates: list[_Candidate] = []
    files: dict[str, Path | None] = {}
    for folder in repository_folders(path):
        try:
            repo = read_repository(folder)
        except CorpusError as exc:
            report.refusals.append(str(exc))
            _count(report.files_refused, "repository record")
            continue
        report.repositories += 1
        if settings.removals and settings.removals.removes(repository_record(folder)["repo"]):
            report.removed += 1
            continue
        files[f"{WORKSPACE_FOLDER}/{repo.id}"] = repo.files if repo.files.is_dir() else None
        if settings.licences is not None and (repo.licence or "none") not in settings.licences:
            _count(report.left_out, "licence")
            continue
        candidates += _repository_candidates(repo, settings, modules, report)
    kept = _choose(candidates, settings, report)
    for trajectory in kept:
        if trajectory.provenance["cut"] is not None:
            _count(report.cut, trajectory.provenance["cut"]["cause"])
    report.trajectories, report.steps = len(kept), sum(len(t.executions) for t in kept)
    report.developers = len({t.participant for t in kept})
    report.matched_notebook = sum(bool(t.notebook) for t in kept)
    used = {t.workspace for t in kept}
    return CorpusRead(kept, report, {sub: folder for sub, folder in files.items() if sub in used})


def _sessions(kind: str, file: Path, report: CorpusReport) -> list:
    """The sessions of one database or log (their code masked and redacted), or [] when it is refused."""
    from themisto.ingest.ipython_history import HistoryRefused, read_history
    from themisto.ingest.ipython_log import read_logstart

    try:
        read = read_history(file) if kind == "history" else read_logstart(file)
        sessions, redactions = read.sessions, read.redactions
    except HistoryRefused as exc:
        where = f":{exc.line}" if exc.line is not None else ""
        bound = f" (bound: {exc.bound})" if exc.bound else ""
        report.refusals.append(f"{_masked(file)}{where}: {exc.problem}{bound}")
        _count(report.files_refused, kind)
        return []
    report.files_read += 1
    for name, n in redactions.items():
        _count(report.redactions, name, n)
    return sessions


def _repository_candidates(repo: Repository, settings: CorpusSettings, modules: frozenset[str],
                           report: CorpusReport) -> list[_Candidate]:
    from themisto.ingest.session_checks import RepositoryFiles
    from themisto.ingest.start_folder import checked_session

    out: list[_Candidate] = []
    cells: dict[str, set[str]] | None = None
    files = RepositoryFiles(repo.listed, repo.kept, complete=repo.tree_complete)
    for kind, file in session_files(repo):
        for session in _sessions(kind, file, report):
            report.sessions_read += 1
            report.inputs_read += len(session.inputs)
            if len(session.inputs) < settings.min_inputs:
                continue
            report.sessions_long_enough += 1
            codes = [i.code for i in session.inputs]
            cells = notebook_cells(repo) if cells is None else cells
            match = match_notebook(codes, cells, settings)
            notebook_folder = str(Path(match[0]).parent.as_posix()) if match and "/" in match[0] else ""
            start, blocker = checked_session(codes[:settings.max_steps], modules, files, notebook_folder)
            end = min(len(codes), settings.max_steps, blocker.index if blocker else len(codes))
            if end < settings.min_steps:
                _count(report.left_out, blocker.cause if blocker else "too_short")
                continue
            cut = {"cause": blocker.cause, "at": blocker.index} if blocker and blocker.index < len(codes) else None
            if cut is None and end < len(codes):
                cut = {"cause": "max_steps", "at": end}
            trajectory = trajectory_of(repo, kind, file, session, codes[:end], settings, match, cut, start)
            out.append(_Candidate(trajectory, session_key(codes)))
    return out


def _rank(seed: int, text: str) -> str:
    return hashlib.sha256(f"{seed}/{text}".encode()).hexdigest()


def _choose(candidates: list[_Candidate], settings: CorpusSettings, report: CorpusReport) -> list[Trajectory]:
    """Each session once (the first repository in hash order keeps a copied one), at most `sessions_per_developer`
    per developer, and at most `limit` in all: every developer's first session before anyone's second."""
    seen: set[str] = set()
    per_developer: dict[str, list[Trajectory]] = {}
    for candidate in sorted(candidates, key=lambda c: _rank(settings.seed, c.trajectory.id)):
        if candidate.key in seen:
            _count(report.left_out, "duplicate")
            continue
        seen.add(candidate.key)
        mine = per_developer.setdefault(candidate.trajectory.participant or "", [])
        if len(mine) >= settings.sessions_per_developer:
            _count(report.left_out, "over_developer_cap")
            continue
        mine.append(candidate.trajectory)
    rounds = max((len(v) for v in per_developer.values()), default=0)
    order = [dev_list[r] for r in range(rounds) for _, dev_list in sorted(
        per_developer.items(), key=lambda kv: _rank(settings.seed, kv[0])) if r < len(dev_list)]
    if settings.limit is not None and len(order) > settings.limit:
        _count(report.left_out, "over_limit", len(order) - settings.limit)
        order = order[:settings.limit]
    return sorted(order, key=lambda t: t.id)


def _count(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n
