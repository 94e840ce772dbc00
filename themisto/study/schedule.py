"""Running a study's units in run order, in turn or side by side (processes of their own), within a time budget.

A unit starts only when its estimated time fits what is left of `--budget-s`: the plan's estimate
(themisto.study.plan) times the slowdown of sharing the device, corrected once units of this run have finished by how
long they took against their estimate. A unit that started runs to its end (units/<unit>.json is written when it is
whole), so a study stopped by its budget, or killed, leaves whole units only; a later run, here or on another
machine, resumes with the next.

>>> Clock(started=0.0, budget_s=100.0, slowdown=2.0).fits(40.0, now=10.0), Clock(0.0, 100.0, 2.0).fits(50.0, now=10.0)
(True, False)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from themisto.study.settings import StudySettings


@dataclass
class Clock:
    """The budget: when the study started, its seconds, and how much longer than planned a unit takes here."""

    started: float
    budget_s: float | None
    slowdown: float
    ratios: list[float] = field(default_factory=list)

    def fits(self, planned_s: float, *, now: float | None = None) -> bool:
        if self.budget_s is None:
            return True
        now = time.perf_counter() if now is None else now
        return now - self.started + planned_s * self.factor <= self.budget_s

    @property
    def factor(self) -> float:
        return sum(self.ratios) / len(self.ratios) if self.ratios else self.slowdown

    def finished(self, planned_s: float, took_s: float) -> None:
        if planned_s > 0:
            self.ratios.append(took_s / planned_s)


@dataclass(frozen=True)
class UnitJobs:
    """What runs a unit, the base model and a mode's export: module-level functions of `themisto.study.run` (a
    process of its own pickles them by name), handed down so that this module need not import the one that calls it.
    Each is called with the settings as a dict, the release's handle (it pickles as its path and content hash), the
    study folder, and the job's own arguments."""

    run_base: Callable
    run_unit: Callable
    export: Callable


def _name(job) -> str:
    from themisto.study.scores import BASE_SYSTEM

    return BASE_SYSTEM if job is None else job.name


def _call(job, jobs: UnitJobs):
    """The function and arguments that run `job` (a Unit, or None for the base model)."""
    return (jobs.run_base, ()) if job is None else (jobs.run_unit, (job.mode, job.seed))


def run_work(out: Path, settings: StudySettings, info, rows, todo: list, say: Callable[[str], None],
             started: float, export: Callable[[str], None], jobs: UnitJobs) -> list[str]:
    """Run `todo` (Units, None for the base model) in order within the budget, each mode's export written before
    its first unit starts; returns the names of those the budget left unstarted."""
    from tqdm import tqdm

    from themisto.study.plan import plan_for

    plan = plan_for(settings, rows, info, out)
    planned = {u.name: u.seconds for u in plan.units}
    parallel = min(settings.parallel, max(len(todo), 1))
    # Side by side each unit shares the device: it takes `parallel / speedup` times its time alone.
    clock = Clock(started, settings.budget_s, slowdown=parallel / plan.speedup if parallel > 1 else 1.0)
    bar = tqdm(total=len(todo), desc="study units (fine-tune + generate)", unit="unit", disable=not settings.progress)
    with bar:
        if parallel == 1:
            return _in_turn(out, settings, info, todo, planned, clock, say, bar, export, jobs)
        return _side_by_side(out, settings, info, todo, planned, clock, say, bar, parallel, jobs)


def _report(record: dict, say: Callable[[str], None]) -> None:
    if record.get("steps") is not None:
        say(f"{record['unit']}: {record['steps']} steps, loss {record['first_loss']:.3f} -> "
            f"{record['final_loss']:.3f}, {record['prompts']} prompts, {record['unit_seconds']} s")
    else:
        say(f"{record['unit']}: {record['prompts']} prompts, {record['unit_seconds']} s")


def _in_turn(out: Path, settings: StudySettings, info, todo: list, planned: dict, clock: Clock, say, bar,
             export, jobs: UnitJobs) -> list[str]:
    data = settings.to_dict()
    for k, job in enumerate(todo):
        if not clock.fits(planned[_name(job)]):
            return [_name(j) for j in todo[k:]]
        bar.set_postfix_str(_name(job))
        if job is not None:
            export(job.mode)
        function, args = _call(job, jobs)
        record = function(data, info, str(out), *args)
        clock.finished(planned[_name(job)], record["unit_seconds"])
        _report(record, say)
        bar.update(1)
    return []


def _side_by_side(out: Path, settings: StudySettings, info, todo: list, planned: dict, clock: Clock, say, bar,
                  parallel: int, jobs: UnitJobs) -> list[str]:
    import multiprocessing
    import os
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    data, pending, running = settings.to_dict(), list(todo), {}
    modes = list(dict.fromkeys(job.mode for job in todo if job is not None))
    spawn = multiprocessing.get_context("spawn")  # a CUDA context does not survive fork
    import sys

    main = sys.modules.get("__main__")
    if main is not None and not hasattr(main, "__spec__"):
        # spawn reads `__main__.__spec__` to re-import the caller's main module; a host that made its own `__main__`
        # (an embedding interpreter, a test runner's doctest) has none, and spawn would fail on it.
        try:
            main.__spec__ = None
        except (AttributeError, TypeError):
            pass  # an object that takes no attribute: spawn says what it lacks
    # Every mode's export is written at once, beside the units (a mode's first unit waits for its own only).
    with ProcessPoolExecutor(max_workers=max(1, min(len(modes), (os.cpu_count() or 2) // 2)), mp_context=spawn) as \
            exporting, ProcessPoolExecutor(max_workers=parallel, mp_context=spawn) as pool:
        exports = {mode: exporting.submit(jobs.export, data, info, str(out), mode) for mode in modes}
        while pending or running:
            while pending and len(running) < parallel and clock.fits(planned[_name(pending[0])]):
                job = pending.pop(0)
                if job is not None:
                    say(f"{job.name}: its export ({exports[job.mode].result()})")
                function, args = _call(job, jobs)
                running[pool.submit(function, data, info, str(out), *args)] = job
            if not running:
                break  # the budget admits no more
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                job = running.pop(future)
                record = future.result()  # a failed unit stops the study (the finished ones are kept)
                clock.finished(planned[_name(job)], record["unit_seconds"])
                _report(record, say)
                bar.update(1)
    return [_name(j) for j in pending]
