"""The prompt budget: how a prompt longer than the model can take is cut, and what the cut prompt kept.

A prompt has up to two sections that can be cut: the history (cells, dropped oldest first) and the runtime section
(variables in `themisto.generation.variable_ranking`'s order: each kept variable's fields are cut through
`FIELD_CUTS` before any variable goes, then the lowest ranked go first, and the prompt says how many it left out).
When both are there and the whole prompt does not fit, the newest history cell goes in first (where it fits beside
the instruction), the runtime section is cut to its share of the room left (half of it, or more where the rest of
the history needs less than its half), then the history keeps as many of its newest cells as fit, then the runtime
section takes back what the history left unused. A
prompt is skipped only when the instruction (and output_prediction's target cell) alone, with both sections empty,
does not fit. `budget_rule` says this in words; it is part of every template's text, so the templates' sha256
change with it, and it is the same for every backend: only the token counter is the model's.

Counting tokens is the expensive part: each search below is a binary search, so a prompt costs four counts plus
about log2(history cells) + 2·log2(variables + cuts), never one count per dropped cell or variable.

>>> least(0, 100, lambda i: i >= 37)
37
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Callable

from themisto.generation.variable_ranking import RANKING_RULE


@dataclass(frozen=True)
class Fields:
    """How much of each variable's description a rendering shows: repr characters and column names."""

    repr_chars: int
    columns: int


# As the prompt shows each variable before any cut (the snapshot's repr is itself bounded), then the cuts in turn.
WHOLE_FIELDS = Fields(repr_chars=400, columns=30)
FIELD_CUTS: tuple[Fields, ...] = (Fields(120, 30), Fields(40, 10), Fields(0, 10), Fields(0, 0))


@dataclass(frozen=True)
class Cut:
    """One rendering's share of each section: the newest `history` cells, the `variables` ranked highest, and how
    much of each variable's fields."""

    history: int
    variables: int
    fields: Fields = WHOLE_FIELDS


@dataclass(frozen=True)
class Kept:
    """What a prompt kept, as its generation line records it: history cells and variables shown of all there were
    (variables are None in a mode without a runtime section), the repr limit the budget imposed (None: uncut) and
    how many shown variables lost repr text to it."""

    history_shown: int
    history_total: int
    variables_shown: int | None
    variables_total: int | None
    repr_chars: int | None
    reprs_cut: int

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def valid(value: object) -> bool:
        """Whether a generation line's `kept` (read back from a file someone wrote) is null or this record's shape:
        its fields only, each a count or null."""
        if value is None:
            return True
        names = {f.name for f in fields(Kept)}
        return isinstance(value, dict) and set(value) <= names and all(
            v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in value.values())


@dataclass(frozen=True)
class Fit:
    """The cut a budget chose (None: skipped, nothing fits) and the tokens of that rendering (or of the smallest)."""

    cut: Cut | None
    tokens: int | None


def budget_rule(runtime: bool) -> str:
    """The budget rule in words, as the templates' text carries it."""
    rule = ("over the prompt budget the oldest history cells are dropped first; the instruction and the cell to run "
            "are never cut, and a prompt is skipped only when they alone do not fit")
    if not runtime:
        return rule
    cuts = ", ".join(f"repr {f.repr_chars} chars and {f.columns} columns" for f in FIELD_CUTS)
    return (f"{rule}; the newest history cell goes in first where it fits, then the runtime section gets half the "
            f"room left (more where the history needs less), the history the rest, and the runtime section what the "
            f"history left; within it every "
            f"kept variable is shown with repr {WHOLE_FIELDS.repr_chars} chars and {WHOLE_FIELDS.columns} columns, "
            f"cut in turn to {cuts} before any variable is dropped; {RANKING_RULE}; the prompt says how many "
            "variables it left out")


def least(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The smallest i in [low, high] for which `fits(i)`, by binary search; `fits(high)` must hold (it is never
    asked), so the answer always fits even where `fits` is not quite monotone."""
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return low


def runtime_cut(history: int, level: int, variables: int) -> Cut:
    """The cut at one `level` of the runtime section: 0 shows every variable whole, the next len(FIELD_CUTS) levels
    cut every variable's fields further, each level past them drops one more of the lowest ranked variables."""
    if level == 0:
        return Cut(history, variables)
    if level <= len(FIELD_CUTS):
        return Cut(history, variables, FIELD_CUTS[level - 1])
    return Cut(history, max(0, variables - (level - len(FIELD_CUTS))), FIELD_CUTS[-1])


def fit(count: Callable[[Cut], int], budget: int, history: int, variables: int | None) -> Fit:
    """The cut that fits `budget` under the rule above; `count(cut)` gives a rendering's tokens (memoised here, as
    the searches ask some cuts twice). `variables` is None in a mode without a runtime section."""
    memo: dict[Cut, int] = {}

    def tokens(cut: Cut) -> int:
        if cut not in memo:
            memo[cut] = count(cut)
        return memo[cut]

    whole = Cut(history, variables or 0)
    if tokens(whole) <= budget:
        return Fit(whole, memo[whole])
    if not variables:  # no runtime section (or nothing in it): only the history can give way
        floor = Cut(0, 0)
        if tokens(floor) > budget:
            return Fit(None, memo[floor])
        kept = history - least(1, history, lambda d: tokens(Cut(history - d, 0)) <= budget)
        return Fit(Cut(kept, 0), tokens(Cut(kept, 0)))
    last = len(FIELD_CUTS) + variables
    if tokens(runtime_cut(0, last, variables)) > budget:
        return Fit(None, memo[runtime_cut(0, last, variables)])
    # The newest cell says most about the next one (repeating it is a strong baseline): it goes in before the split,
    # so a runtime mode never loses it to the variables where it fits beside the instruction.
    newest = min(1, history) if tokens(runtime_cut(min(1, history), last, variables)) <= budget else 0
    floor = tokens(runtime_cut(newest, last, variables))
    room = budget - floor
    history_needs = tokens(runtime_cut(history, last, variables)) - floor
    share = max(room // 2, room - history_needs)
    level = least(0, last, lambda lv: tokens(runtime_cut(newest, lv, variables)) - floor <= share)
    dropped = least(0, history - newest, lambda d: tokens(runtime_cut(history - d, level, variables)) <= budget)
    level = least(0, level, lambda lv: tokens(runtime_cut(history - dropped, lv, variables)) <= budget)
    cut = runtime_cut(history - dropped, level, variables)
    return Fit(cut, tokens(cut))
