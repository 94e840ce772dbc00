"""Continuation match: judge a prediction by the developer's own future cells.

After the candidate, its branch runs the next k logged cells of the trajectory (as the reference's branches do);
the prediction matches when its own output matches, every continuation cell ends the same way with an equivalent
output, and the state left behind agrees on the names the target or the continuation reads or writes. Names are
collected with `ast`, conservatively: where a cell's names cannot be known (a syntax error, `exec`, `globals()`, a
star import, a magic that runs code), every user variable is compared.

>>> sorted(cell_names("for i in range(n):\\n    total += f(i)"))
['f', 'i', 'n', 'range', 'total']
>>> cell_names("exec(code)") is None
True
"""

from __future__ import annotations

import ast
from typing import Sequence

from themisto.scoring.records import PredictionRecord, ScoreSettings
from themisto.vocabulary import UNFINISHED_STATUSES

# Calls and attributes through which code reaches names it does not spell out.
_DYNAMIC_NAMES = frozenset({"globals", "locals", "vars", "exec", "eval", "execfile", "__builtins__"})
_DYNAMIC_ATTRIBUTES = frozenset({"user_ns", "user_global_ns", "__dict__", "f_globals", "f_locals", "__globals__",
                                 "push", "ev", "ex"})
# Magics that touch no user variable, and magics whose argument (line or cell body) is code run in the namespace.
_NAMESPACE_FREE_MAGICS = frozenset({"matplotlib", "load_ext", "reload_ext", "unload_ext", "autoreload", "config",
                                    "pip", "conda", "cd", "pwd", "ls", "env", "lsmagic", "history", "pinfo",
                                    "pinfo2", "pdoc", "psource", "pdef", "xmode", "precision", "pprint", "system",
                                    "sx", "html", "HTML", "markdown", "latex", "javascript", "js", "svg", "bash",
                                    "sh", "writefile"})
_CODE_MAGICS = frozenset({"time", "timeit", "prun"})


def _python_source(code: str) -> str:
    """The cell as Python: IPython's own transforms turn magics and `!` commands into calls."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(code)


def _magic_names(call: ast.Call) -> frozenset[str] | None:
    """Names a `get_ipython().run_line_magic/run_cell_magic(...)` call touches; None when unknowable."""
    method = call.func.attr  # type: ignore[union-attr]
    if method not in ("run_line_magic", "run_cell_magic"):
        return frozenset()  # system / getoutput: a shell command; an assignment of its result is an ast.Name
    texts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(texts) != len(call.args) or not texts:
        return None
    magic = texts[0].lstrip("%")
    if magic in _NAMESPACE_FREE_MAGICS:
        return frozenset()
    if magic not in _CODE_MAGICS:
        return None
    found: set[str] = set()
    for text in texts[1:]:
        names = cell_names(text) if text.strip() else frozenset()
        if names is None:
            return None
        found |= names
    return frozenset(found)


def _is_ipython_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython")


def cell_names(code: str) -> frozenset[str] | None:
    """Every name a cell may read, write or delete (a superset), or None when that cannot be known."""
    try:
        tree = ast.parse(_python_source(code))
    except (SyntaxError, ValueError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id in _DYNAMIC_NAMES:
                return None
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in _DYNAMIC_ATTRIBUTES:
            return None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            if node.name == "*":
                return None
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
        elif _is_ipython_call(node):
            found = _magic_names(node)  # type: ignore[arg-type]
            if found is None:
                return None
            names |= found
    return frozenset(names - {"get_ipython"})  # IPython's own accessor, spelled by the magics' transforms


def _definitions(codes: Sequence[str]) -> dict[str, frozenset[str]]:
    """Names used inside each top-level function or class body the cells define (the last definition wins)."""
    bodies: dict[str, frozenset[str]] = {}
    for code in codes:
        try:
            tree = ast.parse(_python_source(code))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bodies[node.name] = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    return bodies


def state_names(target: str, continuation: Sequence[str], earlier: Sequence[str] = ()) -> list[str] | None:
    """The names whose state the continuation match compares: those the target or the continuation reads or writes,
    plus the globals used by the functions they call that the trajectory defined (`earlier` and these cells);
    None (compare everything) when some cell's names cannot be known."""
    names: set[str] = set()
    for code in (target, *continuation):
        found = cell_names(code)
        if found is None:
            return None
        names |= found
    bodies = _definitions([*earlier, target, *continuation])
    todo = [n for n in names if n in bodies]
    while todo:  # a called function reads the globals its body names, and calls others
        for name in bodies[todo.pop()] - names:
            names.add(name)
            if name in bodies:
                todo.append(name)
    return sorted(names)


