"""The `trace` context mode's state lines: after each history cell, the user's variables as JSON in the spirit of
Meta's CWM execution traces (locals as JSON, an unchanged value written ".."), so that an execution-trained model
reads the trajectory in the form it was trained on.

A history cell's state is the snapshot after its step (joined from the release's `trajectories` config by
`themisto.generation.release_rows`): each variable it changed or made is shown with its repr, each one it left as it
was as "..", and a variable it removed is not there. The variables are in the order of
`themisto.generation.variable_ranking` (those the target's snapshot no longer holds last), and the prompt budget
(`themisto.generation.budget`) cuts them as it cuts the `variables` mode's runtime section: each value's text first,
then the lowest ranked variables from every line.
"""

from __future__ import annotations

import json

from themisto.generation.budget import Cut

UNCHANGED = ".."
TRACE_INTRO = ("After each cell, the state it left: the user's variables as JSON (name to repr, the most relevant "
               f"first), \"{UNCHANGED}\" where the cell left a variable as it was; a variable it removed is not shown.")


def trace_names(row: dict, ranked: list[dict]) -> list[str]:
    """Every variable name the trace can show: the ranked snapshot before the target first, then those only earlier
    states held (by name)."""
    names = [v["name"] for v in ranked]
    seen = set(names)
    earlier = {v["name"] for cell in row.get("history") or [] for v in cell.get("state_after") or []}
    return names + sorted(earlier - seen)


def _value(variable: dict, repr_chars: int) -> str:
    text = variable.get("repr") or ""
    if repr_chars <= 0 or not text:
        return f"<{variable.get('type') or 'object'}>"
    return text if len(text) <= repr_chars else text[:repr_chars] + " ..."


def state_line(cell: dict, before: dict[str, str], shown: list[str], cut: Cut) -> str:
    """One cell's state as JSON: `before` is the name -> hash of the state the cell started from."""
    after = {v["name"]: v for v in cell.get("state_after") or []}
    state = {}
    for name in shown:
        variable = after.get(name)
        if variable is None:
            continue
        state[name] = UNCHANGED if before.get(name) == variable.get("hash") else _value(variable, cut.fields.repr_chars)
    return json.dumps(state, ensure_ascii=False)


def state_lines(row: dict, history: list[dict], names: list[str], cut: Cut) -> list[str | None]:
    """The state line of each shown history cell (None where the release has no snapshot of its step); `names`:
    `trace_names`, of which the budget keeps the first `cut.variables`."""
    shown = names[:cut.variables]
    before = {v["name"]: v.get("hash") for v in row.get("state_before_history") or []}
    all_cells = list(row.get("history") or [])
    lines = []
    for cell in all_cells:
        if cell.get("restarted_before"):
            before = {}
        if cell.get("state_after") is None:
            lines.append(None)
            before = {}
        else:
            lines.append(state_line(cell, before, shown, cut))
            before = {v["name"]: v.get("hash") for v in cell["state_after"]}
    return lines[len(all_cells) - len(history):]
