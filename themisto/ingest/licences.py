"""A repository's licence, named by its SPDX id: the licence file at the session's commit identified by askalono
(`pyaskalono`, pinned; a maintained matcher of licence texts against SPDX's list), and which ids let a release
redistribute what the repository holds (a setting, `REDISTRIBUTABLE` by default).

Without a licence nothing may be redistributed: GitHub's terms license public content for viewing and forking on
GitHub only. A text askalono matches below `MIN_SCORE` names no licence here ("other"). Where the licence file was
not kept, the licence a corpus recorded counts when it is an SPDX id; a family name (`BSD`, `CC`) is no licence
anyone can check, so it is "other" too.

>>> may_redistribute("MIT", REDISTRIBUTABLE), may_redistribute("none", REDISTRIBUTABLE)
(True, False)
>>> [is_licence_file(p) for p in ("LICENSE", "LICENSE.md", "COPYING", "src/LICENSE", "licenses.py")]
[True, True, True, False, False]
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

NONE = "none"  # the repository holds no licence file
OTHER = "other"  # a licence file no SPDX id names with confidence
MIN_SCORE = 0.9  # askalono's score (0-1) a text must reach to be named by the licence it matched
LICENCE_BYTES = 256 << 10  # a licence file read for identification, at most
# Licences that let anyone redistribute with attribution (permissive, and public-domain dedications). Copyleft ids
# (GPL, LGPL, AGPL, MPL, CC-BY-SA) permit it under their own terms; add them to the setting where those are met.
REDISTRIBUTABLE: tuple[str, ...] = ("0BSD", "Apache-2.0", "BSD-2-Clause", "BSD-3-Clause", "BSL-1.0", "CC-BY-4.0",
                                    "CC0-1.0", "ISC", "MIT", "MIT-0", "PSF-2.0", "Unlicense", "Zlib")
_LICENCE_FILE = re.compile(r"^(?:un)?licen[cs]e(?:[-_.][\w.-]*)?$|^copying(?:[-_.][\w.-]*)?$", re.IGNORECASE)
_CODE_SUFFIX = re.compile(r"\.(?:py|ipynb|js|ts|r|sh|json|ya?ml|toml|cfg|ini)$", re.IGNORECASE)
_SPDX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+-]*$")
# Family names a corpus may have recorded that name no one licence.
_FAMILIES = frozenset({"BSD", "CC", "GPL", "LGPL", "AGPL", "other", "unknown"})


class LicenceSettingError(ValueError):
    """A redistribution setting that names something no SPDX id is."""


@dataclass(frozen=True)
class Licence:
    """A repository's licence: its SPDX id (or NONE, OTHER), the file it was read from, and how it was named
    (`detected`: askalono on the file; `recorded`: the corpus's record; `none`: no licence file)."""

    spdx: str
    file: str | None
    how: str
    score: float | None = None


def is_licence_file(path: str) -> bool:
    """Whether a repository path is a licence file at the repository's top (LICENSE, LICENCE.md, COPYING, UNLICENSE)."""
    return "/" not in path and bool(_LICENCE_FILE.match(path)) and not _CODE_SUFFIX.search(path)


@functools.lru_cache(maxsize=256)
def _identify(digest: str, text: str) -> tuple[str, float]:
    from askalono import identify

    match = identify(text)
    return (match.name, float(match.score)) if match is not None else (OTHER, 0.0)


def identify_licence(text: str, file: str | None = None) -> Licence:
    """The licence a licence file's text is, by askalono (cached per text); OTHER under `MIN_SCORE`."""
    text = text[:LICENCE_BYTES]
    name, score = _identify(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest(), text)
    return Licence(name if score >= MIN_SCORE else OTHER, file, "detected", round(score, 3))


def recorded_licence(recorded: str | None) -> Licence:
    """A corpus's recorded licence (`LICENSE:MIT` or `MIT`; None: no licence file) where its file is not at hand."""
    if not recorded:
        return Licence(NONE, None, "none")
    file, _, name = recorded.rpartition(":")
    spdx = name if _SPDX_ID.match(name) and name not in _FAMILIES else OTHER
    return Licence(spdx, file or None, "recorded")


def redistribution_setting(ids: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The SPDX ids a release may redistribute ("MIT,Apache-2.0" or a tuple; None: `REDISTRIBUTABLE`); an id that
    is no SPDX id, or NONE/OTHER, raises LicenceSettingError naming it."""
    if ids is None:
        return REDISTRIBUTABLE
    items = tuple(x.strip() for x in ids.split(",")) if isinstance(ids, str) else tuple(ids)
    items = tuple(x for x in items if x)
    bad = [x for x in items if not _SPDX_ID.match(x) or x in _FAMILIES or x.lower() in (NONE, OTHER)]
    if bad or not items:
        raise LicenceSettingError(f"licences a release may redistribute must be SPDX ids (e.g. MIT,Apache-2.0); "
                                  f"not {', '.join(bad) or 'an empty list'}: without a licence nothing may be "
                                  f"redistributed")
    return tuple(sorted(set(items)))


def may_redistribute(spdx: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether content under `spdx` may be redistributed under the setting `allowed` (SPDX ids compare as the
    SPDX list does: without case)."""
    return bool(spdx) and spdx.lower() in {a.lower() for a in allowed}
