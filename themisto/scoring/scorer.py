"""Score predictions for Themisto's two tasks: the paper's text scores, and for next_cell, execution in the exact
pre-cell kernel state.

Text scores (exact match, ROUGE-L, chrF; for output prediction also the equivalence verdict) need nothing but the
texts. Execution scores replay each trajectory of a release once in a fresh sandboxed kernel; before every scored
step the reference cell (twice, to catch nondeterminism) and all predictions for that step run as forked branches
of the live kernel, so each sees exactly the state the developer's cell saw and none disturbs the others. Executing
predictions needs both opt-in switches of `themisto.gate`.

Bad input raises ScoreError naming the example id before anything runs (lengths that differ, an unknown id, a
prediction that is not a string, a reference that is not the release's target, a release without the rows or the
workspace to rebuild an example's state). Where one example cannot be executed at run time (its replay broke, the
kernel could not branch), its predictions get the outcome `refused` with the reason and scoring goes on.

>>> result = score(["df.head()", "df.tail()"], ["df.head()", "df.head()"], ids=["k/5", "k/6"])
>>> result.scores["exact_match"], [p.exact_match for p in result.predictions]
(0.5, [1.0, 0.0])
"""


from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any, Callable, Iterable, Mapping, Sequence

from themisto.bounded import Bounds, iter_json_lines
from themisto.release.folder import ReleaseInfo
from themisto.release.workspaces import SourceFolders
from themisto.resume import (LineWriter, ResumeError, folder_fingerprint, hold_file, read_lines,
                             settings_difference, write_text_atomic)
from themisto.scoring.execution import TrajectoryRunner, execute_examples
from themisto.gate import permit as gate_permit
from themisto.scoring.records import (
    EXECUTION_SCORES,
    ExampleRecord,
    PredictionRecord,
    ScoreError,
    ScoreResult,
    ScoreSettings,
    TrajectoryScore,
    make_examples,
    text_records,
)
from themisto.scoring.release_state import check_against_release, task_rows
from themisto.vocabulary import OUTCOMES, TEXT_ONLY_REASONS

# What each reason an executing run scored an example by text only says (themisto.release.workspaces).
TEXT_ONLY_WHY = {"sources_missing": "input files are in no source folder (name them with --sources)",
                 "sources_changed": "input files differ from those its build replayed it over",
                 "environment_missing": "kernel environment is not installed"}

# A predictions file someone gave: one line per example, each holding its predictions (several samples each).
PREDICTIONS_BOUNDS = Bounds(file_bytes=1 << 30, line_bytes=16 << 20, depth=16, items=20_000_000)


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return fmean(kept) if kept else None


