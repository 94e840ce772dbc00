"""Where a session from the wild stood, and where it stops: the folder of its repository from which its literal reads
find kept files, and its first input a replay started there cannot run.

A history records no working folder. A notebook's kernel starts in the notebook's folder, but the notebook a
session's inputs match may have been moved after it ran, or its data kept beside it in a folder of their own
(`notebooks/analysis.ipynb` reading `bills.xlsx`, which the repository keeps at `data/bills.xlsx`). So every folder
of the repository that holds kept files (or lies above one) is a candidate. The one wins from which the session runs
longest before a read of a kept file or an import of the repository's own module finds nothing (a session is cut
there); then the one from which most of its distinct reads and own imports find their file; then the one from which
most of its other data-file literals do (`path = 'x.csv'` passed on in a way no check follows); then the matched
notebook's folder, the repository's top, and the shallowest. With no read to tell folders apart, the notebook's
folder is the choice.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Sequence

from themisto.ingest.file_uses import IMPORT, READ, UNKNOWN, FileUse, file_uses
from themisto.ingest.session_checks import Blocker, RepositoryFiles, first_blocker, local_modules


def choose_start(uses: Sequence[Sequence[FileUse]], files: RepositoryFiles, preferred: str = "",
                 modules: frozenset[str] = frozenset()) -> str:
    """The folder (relative to the repository's top; "" for the top) a session whose file uses are `uses` started in
    (see the module docstring); `preferred`: the matched notebook's folder; `modules`: what the kernel environment
    imports (an import of another name may be the repository's own module)."""
    kept_names = {path.rsplit("/", 1)[-1] for path in files.kept}
    provided = _modules_by_folder(files.kept)
    everywhere = frozenset().union(*provided.values())
    # The uses whose outcome depends on the folder: reads of a file kept somewhere, imports of the repository's own.
    reads = [(u.index, u.path, u.cwd) for each in uses for u in each
             if u.kind == READ and u.cwd is not None and u.path.rsplit("/", 1)[-1] in kept_names]
    own = [(u.index, u.path) for each in uses for u in each
           if u.kind == IMPORT and u.path not in modules and u.path in everywhere]
    others = {(u.path, u.cwd) for each in uses for u in each if u.kind == UNKNOWN and u.cwd is not None}

    def score(folder: str) -> tuple:
        at = replace(files, start=folder)
        read = [(index, path, cwd) for index, path, cwd in reads if at.resolve(path, cwd) in files.kept]
        imported = [(index, name) for index, name in own if name in provided.get(folder, ())]
        fails = [use[0] for use in reads if use not in read] + [use[0] for use in own if use not in imported]
        found = len({use[1:] for use in read}) + len({name for _, name in imported})
        return (min(fails, default=len(uses)), found, sum(at.resolve(p, c) in files.kept for p, c in others),
                folder == preferred, folder == "", -folder.count("/"))

    return max(sorted(_folders(files.kept) | {preferred}), key=score)


def checked_session(codes: Sequence[str], modules: frozenset[str], files: RepositoryFiles,
                    preferred: str = "") -> tuple[str, Blocker | None]:
    """The folder a session starts in (`choose_start`) and its first input a replay started there cannot run
    (`session_checks.first_blocker`), or None."""
    uses = file_uses(codes)
    start = choose_start(uses, files, preferred, modules)
    return start, first_blocker(codes, modules, replace(files, start=start), local_modules(files.kept, start), uses)


@functools.lru_cache(maxsize=8)
def _folders(kept: frozenset[str]) -> frozenset[str]:
    """Every folder that holds a kept file, and the folders above them (the top is "")."""
    out = {""}
    for path in kept:
        parts = path.split("/")[:-1]
        out |= {"/".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return frozenset(out)


@functools.lru_cache(maxsize=8)
def _modules_by_folder(kept: frozenset[str]) -> dict[str, frozenset[str]]:
    """Per folder, the module names its kept files provide to a kernel started there (`local_modules`)."""
    return {folder: frozenset(local_modules(kept, folder)) for folder in _folders(kept)}