def continuation_rows(rows: Sequence[dict], step: int, k: int, max_s: float | None = None) -> list[dict]:
    """The next k logged steps after `step` that run in the same kernel state: the continuation stops before a logged
    restart, a step whose replay lost the kernel, a cell the developer interrupted (its end is a timer's), and a cell
    that took longer than `max_s` in the build's replay (the developer's quick next steps, not a model's retraining in
    every branch of the examples before it)."""
    kept = []
    for row in rows[step + 1: step + 1 + k]:
        if row["restarted_before"] or row.get("kernel_restarted") or row.get("ename") == "KeyboardInterrupt":
            break
        if max_s is not None and float(row.get("execution_time") or 0.0) > max_s:
            break
        kept.append(row)
    return kept


def _ending(cell: dict) -> str:
    return cell["status"] if cell["status"] == "ok" else f"{cell['status']} ({cell.get('ename')})"


def _cell_difference(reference: dict, candidate: dict, settings: ScoreSettings) -> str | None:
    from themisto.scoring.equivalence import outputs_equivalent
    from themisto.scoring.judging import compared_output

    if candidate["status"] != reference["status"] or candidate.get("ename") != reference.get("ename"):
        return f"ended {_ending(candidate)} where the reference's continuation ended {_ending(reference)}"
    verdict = outputs_equivalent(compared_output(candidate["outputs"]), compared_output(reference["outputs"]),
                                 rel_tol=settings.rel_tol, abs_tol=settings.abs_tol)
    return None if verdict.equal else f"output differs: {verdict.reason}"


def _left_state(result, names: list[str] | None, ran_continuation: bool) -> dict[str, str] | None:
    """The compared state a branch left: the continuation's name hashes, or (no continuation cells) the candidate's
    own delta on the names, where an untouched name reads as unchanged (both branches start from one state)."""
    if ran_continuation:
        return result.continuation_state
    picked = {}
    for name in set(result.added) | set(result.changed) | set(result.deleted):
        if names is None or name in names:
            picked[name] = "<deleted>" if name in result.deleted else {**result.changed, **result.added}[name]
    return picked


def _state_difference(reference: dict[str, str], candidate: dict[str, str]) -> str | None:
    for name in sorted(set(reference) | set(candidate)):
        if reference.get(name) != candidate.get(name):
            if name not in candidate or candidate[name] == "<deleted>":
                return f"`{name}` is missing where the reference's continuation left it"
            if name not in reference or reference[name] == "<deleted>":
                return f"`{name}` is left where the reference's continuation had none"
            return f"`{name}` holds a different value after the continuation"
    return None


def reference_continuation_problem(first, second, names: list[str] | None, k: int,
                                   settings: ScoreSettings) -> str | None:
    """Why the two reference runs' continuations define no answer (unfinished, or different), else None."""
    if len(first.continuation) != len(second.continuation) or len(first.continuation) != k:
        return "the reference's continuation did not run every cell"
    for number, (a, b) in enumerate(zip(first.continuation, second.continuation), start=1):
        if a["status"] in UNFINISHED_STATUSES:
            return f"the reference's continuation cell +{number} ended {a['status']}"
        why = _cell_difference(a, b, settings)
        if why is not None:
            return f"the reference's continuation cell +{number} differs between two runs ({why})"
    why = _state_difference(_left_state(first, names, k > 0) or {}, _left_state(second, names, k > 0) or {})
    return None if why is None else f"the reference's continuation left different states in two runs ({why})"


def judge_continuation(record: PredictionRecord, reference, candidate, names: list[str] | None, k: int,
                       settings: ScoreSettings) -> PredictionRecord:
    """The record (as `judge` gave it) with its `continuation_match`: the prediction's own output matches, each
    continuation cell ends as the reference's did with an equivalent output, and the compared names agree."""
    from dataclasses import replace

    from themisto.scoring.judging import clip

    why = None
    if candidate.status in UNFINISHED_STATUSES:
        why = "the prediction did not finish"
    elif not record.output_match:
        why = "the prediction's own output differs"
    elif len(candidate.continuation) < k:
        why = f"only {len(candidate.continuation)} of {k} continuation cells ran"
    else:
        for number, (want, got) in enumerate(zip(reference.continuation, candidate.continuation), start=1):
            difference = _cell_difference(want, got, settings)
            if difference is not None:
                why = f"continuation cell +{number} {difference}"
                break
    if why is None:
        left = _left_state(candidate, names, k > 0)
        why = "the continuation left no state to compare" if left is None else _state_difference(
            _left_state(reference, names, k > 0) or {}, left)
    reason = record.reason
    if why is not None and record.output_match:
        reason = clip("; ".join(filter(None, [record.reason, f"continuation differs: {why}"])))
    return replace(record, continuation_match=why is None, reason=reason)


def own_alarms(candidate, references: Sequence) -> list[str]:
    """The candidate's alarms less those its continuation shares with the reference's runs: the developer's own next
    cells may touch the machinery (a library walking gc referents), which is not the prediction's doing."""
    from themisto.runtime.agent.integrity import CONTINUATION_PREFIX

    developers = {a for r in references for a in (r.suspicious or []) if a.startswith(CONTINUATION_PREFIX)}
    return [a for a in candidate.suspicious or [] if a not in developers]
