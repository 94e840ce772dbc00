"""Read and validate a submission: a run folder (`run.json` + `generations.jsonl`, optional `submission.json`).

A submission is predictions, never scores. It is read through the run folder's own reader
(`themisto.generation.run_folder`, within bounds: a hostile file is refused with its line and bound), and then
checked as the board needs it: the run's settings are complete, the release content hash is the board's release,
and every test id appears exactly once per context mode and sample with a string prediction; the first problem is
an InputError naming the file and line. Anything that claims a score (a results file, a `scores` key, a per-line
`score`) is dropped and listed in `Submission.ignored`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

from themisto.bounded import Bounds, read_json
from themisto.errors import InputError
from themisto.generation.run_folder import (GENERATIONS_BOUNDS, GENERATIONS_FILE, RUN_FILE, Generation,
                                            read_generations, read_run_json)
from themisto.release.folder import ReleaseInfo
from themisto.resume import LOCK_FILE, folder_written_whole, refuse_if_written
from themisto.vocabulary import BENCHMARK_SPLIT

SUBMISSION_FILE = "submission.json"
SUBMITTED_FILES: tuple[str, ...] = (RUN_FILE, GENERATIONS_FILE, SUBMISSION_FILE)
SUBMISSION_BOUNDS = Bounds(file_bytes=64 << 10, depth=4, items=1_000)  # a few strings about the submitter
SAMPLING_KEYS: tuple[str, ...] = ("n", "temperature", "top_p", "max_new_tokens", "seed")
SUBMISSION_KEYS: tuple[str, ...] = ("submitter", "model_id", "model_revision", "link", "submitted")
# Keys and file names that carry a score someone computed elsewhere: never read, always reported.
_SCORE_WORDS = ("score", "result", "metric", "exact_match", "rouge", "chrf", "functional", "accuracy", "pass@",
                "correct", "leaderboard")


class SubmissionError(InputError):
    """A submission the board refuses; the message names the file (and line, or example id) and the reason."""


@dataclass
class Submission:
    """A validated submission: its run settings, cleaned generation records, predictions hash, what was ignored."""

    folder: Path
    run: dict
    meta: dict
    generations: list[Generation]
    predictions_sha256: str
    ignored: list[str] = field(default_factory=list)
    name: str = ""  # as the board shows it: the folder relative to the submissions folder it was found in

    @property
    def task(self) -> str:
        return self.run["task"]

    @property
    def contexts(self) -> tuple[str, ...]:
        return tuple(self.run["contexts"])

    @property
    def model(self) -> str:
        """The model's name as the board shows it: the Hub id from submission.json, else run.json's model."""
        return str(self.meta.get("model_id") or self.run["model"])

    @property
    def settings_key(self) -> str:
        """Equal for two submissions of the same model with the same settings (the later one replaces the other)."""
        run = self.run
        templates = {c: (run.get("templates") or {}).get(c, {}).get("sha256") for c in self.contexts}
        key = [run["task"], run["backend"], run["model"], run.get("model_revision"), run.get("weights_sha256"),
               run["sampling"], sorted(self.contexts), templates]
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    @property
    def order(self) -> str:
        """When it was made, for `later replaces earlier`: submission.json `submitted`, else run.json `finished`."""
        return str(self.meta.get("submitted") or self.run.get("finished") or "")


def claims_score(name: str) -> bool:
    """Whether a file or key name says it holds a score (such things are ignored, never read)."""
    lowered = name.lower()
    return any(word in lowered for word in _SCORE_WORDS)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_run(run: dict, path: Path, release: ReleaseInfo) -> None:
    """run.json's settings are complete and name the board's release and split; SubmissionError names the field."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise SubmissionError(f"{path}: {what}")

    contexts = run["contexts"]  # format, task, contexts, sampling.n and the release hash: checked by the reader
    for key in ("backend", "model"):
        need(isinstance(run.get(key), str) and run[key].strip() != "", f"`{key}` must be a non-empty string")
    need("model_revision" in run or "weights_sha256" in run, "names neither `model_revision` nor `weights_sha256`")
    sampling = run.get("sampling")
    need(isinstance(sampling, dict) and all(k in sampling for k in SAMPLING_KEYS),
         f"`sampling` must give {', '.join(SAMPLING_KEYS)}")
    need(_is_int(sampling["n"]) and sampling["n"] >= 1, "`sampling.n` must be an integer >= 1")
    need(_is_number(sampling["temperature"]) and _is_number(sampling["top_p"]) and _is_int(sampling["max_new_tokens"])
         and (sampling["seed"] is None or _is_int(sampling["seed"])), "`sampling` values have the wrong types")
    templates = run.get("templates")
    need(isinstance(templates, dict) and all(isinstance(templates.get(c), dict) and
                                             isinstance(templates[c].get("sha256"), str) for c in contexts),
         "`templates` must give {text, sha256} for every context mode")
    hash_ = run["release"]["content_hash"]
    need(hash_ == release.content_hash, f"made on release {hash_[:12]}…, the board's release is "
                                        f"{release.content_hash[:12]}… (ids and targets differ between releases)")
    need(run.get("split") == BENCHMARK_SPLIT, f"`split` must be \"{BENCHMARK_SPLIT}\"")
    need(release.has(run["task"]), f"the release has no {run['task']} test split")