def aggregate(examples: Sequence[ExampleRecord], predictions: Sequence[PredictionRecord], settings: ScoreSettings,
              *, executed: bool) -> tuple[dict[str, Any], list[str]]:
    """The aggregate scores and notes: each score is a mean over examples of the mean over their predictions."""
    by_id: dict[str, list[PredictionRecord]] = {}
    for record in predictions:
        by_id.setdefault(record.id, []).append(record)
    names = ["exact_match", "rouge_l", "chrf"] + (["output_equivalent"] if settings.task == "output_prediction" else [])
    scores: dict[str, Any] = {name: _mean(_mean(getattr(r, name) for r in records) for records in by_id.values())
                              for name in names}
    scores["examples"], scores["predictions"] = len(by_id), len(predictions)
    notes: list[str] = []
    if not executed:
        return scores, notes
    scored = [e for e in examples if e.status == "scored"]
    for name in EXECUTION_SCORES:
        scores[name] = _mean(_mean(getattr(r, name) for r in by_id[e.id]) for e in scored)
    for k in settings.k:
        if scored and all(e.predictions >= k for e in scored):
            scores[f"pass@{k}"] = fmean(e.pass_at_k[f"pass@{k}"] for e in scored)
        else:
            scores[f"pass@{k}"] = None
            if scored:
                notes.append(f"pass@{k} needs at least {k} predictions for every scored example")
    scores["scored_examples"] = len(scored)
    for status in ("nondeterministic", "reference_unfinished", "reference_diverged", "refused"):
        ids = [e.id for e in examples if e.status == status]
        scores[f"{status}_examples"] = len(ids)
        if ids:
            notes.append(f"{len(ids)} example(s) {status.replace('_', ' ')}, not in the functional scores: "
                         + ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else ""))
    unexecuted = {reason: [e.id for e in examples if e.status == "text_only" and e.text_only_reason == reason]
                  for reason in TEXT_ONLY_REASONS}
    scores["text_only_examples"] = {reason: len(ids) for reason, ids in unexecuted.items()}
    for reason, ids in unexecuted.items():
        if ids:
            notes.append(f"{len(ids)} example(s) scored by text only, their trajectory's {TEXT_ONLY_WHY[reason]}: "
                         + ", ".join(ids[:10]) + (" ..." if len(ids) > 10 else ""))
    if settings.continuation_cells:
        undefined = [e.id for e in scored if e.continuation_problem]
        scores["continuation_undefined_examples"] = len(undefined)
        if undefined:
            notes.append(f"{len(undefined)} scored example(s) have no continuation_match (their continuation "
                         "differs between two reference runs or did not finish): " + ", ".join(undefined[:10]))
    unverified = [e.id for e in examples if e.state_verified is False]
    scores["state_mismatch_examples"] = len(unverified)
    loose = [e.id for e in examples if e.state_run_specific]
    scores["state_run_specific_examples"] = len(loose)
    if loose:
        notes.append(f"{len(loose)} example(s) ran in a rebuilt state whose run-specific values (the clock, the "
                     "system's entropy: not checked) differ from the release's: " + ", ".join(loose[:10]))
    if unverified:
        notes.append(f"{len(unverified)} example(s) ran in a rebuilt state whose hash differs from the release's: "
                     + ", ".join(unverified[:10]))
    scores["outcomes"] = {o: sum(1 for r in predictions if r.outcome == o) for o in OUTCOMES}
    suspicious = [f"{r.id}#{r.index}" for r in predictions if r.suspicious]
    scores["suspicious_predictions"] = len(suspicious)
    if suspicious:
        notes.append(f"{len(suspicious)} prediction(s) touched the scorer's machinery (see each record's "
                     "`suspicious`): " + ", ".join(suspicious[:10]) + (" ..." if len(suspicious) > 10 else ""))
    return scores, notes


# ---------------------------------------------------------------------------------------------------------------
# The door


def score(predictions: Sequence, references: Sequence, *, ids: Sequence[str] | None = None,
          settings: ScoreSettings | None = None, execute: bool = False, release: ReleaseInfo | None = None,
          workspace: SourceFolders | str | Path | None = None, done: Mapping[str, TrajectoryScore] | None = None,
          on_trajectory: Callable[[TrajectoryScore], None] | None = None,
          progress: Callable[[str], None] | None = None, workers: int | None = None,
          runner: TrajectoryRunner | None = None) -> ScoreResult:
    """Score predictions (a string, or a list of strings, per example) against references.

    With `execute=True` (and HF_ALLOW_CODE_EVAL=1) next_cell predictions also run in the exact pre-cell state
    rebuilt from `release` (opened by the caller: `themisto.release.folder.open_release`); `done` holds trajectories
    scored by an earlier run (resume), `on_trajectory` receives each trajectory as it finishes; `workers`
    trajectories run at once (default: one per core), or `runner` runs them (themisto.distributed.ray_scoring: on
    Ray).
    """
    settings = settings or ScoreSettings()
    permit = gate_permit(execute=True) if execute else None  # refuses before any input is read
    examples = make_examples(predictions, references, ids)
    if permit is not None and settings.task != "next_cell":
        raise ScoreError(f"execution scores exist for next_cell only, not {settings.task}; score without execute")
    if permit is not None and ids is None:
        raise ScoreError("execution needs the example ids (`ids`) to find each example's state in the release")
    if permit is not None and release is None:
        raise ScoreError("execution needs the release (`release`) the examples come from")
    records = text_records(examples, settings)
    by_id: dict[str, list[PredictionRecord]] = {}
    for record in records:
        by_id.setdefault(record.id, []).append(record)
    scored = {e.id: (ExampleRecord(id=e.id, predictions=len(e.predictions)), by_id[e.id]) for e in examples}
    if permit is not None:
        check_against_release(examples, release, settings.task)
        scored.update(execute_examples(permit, release, examples, by_id, settings, workspace, done or {}, on_trajectory,
                                       progress or (lambda msg: print(msg, file=sys.stderr, flush=True)), workers,
                                       runner))
    ordered_examples = [scored[e.id][0] for e in examples]
    ordered_records = [r for e in examples for r in scored[e.id][1]]
    scores, notes = aggregate(ordered_examples, ordered_records, settings, executed=permit is not None)
    return ScoreResult(settings.task, scores, ordered_examples, ordered_records, settings, notes)





