"""The pointer list, owned here: per trajectory a build could not redistribute, where its inputs lie and what
Themisto made of them, so that anyone can fetch them again (`themisto collect`) and rebuild the same trajectory.

A JSON-lines file: a header (`format`, `version`, what it is), then one `Pointer` per trajectory: the repository
(`owner/name`), commit, the history file's repository path, the session number, the file's git blob id and the hash
of the session's inputs (`themisto.ingest.trajectory.inputs_sha256`), its licence; and what Themisto made: the split,
the cut before replay and by replay, the steps kept and the replay's causes. A JuNE log's pointer names its file
and sha256 instead (no repository: their redistribution status is unclear). No code and no output is in it; it names
repositories, as it must to be fetched, so it is written beside the releases, never inside one and never committed.

>>> git_blob_id(b"a\\n")
'78981922613b2afb6025042ff6bd878ac1994e85'
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

from themisto.bounded import BoundError, Bounds, iter_json_lines
from themisto.errors import InputError

FORMAT = "themisto-pointers"
VERSION = 1
_BOUNDS = Bounds(file_bytes=256 << 20, line_bytes=1 << 20, lines=2_000_000, depth=8, items=50_000_000)
NOTE = ("names public repositories and their files: keep it beside the releases, never inside a release, never in "
        "a commit; `themisto collect` fetches what it points at")


class PointerError(InputError):
    """A pointer list that cannot be read or written; the message names the file and line."""


@dataclass(frozen=True)
class Pointer:
    """Where one trajectory's inputs lie and what Themisto made of them."""

    id: str  # the trajectory id (the release's kernel_id)
    source: str  # ipython-history, ipython-log, june-log, june-table, notebook
    inputs_sha256: str  # the session's inputs, whole and in order
    inputs: int
    repository: str | None = None  # owner/name
    commit: str | None = None
    path: str | None = None  # the history database or log, at its repository path
    session: int | None = None
    blob: str | None = None  # git blob id of that file: at the commit, or as the corpus stored it (`blob_of`)
    blob_of: str | None = None  # "commit" or "stored"
    file: str | None = None  # a JuNE log or table as ingest named it
    file_sha256: str | None = None
    licence: str | None = None  # SPDX id, "none" or "other"
    split: str | None = None
    steps: int = 0  # steps the full release keeps
    cut: dict | None = None  # {cause, at} before replay (`themisto.ingest.session_checks`)
    replay_causes: dict[str, int] = field(default_factory=dict)  # steps by replay cause (`themisto.replay.health`)

    @property
    def fetchable(self) -> bool:
        return bool(self.repository and self.commit and self.path)


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_pointers(path: Path, pointers: Iterable[Pointer], *, about: dict | None = None) -> int:
    """Write the list whole (a temp file, then a rename); the number of pointers written."""
    from themisto.resume import write_text_atomic

    pointers = sorted(pointers, key=lambda p: p.id)
    header = {"format": FORMAT, "version": VERSION, "note": NOTE, **(about or {})}
    lines = [json.dumps(header, sort_keys=True)] + [json.dumps(asdict(p), sort_keys=True) for p in pointers]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(path), "\n".join(lines) + "\n")
    return len(pointers)


def read_pointers(path: Path) -> tuple[dict, list[Pointer]]:
    """(header, pointers) of a list, read within bounds; PointerError naming the file and line."""
    from themisto.jsonrecords import from_dict

    header, pointers = None, []
    try:
        for line in iter_json_lines(path, _BOUNDS):
            if header is None:
                if not isinstance(line.value, dict) or line.value.get("format") != FORMAT:
                    raise PointerError(f"{path}:{line.number}: not a pointer list (its first line names no "
                                       f"format {FORMAT!r})")
                if line.value.get("version") != VERSION:
                    raise PointerError(f"{path}:{line.number}: version {line.value.get('version')!r}, this Themisto "
                                       f"reads {VERSION}")
                header = line.value
                continue
            if not isinstance(line.value, dict) or not isinstance(line.value.get("id"), str):
                raise PointerError(f"{path}:{line.number}: expected a pointer object with an id")
            try:
                pointers.append(from_dict(Pointer, line.value))
            except (TypeError, ValueError) as exc:
                raise PointerError(f"{path}:{line.number}: not a pointer ({exc})") from None
    except BoundError as exc:
        raise PointerError(str(exc)) from None
    if header is None:
        raise PointerError(f"{path}: empty (a pointer list starts with its header line)")
    return header, pointers
