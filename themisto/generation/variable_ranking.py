"""Which variables of a runtime snapshot a prompt keeps first when it cannot show them all.

`rank_variables` orders a snapshot's variables from most to least relevant, and the prompt budget
(`themisto.generation.budget`) drops them from the end. The rule reads only the row the prompt is made from, so it
is the same for every backend, and any context mode that shows variables (the runtime section today; a per-cell
trace or a probe's opening state later) can take its order from here. `RANKING_RULE` states it in words: it is part
of every runtime template's text, so a change of rule changes the templates' sha256.

>>> row = {"history": [{"code": "df = load()"}, {"code": "model.fit(X)"}],
...        "variables_before": [{"name": n, "size": s} for n, s in
...                             (("big", 10**6), ("df", 5000), ("X", 800), ("model", 64), ("tiny", 8))]}
>>> [v["name"] for v in rank_variables(row, "next_cell")]
['model', 'X', 'df', 'tiny', 'big']
>>> [v["name"] for v in rank_variables({**row, "code": "big.head()"}, "output_prediction")]
['big', 'model', 'X', 'df', 'tiny']
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

RANKING_RULE = ("variables are ranked: first those the cell to run reads or writes (output_prediction), then those "
                "the history's cells name, the most recent mention first, then the rest, the most recently changed "
                "first; ties go to the smaller value, then to the name; the lowest ranked are dropped first")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def names_in_order(code: str) -> list[str]:
    """Identifiers as they appear in the source: from the AST where it parses, else from its tokens or text (a
    cell with IPython magics or a syntax error still names its variables)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        try:
            return [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME]
        except (tokenize.TokenError, IndentationError, SyntaxError):
            return _IDENTIFIER.findall(code)
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
    nodes.sort(key=lambda n: (n.lineno, n.col_offset))
    return [n.id for n in nodes]


def _size(variable: dict) -> int:
    size = variable.get("size")
    return size if isinstance(size, int) and size >= 0 else 1 << 62  # an unmeasured size ranks as the largest


def rank_variables(row: dict, task: str) -> list[dict]:
    """The row's `variables_before`, most relevant first (see `RANKING_RULE`)."""
    variables = list(row.get("variables_before") or [])
    target = set(names_in_order(row.get("code") or "")) if task == "output_prediction" else set()
    # next_cell's target is the answer: only the cells before it may say what matters.
    last_mention: dict[str, int] = {}
    for index, cell in enumerate(row.get("history") or []):
        for name in names_in_order(cell.get("code") or ""):
            last_mention[name] = index

    def key(variable: dict) -> tuple:
        name = variable.get("name") or ""
        changed = variable.get("changed_step")
        if name in target:
            tier, recency = 0, 0
        elif name in last_mention:
            tier, recency = 1, -last_mention[name]
        else:
            tier, recency = 2, -changed if isinstance(changed, int) else 1
        return tier, recency, _size(variable), name

    return sorted(variables, key=key)