def read_predictions(path: str | Path) -> tuple[list[str], list]:
    """Ids and predictions from a JSONL file of `{"id": ..., "prediction": str | [str, ...]}` lines; a malformed
    line, a prediction that is not text, or a repeated id is an error naming the file and line."""
    path = Path(path)
    ids: list[str] = []
    predictions: list = []
    first_line: dict[str, int] = {}
    for line in iter_json_lines(path, PREDICTIONS_BOUNDS, skip_blank=True):
        record, lineno = line.value, line.number
        if not isinstance(record, dict) or "id" not in record or "prediction" not in record:
            raise ScoreError(f"{path}:{lineno}: expected an object with `id` and `prediction`")
        example_id, prediction = str(record["id"]), record["prediction"]
        texts = prediction if isinstance(prediction, list) else [prediction]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ScoreError(f"{path}:{lineno}: example {example_id}: `prediction` must be a string or a "
                             "non-empty list of strings")
        if example_id in first_line:
            raise ScoreError(f"{path}:{lineno}: example {example_id} was already given on line "
                             f"{first_line[example_id]}")
        first_line[example_id] = lineno
        ids.append(example_id)
        predictions.append(prediction)
    if not ids:
        raise ScoreError(f"{path}: no predictions")
    return ids, predictions


@dataclass
class ScoreRun:
    """What `score_to_file` did: the result, where it went, and which trajectories an earlier run had scored."""

    result: ScoreResult
    path: Path
    resumed: list[str]
    seconds: float


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def _verdicts_path(out: Path) -> Path:
    """Where a finished execution run keeps its header and every trajectory's verdicts: a later run with the same
    header (another `--cluster`, another table over the same records) reuses them instead of executing again."""
    return out.with_name(out.name + ".verdicts.jsonl")


def _load_partial(partial: Path, header: dict, say: Callable[[str], None]) -> dict[str, TrajectoryScore]:
    """Trajectories an interrupted run with the same header finished (themisto.resume); otherwise say which setting
    differs and start over. A torn last line is cut off."""
    try:
        lines, _ = read_lines(partial)
    except ResumeError as error:
        say(f"{error}; starting over")
        return {}
    if not lines:
        return {}
    difference = settings_difference(lines[0], header) if isinstance(lines[0], dict) else "no settings header"
    if difference is not None:
        say(f"{partial}: written by another run ({difference}); starting over")
        return {}
    done: dict[str, TrajectoryScore] = {}
    for line in lines[1:]:
        try:
            item = TrajectoryScore.from_dict(line)
        except (KeyError, TypeError, AttributeError):
            break
        # A trajectory scored by text only for want of its files or environment is executed again: the run that
        # follows the note's advice (--sources, an install) must not be answered from the run that gave it.
        if not any(example.status == "text_only" for example in item.examples):
            done[item.kernel_id] = item
    return done