def read_predictions(folder: Path, run: dict, release: ReleaseInfo) -> tuple[list[Generation], dict[str, int]]:
    """The checked records (every test id once per context and sample), in file order, and the count of each key
    outside the record's schema (ignored)."""
    ids = release.ids(run["task"])
    calls_for = len(ids) * len(run["contexts"]) * run["sampling"]["n"]
    # Each line is one prediction the settings call for (blank lines aside): a file of many more lines is a flood,
    # refused before any line is parsed.
    bounds = replace(GENERATIONS_BOUNDS, lines=min(GENERATIONS_BOUNDS.lines, 2 * calls_for))
    found = read_generations(folder, run, ids=set(ids), bounds=bounds)
    missing = found.missing(ids, run)
    if missing:
        example, context, sample = missing[0]
        limit = f"; run.json has limit={run['limit']}" if run.get("limit") else ""
        raise SubmissionError(f"{folder / GENERATIONS_FILE}: {len(missing)} of {calls_for} predictions missing, "
                              f"first: id {example} (context {context}, sample {sample}){limit}")
    return list(found.records.values()), dict(found.extra_keys)


def predictions_sha256(task: str, records: Iterable[Generation]) -> str:
    """sha256 over the task and every (context, sample, id, status, prediction), sorted: the scores' cache key."""
    digest = hashlib.sha256(task.encode() + b"\n")
    for r in sorted(records, key=lambda r: (r.context, r.sample, r.id)):
        digest.update(json.dumps([r.context, r.sample, r.id, r.status, r.prediction]).encode() + b"\n")
    return digest.hexdigest()


def _meta(folder: Path, ignored: list[str]) -> dict:
    path = folder / SUBMISSION_FILE
    if not path.exists():
        return {}
    data = read_json(path, SUBMISSION_BOUNDS)
    if not isinstance(data, dict):
        raise SubmissionError(f"{path}: expected a JSON object (the submitter's details)")
    for key, value in data.items():
        if key not in SUBMISSION_KEYS:
            ignored.append(f"{SUBMISSION_FILE}: key `{key}` ignored" + (" (a claimed score)" if claims_score(key)
                                                                         else ""))
        elif value is not None and not isinstance(value, str):
            raise SubmissionError(f"{path}: `{key}` must be a string")
    return {k: data.get(k) for k in SUBMISSION_KEYS if data.get(k) is not None}


