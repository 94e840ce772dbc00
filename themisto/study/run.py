"""`themisto study`: the folder, its units of work, and resuming them.

    STUDY/study.json                   the settings, the release's hash, the base model, versions (a rerun must match)
    STUDY/rows.json                    the train rows every mode trains on, with tokens per mode and per row
    STUDY/exports/<mode>/              each mode's sft-export of exactly those rows
    STUDY/models/<mode>-s<seed>/       each fine-tuned model (eval/finetune.py's folder)
    STUDY/runs/<system>/<task>/        run folders (`themisto generate`): each model in its own mode and in `none`;
                                       `base` in every mode
    STUDY/units/<unit>.json            each finished unit's record (steps, losses, tokens, prompts, seconds)
    STUDY/scored/                      the scorer's records: every prediction of the study at once, per task
    STUDY/results.json, results.md, effects.png

A unit is one (mode, seed): fine-tune, then generate on the test split; or the base model generating in every mode.
They run in `work_order`: seed 0 of every mode, the base model, then seed 1 of every mode, ...; a finished unit
leaves `units/<unit>.json` and is not run again. With `parallel` > 1 units run side by side in processes of their
own (on one GPU several small models fit); `budget_s` starts no unit the plan says would end past it
(themisto.study.schedule).

Generation and scoring may run on two machines: `generate_only` stops once every model has generated; the folder
without `models/` and `exports/` (the predictions are small) is then finished by the same command elsewhere, the
release and the base model matched by their content, not their paths.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from themisto.resume import LOCK_FILE, hold_folder, write_json_atomic
from themisto.study.scores import BASE_SYSTEM, eval_contexts
from themisto.study.units import (ROWS_FILE, STUDY_FILE, Unit, base_done, unit_record, unit_records,  # noqa: F401
                                  units_of, work_order)
from themisto.study.settings import LOCATIONS, StudyError, StudySettings, what_differs

FORMAT = 1


# ---------------------------------------------------------------------------------------------------------------
# The folder


def _header(settings: StudySettings, release_hash: str) -> dict:
    from themisto.generation.runs import git_commit, package_versions
    from themisto.training.finetune import describe_base_model

    return {"format": FORMAT, "settings": settings.to_dict(), "release_hash": release_hash,
            "base_model": describe_base_model(settings.model), "packages": package_versions(),
            "git_commit": git_commit()}


def _model_identity(base_model: dict) -> str:
    """Local weights by their hash; a Hub id by its name."""
    return base_model.get("weights_sha256") or base_model["model"]


def open_study(out: Path, settings: StudySettings, release_hash: str) -> dict:
    """The folder's study.json, written now or checked against these settings (what differs is named)."""
    path = out / STUDY_FILE
    header = _header(settings, release_hash)
    if path.exists():
        from themisto.bounded import read_json

        recorded = read_json(path)
        if not isinstance(recorded, dict) or recorded.get("format") != FORMAT or \
                not isinstance(recorded.get("settings"), dict):
            raise StudyError(f"{path}: not a study folder's {STUDY_FILE} (format {FORMAT}, with its settings)")
        # Folders written before the base model was recorded by its weights match it by its path.
        located = LOCATIONS if isinstance(recorded.get("base_model"), dict) else ("release",)
        changed = what_differs(recorded["settings"], header["settings"], ignore=located)
        if changed:
            raise StudyError(f"{out}: holds a study with other settings ({changed}); give another folder or the "
                             "same settings")
        if recorded.get("release_hash") != release_hash:
            raise StudyError(f"{out}: written against another release (content hash {recorded.get('release_hash')} "
                             f"there, {release_hash} here)")
        if "model" in located and _model_identity(recorded["base_model"]) != _model_identity(header["base_model"]):
            raise StudyError(f"{out}: written with another base model ({recorded['base_model']['model']} there, "
                             f"{settings.model} here, whose weights differ)")
        return recorded
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise StudyError(f"{out}: not empty and has no {STUDY_FILE}; give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, header)
    return header


def _rows(out: Path, settings: StudySettings, info, tokenizer, counter, say):
    """The common rows, chosen once (rows.json)."""
    from themisto.study.rows import CommonRows, common_rows

    path = out / ROWS_FILE
    if path.exists():
        return CommonRows.from_dict(json.loads(path.read_text(encoding="utf-8")))
    say("choosing the train rows every mode can verify and fit")
    rows = common_rows(info, settings, tokenizer, counter)
    write_json_atomic(path, rows.to_dict())
    return rows


def export_for(out: Path, settings: StudySettings, info, rows, counter, say) -> Callable[[str], None]:
    """A function that writes a mode's export of the common rows unless it is there (before its first unit)."""
    from themisto.study.rows import export_mode

    def export(mode: str) -> None:
        folder = out / "exports" / mode
        if not (folder / "manifest.json").is_file():
            say(f"exporting {len(rows.keys)} rows in mode {mode}")
            export_mode(info, settings, mode, rows, folder, counter)

    return export


def export_job(settings_dict: dict, info, out: str, mode: str) -> str:
    """Write `mode`'s export in a process of its own (side by side, the modes' exports are written at once)."""
    from themisto.generation.backends.hf import prompt_token_counter
    from themisto.study.rows import CommonRows, load_tokenizer

    settings, folder = _settings_of(settings_dict), Path(out)
    rows = CommonRows.from_dict(json.loads((folder / ROWS_FILE).read_text(encoding="utf-8")))
    counter = prompt_token_counter(load_tokenizer(settings.model))
    export_for(folder, settings, info, rows, counter, lambda msg: None)(mode)
    return mode


# ---------------------------------------------------------------------------------------------------------------
# Units: fine-tune, then generate


def _generate(settings: StudySettings, info, model: str, contexts: tuple[str, ...], out: Path,
              progress: bool) -> dict:
    """Each task's run folder for `model` in `contexts` (resumed where it stopped); one model load for all tasks.
    Returns the prompts generated now, the seconds generation took (loading aside) and the device."""
    from themisto.generation.backends import Sampling, make_backend
    from themisto.generation.backends.hf_batched import DEFAULT_MEMORY_FRACTION
    from themisto.generation.runs import RunSettings, backend_options, generate_run

    backend, prompts, seconds = None, 0, 0.0
    for task in settings.tasks:
        run = RunSettings(spec=settings.test_spec((task,), contexts), backend="transformers", model=model,
                          sampling=Sampling(max_new_tokens=settings.max_new_tokens),
                          batch_size=settings.generation_batch,
                          backend_options={"device": settings.device, "dtype": settings.dtype})
        if backend is None:
            # How it batches is not a run setting (the same answers): a resumed run may batch otherwise. The models
            # side by side share the device's memory.
            backend = make_backend(run.backend, run.model, **backend_options(run), batching=settings.batching,
                                   memory_fraction=DEFAULT_MEMORY_FRACTION / settings.parallel)
        report = generate_run(info, out / task, run, backend=backend, progress=progress)
        prompts, seconds = prompts + report.written, seconds + report.seconds
    return {"prompts": prompts, "generate_seconds": round(seconds, 1), "device": backend.device}


def _settings_of(settings_dict: dict) -> StudySettings:
    return StudySettings(**{**settings_dict, "contexts": tuple(settings_dict["contexts"]),
                            "tasks": tuple(settings_dict["tasks"])})


def _train(settings: StudySettings, folder: Path, unit: Unit) -> tuple[dict, int | None]:
    """The unit's model (trained now, or found trained) and the training tokens it took now (None: found)."""
    from themisto.study.tokens import optimizer_steps, unit_tokens
    from themisto.study.rows import CommonRows
    from themisto.training.finetune import TRAINING_FILE, FinetuneSettings, finetune

    model = folder / "models" / unit.name
    tokens = None
    if not (model / TRAINING_FILE).is_file():
        finetune(FinetuneSettings(
            data=str(folder / "exports" / unit.mode), base_model=settings.model, output=str(model),
            method=settings.method, epochs=settings.epochs, max_steps=settings.max_steps,
            learning_rate=settings.learning_rate, batch_size=settings.batch_size, grad_accum=settings.grad_accum,
            max_length=settings.max_length, seed=unit.seed, device=settings.device,
            length_grouped=settings.length_grouped, checkpoints=False),
            overwrite=True)
        rows = CommonRows.from_dict(json.loads((folder / ROWS_FILE).read_text(encoding="utf-8")))
        if rows.lengths.get(unit.mode):
            tokens = unit_tokens(rows.lengths[unit.mode], settings, optimizer_steps(len(rows.keys), settings))
    trained = json.loads((model / TRAINING_FILE).read_text(encoding="utf-8"))
    if trained["examples"]["over_max_length"]:
        raise StudyError(f"{model}: fine-tuning left out {trained['examples']['over_max_length']} rows as too long; "
                         "every mode must train on the same rows")
    return trained, tokens


def run_unit(settings_dict: dict, info, out: str, mode: str, seed: int) -> dict:
    """Train and generate one unit (a process of its own when units run side by side); returns its record, written
    to units/<unit>.json once the unit is whole."""
    settings = _settings_of(settings_dict)
    folder, unit = Path(out), Unit(mode, seed)
    started = time.perf_counter()
    trained, tokens = _train(settings, folder, unit)
    generated = _generate(settings, info, str(folder / "models" / unit.name), eval_contexts(mode),
                          folder / "runs" / unit.name, progress=settings.progress and settings.parallel == 1)
    record = {"unit": unit.name, "mode": mode, "seed": seed, "steps": trained["steps"],
              "trained_on": trained["examples"]["trained_on"], "first_loss": trained["first_loss"],
              "final_loss": trained["final_loss"], "train_seconds": trained["train_seconds"] if tokens else None,
              "train_tokens": tokens, "unit_seconds": round(time.perf_counter() - started, 1), **generated,
              "precision": trained["precision"], "parallel": settings.parallel}
    (folder / "units").mkdir(exist_ok=True)
    write_json_atomic(folder / "units" / f"{unit.name}.json", record)
    return record


def run_base(settings_dict: dict, info, out: str) -> dict:
    """The base model generating in every mode (the scores' examples and the untrained effects); its record."""
    settings = _settings_of(settings_dict)
    folder = Path(out)
    started = time.perf_counter()
    generated = _generate(settings, info, settings.model, settings.contexts, folder / "runs" / BASE_SYSTEM,
                          progress=settings.progress and settings.parallel == 1)
    write_json_atomic(folder / "runs" / BASE_SYSTEM / "done.json", {"contexts": list(settings.contexts)})
    record = {"unit": BASE_SYSTEM, "mode": None, "seed": None, "unit_seconds": round(time.perf_counter() - started, 1),
              **generated, "parallel": settings.parallel}
    (folder / "units").mkdir(exist_ok=True)
    write_json_atomic(folder / "units" / f"{BASE_SYSTEM}.json", record)
    return record


# ---------------------------------------------------------------------------------------------------------------
# The study


def run_study(settings: StudySettings, info, out: str | Path, *, progress: Callable[[str], None] | None = None,
              prepare_only: bool = False) -> dict:
    """Run (or resume) the study of the release `info` (its handle, opened once for the whole study: every unit
    and export takes it) into `out` and write its results; returns results.json's content, or (with
    --generate-only, or when the budget stopped it) what was generated and what is left. `prepare_only`: write
    study.json and rows.json and stop (what a GPU slot then need not spend time on)."""
    from themisto.gate import permit
    from themisto.study.plan import require_splits

    started = time.perf_counter()
    say = progress or (lambda msg: print(f"study: {msg}", file=sys.stderr, flush=True))
    if settings.execute and not settings.generate_only and not prepare_only:
        permit(execute=True)  # refuse before anything is trained
    out = Path(out)
    require_splits(info, settings)
    with hold_folder(out, "study folder"):  # one writer: a second study into the folder is refused at once
        return _run(settings, out, info, say, started, prepare_only)


def _run(settings: StudySettings, out: Path, info, say: Callable[[str], None], started: float,
         prepare_only: bool) -> dict:
    from themisto.generation.backends.hf import prompt_token_counter
    from themisto.study.rows import load_tokenizer
    from themisto.study.schedule import UnitJobs, run_work

    open_study(out, settings, info.content_hash)
    units = units_of(settings)
    if settings.score_only:
        return _score(out, settings, info, say, started)
    tokenizer = load_tokenizer(settings.model)
    counter = prompt_token_counter(tokenizer)
    rows = _rows(out, settings, info, tokenizer, counter, say)
    if prepare_only:
        say(f"prepared {out}: {STUDY_FILE} and {ROWS_FILE} ({len(rows.keys)} rows); nothing trained")
        return {"generated": [], "left": [u.name if u else BASE_SYSTEM for u in work_order(settings)],
                "seconds": round(time.perf_counter() - started, 1)}
    todo = [job for job in work_order(settings) if unit_record(out, job) is None]
    say(f"{len(units)} models ({len(settings.contexts)} modes x {settings.seeds} seeds) on {len(rows.keys)} rows "
        f"each and the base model; {len(work_order(settings)) - len(todo)} units done before")
    left = run_work(out, settings, info, rows, todo, say, started, export_for(out, settings, info, rows, counter, say),
                    UnitJobs(run_base, run_unit, export_job))
    if settings.generate_only or left:
        done = [u.name if u else BASE_SYSTEM for u in work_order(settings) if unit_record(out, u) is not None]
        if left:
            say(f"the budget stopped the study before {', '.join(left)}: rerun the command to go on (here or on "
                f"another machine); --score-only scores the {len(done)} units done")
        else:
            say(f"every model has generated; to score, run the same command without --generate-only (on another "
                f"machine: copy {out} without models/ and exports/)")
        return {"generated": done, "left": left, "seconds": round(time.perf_counter() - started, 1)}
    return _score(out, settings, info, say, started)


def _score(out: Path, settings: StudySettings, info, say: Callable[[str], None], started: float) -> dict:
    """Score the finished units (every unit, unless --score-only takes a study stopped part way) and report."""
    from themisto.study.report import write_report
    from themisto.study.rows import CommonRows
    from themisto.study.scores import score_study

    if not base_done(out):
        raise StudyError(f"{out}: the base model has not generated yet (it runs after seed 0 of every mode); "
                         "nothing to score")
    finished = [u for u in units_of(settings) if unit_record(out, u) is not None]
    left = [u.name for u in units_of(settings) if unit_record(out, u) is None]
    if left:
        say(f"scoring {len(finished)} finished units; {len(left)} left for a later run: {', '.join(left)}")
    rows = json.loads((out / ROWS_FILE).read_text(encoding="utf-8"))
    scores = score_study(out, settings, info, finished, say)
    records = [unit_record(out, u) for u in finished]
    return write_report(out, settings, CommonRows.from_dict(rows), records, scores,
                        seconds=time.perf_counter() - started, left=left)
