"""What `themisto collect` takes from one commit of a repository, and what it refuses, one line each.

Taken: the IPython history databases and `%logstart` logs (`SESSION_FILES`), the files their sessions read (found by
the project's own read analysis, `themisto.ingest.file_uses`, each literal matched to the tree by
exact path, by path suffix or by file name), the repository's notebooks (a session is started beside the notebook its
inputs match) and its licence file. Refused, each in one line naming the path: a symlink (never followed; the line
says when it points out of the repository), a submodule, a Git LFS pointer where data was expected, a file named
like a key or credential file, and anything past a bound (file size, the repository's budget).

A history database is never copied as committed: it is read by the project's read-only reader
(`themisto.ingest.ipython_history`: its schema refused when hostile, each input's credentials redacted by the secret
scanner and personal data masked) and written again as a fresh database of IPython's schema holding what was read,
so re-reading it gives the same sessions. Logs and text files are passed through the secret scanner; a binary file
(a spreadsheet, a pickle) is kept as it is, within its bound.
"""

from __future__ import annotations

import posixpath
import re
import sqlite3
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from themisto.ingest.git_fetch import GitRefused, Repository, TreeEntry

HISTORY_FILE = re.compile(r"(?:^|/)history\.sqlite$")
LOG_FILE = re.compile(r"(?:^|/)ipython_log\.py$|(?:^|/)\.logs/[^/]+\.py$")
SESSION_FILES = re.compile(f"{HISTORY_FILE.pattern}|{LOG_FILE.pattern}")
LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
CREDENTIAL_FILE = re.compile(r"(?:^|/)(?:id_(?:rsa|dsa|ecdsa|ed25519)|\.env|\.netrc|\.pgpass|credentials(?:\.json)?"
                             r"|[^/]*\.(?:pem|key|p12|pfx|keystore))$", re.IGNORECASE)
_MATCHES_PER_LITERAL = 4  # tree files one literal may name (a bare `data.csv` may be in many folders)


@dataclass(frozen=True)
class FileBounds:
    """How much of a repository is taken: per file and in all."""

    session_file_bytes: int = 64 << 20  # a history database or log
    file_bytes: int = 2 << 20  # a file the sessions read
    notebook_bytes: int = 512 << 10
    repository_bytes: int = 5 << 20  # everything kept under files/


@dataclass
class Taken:
    """What one commit gave: the repo.json lists, the refusals, the sessions' inputs and the redactions."""

    histories: list[dict] = field(default_factory=list)
    logs: list[dict] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    omitted: list[dict] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    redactions: Counter = field(default_factory=Counter)
    kept_bytes: int = 0


def session_kind(path: str) -> str | None:
    """"history" or "logs" (the corpus folder a session file goes to), or None."""
    return "history" if HISTORY_FILE.search(path) else "logs" if LOG_FILE.search(path) else None


def entry_refusal(entry: TreeEntry, data: bytes | None = None) -> str | None:
    """Why an entry is not taken (None: it may be), from its kind and, for a symlink, its target (`data`)."""
    if entry.path.startswith("/") or any(p in ("", ".", "..", ".git") for p in entry.path.split("/")):
        return "a path that is no plain repository path"
    if entry.is_submodule:
        return "a submodule (not followed)"
    if entry.is_symlink:
        target = (data or b"").decode("utf-8", "replace")
        where = posixpath.normpath(posixpath.join(posixpath.dirname(entry.path), target))
        out = target.startswith("/") or where == ".." or where.startswith("../")
        return "a symlink pointing out of the repository (not followed)" if out else "a symlink (not followed)"
    if CREDENTIAL_FILE.search(entry.path):
        return "named like a key or credential file"
    if data is not None and data.startswith(LFS_POINTER):
        return "a Git LFS pointer, not the data"
    return None