def read_submission(folder: str | Path, release: ReleaseInfo, name: str | None = None) -> Submission:
    """Validate one run folder against the board's release; an InputError says why it is refused."""
    folder = Path(folder)
    if folder.is_symlink():
        raise SubmissionError(f"{folder}: a link; a submission is a folder of plain files, read where it lies")
    if not folder.is_dir():
        raise SubmissionError(f"{folder}: no such submission folder")
    # A run still being generated (or scored) into: refused with the writer's pid, not read half-written.
    refuse_if_written(folder, "run folder")
    ignored: list[str] = []
    for entry in sorted(folder.iterdir()):
        if entry.name == LOCK_FILE and entry.is_file() and not entry.is_symlink():
            continue  # the lock file a killed writer left: its writer's, not the submitter's
        # A link could point the board at any file it can read (a key, another submission) and print what it
        # finds in a refusal on the public page.
        if entry.is_symlink() or (entry.name in SUBMITTED_FILES and not entry.is_file()):
            raise SubmissionError(f"{entry}: not a plain file (a link or a folder); a submission holds plain files")
        if entry.name not in SUBMITTED_FILES:
            why = "claimed scores, ignored: the board re-scores the predictions" if claims_score(entry.name) \
                else "not part of a submission, ignored"
            ignored.append(f"{entry.name}{'/' if entry.is_dir() else ''}: {why}")
    run = read_run_json(folder)
    check_run(run, folder / RUN_FILE, release)
    for key in run:
        if claims_score(key):
            ignored.append(f"{RUN_FILE}: key `{key}` ignored (a claimed score)")
    meta = _meta(folder, ignored)
    records, extra = read_predictions(folder, run, release)
    for key, count in sorted(extra.items()):
        ignored.append(f"{GENERATIONS_FILE}: key `{key}` on {count} line(s) ignored"
                       + (" (a claimed score)" if claims_score(key) else ""))
    return Submission(folder, run, meta, records, predictions_sha256(run["task"], records), ignored,
                      name or folder.name)


def submission_bytes(submission: Submission) -> dict[str, bytes]:
    """The files a validated submission is passed on as: settings (no claimed score), cleaned records, details."""
    run = {k: v for k, v in submission.run.items() if not claims_score(k)}
    lines = "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in submission.generations)
    files = {RUN_FILE: (json.dumps(run, indent=2, sort_keys=True) + "\n").encode(), GENERATIONS_FILE: lines.encode()}
    if submission.meta:
        files[SUBMISSION_FILE] = (json.dumps(submission.meta, indent=2, sort_keys=True) + "\n").encode()
    return files


def write_submission(submission: Submission, dest: str | Path) -> Path:
    """Write the validated submission (`submission_bytes`; nothing ignored) to the folder `dest` whole."""
    dest = Path(dest)
    with folder_written_whole(dest) as tmp:
        for name, data in submission_bytes(submission).items():
            (tmp / name).write_bytes(data)
    return dest


@dataclass(frozen=True)
class Found:
    """A submission found under a path the board was given: its folder, its name relative to that path, and why
    it is refused unread (a link), if it is."""

    folder: Path
    name: str
    refusal: str | None = None


def find_submissions(paths: Iterable[str | Path]) -> list[Found]:
    """Each path that holds a run.json, or the run folders found below a folder of submissions (sorted). Links are
    not followed: a link to a folder, or a submission folder that is a link, is found refused."""
    found: list[Found] = []
    for raw in paths:
        path = Path(raw)
        if path.is_symlink():
            found.append(Found(path, path.name, f"{path.name}: a link, not followed (a submission is a folder of "
                                                 "plain files)"))
        elif (path / RUN_FILE).exists() or (path / RUN_FILE).is_symlink():
            found.append(Found(path, path.name))
        elif path.is_dir():
            inside = _walk(path)
            if not inside:
                raise SubmissionError(f"{path}: no {RUN_FILE} in this folder or below it")
            found.extend(inside)
        else:
            raise SubmissionError(f"{path}: no such submission folder")
    return found


def _walk(root: Path) -> list[Found]:
    """The run folders below a folder of submissions, and every link to a folder met on the way (not followed)."""
    found = []
    for folder, dirs, files in os.walk(root):  # os.walk does not descend into links to folders
        here = Path(folder)
        for name in sorted(dirs) if RUN_FILE not in files else ():  # a run folder's links refuse it (read_submission)
            if (here / name).is_symlink():
                rel = (here / name).relative_to(root).as_posix()
                found.append(Found(here / name, rel, f"{rel}: a link to a folder, not followed (a submission is a "
                                                     "folder of plain files)"))
        if RUN_FILE in files:
            found.append(Found(here, here.relative_to(root).as_posix() if here != root else root.name))
    return sorted(found, key=lambda item: item.folder)


def submission_slug(submission: Submission) -> str:
    """A path-safe folder name for a submission: task, model and the start of its predictions hash."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in submission.model)[:80].strip("-.") or "model"
    return f"{submission.task}/{safe}/{submission.predictions_sha256[:12]}"
