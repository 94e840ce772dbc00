"""The bounds ingest reads other people's files within (`themisto.bounded`): a log line, a table, a notebook, a
trajectories file, a participants mapping. Past a bound is a `BoundError` naming the file, the line and the bound.
"""

from __future__ import annotations

import json
from typing import Any

from themisto.bounded import BoundError, Bounds, check_json_text

# One JuNE log (or table): a save_notebook line holds a whole notebook's sources, a finished line its outputs' sizes.
LOG = Bounds(file_bytes=256 << 20, line_bytes=64 << 20, lines=10_000_000, depth=64, items=50_000_000)
# A notebook is one JSON document with every output in it (plots, tables): large, never deep.
NOTEBOOK = Bounds(file_bytes=256 << 20, line_bytes=256 << 20, lines=10_000_000, depth=64, items=50_000_000)
# One trajectory per line: a long development day is a long line.
TRAJECTORIES = Bounds(file_bytes=1 << 30, line_bytes=256 << 20, lines=1_000_000, depth=16, items=500_000_000)
MAPPING = Bounds(file_bytes=16 << 20, line_bytes=16 << 20, lines=1_000_000, depth=2, items=2_000_000)

__all__ = ["LOG", "NOTEBOOK", "TRAJECTORIES", "MAPPING", "BoundError", "parse_json"]


def parse_json(text: str, bounds: Bounds, *, path: str, line: int | None = None) -> Any:
    """`json.loads` of a text checked within `bounds` first; a malformed text raises `json.JSONDecodeError`, for the
    caller to say what it expected there."""
    check_json_text(text, bounds, path=path, line=line)
    return json.loads(text)
