"""The one door to ingest: paths in (files, or folders read recursively), trajectories and a report per file out.

Every command that reads trajectories (`ingest`, `replay`, `build`) comes through `read_inputs`. A folder is
walked for `.log` (JuNE logs), `.csv` (the JuNE table) and `.ipynb` files. A notebook named like a participant's
final notebook (`*final-task<N>*.ipynb`) in a folder that holds logs is that participant's final notebook of the
task: evidence for repairing the logs beside it (`themisto.ingest.repair`), not a trajectory of its own; other
notebooks are one-pass trajectories (`themisto.ingest.notebook`).

A folder that is a corpus of IPython kernel histories (`repos/*/repo.json`, see `themisto.ingest.ipython_corpus`) is
read by that reader instead, under the corpus settings given: each repository's owner is one developer (a
pseudonym), and each trajectory names the subfolder of the replay's workspace its repository's files are in.

Participants: a log under `participants/<name>/` is <name>'s; a mapping file (JSON `{kernel_id: participant}`,
`--participants` on the command line) says whose the others are, such as the two logs beside the participants
folder; the JuNE table carries its own `user_id`. Every label is pseudonymised (`trajectory.anonymize`). A
participant's kernels on one notebook are then joined (`themisto.ingest.kernels`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from themisto.errors import InputError
from themisto.ingest import limits
from themisto.ingest.personal import mask_personal
from themisto.ingest.trajectory import SourceFile, Trajectory, anonymize, task_of

INGEST_SUFFIXES: tuple[str, ...] = (".log", ".csv", ".ipynb")
PARTICIPANTS_FOLDER = "participants"


class IngestInputError(InputError):
    """An input that cannot be read: no such file, an unreadable kind, a bad participants mapping."""


@dataclass(frozen=True)
class Input:
    """One file to read, the name the report and the trajectories give it, and its folder's participant."""

    path: Path
    name: str
    participant: str | None = None  # the folder name under `participants/`, unpseudonymised


@dataclass
class Ingested:
    """What the inputs gave: the trajectories, per log file (by name) the figures `themisto ingest` prints, and
    notes for the user (e.g. mapping entries no input matched)."""

    trajectories: list[Trajectory]
    files: dict[str, dict] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    read: list[SourceFile] = field(default_factory=list)  # every file read (final notebooks too), by name
    # A trajectory's participant's final notebook of its task, where one lies beside its log (evidence for repair
    # here, and for the replay's fidelity to the outputs the developer saw: `themisto.replay.final_notebook`).
    final_notebooks: dict[str, Path] = field(default_factory=dict)
    # Per corpus folder read (by its position among the paths): its reader's report (`CorpusReport.to_dict`).
    corpora: list[dict] = field(default_factory=list)
    # The workspace subfolders trajectories name (`Trajectory.workspace`) -> the folder of files each holds.
    workspace_folders: dict[str, Path | None] = field(default_factory=dict)


def _folder_participant(path: Path) -> str | None:
    for folder in path.resolve().parents:
        if folder.parent.name == PARTICIPANTS_FOLDER:
            return folder.name
    return None


def expand_inputs(paths: Sequence[str | Path]) -> list[Input]:
    """Every file the paths name, folders walked recursively (sorted); unknown kinds and missing paths refused."""
    found: list[Input] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in INGEST_SUFFIXES)
            if not inside:
                raise IngestInputError(f"{path}: no {', '.join(INGEST_SUFFIXES)} file in this directory")
            found += [Input(p, p.relative_to(path).as_posix(), _folder_participant(p)) for p in inside]
        elif not path.exists():
            raise IngestInputError(f"{path}: no such file")
        elif path.suffix.lower() not in INGEST_SUFFIXES:
            raise IngestInputError(f"{path}: expected a {', '.join(INGEST_SUFFIXES)} file or a directory of them")
        else:
            found.append(Input(path, path.name, _folder_participant(path)))
    names: dict[str, Path] = {}
    for item in found:
        if names.setdefault(item.name, item.path).resolve() != item.path.resolve():
            # Two different files with one name (inputs from two folders): name them by their paths instead.
            return [Input(i.path, i.path.as_posix(), i.participant) for i in found]
    return found


