"""`themisto study`: the folder, its units of work, and resuming them.

    STUDY/study.json                   the settings, the release's hash, the base model, versions (a rerun must match)
    STUDY/rows.json                    the train rows every mode trains on, with tokens per mode (`rows`)
    STUDY/exports/<mode>/              each mode's sft-export of exactly those rows
    STUDY/models/<mode>-s<seed>/       each fine-tuned model (eval/finetune.py's folder)
    STUDY/runs/<system>/<task>/        run folders (`themisto generate`): each model in its own mode and in `none`;
                                       `base` in every mode
    STUDY/scored/                      the scorer's records: every prediction of the study at once, per task
    STUDY/results.json, results.md, effects.png

A unit is one (mode, seed): fine-tune, then generate on the test split; a finished unit leaves
`units/<mode>-s<seed>.json` and is not run again. With `parallel` > 1 units run side by side in processes of their
own (on one GPU several small models fit).

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
from themisto.study.settings import LOCATIONS, StudyError, StudySettings, what_differs

STUDY_FILE, ROWS_FILE = "study.json", "rows.json"
FORMAT = 1


@dataclass(frozen=True)
class Unit:
    """One (mode, seed): a model trained with `mode` prompts from data order `seed`."""

    mode: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.mode}-s{self.seed}"


def units_of(settings: StudySettings) -> list[Unit]:
    return [Unit(mode, seed) for mode in settings.contexts for seed in range(settings.seeds)]


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


def _rows(out: Path, settings: StudySettings, tokenizer, counter, say, modes: tuple[str, ...]):
    """The common rows (chosen once), and the exports of `modes` (those with a model still to train)."""
    from themisto.study.rows import CommonRows, common_rows, export_mode

    path = out / ROWS_FILE
    if path.exists():
        rows = CommonRows.from_dict(json.loads(path.read_text(encoding="utf-8")))
    else:
        say("choosing the train rows every mode can verify and fit")
        rows = common_rows(settings, tokenizer, counter)
        write_json_atomic(path, rows.to_dict())
    for mode in modes:
        folder = out / "exports" / mode
        if not (folder / "manifest.json").is_file():
            say(f"exporting {len(rows.keys)} rows in mode {mode}")
            export_mode(settings, mode, rows, folder, counter)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Units: fine-tune, then generate


def _generate(settings: StudySettings, model: str, contexts: tuple[str, ...], out: Path, progress: bool) -> None:
    """Each task's run folder for `model` in `contexts` (resumed where it stopped); one model load for all tasks."""
    from themisto.generation.backends import Sampling, make_backend
    from themisto.generation.runs import RunSettings, backend_options, generate_run

    backend = None
    for task in settings.tasks:
        run = RunSettings(task=task, contexts=contexts, backend="transformers", model=model,
                          sampling=Sampling(max_new_tokens=settings.max_new_tokens), limit=settings.test_limit,
                          max_prompt_tokens=settings.max_prompt_tokens, batch_size=settings.generation_batch,
                          backend_options={"device": settings.device, "dtype": settings.dtype})
        if backend is None:
            backend = make_backend(run.backend, run.model, **backend_options(run))
        generate_run(settings.release, out / task, run, backend=backend, progress=progress)


def run_unit(settings_dict: dict, out: str, mode: str, seed: int) -> dict:
    """Train and generate one unit (a process of its own when units run side by side); returns its record."""
    from themisto.training.finetune import TRAINING_FILE, FinetuneSettings, finetune

    settings = StudySettings(**{**settings_dict, "contexts": tuple(settings_dict["contexts"]),
                                "tasks": tuple(settings_dict["tasks"])})
    folder, unit = Path(out), Unit(mode, seed)
    model = folder / "models" / unit.name
    started = time.perf_counter()
    if not (model / TRAINING_FILE).is_file():
        finetune(FinetuneSettings(
            data=str(folder / "exports" / mode), base_model=settings.model, output=str(model),
            method=settings.method, epochs=settings.epochs, max_steps=settings.max_steps,
            learning_rate=settings.learning_rate, batch_size=settings.batch_size, grad_accum=settings.grad_accum,
            max_length=settings.max_length, seed=seed, device=settings.device),
            overwrite=True)
    trained = json.loads((model / TRAINING_FILE).read_text(encoding="utf-8"))
    if trained["examples"]["over_max_length"]:
        raise StudyError(f"{model}: fine-tuning left out {trained['examples']['over_max_length']} rows as too long; "
                         "every mode must train on the same rows")
    train_seconds = time.perf_counter() - started
    _generate(settings, str(model), eval_contexts(mode), folder / "runs" / unit.name,
              progress=settings.progress and settings.parallel == 1)
    record = {"unit": unit.name, "mode": mode, "seed": seed, "steps": trained["steps"],
              "trained_on": trained["examples"]["trained_on"], "first_loss": trained["first_loss"],
              "final_loss": trained["final_loss"], "train_seconds": trained["train_seconds"],
              "unit_seconds": round(time.perf_counter() - started, 1),
              "generate_seconds": round(time.perf_counter() - started - train_seconds, 1),
              "device": trained["device"], "precision": trained["precision"]}
    (folder / "units").mkdir(exist_ok=True)
    write_json_atomic(folder / "units" / f"{unit.name}.json", record)
    return record


