"""The values a replay stored, in a folder beside its steps file (`<steps>.values/`): one file per content hash, in the
formats the kernel writes them in (themisto.runtime.agent.formats), and `index.jsonl` with one line per file (hash,
format, type, whether it comes back exactly, bytes, sha256).

A value unchanged across steps, or shared by two trajectories, is one file. The kernel writes into its session's
values folder; after each step the host moves what the snapshot says it wrote here, checking each file's name and
size (the kernel runs the developer's code, so what it leaves there is input), and empties that folder. `themisto
build` checks every file's format as it puts the values in the release (themisto.release.values); a restore reads
them (themisto.replay.restore).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from themisto.bounded import Bounds, iter_json_lines
from themisto.resume import write_text_atomic
from themisto.runtime.agent import formats

INDEX = "index.jsonl"
INDEX_BOUNDS = Bounds(file_bytes=1 << 30, line_bytes=64 << 10, lines=10_000_000, depth=4)
_HASH = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class ValueEntry:
    """One stored value: its content hash (the variables' `hash`), format, type, exactness, size and file sha256."""

    hash: str
    format: str
    type: str
    exact: bool
    bytes: int
    sha256: str

    @property
    def file(self) -> str:
        return formats.file_name(self.hash, self.format)


def values_folder(steps: str | Path) -> Path:
    """The values folder of a steps file."""
    steps = Path(steps)
    return steps.with_name(steps.name + ".values")


class ValueFolder:
    """A replay's values folder: files by content hash and their index, appended to as steps complete."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._entries: dict[str, ValueEntry] | None = None
        self._lock = threading.Lock()  # replays in threads (themisto.replay.workers) add to one folder

    def entries(self) -> dict[str, ValueEntry]:
        """hash -> entry, read once from the index (a torn last line, from a stopped run, is ignored; its file is
        stored again when its value is)."""
        if self._entries is None:
            self._entries = {}
            index = self.path / INDEX
            if index.is_file():
                for line in iter_json_lines(index, INDEX_BOUNDS, torn_tail="report"):
                    try:
                        entry = ValueEntry(**line.value) if line.ended else None
                    except TypeError:
                        entry = None
                    if entry is not None and _HASH.match(str(entry.hash)) and formats.named(entry.format) is not None and \
                            (self.path / entry.file).is_file():
                        self._entries[entry.hash] = entry
        return self._entries

    def exact_since(self, count: int) -> tuple[list[str], int]:
        """The hashes of the exactly stored values after the first `count` entries (in the order they were added),
        and how many entries there are now: what a kernel told about the first `count` has yet to hear of."""
        with self._lock:
            added = list(self.entries().values())
        return [entry.hash for entry in added[count:] if entry.exact], len(added)

    def entry(self, digest: str) -> ValueEntry | None:
        return self.entries().get(digest)

    def file(self, entry: ValueEntry) -> Path:
        return self.path / entry.file

    def take(self, source: Path, written: Iterable) -> list[ValueEntry]:
        """Move the files a snapshot wrote (`written`: its StoredValue records) from the kernel's folder `source`
        into this folder, and empty `source`; a file whose name, format or size is not what the record says is
        dropped. Returns the entries added."""
        added = []
        for record in written:
            if not (_HASH.match(record.hash) and formats.named(record.format) is not None):
                continue
            src = source / formats.file_name(record.hash, record.format)
            if record.hash in self.entries() or not src.is_file() or src.is_symlink() or \
                    src.stat().st_size != record.bytes:
                continue
            data = src.read_bytes()
            entry = ValueEntry(record.hash, record.format, record.type, bool(record.exact), record.bytes,
                               hashlib.sha256(data).hexdigest())
            if self._add(entry, data):
                added.append(entry)
        for leftover in source.iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        return added

    def add_bytes(self, entry: ValueEntry, data: bytes) -> None:
        """Store a value that came from elsewhere (a Ray worker's folder), checked against its entry's sha256."""
        if hashlib.sha256(data).hexdigest() == entry.sha256 and _HASH.match(entry.hash) and formats.named(entry.format) is not None:
            self._add(entry, data)

    def _add(self, entry: ValueEntry, data: bytes) -> bool:
        """Write the file whole (temp name, then rename) and its index line; False when the hash is there already."""
        with self._lock:
            entries = self.entries()
            if entry.hash in entries:
                return False
            self.path.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path / entry.file, data)
            # One write per line with O_APPEND: replays of other processes may append to the same index.
            line = (json.dumps(asdict(entry), sort_keys=True) + "\n").encode("utf-8")
            fd = os.open(self.path / INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            entries[entry.hash] = entry
            return True