def read_participants(path: str | Path) -> dict[str, str]:
    """A kernel → participant mapping: a JSON object of strings, e.g. `{"bc147b33-…": "student_7"}`."""
    path = Path(path)
    try:
        mapping = limits.parse_json(path.read_text(encoding="utf-8"), limits.MAPPING, path=str(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IngestInputError(f"{path}: expected a JSON object {{kernel_id: participant}} ({exc})") from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                for k, v in mapping.items()):
        raise IngestInputError(f"{path}: expected a JSON object mapping kernel ids to participant names (strings)")
    return mapping


def _is_final_notebook(item: Input, log_folders: set[Path]) -> bool:
    return (item.path.suffix.lower() == ".ipynb" and "final-task" in item.path.name.lower()
            and task_of(item.path.name) is not None and item.path.parent.resolve() in log_folders)


def _final_cells(notebooks: list[Input]) -> dict[Path, dict[str | None, list]]:
    """Per folder, per task, the code cells of its final notebooks as repair candidates."""
    from themisto.ingest.notebook import code_cells, load_notebook
    from themisto.ingest.repair import Candidate

    cells: dict[Path, dict[str | None, list]] = {}
    for item in notebooks:
        notebook = load_notebook(item.path)
        cells.setdefault(item.path.parent.resolve(), {}).setdefault(task_of(item.path.name), []).extend(
            Candidate(text, f"{item.name} (cell {index})") for index, text in code_cells(notebook))
    return cells


def _assign(trajectories: list[Trajectory], owner: Mapping[str, str | None], mapping: Mapping[str, str],
            origin: Mapping[str, str]) -> None:
    """Set each trajectory's participant: the mapping's, its folder's, or the table's, pseudonymised."""
    for traj in trajectories:
        given, folder = mapping.get(traj.id), owner.get(traj.id)
        if given and folder and given != folder:
            raise IngestInputError(f"{origin.get(traj.id, traj.id)}: kernel {traj.id} is {folder}'s by its folder "
                                   f"but {given}'s by the participants mapping")
        label = given or folder
        if label:
            if traj.participant and traj.participant != anonymize(label):
                raise IngestInputError(f"{origin.get(traj.id, traj.id)}: kernel {traj.id} has another participant "
                                       "in the JuNE table than the one given")
            traj.participant = anonymize(label)


def read_inputs(paths: Sequence[str | Path], *, skip_bad_lines: bool = False,
                participants: Mapping[str, str] | None = None, corpus=None) -> Ingested:
    """Read every input into trajectories (ids unique) and the per-file report (see the module docstring);
    `corpus`: the `CorpusSettings` corpus folders are read under (default ones)."""
    from themisto.ingest.ipython_corpus import is_corpus

    corpora = [Path(p) for p in paths if is_corpus(Path(p))]
    others = [p for p in paths if not is_corpus(Path(p))]
    ingested = _read_files(others, skip_bad_lines, participants) if others else Ingested([])
    if corpora:
        _add_corpora(ingested, corpora, corpus)
    return ingested


def _add_corpora(ingested: Ingested, corpora: list[Path], settings) -> None:
    from themisto.ingest.ipython_corpus import CorpusSettings, read_corpus

    seen = {t.id for t in ingested.trajectories}
    for folder in corpora:
        read = read_corpus(folder, settings or CorpusSettings())
        clash = sorted(seen & {t.id for t in read.trajectories})
        if clash:
            raise IngestInputError(f"{folder}: trajectory {clash[0]} is read twice (the same corpus given twice?)")
        seen |= {t.id for t in read.trajectories}
        ingested.trajectories += read.trajectories
        ingested.corpora.append(read.report.to_dict())
        ingested.workspace_folders.update(read.workspace_folders)
        ingested.read += [s for t in read.trajectories for s in t.sources]


def _read_files(paths: Sequence[str | Path], skip_bad_lines: bool,
                participants: Mapping[str, str] | None) -> Ingested:
    from themisto.ingest.june_log import read_log_file, trajectories_of
    from themisto.ingest.june_table import read_june_table
    from themisto.ingest.kernels import join_kernels
    from themisto.ingest.notebook import read_notebook

    inputs = expand_inputs(paths)
    log_inputs = [i for i in inputs if i.path.suffix.lower() == ".log"]
    log_folders = {i.path.parent.resolve() for i in log_inputs}
    finals = [i for i in inputs if _is_final_notebook(i, log_folders)]
    final_cells = _final_cells(finals)
    logs = [read_log_file(i.path, name=i.name, skip_bad_lines=skip_bad_lines,
                          final_cells=final_cells.get(i.path.parent.resolve(), {})) for i in log_inputs]
    trajectories = trajectories_of(logs) if logs else []
    owner: dict[str, str | None] = {}
    first_event: dict[str, str] = {}
    origin: dict[str, str] = {}
    for item, log in zip(log_inputs, logs):
        for ev in log.events:
            owner[ev.kernel_id] = item.participant
            first_event[ev.kernel_id] = min(first_event.get(ev.kernel_id, ev.time), ev.time)
            origin.setdefault(ev.kernel_id, str(item.path))
    for item in inputs:
        if item.path.suffix.lower() == ".csv":
            table = read_june_table(item.path, skip_bad_lines=skip_bad_lines, name=item.name)
            trajectories += table
        elif item.path.suffix.lower() == ".ipynb" and item not in finals:
            trajectories.append(read_notebook(item.path, name=item.name))
    seen: dict[str, str] = {}
    for traj in trajectories:
        where = ", ".join(s.file for s in traj.sources) or traj.id
        if traj.id in seen:
            raise IngestInputError(f"trajectory {traj.id} is read twice, from {seen[traj.id]} and from {where}")
        seen[traj.id] = where
    mapping = participants or {}
    _assign(trajectories, owner, mapping, origin)
    unused = sorted(set(mapping) - set(seen))
    notes = [f"the participants mapping names {len(unused)} kernel(s) no input holds: {', '.join(unused[:5])}"
             ] if unused else []
    joined = join_kernels(trajectories, first_event)
    read = [SourceFile(file=mask_personal(i.name), sha256=_sha256(i.path)) for i in inputs]
    by_place = {(i.path.parent.resolve(), task_of(i.path.name)): i.path for i in finals}
    final_notebooks = {t.id: by_place[place] for t in joined if t.id in origin
                       and (place := (Path(origin[t.id]).parent.resolve(), t.task)) in by_place}
    return Ingested(joined, {log.name: _file_report(log, joined) for log in logs}, notes, read, final_notebooks)


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_report(log, trajectories: list[Trajectory]) -> dict:
    """A log file's figures: lines, events, executions, damaged lines, repaired and unrepaired executions, and
    the `execute` lines no `finished_execute` followed or whose code, logged as run ok, does not compile."""
    mine = [ex for traj in trajectories for ex in traj.executions
            if ex.origin and ex.origin.rsplit(":", 1)[0] == log.name]
    report = log.report()
    report.update(
        executions=len(mine),
        repaired=sum(ex.code_state == "repaired" for ex in mine),
        unrepaired=sum(ex.code_state == "damaged" for ex in mine),
        no_finish=_lines(mine, "no_finish"),
        uncompilable=_lines(mine, "uncompilable"),
    )
    return report


def _lines(executions: list, kind: str) -> list[int]:
    """The line numbers the executions' damage of `kind` names (`file:line`)."""
    return sorted(int(d.line.rsplit(":", 1)[1]) for ex in executions for d in ex.damage if d.kind == kind)