def write_history(path: Path, sessions) -> None:
    """A fresh history database of IPython's schema holding `sessions` (`HistorySession`s as read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    try:
        con.executescript("CREATE TABLE sessions (session integer primary key autoincrement, start timestamp, "
                          "end timestamp, num_cmds integer, remark text);"
                          "CREATE TABLE history (session integer, line integer, source text, source_raw text, "
                          "PRIMARY KEY (session, line));"
                          "CREATE TABLE output_history (session integer, line integer, output text, "
                          "PRIMARY KEY (session, line));")
        for s in sessions:
            con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                        (s.session, s.start, s.end, len(s.inputs), s.remark))
            con.executemany("INSERT INTO history VALUES (?, ?, ?, ?)",
                            [(s.session, i.line, i.code, i.code) for i in s.inputs])
            con.executemany("INSERT INTO output_history VALUES (?, ?, ?)",
                            [(s.session, i.line, i.output) for i in s.inputs if i.output is not None])
        con.commit()
    finally:
        con.close()


def take_session_file(git: Repository, entry: TreeEntry, into: Path, bounds: FileBounds, taken: Taken) -> None:
    """Take one history database or log into `into/history/` or `into/logs/` (named by its path, `/` as `__`), its
    inputs into `taken.codes`; or refuse it in one line."""
    from themisto.ingest.ipython_history import HistoryRefused, read_history
    from themisto.ingest.ipython_log import read_logstart
    from themisto.ingest.secrets import scrub

    kind = session_kind(entry.path)
    try:
        data = git.blob(entry.oid, bounds.session_file_bytes) if not entry.is_submodule else None
    except GitRefused:
        return _refuse(taken, entry, f"{entry.size:,} bytes, more than {bounds.session_file_bytes:,} (bound: file "
                                     "size)")
    why = entry_refusal(entry, data)
    if why is not None:
        return _refuse(taken, entry, why)
    stored = into / kind / entry.path.replace("/", "__")
    stored.parent.mkdir(parents=True, exist_ok=True)
    try:
        if kind == "history":
            with tempfile.TemporaryDirectory(prefix="themisto-collect-") as tmp:
                raw = Path(tmp) / "history.sqlite"
                raw.write_bytes(data)
                read = read_history(raw)
            write_history(stored, read.sessions)
        else:
            stored.write_text(scrub(data.decode("utf-8"), taken.redactions), encoding="utf-8")
            read = read_logstart(stored)
    except (HistoryRefused, UnicodeDecodeError) as exc:
        stored.unlink(missing_ok=True)
        problem = exc.problem if isinstance(exc, HistoryRefused) else "not UTF-8 text"
        return _refuse(taken, entry, problem)
    taken.redactions.update(read.redactions)
    (taken.histories if kind == "history" else taken.logs).append({
        "path": entry.path, "stored": f"{kind}/{stored.name}", "blob": entry.oid, "sessions": len(read.sessions),
        "inputs": sum(len(s.inputs) for s in read.sessions)})
    taken.codes += [i.code for s in read.sessions for i in s.inputs]


def _refuse(taken: Taken, entry: TreeEntry, why: str) -> None:
    taken.refusals.append(f"{entry.path}: refused: {why}")


def read_paths(codes: Iterable[str]) -> list[str]:
    """The files the sessions' inputs name, by the project's read analysis (`themisto.ingest.file_uses`: every
    data-file literal it finds, read, written or of unknown use)."""
    from themisto.ingest.file_uses import IMPORT, MAKES, file_uses

    found: dict[str, None] = {}
    for uses in file_uses(list(codes)):
        found.update(dict.fromkeys(u.path for u in uses if u.path and u.kind not in (IMPORT, MAKES)))
    return list(found)


def matching_entries(literal: str, tree: list[TreeEntry]) -> list[TreeEntry]:
    """The tree's files a path literal may name: its exact path, a path ending with it, else its file name."""
    parts = [p for p in literal.split("/") if p not in ("", ".", "..")]
    if not parts:
        return []
    suffix = "/".join(parts)
    exact = [e for e in tree if e.path == suffix or e.path.endswith("/" + suffix)]
    named = [e for e in tree if posixpath.basename(e.path) == parts[-1]] if not exact else []
    return (exact or named)[:_MATCHES_PER_LITERAL]


def take_file(git: Repository, entry: TreeEntry, why: str, files: Path, bounds: FileBounds, taken: Taken) -> None:
    """Keep one file of the repository under `files/` at its path (credentials redacted where it is text), or omit
    or refuse it, within its bound and the repository's budget."""
    from themisto.ingest.secrets import redact_secrets

    cap = bounds.notebook_bytes if why == "notebook" else bounds.file_bytes
    refused = entry_refusal(entry, git.blob(entry.oid, 4096) if entry.is_symlink else None)
    if refused is not None:
        return _refuse(taken, entry, refused)
    if entry.size is not None and entry.size > cap:
        taken.omitted.append({"path": entry.path, "bytes": entry.size, "why": f"{why}: over the size cap"})
        return _refuse(taken, entry, f"{entry.size:,} bytes, more than {cap:,} (bound: file size)")
    if taken.kept_bytes + (entry.size or 0) > bounds.repository_bytes:
        taken.omitted.append({"path": entry.path, "bytes": entry.size, "why": f"{why}: over the repository's cap"})
        return None  # counted in omitted[]: the budget is spent, not the file refused
    data = git.blob(entry.oid, cap)
    if data.startswith(LFS_POINTER):
        taken.omitted.append({"path": entry.path, "bytes": entry.size, "why": f"{why}: a Git LFS pointer"})
        return _refuse(taken, entry, "a Git LFS pointer, not the data")
    try:
        text, found = redact_secrets(data.decode("utf-8"))
        taken.redactions.update(found)
        data = text.encode("utf-8")
    except UnicodeDecodeError:
        pass  # binary: kept as it is, within its bound
    target = files / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    taken.kept.append({"path": entry.path, "bytes": len(data), "why": why})
    taken.kept_bytes += len(data)