def resume_header(release: ReleaseInfo, ids: list[str], texts: list, settings: ScoreSettings,
                  workspace: SourceFolders | str | Path | None, out: Path) -> dict:
    """Everything that changes an execution run's records: settings, predictions, the release's content, the
    workspace the states are rebuilt over and the kernel's environment (interpreter, hash seed, package versions).
    The source folders (`--sources`) are not in it: a trajectory's files are checked by their hash where they are
    used, and one scored by text only for want of them is executed again by the next run."""
    import hashlib

    from themisto.runtime.sandbox import kernel_environment

    digest = hashlib.sha256(json.dumps([ids, texts], ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"settings": json.loads(json.dumps(asdict(settings))), "predictions_sha256": digest,
            "release": str(release.path), "release_content_sha256": release.content_hash,
            "workspace": folder_fingerprint(SourceFolders.of(workspace).workspace, output=out),
            "kernel": kernel_environment()}


def score_to_file(release: ReleaseInfo, predictions: str | Path, out: str | Path,
                  settings: ScoreSettings = ScoreSettings(), *, execute: bool = False,
                  workspace: SourceFolders | str | Path | None = None, resume: bool = True,
                  progress: Callable[[str], None] | None = None, workers: int | None = None,
                  runner: TrajectoryRunner | None = None) -> ScoreRun:
    """Score a predictions JSONL against a release's targets and write the results JSON to `out` (see
    `score_texts_to_file`)."""
    if execute:
        gate_permit(execute=True)  # refuse before reading anything
    ids, texts = read_predictions(predictions)
    return score_texts_to_file(release, ids, texts, out, settings, execute=execute, workspace=workspace,
                               resume=resume, progress=progress, workers=workers, runner=runner,
                               source=str(predictions))


def score_texts_to_file(release: ReleaseInfo, ids: list[str], texts: list, out: str | Path,
                        settings: ScoreSettings = ScoreSettings(), *, execute: bool = False,
                        workspace: SourceFolders | str | Path | None = None, resume: bool = True,
                        progress: Callable[[str], None] | None = None, workers: int | None = None,
                        runner: TrajectoryRunner | None = None, source: str = "predictions") -> ScoreRun:
    """Score each id's prediction (a text, or a list of them) against a release's targets and write the results
    JSON to `out`; `source` names where the predictions came from in errors.

    With execution, each finished trajectory is appended to `<out>.partial.jsonl` at once, and a rerun with the
    same settings, predictions, release and workspace keeps those trajectories; `out` appears whole when everything
    is scored, and the partial file becomes `<out>.verdicts.jsonl`, which a later run with the same header reuses
    (it executes only the trajectories scored by text only for want of their files or environment). A text-only run
    touches neither file. One process writes `out` and the files beside it at a time (`themisto.resume.hold_file`):
    another is refused with its pid before it reads anything.
    """
    if execute:
        gate_permit(execute=True)  # refuse before reading anything
    with hold_file(out, "results file") as out:
        return _score_held(release, ids, texts, out, settings, execute, workspace, resume, progress, workers, runner,
                           source)


def _score_held(release: ReleaseInfo, ids: list[str], texts: list, out: Path, settings: ScoreSettings,
                execute: bool, workspace: SourceFolders | str | Path | None, resume: bool,
                progress: Callable[[str], None] | None,
                workers: int | None, runner: TrajectoryRunner | None, source: str) -> ScoreRun:
    started = time.perf_counter()
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    rows = task_rows(release, settings.task)
    unknown = [i for i in ids if i not in rows]
    if unknown:
        raise ScoreError(f"{source}: example {unknown[0]}: no such id in {release.path}"
                         + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    references = [rows[i]["target"] for i in ids]
    partial = _partial_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer, done = None, {}
    if execute:
        header = resume_header(release, ids, texts, settings, workspace, out)
        # An interrupted run's partial file, else a finished run's verdicts (a missing file reads as empty).
        done = _load_partial(partial if partial.exists() else _verdicts_path(out), header, say) if resume else {}
        kept = [json.dumps(header, sort_keys=True)] + [json.dumps(t.to_dict(), ensure_ascii=False)
                                                       for t in done.values()]
        write_text_atomic(partial, "\n".join(kept) + "\n")
        writer = LineWriter(partial)
    try:
        result = score(texts, references, ids=ids, settings=settings, execute=execute, release=release,
                       workspace=workspace, done=done,
                       on_trajectory=(lambda item: writer.write(item.to_dict())) if writer else None, progress=say,
                       workers=workers, runner=runner)
    finally:
        if writer is not None:
            writer.close()
    write_text_atomic(out, json.dumps(result.to_dict(), ensure_ascii=False, indent=1) + "\n")
    if execute:  # only an execution run owns these files; a text-only run leaves earlier ones alone
        partial.replace(_verdicts_path(out))
    return ScoreRun(result, out, sorted(done), time.perf_counter() - started)

