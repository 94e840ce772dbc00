"""A run folder on disk: run.json (written whole, by rename) and generations.jsonl (appended line by line).

Resuming reads the lines written so far: a torn last line (the process died mid-write) is cut off and redone; a
corrupt or duplicated line anywhere else stops the run with its line number, and the file is left as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from themisto.errors import InputError
from themisto.resume import LineWriter, ResumeError, read_lines
from themisto.vocabulary import GENERATION_STATUSES

RUN_FILE = "run.json"
GENERATIONS_FILE = "generations.jsonl"
RECORD_KEYS: tuple[str, ...] = ("id", "task", "context", "sample", "prediction", "raw", "status", "reason",
                                "tokens_in", "tokens_out")
# The settings a resumed run must share with the one that started the folder, as (label, path in run.json).
SAME_SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("task", ("task",)), ("contexts", ("contexts",)), ("backend", ("backend",)), ("model", ("model",)),
    ("sampling", ("sampling",)), ("limit", ("limit",)), ("max_prompt_tokens", ("max_prompt_tokens",)),
    ("split", ("split",)), ("templates", ("templates",)), ("backend_options", ("backend_options",)),
)


class RunFolderError(InputError):
    """A run folder that cannot be resumed: other settings or release, or a corrupt line (named by number)."""


def read_run_json(folder: Path) -> dict | None:
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != 1:
        raise RunFolderError(f"{path}: not a run.json of format 1")
    return data


def _get(data: dict, path: tuple[str, ...]):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def check_same_run(existing: dict, new: dict, folder: Path) -> None:
    """Refuse to add generations to a folder written against another release or with other settings."""
    old_hash, new_hash = _get(existing, ("release", "content_hash")), _get(new, ("release", "content_hash"))
    if old_hash != new_hash:
        raise RunFolderError(f"{folder}: written against another release (content hash {old_hash} there, "
                             f"{new_hash} here); use another output folder")
    for label, path in SAME_SETTINGS:
        old, now = _get(existing, path), _get(new, path)
        if old != now:
            raise RunFolderError(f"{folder}: written with {label} = {json.dumps(old)}, this run has "
                                 f"{json.dumps(now)}; refusing to mix (use another output folder)")


def _check_record(record, lineno: int, path: Path) -> tuple[str, str, int]:
    if not isinstance(record, dict) or set(record) != set(RECORD_KEYS):
        raise RunFolderError(f"{path}:{lineno}: not a generation record (expected keys {', '.join(RECORD_KEYS)})")
    if record["status"] not in GENERATION_STATUSES or not isinstance(record["sample"], int):
        raise RunFolderError(f"{path}:{lineno}: bad status or sample ({record['status']!r}, {record['sample']!r})")
    return record["id"], record["context"], record["sample"]


@dataclass
class Existing:
    """What earlier runs left: the records by (id, context, sample), and whether a torn last line was cut off."""

    records: dict[tuple[str, str, int], dict]
    torn_line_dropped: bool = False


def read_generations(folder: Path, *, repair: bool = True) -> Existing:
    """Read generations.jsonl (themisto.resume): a torn last line is cut off (with `repair`), any other bad line
    raises naming its number."""
    path = folder / GENERATIONS_FILE
    try:
        values, torn = read_lines(path, repair=repair)
    except ResumeError as error:
        raise RunFolderError(str(error)) from None
    records: dict[tuple[str, str, int], dict] = {}
    for lineno, record in enumerate(values, start=1):
        key = _check_record(record, lineno, path)
        if key in records:
            raise RunFolderError(f"{path}:{lineno}: a second record for {key}")
        records[key] = record
    return Existing(records, torn_line_dropped=torn)


class GenerationWriter(LineWriter):
    """Appends one record per line and flushes it, so a killed run loses at most the line being written."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / GENERATIONS_FILE)

