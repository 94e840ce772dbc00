"""Resumable output: the one scheme the scorer, replay and generation share.

A long run records the settings that change its results (a header), appends one JSON line per finished unit, and
flushes each line. A later run compares its own header with the recorded one field by field (`settings_difference`
names the first that differs, so the caller can refuse or start over and say why), keeps the complete lines, and cuts
a torn last line (the process died mid-write). Whole files are written to a temp file beside them and renamed.
One process writes a resumable folder or file at a time (`hold_folder`, `hold_file`): a second is refused with the
first one's pid (`FolderBusy`), and a reader of an unfinished one can ask who is writing it (`writer_of`).

>>> settings_difference({"timeout_s": 30, "workspace": "/a"}, {"timeout_s": 30, "workspace": "/b"})
'workspace is "/a" there, "/b" here'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
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


def folder_fingerprint(folder: str | Path | None, *, output: Path | None = None, whole: bool = False) -> dict | None:
    """What identifies an input folder for a resume: a digest of every file's relative path, size and content (all
    of a file up to 2 MiB, its first and last MiB beyond; `whole`: all of every file, where the folder comes from
    someone else and a file changed in its middle must not pass), not its location or times, so look-alike inputs
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
            if size > 2 * _SAMPLED_BYTES and not whole:
                fh.seek(size - _SAMPLED_BYTES)
            for chunk in iter(lambda: fh.read(_SAMPLED_BYTES), b""):  # the rest (one MiB, where not `whole`)
                digest.update(chunk)
                if not whole:
                    break
    return {"files_sha256": digest.hexdigest()}


# ---------------------------------------------------------------------------------------------------------------
# One writer at a time
#
# A folder (or file) a command appends to and resumes from is held by one process: an advisory flock on a lock file,
# which the kernel releases when its holder ends, however it ends (a killed run leaves no stale lock, only the file,
# which the next holder takes over). The holder writes its pid into the file, so a refused writer can name it. A
# clean release removes the file, so a finished folder holds only what its writer wrote.

LOCK_FILE = ".themisto.lock"  # inside a held folder; a held file's lock lies beside it: `.NAME.lock`
# How long a writer that finds the lock taken waits for its holder's pid to be readable and alive (the holder writes
# it right after taking the lock; a reader's check holds a shared lock for microseconds) before it refuses.
_SETTLE_S = 0.5
_held: dict[str, list] = {}  # this process's holds by lock path: [fd, depth] (a nested hold of the same is free)


class FolderBusy(InputError):
    """Another process holds the folder or file this one would write (or is reading unfinished): the message names
    it and the holder's pid; the command line exits 2 with it."""

    def __init__(self, path: str | os.PathLike, pid: int | None, what: str, reading: bool = False) -> None:
        self.path, self.pid, self.what, self.reading = str(path), pid, what, reading
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        then = ("read it when that run has ended" if reading else
                "one writer at a time: wait for that one to end (its lock ends with it), or write elsewhere")
        super().__init__(f"{path}: this {what} is being written by another process ({holder}); {then}")

    def __reduce__(self):  # crosses process boundaries (Ray, multiprocessing) whole
        return type(self), (self.path, self.pid, self.what, self.reading)


def lock_path(path: str | os.PathLike, *, folder: bool = True) -> Path:
    """Where the lock of `path` lies: `LOCK_FILE` inside a folder, `.NAME.lock` beside a file."""
    path = Path(path)
    return path / LOCK_FILE if folder else path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def hold_folder(folder: str | os.PathLike, what: str = "folder", *, create: bool = True) -> Iterator[Path]:
    """Hold `folder` as its one writer while the block runs: taken before anything is written, refused at once with
    `FolderBusy` (holder's pid) when another process holds it. `create` makes a missing folder (and removes it again
    when the block leaves it empty); without it a missing folder is an InputError. A nested hold of the same folder in
    one process is free. Yields the folder.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp, hold_folder(Path(tmp) / "run", "run folder") as run:
    ...     (run / LOCK_FILE).read_text() == f"{os.getpid()}\\n"
    True
    """
    folder = Path(folder)
    made = not folder.exists()
    if made and not create:
        raise InputError(f"{folder}: no such {what}")
    if not made and not folder.is_dir():
        raise InputError(f"{folder}: not a folder (a {what} is one)")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with _hold(lock_path(folder), folder, what):
            yield folder
    finally:
        if made:
            with contextlib.suppress(OSError):  # only while empty: what the block wrote stays
                folder.rmdir()


@contextlib.contextmanager
def hold_file(path: str | os.PathLike, what: str = "output") -> Iterator[Path]:
    """Hold the output file `path` (and the files a run keeps beside it: `.partial`, `.progress.json`) as its one
    writer while the block runs, like `hold_folder`; the lock lies beside it (`lock_path(path, folder=False)`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _hold(lock_path(path, folder=False), path, what):
        yield path


def writer_of(path: str | os.PathLike, *, folder: bool = True) -> int | None:
    """The pid of the process writing `path` now (0 where its pid cannot be read), or None when none is. A reader's
    check: it creates nothing and takes no lock beyond a moment's shared one; a link or a FIFO in the lock file's
    place (an untrusted folder) reads as not held."""
    lock = lock_path(path, folder=folder)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def refuse_if_written(path: str | os.PathLike, what: str = "folder", *, folder: bool = True) -> None:
    """For a reader: FolderBusy (reading) when another process is writing `path` now."""
    pid = writer_of(path, folder=folder)
    if pid is not None:
        raise FolderBusy(path, pid or None, what, reading=True)


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def _hold(lock: Path, shown: Path, what: str) -> Iterator[None]:
    key = os.path.realpath(lock)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    fd = _acquire(lock, shown, what)
    _held[key] = [fd, 1]
    try:
        yield
    finally:
        del _held[key]
        try:
            # Removed while still held, so a writer that opens the path next makes a fresh file (see _acquire).
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _acquire(lock: Path, shown: Path, what: str) -> int:
    """The lock file opened, exclusively locked and holding this pid; FolderBusy when a live process holds it."""
    import time

    deadline = time.monotonic() + _SETTLE_S
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the folder went (a holder that made it removed it empty): make it again
            lock.parent.mkdir(parents=True, exist_ok=True)
            continue
        except OSError as exc:  # a link or something else planted in its place
            raise InputError(f"{lock}: cannot be used as the lock of this {what} ({exc.strerror}); remove it") \
                from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            if _alive(pid) and pid != os.getpid() or time.monotonic() > deadline:
                raise FolderBusy(shown, pid, what) from None
            time.sleep(0.02)  # the holder has not written its pid yet, or a reader is checking: look again
            continue
        # A holder that ended between our open and our lock removed the file: ours is then no one's lock.
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
