"""Restore a damaged cmd.exe log line's code only where the full text is proven to be the developer's.

A candidate is the full text of the same cell found elsewhere: another whole, undamaged event of the same cell
id in the same file, a cell with that id in a `save_notebook` event, or a code cell of the participant's final
notebook of that task (`final-task*.ipynb`, whose cell ids differ from the log's, so its cells are candidates for
every cell). It proves the damaged line's text when cmd.exe's rule (`themisto.ingest.cmd_shell`), applied to the
line the extension would have written for it, gives back exactly what the log kept:

- a line that parsed: the whole line, every character;
- a line cut short in its code: everything up to the cut, with cmd.exe still eating the file name of a
  redirection where the line ends (so the rest of the line was that file name);
- a line whose code swallowed the fields after it: everything up to the point where cmd.exe was still eating.

A line that parsed and agrees with a candidate's echo from its start to `AROUND` characters past a place cmd.exe
ate something, but not to its end (the developer edited the cell elsewhere since), lost text there: the loss is
named and the code stays damaged.

Only a single text may pass: when two different texts both explain the line, neither is proven and the line
stays damaged. What no check can see is an edit the developer made between the damaged event and its evidence
that touched only characters cmd.exe ate. Where the evidence is: an exposed text is damaged the same way in every
`execute` or `finished_execute` line that logs it, so another such event never holds it whole; a `save_notebook`
holds the cells one JSON level deeper, inside cmd.exe's quotes, so it keeps them whole (the notebook as it was
loaded, before any edit); the final notebook holds each cell's last text. Measured on the real logs: every one of
the 16 repaired executions of student_1 is proven by the final notebook (none of its damaged cells was run as
loaded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from themisto.ingest import cmd_shell
from themisto.ingest.june_format import encode_log_line

_MARK = "THEMISTOSOURCEMARK"
_OPERATORS = "<>^"
# How far past a place where cmd.exe ate something a line must agree with a text's echo for the loss to be named.
AROUND = 8


@dataclass(frozen=True)
class Candidate:
    """A full text of a cell and where it was found (`file:line (event)`, or a notebook and its cell)."""

    text: str
    where: str


@dataclass
class Evidence:
    """The texts a damaged line's code may be restored from: per cell id, and the final notebook's cells."""

    cells: dict[str, list[Candidate]] = field(default_factory=dict)
    final: list[Candidate] = field(default_factory=list)

    def add(self, cell_id: str, text: str, where: str) -> None:
        if cell_id and text:
            known = self.cells.setdefault(cell_id, [])
            if all(c.text != text for c in known):
                known.append(Candidate(text, where))

    def candidates(self, cell_id: str) -> list[Candidate]:
        return [*self.cells.get(cell_id, ()), *self.final]


@dataclass(frozen=True)
class Proof:
    """What the evidence says of one line: the proven text (None when none, or several, explain it), how many
    different texts explain it, and, for a line that parsed, a text that explains it around a place cmd.exe ate
    something but not in full (the line lost text there; nothing restores it)."""

    candidate: Candidate | None
    agreeing: int
    around: Candidate | None = None


def _fragment(text: str) -> str:
    """How the extension wrote `text` as a string value inside its line (twice JSON-encoded, `'` replaced)."""
    inner = json.dumps(text, ensure_ascii=False)[1:-1]
    return json.dumps(inner, ensure_ascii=False)[1:-1].replace("'", '"')


def agreeing_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of `a` and `b` (slices compare at C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _may_explain(kept: str, text: str) -> bool:
    """A cheap necessary condition: where `kept` first leaves `text`, `text` holds something cmd.exe eats."""
    if kept == text:
        return False
    p = agreeing_prefix(kept, text)
    return p < len(text) and (text[p] in _OPERATORS or (text[p].isdigit() and text[p + 1:p + 2] == ">"))


def _explains(text: str, line: str, record: dict, how: str) -> str | None:
    """"full" when `text` explains every character of the line; "around" when, for a line that parsed, it explains
    the line from its start to past a place cmd.exe ate something (by `AROUND` characters); else None."""
    marked = encode_log_line({**record, "cell_source": _MARK}, "cmd")
    at = marked.index(_MARK)
    head, tail = marked[:at], marked[at + len(_MARK):]
    kept = line.rstrip(" ")
    if how == "whole":
        echo = cmd_shell.echoed(head + _fragment(text) + tail)
        if echo.text is None:
            return None
        if echo.text.rstrip(" ") == kept:
            return "full"
        agree = agreeing_prefix(echo.text, kept)
        return "around" if any(cut + AROUND <= agree for cut in echo.cuts if cut >= at) else None
    echo = cmd_shell.echoed(head + _fragment(text))
    if echo.text is None or not echo.eating:
        return None
    if how == "cut":
        return "full" if echo.text.rstrip(" ") == kept else None
    return "full" if kept.startswith(echo.text) else None  # "swallowed": the rest is what the fields after left


def prove(line: str, record: dict, how: str, candidates: list[Candidate]) -> Proof:
    """The candidate that explains a cmd.exe line whose code (`record["cell_source"]`) may have lost text.

    `how` says what the reader saw: "whole" (the line parsed), "cut" (cut short in its code), "swallowed" (its
    code ran over the fields after it)."""
    kept_source = str(record.get("cell_source") or "")
    agreeing: dict[str, Candidate] = {}
    around = None
    for candidate in candidates:
        if candidate.text in agreeing or not _may_explain(kept_source, candidate.text):
            continue
        found = _explains(candidate.text, line, record, how)
        if found == "full":
            agreeing[candidate.text] = candidate
        elif found == "around" and around is None:
            around = candidate
    only = next(iter(agreeing.values())) if len(agreeing) == 1 else None
    return Proof(only, len(agreeing), around)
