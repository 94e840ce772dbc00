"""Collect submissions into a board: validate each against the release, re-score it, keep the latest per model.

Scores come only from `themisto.scoring.run_scores.score_run` run here on the validated predictions (a results file
inside a submission is ignored), cached by the hash of the predictions, the release and the execution opt-in.
A refused submission costs only its own row; the board says why.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from themisto.errors import InputError
from themisto.leaderboard.submission import Found, Submission, find_submissions, read_submission, write_submission
from themisto.release.folder import ReleaseInfo
from themisto.resume import write_text_atomic

# Bump when what a cached results.json means changes (the scorer, its metrics or intervals).
CACHE_VERSION = 1
BASELINE_BACKEND = "baseline"


@dataclass
class Entry:
    """One accepted submission and its re-scored results."""

    folder: str
    model: str
    backend: str
    task: str
    contexts: list[str]
    kind: str  # "model" | "baseline"
    predictions_sha256: str
    settings_key: str
    results: dict
    cached: bool
    ignored: list[str] = field(default_factory=list)
    submitter: str | None = None
    link: str | None = None
    # Per context mode: generations in all, and how many were skipped or failed (they score 0).
    answered: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class Refusal:
    """A submission the board did not take, and why; both name the submission relative to the submissions folder
    (the board is public: the maintainer's paths stay off it)."""

    folder: str
    reason: str

    @classmethod
    def of(cls, found: Found, error: Exception | str) -> Refusal:
        return cls(found.name, str(error).replace(str(found.folder), found.name))


@dataclass
class Board:
    """Everything the board files show: the release, entries, the board's own baselines, refusals and notes."""

    release_hash: str
    release_built: str
    generated: str
    executed: bool
    entries: list[Entry] = field(default_factory=list)
    baselines: dict[str, list[dict]] = field(default_factory=dict)  # task -> results.json "baselines" rows
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def cache_key(submission: Submission, release: ReleaseInfo, execute: bool) -> str:
    """What the cached scores depend on: the predictions, the release and whether predictions were executed."""
    parts = [CACHE_VERSION, submission.predictions_sha256, release.content_hash, bool(execute)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def rescore(submission: Submission, release: ReleaseInfo, *, execute: bool = False,
            cache_dir: Path | None = None, progress: Callable[[str], None] | None = None,
            runner=None, workspace=None) -> tuple[dict, bool]:
    """The submission's results.json as the board computes it, and whether it came from the cache; `runner` runs
    the executed trajectories elsewhere (themisto.distributed.ray_scoring: on Ray); `workspace`: where the release's
    input files are (`themisto.release.workspaces.SourceFolders`). Results that scored some examples by text only
    for want of their files are not cached: given the files, the next board executes them."""
    from themisto.scoring.run_scores import score_run

    cached = cache_dir / f"{cache_key(submission, release, execute)}.json" if cache_dir else None
    if cached is not None and cached.is_file():
        return json.loads(cached.read_text(encoding="utf-8")), True
    with tempfile.TemporaryDirectory(prefix="themisto-rescore-") as tmp:
        # Only the validated files are scored: nothing else from the submission folder is read.
        run_dir = write_submission(submission, Path(tmp) / "run")
        results = score_run(run_dir, release=release, execute=execute, out=run_dir / "results.json",
                            progress=progress, runner=runner, workspace=workspace)
    if cached is not None and not sum((results["counts"].get("text_only") or {}).values()):
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cached, json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results, False


def _entry(submission: Submission, results: dict, cached: bool) -> Entry:
    backend = submission.run["backend"]
    answered = {c: {"generations": 0, "unanswered": 0} for c in submission.contexts}
    for record in submission.generations:
        answered[record.context]["generations"] += 1
        answered[record.context]["unanswered"] += record.status != "ok"
    return Entry(folder=submission.name, model=submission.model, backend=backend, task=submission.task,
                 contexts=list(submission.contexts), kind="baseline" if backend == BASELINE_BACKEND else "model",
                 predictions_sha256=submission.predictions_sha256, settings_key=submission.settings_key,
                 results=results, cached=cached, ignored=list(submission.ignored),
                 submitter=submission.meta.get("submitter"), link=submission.meta.get("link"), answered=answered)


def _latest(submissions: list[Submission], notes: list[str]) -> list[Submission]:
    """One submission per model and settings: the later one (by its date, then by argument order) replaces."""
    kept: dict[str, Submission] = {}
    for sub in sorted(enumerate(submissions), key=lambda pair: (pair[1].order, pair[0])):
        earlier = kept.get(sub[1].settings_key)
        if earlier is not None:
            notes.append(f"{sub[1].name} replaces {earlier.name}: same model ({sub[1].model}) and settings, "
                         "the later one counts")
        kept[sub[1].settings_key] = sub[1]
    return sorted(kept.values(), key=lambda s: submissions.index(s))


def build_board(paths: Sequence[str | Path], release: ReleaseInfo, *, execute: bool = False,
                cache_dir: Path | None = None, progress: Callable[[str], None] | None = None,
                runner=None, workspace=None) -> Board:
    """Validate, de-duplicate and re-score every submission under `paths` against `release` (`workspace`: where
    its input files are, `themisto.release.workspaces.SourceFolders`)."""
    say = progress or (lambda message: None)
    board = Board(release.content_hash, release.built,
                  datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), execute)
    valid: list[Submission] = []
    found = {}
    for item in find_submissions(paths):
        if item.refusal is not None:
            board.refused.append(Refusal.of(item, item.refusal))
            continue
        try:  # whatever a submission holds, a refusal names its file, line and bound, and costs only its own row
            valid.append(read_submission(item.folder, release, item.name))
            found[item.name] = item
        except InputError as exc:
            board.refused.append(Refusal.of(item, exc))
    for number, submission in enumerate(_latest(valid, board.notes), start=1):
        try:
            results, cached = rescore(submission, release, execute=execute, cache_dir=cache_dir, progress=say,
                                      runner=runner, workspace=workspace)
        except InputError as exc:
            board.refused.append(Refusal.of(found[submission.name], exc))
            continue
        say(f"[{number}] {submission.model} ({submission.task}): " + ("scores from the cache" if cached
                                                                     else "re-scored"))
        for line in submission.ignored:
            say(f"    ignored: {line}")
        board.entries.append(_entry(submission, results, cached))
        board.baselines.setdefault(submission.task, list(results.get("baselines") or []))
    return board
