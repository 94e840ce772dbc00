"""The opt-out list: repositories and owners whose sessions no collection and no build may keep, each with the date
its removal was asked for.

One entry a line, `YYYY-MM-DD owner/name` (one repository) or `YYYY-MM-DD owner` (every repository of that owner);
`#` starts a comment. Names compare without case, as GitHub's do. The list names people, so it lives beside the
corpus and the releases, never in a release or a commit; what leaves it is counts by date. `themisto collect`
skips a removed repository before fetching it, and a build's corpus reader (`themisto.ingest.ipython_corpus`) leaves
out every session of one before anything is replayed; both count what they removed.

>>> removals = parse_removals("2026-12-01 SomeOwner/Some-Repo\\n2026-12-03 another  # every repository", "list")
>>> removals.removes("someowner/some-repo"), removals.removes("another/x"), removals.removes("someowner/other")
(True, True, False)
>>> removals.by_date()
{'2026-12-01': {'repositories': 1, 'owners': 0}, '2026-12-03': {'repositories': 0, 'owners': 1}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from themisto.bounded import Bounds, read_text
from themisto.errors import InputError

_BOUNDS = Bounds(file_bytes=16 << 20, lines=1_000_000)
_ENTRY = re.compile(r"^(\d{4}-\d{2}-\d{2})\s+([A-Za-z0-9][A-Za-z0-9._-]*)(?:/([A-Za-z0-9._-]+))?$")


class RemovalListError(InputError):
    """A removal list that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Removals:
    """What an opt-out list removes: repositories (`owner/name`, lower case) and owners, each with its date."""

    repositories: tuple[tuple[str, str], ...] = ()  # (date, owner/name)
    owners: tuple[tuple[str, str], ...] = ()  # (date, owner)

    def removes(self, repo: str) -> bool:
        """Whether the repository `owner/name` is removed, by its own entry or its owner's."""
        repo = repo.lower()
        return repo in {r for _, r in self.repositories} or repo.split("/", 1)[0] in {o for _, o in self.owners}

    def by_date(self) -> dict[str, dict[str, int]]:
        """Per date, how many repositories and owners were removed (what a card may show: no names)."""
        out: dict[str, dict[str, int]] = {}
        for key, entries in (("repositories", self.repositories), ("owners", self.owners)):
            for date, _ in entries:
                out.setdefault(date, {"repositories": 0, "owners": 0})[key] += 1
        return dict(sorted(out.items()))

    def __bool__(self) -> bool:
        return bool(self.repositories or self.owners)


def parse_removals(text: str, where: str) -> Removals:
    """The removals of a list's text; a line that is no entry raises RemovalListError naming `where` and the line."""
    repositories, owners = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _ENTRY.match(line)
        if match is None:
            raise RemovalListError(f"{where}:{number}: expected `YYYY-MM-DD owner/name` or `YYYY-MM-DD owner`")
        date, owner, name = match.groups()
        if name:
            repositories.append((date, f"{owner}/{name}".lower()))
        else:
            owners.append((date, owner.lower()))
    return Removals(tuple(sorted(set(repositories))), tuple(sorted(set(owners))))


def read_removals(path: str | Path | None) -> Removals:
    """The removal list at `path` (read within bounds); no path, no removals."""
    if path is None:
        return Removals()
    return parse_removals(read_text(path, _BOUNDS), str(path))
