"""Model-free baselines: what "better than trivial" means on each task.

next_cell: the previous cell again (developers re-run edited cells), or the most common cell so far.
output_prediction: the previous cell's output, or the repr of the variable the cell names last.

Probing baselines run the `probe` mode's whole path without a model: `probe-previous-cell` probes the variables the
previous cell names, then answers as `previous-cell`; `probe-last-repr` probes the variable the cell names last and
answers with what the live kernel showed of it (the snapshot's `last-repr`, read live). In other modes they answer
as their static twin. The scorer does not run them (they need probes): they are models like any other.
"""

from __future__ import annotations

from collections import Counter

from themisto.errors import InputError
from themisto.generation.variable_ranking import names_in_order

BASELINES: tuple[str, ...] = ("previous-cell", "common-cell", "previous-output", "last-repr")
_FOR_TASK: dict[str, tuple[str, ...]] = {
    "next_cell": ("previous-cell", "common-cell"),
    "output_prediction": ("previous-output", "last-repr"),
}
# Each probing baseline and the static baseline it answers as where it cannot probe.
PROBING_BASELINES: dict[str, str] = {"probe-previous-cell": "previous-cell", "probe-last-repr": "last-repr"}
_PROBING_FOR_TASK: dict[str, tuple[str, ...]] = {"next_cell": ("probe-previous-cell",),
                                                 "output_prediction": ("probe-last-repr",)}


class BaselineError(InputError):
    """An unknown baseline or task, or a baseline that does not apply to the task."""


def baselines_for(task: str) -> tuple[str, ...]:
    """The baselines that make sense for one task."""
    try:
        return _FOR_TASK[task]
    except KeyError:
        raise BaselineError(f"unknown task {task!r} (expected one of {', '.join(_FOR_TASK)})") from None


def probing_baselines_for(task: str) -> tuple[str, ...]:
    """The probing baselines that make sense for one task."""
    baselines_for(task)
    return _PROBING_FOR_TASK[task]


def _cells(row: dict) -> list[dict]:
    # Cells whose code the log did not record tell nothing about what comes next.
    return [c for c in row.get("history") or [] if (c.get("code") or "").strip()]


def previous_cell(row: dict) -> str:
    cells = _cells(row)
    return cells[-1]["code"] if cells else ""


def common_cell(row: dict) -> str:
    """The most frequent cell of the history; ties go to the most recent one."""
    cells = [c["code"] for c in _cells(row)]
    if not cells:
        return ""
    counts = Counter(cells)
    best = max(counts.values())
    return next(code for code in reversed(cells) if counts[code] == best)


def previous_output(row: dict) -> str:
    history = row.get("history") or []
    return (history[-1].get("output") or "") if history else ""


def last_repr(row: dict) -> str:
    """The repr of the last variable (known before the cell) that the cell's code names."""
    reprs = {v.get("name"): v.get("repr") or "" for v in row.get("variables_before") or []}
    for name in reversed(names_in_order(row.get("code") or "")):
        if name in reprs:
            return reprs[name]
    return ""


_FUNCTIONS = {"previous-cell": previous_cell, "common-cell": common_cell, "previous-output": previous_output,
              "last-repr": last_repr}


def _known(row: dict) -> set[str]:
    return {v.get("name") for v in row.get("variables_before") or []}


def baseline_probes(name: str, row: dict, task: str) -> list[str]:
    """The probes a probing baseline asks for, in order: the known variables the previous cell names (each once),
    or the last known variable the target cell names."""
    if name not in probing_baselines_for(task):
        raise BaselineError(f"{name!r} is not a probing baseline of {task} (use one of "
                            f"{', '.join(probing_baselines_for(task))})")
    known = _known(row)
    if name == "probe-previous-cell":
        names = [n for n in names_in_order(previous_cell(row)) if n in known]
        return list(dict.fromkeys(names))
    last = next((n for n in reversed(names_in_order(row.get("code") or "")) if n in known), None)
    return [last] if last else []


def probing_answer(name: str, row: dict, task: str, outputs: list[str]) -> str:
    """A probing baseline's answer once its probes came back with `outputs`: `probe-last-repr` answers with the live
    repr its probe showed (the snapshot's when it could not probe), `probe-previous-cell` with the previous cell."""
    if name == "probe-last-repr" and outputs:
        return outputs[-1]
    return baseline_prediction(PROBING_BASELINES[name], row, task)


def baseline_prediction(name: str, row: dict, task: str) -> str:
    """One baseline's prediction for one row; a baseline that does not fit the task raises BaselineError."""
    if name not in BASELINES:
        raise BaselineError(f"unknown baseline {name!r} (expected one of {', '.join(BASELINES)})")
    if name not in baselines_for(task):
        raise BaselineError(f"baseline {name!r} does not apply to {task} (use one of {', '.join(baselines_for(task))})")
    return _FUNCTIONS[name](row)
