"""Static checks of a session from the wild before it is replayed: what it imports, reads and needs.

A session committed to a public repository ran on its developer's machine, with packages, files, a network and
sometimes a GPU that a replay here lacks. Replaying a few thousand sessions takes hours on two cores, so each input is
read (never run) first, and the session is cut at its first input that needs what the replay cannot give: a package
the kernel environment lacks, a file its repository lists but the corpus did not keep, a URL, a GPU, Python 2
syntax, or a program that waits for a person at a terminal (`!vim`, `!less`, `%edit`). What replay then finds on its
own (`themisto.replay.health`) cuts it further.

An input file is absent where a string literal names a file the repository lists but the corpus did not keep, and
where a read (a literal passed to a reader: `themisto.ingest.file_uses`) finds no kept file from the folder the
session stands in: a file of that name is kept elsewhere, or the repository never held it (the whole tree does not
list it, or the path is on the developer's machine) and no earlier input wrote it. After an input that may have made
files no literal names (a shell command, a script, a write to a computed path), those two read rules rest: the file
may be the session's own.

The checks read IPython's transformed text of each input with `ast`; an input that does not parse as Python 3 is
Python 2 where it holds a `print` statement or an `except X, e:` clause, else it is left to the replay.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Iterable, Mapping, Sequence

from themisto.ingest.compiles import parse_cell
from themisto.ingest.file_uses import IMPORT, MAKES, READ, WRITE, FileUse, file_uses, imported

# Why an input cannot replay as its developer ran it (a closed set, also `themisto.replay.health`'s causes).
BLOCKERS: tuple[str, ...] = ("package_absent", "input_absent", "network_needed", "gpu_needed", "python2",
                              "interactive")

_URL = re.compile(r"""['"](?:https?|ftp|s3|gs)://""", re.IGNORECASE)
_GPU = re.compile(r"""\.cuda\(|['"]cuda(?::\d+)?['"]|device\s*=\s*['"]?cuda|\bcupy\b|\bnumba\.cuda\b""")
# A program that waits for a person at a terminal (an editor, a pager, a shell or an interpreter with no script): in a
# replay it would wait, computing nothing, until its cell's clock ran out.
_WAITING = r"(?:vim?|nvim|nano|emacs|pico|less|more|top|htop|man|ssh|ftp|sftp|telnet|mysql|psql|sqlite3|watch)"
_ESCAPE = r"(?:!|%sx\s+|%system\s+)"
_INTERACTIVE = re.compile(
    rf"^\s*{_ESCAPE}\s*(?:sudo\s+)?{_WAITING}\b"  # a shell escape to one of them
    rf"|^\s*(?:sudo\s+)?{_WAITING}\s+[\w./~-]"  # an alias of it (`%rehashx` makes one of every program) with an argument
    rf"|^\s*{_ESCAPE}\s*(?:python[0-9.]*|ipython|bash|sh|zsh)\s*$"  # a shell or an interpreter with no script
    r"|^\s*%(?:edit|ed|qtconsole)\b", re.MULTILINE)
_PY2 = re.compile(r"^\s*(?:print\s+[^\s(=.,)\]][^=]*$|exec\s+['\"]|except\s+[\w.]+\s*,\s*\w+\s*:)", re.MULTILINE)


@dataclass(frozen=True)
class Blocker:
    """The first input (0-based index) a replay here cannot run as its developer did, and why."""

    index: int
    cause: str  # one of BLOCKERS
    detail: str  # the module, file or line that decided it (masked text of the session; no names of anyone)


@functools.lru_cache(maxsize=8)
def importable_modules(python: str) -> frozenset[str]:
    """The top-level module names `python` can import: its standard library and every installed distribution's
    top-level packages and modules (read once per interpreter, without importing any of them)."""
    # pkgutil lists no namespace package (`mpl_toolkits`, `google`): the folders of the path are added as they are.
    script = ("import sys, os, pkgutil, json; names = set(sys.stdlib_module_names) | set(sys.builtin_module_names); "
              "names |= {m.name for m in pkgutil.iter_modules()}; "
              "names |= {e for p in sys.path if os.path.isdir(p) for e in os.listdir(p) if e.isidentifier() and "
              "os.path.isdir(os.path.join(p, e))}; print(json.dumps(sorted(names)))")
    done = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not list its modules: {done.stderr.strip()[-500:]}")
    # IPython's own names a session may import without installing anything (`pylab` is matplotlib's).
    return frozenset(json.loads(done.stdout)) | {"pylab"}


@dataclass(frozen=True)
class RepositoryFiles:
    """What the checks need of a repository: the files it lists (paths relative to its root), those the corpus kept,
    the folder the session starts in (relative to the root; "" for the root), and whether the list is the whole tree
    (the collector lists a repository's first 5,000 files: past that, a file it does not list may still be held)."""

    listed: frozenset[str]
    kept: frozenset[str]
    start: str = ""
    complete: bool = True

    def resolve(self, literal: str, cwd: str | None = "") -> str | None:
        """The repository path `literal` names when read from `cwd` (relative to the start), or None where it names
        none: an absolute path or one in a home folder (on the developer's machine), one above the repository's top,
        or a folder no one knows (`cwd` None)."""
        if cwd is None or literal.startswith(("/", "~")) or re.match(r"^[A-Za-z]:/", literal):
            return None
        parts: list[str] = []
        for part in "/".join((self.start, cwd, literal)).split("/"):
            if part == "..":
                if not parts:
                    return None
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return "/".join(parts)

    def absent(self, literal: str, cwd: str | None = "") -> str | None:
        """The repository path `literal` names when the repository lists it but the corpus did not keep it, else
        None (kept, or never listed: a file the session may write itself)."""
        path = self.resolve(literal, cwd)
        if path is not None and path in self.kept:
            return None
        if path is not None and path in self.listed:
            return path
        # A bare file name read from another folder than the start: listed somewhere, kept nowhere.
        name = literal.rsplit("/", 1)[-1]
        if "/" not in literal and name in _names(self.listed) and name not in _names(self.kept):
            return name
        return None

    def unreadable(self, literal: str, cwd: str | None = "") -> str | None:
        """For a read of `literal` that no earlier input wrote: the file it names when the read cannot find it,
        else None. It cannot where the path resolves to no kept file but a file of that name is kept elsewhere (the
        session started in another folder), or where the repository never held it: a path on the developer's
        machine, or one the whole tree does not list under any folder the session could stand in."""
        path = self.resolve(literal, cwd)
        if path is not None and path in self.kept:
            return None
        name = literal.rsplit("/", 1)[-1]
        if path is None:  # off the repository (where `cwd` is known), or from a folder no one knows
            return literal if cwd is not None or (self.complete and name not in _names(self.listed)) else None
        if name in _names(self.kept) or (self.complete and path not in self.listed):
            return path
        return None


@functools.lru_cache(maxsize=32)
def _names(paths: frozenset[str]) -> frozenset[str]:
    """The file names (last parts) of `paths`."""
    return frozenset(p.rsplit("/", 1)[-1] for p in paths)


def first_blocker(codes: Sequence[str], modules: frozenset[str], files: RepositoryFiles,
                  local: Iterable[str] = (), uses: Sequence[Sequence[FileUse]] | None = None) -> Blocker | None:
    """The first input of `codes` a replay here cannot run as its developer did (`modules`: what the kernel
    environment imports; `local`: module names the repository's own kept files provide; `uses`: `file_uses(codes)`
    where the caller has it), or None."""
    available = modules | frozenset(local)
    uses = file_uses(codes) if uses is None else uses
    written: set[str] = set()
    makes = False  # since an input that may have made files no literal names
    for index, code in enumerate(codes):
        if _INTERACTIVE.search(code):
            return Blocker(index, "interactive", "a program waiting for a terminal")
        tree = parse_cell(code)
        if tree is None:
            if _PY2.search(code):
                return Blocker(index, "python2", "a Python 2 statement")
            continue  # a syntax error its developer saw too: replay shows the same
        missing = [name for name in imported(tree) if name not in available]
        if missing:
            return Blocker(index, "package_absent", missing[0])
        if _GPU.search(code):
            return Blocker(index, "gpu_needed", "CUDA")
        if _URL.search(code):
            return Blocker(index, "network_needed", "a URL")
        for use in uses[index]:
            if use.kind == MAKES:
                makes = True
                continue
            made = {use.path.rsplit("/", 1)[-1], files.resolve(use.path, use.cwd)} - {None}
            if use.kind == WRITE:
                written |= made
                continue
            if use.kind == IMPORT or made & written:
                continue
            absent = files.absent(use.path, use.cwd)
            if absent is None and use.kind == READ and not makes:
                absent = files.unreadable(use.path, use.cwd)
            if absent is not None:
                return Blocker(index, "input_absent", PurePosixPath(absent).name)
    return None


def local_modules(kept: Iterable[str], start: str) -> set[str]:
    """Module names the repository's kept `.py` files and packages provide to a kernel started in `start`."""
    names = set()
    prefix = f"{start}/" if start else ""
    for path in kept:
        if not path.startswith(prefix):
            continue
        first = path[len(prefix):].split("/")
        if len(first) == 1 and first[0].endswith(".py"):
            names.add(first[0][:-3])
        elif len(first) > 1:
            names.add(first[0])
    return names


def count_imports(sessions: Iterable[Sequence[str]]) -> Mapping[str, int]:
    """Per top-level module, how many of `sessions` import it (how requirements-kernel-wild.txt was chosen)."""
    counts: dict[str, int] = {}
    for codes in sessions:
        names = set()
        for code in codes:
            tree = parse_cell(code)
            if tree is not None:
                names.update(imported(tree))
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
