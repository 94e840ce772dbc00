"""The bounds ingest reads other people's files within (`themisto.bounded`): a log line, a table, a notebook, a
trajectories file, a participants mapping, an IPython history database or `%logstart` log. Past a bound is a
`BoundError` naming the file, the line and the bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from themisto.bounded import BoundError, Bounds, check_json_text

# One JuNE log (or table): a save_notebook line holds a whole notebook's sources, a finished line its outputs' sizes.
LOG = Bounds(file_bytes=256 << 20, line_bytes=64 << 20, lines=10_000_000, depth=64, items=50_000_000)
# A notebook is one JSON document with every output in it (plots, tables): large, never deep.
NOTEBOOK = Bounds(file_bytes=256 << 20, line_bytes=256 << 20, lines=10_000_000, depth=64, items=50_000_000)
# One trajectory per line: a long development day is a long line.
TRAJECTORIES = Bounds(file_bytes=1 << 30, line_bytes=256 << 20, lines=1_000_000, depth=16, items=500_000_000)
MAPPING = Bounds(file_bytes=16 << 20, line_bytes=16 << 20, lines=1_000_000, depth=2, items=2_000_000)
# An IPython `%logstart` log: Python text, split into statements with `ast` (which holds ~20 times the text in
# memory); the largest of 53 in the corpus is 330 KB.
IPYTHON_LOG = Bounds(file_bytes=16 << 20, line_bytes=1 << 20, lines=1_000_000)


@dataclass(frozen=True)
class DatabaseBounds:
    """How much of an SQLite database the reader takes before it refuses it; each field is one bound a refusal can
    name. SQLite itself enforces `text_bytes` (its length limit: a longer value fails as it is read) and `seconds`
    (a progress handler); the reader counts the rest."""

    file_bytes: int
    schema_entries: int  # rows of sqlite_master: tables, indexes (IPython's schema has six)
    sessions: int  # rows of the sessions table
    rows: int  # rows of the history table, and of output_history
    text_bytes: int  # one stored value (an input's source, an output)
    seconds: float  # the whole read


# An IPython history database from a stranger's repository: the largest of 213 in the corpus holds 14,247 inputs in
# 4 MB; Notebook Archaeology's largest were tens of MB.
HISTORY_DATABASE = DatabaseBounds(file_bytes=256 << 20, schema_entries=64, sessions=100_000, rows=500_000,
                                  text_bytes=1 << 20, seconds=60.0)

__all__ = ["LOG", "NOTEBOOK", "TRAJECTORIES", "MAPPING", "IPYTHON_LOG", "HISTORY_DATABASE", "DatabaseBounds",
           "BoundError", "parse_json"]


def parse_json(text: str, bounds: Bounds, *, path: str, line: int | None = None) -> Any:
    """`json.loads` of a text checked within `bounds` first; a malformed text raises `json.JSONDecodeError`, for the
    caller to say what it expected there."""
    check_json_text(text, bounds, path=path, line=line)
    return json.loads(text)
