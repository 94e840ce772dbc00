"""Replay health: which replayed steps failed for a reason of the replay's environment, and where a trajectory is cut.

A step fails for its environment when replay raised what the developer's machine would not have (the log recorded no
such error): a package the kernel environment lacks, an input file the workspace lacks, a network or a GPU the sandbox
has none of, Python 2 syntax. Such a step's output is no target. When later steps use a name it would have bound
(an import, an assignment, a definition; any name at all for a script it ran, `%run`), their pre-step state is
wrong too: the trajectory is cut before it, so no
later step is a target or a history. Sources without logged outcomes (IPython histories) are judged by the replay
alone; a JuNE step whose log recorded an error is the developer's own failure and stays (by another exception too:
`import pandas` raising ImportError here where the developer saw ModuleNotFoundError for numpy binds nothing in
either run).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from themisto.ingest.compiles import parse_cell

# A step's cause when its environment failed it, with the sentence the card and reports use.
ENVIRONMENT_CAUSES: dict[str, str] = {
    "package_absent": "a package the replay's kernel environment lacks (ModuleNotFoundError, ImportError)",
    "input_absent": "an input file the workspace lacks (over the corpus's size cap, never committed, or elsewhere)",
    "network_needed": "a network the sandbox has none of (a URL, a database server)",
    "gpu_needed": "a GPU the replay has none of",
    "python2": "Python 2 code that Python 3 cannot run",
}
_NETWORK = re.compile(r"URLError|ConnectionError|ConnectTimeout|gaierror|NewConnectionError|MaxRetryError|"
                      r"Name or service not known|Temporary failure in name resolution|Network is unreachable|"
                      r"OperationalError: \(2003|Connection refused", re.IGNORECASE)
_GPU = re.compile(r"CUDA|cuda|GPU|nvidia", re.IGNORECASE)
_RUN_MISSING = re.compile(r"^Exception: File `[^`]*` not found")  # `%run` of a script the workspace lacks
# A cell whose failure leaves unknown names unbound: a script run into the namespace (`%run -i`, `exec`, `execfile`).
_RUNS_CODE = re.compile(r"(?m)^\s*%run\b|\bexec(?:file)?\s*\(")
_PY2 = re.compile(r"Missing parentheses in call to '(print|exec)'|multiple exception types must be parenthesized")


def environment_cause(status: str, ename: str | None, evalue: str | None, logged_status: str = "unknown",
                      logged_ename: str | None = None) -> str | None:
    """The `ENVIRONMENT_CAUSES` key of a replayed step's failure, or None (it ran, or the developer saw it too)."""
    if status != "error" or logged_status == "error":
        return None  # ran, or its developer's run failed there too (if by another exception: the names are unbound alike)
    text = f"{ename}: {evalue or ''}"
    if ename in ("ModuleNotFoundError", "ImportError") and "cuda" not in text.lower():
        return "package_absent"
    if ename == "FileNotFoundError" or (ename in ("OSError", "IOError") and "No such file" in text) \
            or _RUN_MISSING.search(text):
        return "input_absent"
    if _NETWORK.search(text):
        return "network_needed"
    if ename == "SyntaxError" and _PY2.search(text):
        return "python2"
    if ename in ("RuntimeError", "AssertionError", "OSError", "ImportError", "ValueError") and _GPU.search(text) \
            and ("driver" in text.lower() or "cuda" in text.lower()):
        return "gpu_needed"
    return None


def bound_names(code: str) -> set[str]:
    """The names a cell binds at its top level or below: assignments, loop and `with` targets, imports, definitions."""
    tree = parse_cell(code)
    names: set[str] = set()
    if tree is None:
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def used_names(code: str) -> set[str]:
    """The names a cell reads."""
    tree = parse_cell(code)
    if tree is None:
        return set(re.findall(r"[A-Za-z_]\w*", code))  # a cell that does not parse: every word, to be safe
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


@dataclass
class Health:
    """Per trajectory: the steps its environment failed (step -> cause) and the step it is cut before, if any."""

    causes: dict[str, dict[int, str]] = field(default_factory=dict)  # kernel_id -> step -> cause
    cut: dict[str, dict] = field(default_factory=dict)  # kernel_id -> {"at": step, "cause": cause}

    def counts(self) -> dict[str, dict[str, int]]:
        """Steps failed by each cause, and trajectories cut by each."""
        steps: dict[str, int] = {}
        for per_step in self.causes.values():
            for cause in per_step.values():
                steps[cause] = steps.get(cause, 0) + 1
        cut: dict[str, int] = {}
        for info in self.cut.values():
            cut[info["cause"]] = cut.get(info["cause"], 0) + 1
        return {"steps": dict(sorted(steps.items())), "trajectories_cut": dict(sorted(cut.items()))}


def judge(kernels: Mapping[str, Sequence[Mapping]]) -> Health:
    """The health of `trajectories` rows grouped by kernel (ordered by step): causes and cuts by the module's rule."""
    health = Health()
    for kernel_id, rows in kernels.items():
        for index, row in enumerate(rows):
            cause = environment_cause(row["status"], row.get("ename"), row.get("evalue"),
                                      row.get("logged_status") or "unknown", row.get("logged_ename"))
            if cause is None:
                continue
            health.causes.setdefault(kernel_id, {})[int(row["step"])] = cause
            bound = bound_names(row["code"])
            if _RUNS_CODE.search(row["code"]) or bound & _later_uses(rows[index + 1:]):
                health.cut[kernel_id] = {"at": int(row["step"]), "cause": cause}
                break
    return health


def _later_uses(rows: Iterable[Mapping]) -> set[str]:
    used: set[str] = set()
    for row in rows:
        used |= used_names(row["code"])
    return used


def apply(rows: list[dict], health: Health) -> list[dict]:
    """`rows` without the steps past each cut, each kept row's `replay_cause` set (None where its environment did
    not fail it)."""
    out = []
    for row in rows:
        kernel_id, step = row["kernel_id"], int(row["step"])
        cut = health.cut.get(kernel_id)
        if cut is not None and step >= cut["at"]:
            continue
        out.append({**row, "replay_cause": health.causes.get(kernel_id, {}).get(step)})
    return out
