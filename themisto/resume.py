"""Resumable output: the one scheme the scorer, replay and generation share.

A long run records the settings that change its results (a header), appends one JSON line per finished unit, and
flushes each line. A later run compares its own header with the recorded one field by field (`settings_difference`
names the first that differs, so the caller can refuse or start over and say why), keeps the complete lines, and cuts
a torn last line (the process died mid-write). Whole files are written to a temp file beside them and renamed.

>>> settings_difference({"timeout_s": 30, "workspace": "/a"}, {"timeout_s": 30, "workspace": "/b"})
'workspace is "/a" there, "/b" here'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping

from themisto.errors import InputError

_ABSENT = object()


class ResumeError(InputError):
    """An output file that cannot be resumed: a corrupt line (named by file and number) or other settings."""


def settings_difference(recorded: Mapping, current: Mapping, *, prefix: str = "") -> str | None:
    """The first setting (dotted path, in sorted order) whose value differs, as a sentence; None when all agree."""
    for key in sorted(set(recorded) | set(current), key=str):
        old, new = recorded.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            found = settings_difference(old, new, prefix=f"{prefix}{key}.")
            if found is not None:
                return found
        elif _plain(old) != _plain(new):
            return f"{prefix}{key} is {_shown(old)} there, {_shown(new)} here"
    return None


def _plain(value: Any) -> Any:
    """Tuples and lists compare alike (a header read back from JSON has lists where the run had tuples)."""
    return value if value is _ABSENT else json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    return "unset" if value is _ABSENT else json.dumps(value, default=str, ensure_ascii=False)


def read_lines(path: Path, *, repair: bool = True) -> tuple[list[Any], bool]:
    """The JSON values of a JSONL file's complete lines, and whether a torn last line was found (and cut off, with
    `repair`). A corrupt complete line raises ResumeError naming the file and line; the file is left as it is."""
    if not path.exists():
        return [], False
    data = path.read_bytes()
    complete, _, tail = data.rpartition(b"\n")
    values = []
    # Strict: a blank line is corrupt too, so the i-th value is line i + 1 (callers name lines by number).
    for lineno, raw in enumerate(complete.split(b"\n") if complete or data.startswith(b"\n") else [], start=1):
        try:
            values.append(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ResumeError(f"{path}:{lineno}: corrupt line (not JSON); the file is left as it is — remove or "
                              "fix that line, then rerun") from None
    if tail and repair:
        with path.open("r+b") as fh:
            fh.truncate(len(data) - len(tail))
    return values, bool(tail)


class LineWriter:
    """Appends one JSON value per line and flushes it, so a killed run loses at most the line being written."""

    def __init__(self, path: Path, *, sort_keys: bool = False) -> None:
        self.path = Path(path)
        self._sort_keys = sort_keys
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, value: Any) -> None:
        self._fh.write(json.dumps(value, ensure_ascii=False, sort_keys=self._sort_keys) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh.closed:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()

    def __enter__(self) -> LineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_text_atomic(path: Path, text: str | bytes) -> None:
    """Write `text` (UTF-8) or bytes to `path` whole: a temp file beside it, then a rename; the one atomic writer
    (a reader never sees half a file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def folder_written_whole(dest: Path) -> Iterator[Path]:
    """A fresh folder beside `dest` to write into; when the block ends it replaces `dest` whole (the old one is moved
    aside first, so `dest` is never a mix of old and new files); when the block raises, it is removed and `dest` is
    left as it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; what we publish is meant to be read
    try:
        yield tmp
        if not dest.exists():
            os.replace(tmp, dest)
            return
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / "previous")
        try:
            os.replace(tmp, dest)
        except BaseException:
            os.replace(old / "previous", dest)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON to `path` whole (temp file, then rename)."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


# Bytes read from the head and from the tail of each input file for its fingerprint: every byte of a small file.
_SAMPLED_BYTES = 1 << 20


def folder_fingerprint(folder: str | Path | None, *, output: Path | None = None) -> dict | None:
    """What identifies an input folder for a resume: a digest of every file's relative path, size and content (all
    of a file up to 2 MiB, its first and last MiB beyond), not its location or times, so look-alike inputs
    regenerated into a fresh folder from the same seed fingerprint alike. The run's own `output` files (it and its
    `.partial`, `.progress.json`, temp files and folders beside it, such as a replay's `.values/`) are left out when
    they lie inside. None for no folder."""
    if folder is None:
        return None
    root = Path(folder).resolve()
    own = None if output is None else Path(output).resolve()

    def is_input(path: Path) -> bool:
        if not path.is_file():
            return False
        if own is None or own.parent not in path.parents:
            return True
        beside = path.relative_to(own.parent).parts[0]  # the file itself, or the folder beside the output it is in
        return not beside.lstrip(".").startswith(own.name)

    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if is_input(p)):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
        with path.open("rb") as fh:
            digest.update(fh.read(_SAMPLED_BYTES))
            if size > 2 * _SAMPLED_BYTES:
                fh.seek(size - _SAMPLED_BYTES)
            digest.update(fh.read(_SAMPLED_BYTES))
    return {"files_sha256": digest.hexdigest()}
