"""The one door to git: a stranger's repository fetched into a private bare repository and read as data, never
checked out.

git runs as a subprocess with a time limit, no terminal prompt, no credential helper, no hooks (`core.hooksPath` is an
empty folder), no system or user configuration, and the one transport the user's base URL names
(`GIT_ALLOW_PROTOCOL`: `file` for local bare repositories, as the tests use, else `https`); submodules are never
fetched or followed. Nothing is checked out: files are read as blobs of the commit's tree (`ls-tree`), so a symlink
is a blob holding its target and a submodule an entry of kind `commit`, which the collector refuses by name, and a
path that could climb out of a folder (`..`, `.git`) is refused before anything is written at it. A fetch is bounded
by its time and, once done, by the size of what it brought.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from themisto.errors import InputError

_SHA = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+$")
SYMLINK_MODE = "120000"


class GitRefused(InputError):
    """A repository that could not be fetched or read within bounds; one line naming it and why."""


@dataclass(frozen=True)
class TreeEntry:
    """One entry of a commit's tree: path, mode (`100644`, `120000` a symlink, `160000` a submodule), kind (`blob`
    or `commit`), object id and size in bytes (None for a submodule)."""

    path: str
    mode: str
    kind: str
    oid: str
    size: int | None

    @property
    def is_symlink(self) -> bool:
        return self.mode == SYMLINK_MODE

    @property
    def is_submodule(self) -> bool:
        return self.kind == "commit"


def repository_url(base_url: str, repo: str) -> str:
    """The URL of `owner/name` under a base URL (`https://github.com`, `file:///srv/git`); a name that is no
    `owner/name` is refused (it could climb out of the base)."""
    if not _REPO.match(repo) or ".." in repo:
        raise GitRefused(f"{repo!r}: not an owner/name")
    return base_url.rstrip("/") + "/" + repo


def _protocol(base_url: str) -> str:
    scheme = base_url.split("://", 1)[0].lower() if "://" in base_url else ""
    if scheme not in ("https", "file"):
        raise GitRefused(f"base URL {base_url!r}: only https:// or file:// (local bare repositories) is fetched from")
    return scheme


class Repository:
    """A private bare repository holding what was fetched from one URL; read it with `tree` and `blob`."""

    def __init__(self, folder: Path, url: str, timeout_s: float) -> None:
        self.folder, self.url, self.timeout_s = folder, url, timeout_s
        self._hooks = folder / "no-hooks"
        self._env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder),
                     "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "SSH_ASKPASS": "true",
                     "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
                     "GIT_ALLOW_PROTOCOL": _protocol(url), "GIT_LFS_SKIP_SMUDGE": "1", "LC_ALL": "C"}

    def git(self, *args: str, what: str, timeout_s: float | None = None) -> bytes:
        """Run `git ARGS` in the bare repository; GitRefused naming `what` on failure or past the time limit."""
        config = ["-c", f"core.hooksPath={self._hooks}", "-c", "credential.helper=", "-c", "core.askPass=true",
                  "-c", "fetch.recurseSubmodules=false", "-c", "submodule.recurse=false",
                  "-c", "protocol.allow=never", "-c", f"protocol.{_protocol(self.url)}.allow=always",
                  "-c", "core.symlinks=false"]
        try:
            done = subprocess.run(["git", "--git-dir", str(self.folder / "git"), *config, *args], env=self._env,
                                  stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout_s or self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise GitRefused(f"{what}: git took longer than {timeout_s or self.timeout_s:g} s") from None
        if done.returncode != 0:
            last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["(no message)"])[-1]
            raise GitRefused(f"{what}: git {args[0]} failed: {last[:300]}")
        return done.stdout

    def fetch(self, commit: str | None, *, max_bytes: int) -> str:
        """Fetch `commit` alone (depth 1) or, with None, the default branch's whole history; the commit fetched. A
        fetch that brought more than `max_bytes` is refused."""
        if commit is not None and not _SHA.match(commit):
            raise GitRefused(f"{self.url}: {commit!r} is no full commit id")
        if commit is not None:
            self.git("fetch", "--no-tags", "--depth=1", self.url, commit, what=self.url)
        else:
            self.git("fetch", "--no-tags", self.url, "HEAD", what=self.url)
        size = sum(p.stat().st_size for p in (self.folder / "git" / "objects").rglob("*") if p.is_file())
        if size > max_bytes:
            raise GitRefused(f"{self.url}: {size:,} bytes fetched, more than {max_bytes:,} (bound: repository size)")
        return commit or self.git("rev-parse", "FETCH_HEAD", what=self.url).decode().strip()

    def tree(self, commit: str, limit: int) -> list[TreeEntry]:
        """Every entry of the commit's tree, recursively, at most `limit` (the rest left out: a tree that large is
        read in part)."""
        out = self.git("ls-tree", "-r", "-l", "-z", "--full-tree", commit, what=self.url)
        entries = []
        for item in out.split(b"\0"):
            if not item:
                continue
            if len(entries) >= limit:
                break
            meta, _, path = item.partition(b"\t")
            mode, kind, oid, size = meta.decode().split()
            entries.append(TreeEntry(path.decode("utf-8", "replace"), mode, kind, oid,
                                     None if size == "-" else int(size)))
        return entries

    def blob(self, oid: str, max_bytes: int) -> bytes:
        """A blob's bytes, refused past `max_bytes` (asked of git before it is read)."""
        size = int(self.git("cat-file", "-s", oid, what=self.url).decode().strip())
        if size > max_bytes:
            raise GitRefused(f"{self.url}: blob {oid[:12]} is {size:,} bytes, more than {max_bytes:,}")
        return self.git("cat-file", "blob", oid, what=self.url)

    def deletions(self, commit: str, names: re.Pattern) -> list[tuple[str, str]]:
        """(deleting commit, path) of each file whose path matches `names` and that a commit before `commit` deleted,
        newest first."""
        out = self.git("log", "--no-renames", "--diff-filter=D", "--name-only", "-z", "--format=%x01%H", commit,
                       what=self.url).decode("utf-8", "replace")
        found = []
        for block in out.split("\x01")[1:]:
            parts = [part.strip("\n") for part in block.split("\0")]
            found += [(parts[0], path) for path in parts[1:] if path and names.search(path)]
        return found

    def parent(self, commit: str) -> str | None:
        out = self.git("rev-list", "--parents", "-n", "1", commit, what=self.url).decode().split()
        return out[1] if len(out) > 1 else None


@contextlib.contextmanager
def opened(base_url: str, repo: str, timeout_s: float) -> Iterator[Repository]:
    """A fresh private bare repository for `owner/name` under `base_url`, removed when the block ends."""
    url = repository_url(base_url, repo)
    _protocol(url)
    folder = Path(tempfile.mkdtemp(prefix="themisto-git-"))
    try:
        (folder / "no-hooks").mkdir()
        repository = Repository(folder, url, timeout_s)
        repository.git("init", "--quiet", "--bare", str(folder / "git"), what=url)
        yield repository
    finally:
        shutil.rmtree(folder, ignore_errors=True)
