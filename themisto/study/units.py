"""The units of a study and their records in its folder: which (mode, seed) models there are, the order they run
in, and which are finished (`units/<unit>.json`, the base model's `runs/base/done.json`). Below `run`, `plan` and
`schedule`, which all read them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from themisto.study.scores import BASE_SYSTEM
from themisto.study.settings import StudySettings

STUDY_FILE, ROWS_FILE = "study.json", "rows.json"


@dataclass(frozen=True)
class Unit:
    """One (mode, seed): a model trained with `mode` prompts from data order `seed`."""

    mode: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.mode}-s{self.seed}"


def units_of(settings: StudySettings) -> list[Unit]:
    """Every (mode, seed), in the order that answers the question soonest: seed 0 of every mode, then seed 1, ..."""
    return [Unit(mode, seed) for seed in range(settings.seeds) for mode in settings.contexts]


def work_order(settings: StudySettings) -> list[Unit | None]:
    """The units in run order, None standing for the base model: after seed 0 of every mode (the scores need its
    runs; with them, seed 0 alone answers the question)."""
    units = units_of(settings)
    first = len(settings.contexts)
    return [*units[:first], None, *units[first:]]


def unit_record(out: Path, unit: Unit | None) -> dict | None:
    """A finished unit's record (None: the base model's), or None while it is not whole."""
    if unit is None:
        return {"unit": BASE_SYSTEM} if base_done(out) else None
    path = out / "units" / f"{unit.name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def base_done(out: Path) -> bool:
    return (out / "runs" / BASE_SYSTEM / "done.json").is_file()


def unit_records(out: Path) -> list[dict]:
    """Every record under units/ (the base model's too): what the plan measures throughput from."""
    folder = out / "units"
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