def unit_record(out: Path, unit: Unit) -> dict | None:
    path = out / "units" / f"{unit.name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _run_units(out: Path, settings: StudySettings, todo: list[Unit], say: Callable[[str], None]) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc="study units (fine-tune + generate)", unit="model",
               disable=not settings.progress)
    data = settings.to_dict()
    with bar:
        if settings.parallel == 1 or len(todo) == 1:
            for unit in todo:
                bar.set_postfix_str(unit.name)
                run_unit(data, str(out), unit.mode, unit.seed)
                bar.update(1)
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn: a CUDA context does not survive fork, and each unit loads its own model anyway.
        with ProcessPoolExecutor(max_workers=settings.parallel,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_unit, data, str(out), u.mode, u.seed): u for u in todo}
            for future in as_completed(futures):
                record = future.result()  # a failed unit stops the study (the finished ones are kept)
                say(f"{record['unit']}: {record['steps']} steps, loss {record['first_loss']:.3f} -> "
                    f"{record['final_loss']:.3f}, {record['unit_seconds']} s")
                bar.update(1)


# ---------------------------------------------------------------------------------------------------------------
# The study


def run_study(settings: StudySettings, out: str | Path, *, progress: Callable[[str], None] | None = None) -> dict:
    """Run (or resume) the study into `out` and write its results; returns results.json's content."""
    from themisto.gate import permit
    from themisto.release.folder import open_release

    started = time.perf_counter()
    say = progress or (lambda msg: print(f"study: {msg}", file=sys.stderr, flush=True))
    if settings.execute and not settings.generate_only:
        permit(execute=True)  # refuse before anything is trained
    out = Path(out)
    info = open_release(settings.release)
    for task in settings.tasks:
        info.require(task, "train")
        info.require(task, "test")
    with hold_folder(out, "study folder"):  # one writer: a second study into the folder is refused at once
        return _run(settings, out, info, say, started)


def _run(settings: StudySettings, out: Path, info, say: Callable[[str], None], started: float) -> dict:
    from themisto.generation.backends.hf import prompt_token_counter
    from themisto.study.report import write_report
    from themisto.study.rows import load_tokenizer
    from themisto.study.scores import score_study

    open_study(out, settings, info.content_hash)
    tokenizer = load_tokenizer(settings.model)
    counter = prompt_token_counter(tokenizer)
    units = units_of(settings)
    todo = [u for u in units if unit_record(out, u) is None]
    rows = _rows(out, settings, tokenizer, counter, say, tuple(dict.fromkeys(u.mode for u in todo)))
    say(f"{len(units)} models ({len(settings.contexts)} modes x {settings.seeds} seeds) on {len(rows.keys)} rows "
        f"each; {len(units) - len(todo)} done before")
    _run_units(out, settings, todo, say)
    if not (out / "runs" / BASE_SYSTEM / "done.json").is_file():
        say("the base model in every mode")
        _generate(settings, settings.model, settings.contexts, out / "runs" / BASE_SYSTEM, settings.progress)
        write_json_atomic(out / "runs" / BASE_SYSTEM / "done.json", {"contexts": list(settings.contexts)})
    if settings.generate_only:
        say(f"every model has generated; to score, run the same command without --generate-only (on another "
            f"machine: copy {out} without models/ and exports/)")
        return {"generated": [u.name for u in units], "seconds": round(time.perf_counter() - started, 1)}
    scores = score_study(out, settings, info, units, say)
    records = [unit_record(out, u) for u in units]
    return write_report(out, settings, rows, records, scores, seconds=time.perf_counter() - started)
