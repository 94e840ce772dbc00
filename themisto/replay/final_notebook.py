"""The replay's output text against the participant's final notebook, saved with the outputs the developer saw.

The logs hold output types and sizes, never text; a final notebook (`final-task*.ipynb`) holds the text of each
cell's last run. A stored output is compared only where it belongs to the cell's last logged execution: the
notebook cell's code (masked as ingest masks the logs) is the code of a logged cell's last execution, and the
output types and sizes the log recorded for that execution are the stored outputs' (a size may be one byte short:
saving drops an HTML table's trailing newline). Anything else is not compared and is counted by why. The replay's
text of that step and the stored text are then put in one class:

- `equal`: the same text (what drifts between runs masked in both, `themisto.runtime.outputs.mask_volatile`);
- `numbers`: the same once every number is masked and runs of spaces are one: other values, same words and shape;
- `text`: other words or another shape (other rows or categories, a warning of another library version);
- `error`: one side raised and the other did not, or they raised different exceptions;
- `missing`: one side printed text and the other none.

Errors are compared by their `ename: evalue` line, since a traceback names folders and lines of the machine.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# Why a stored output is compared, or why not; the classes of the module docstring come first.
CLASSES: tuple[str, ...] = ("equal", "numbers", "text", "error", "missing")
NOT_COMPARED: dict[str, str] = {
    "no_logged_run": "no logged cell's last execution ran the notebook cell's code (the local log lacks that run, "
                     "or the cell was edited after it ran)",
    "other_run": "the log recorded other output types or sizes for that execution: the stored output is another "
                 "run's",
    "damaged": "the log damaged that execution's code",
    "no_text": "the stored output holds no text (images, HTML only)",
}
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SPACES = re.compile(r"[ \t]+")


@dataclass
class NotebookFidelity:
    """One trajectory against its final notebook: stored outputs compared per class, the others per reason, and
    each compared step's class (steps only: no cell text)."""

    notebook: str
    cells_with_outputs: int
    compared: dict[str, int] = field(default_factory=dict)
    not_compared: dict[str, int] = field(default_factory=dict)
    steps: dict[str, list[int]] = field(default_factory=dict)  # class -> steps

    def to_dict(self) -> dict:
        return asdict(self)


def _shape(text: str) -> str:
    return "\n".join(_SPACES.sub(" ", _NUMBER.sub("#", line)).strip() for line in text.strip().splitlines())


def _error_of(outputs: Sequence[Mapping]) -> tuple[str, str] | None:
    error = next((o for o in outputs if o.get("output_type") == "error"), None)
    return None if error is None else (str(error.get("ename") or ""), str(error.get("evalue") or ""))


def classify(replayed: str, replayed_error: tuple[str, str] | None, stored: str,
             stored_error: tuple[str, str] | None) -> str:
    """The class of one replayed text against the stored one (see the module docstring).

    >>> classify("143", None, "143", None), classify("mean 12.5", None, "mean 13.75", None)
    ('equal', 'numbers')
    >>> classify("a b", None, "a c", None), classify("", None, "x", None), classify("1", None, "", ("KeyError", "'a'"))
    ('text', 'missing', 'error')
    """
    from themisto.runtime.outputs import mask_volatile

    if (replayed_error is None) != (stored_error is None) or (
            replayed_error and stored_error and replayed_error[0] != stored_error[0]):
        return "error"
    if replayed_error and stored_error:
        replayed, stored = ": ".join(replayed_error), ": ".join(stored_error)
    replayed, stored = mask_volatile(replayed).strip(), mask_volatile(stored).strip()
    if replayed == stored:
        return "equal"
    if not replayed or not stored:
        return "missing"
    return "numbers" if _shape(replayed) == _shape(stored) else "text"


def _sizes_agree(logged: Sequence, stored: Sequence[Mapping]) -> bool:
    from themisto.ingest.output_size import summarize

    found = summarize(list(stored))
    return len(found) == len(logged) and all(a.output_type == b.output_type and 0 <= a.size - b.size <= 1
                                             for a, b in zip(logged, found))


def compare_final_notebook(trajectory, steps: Iterable, notebook_path: str | Path) -> NotebookFidelity:
    """Compare a trajectory's replayed steps with the outputs of its participant's final notebook."""
    from themisto.ingest.notebook import load_notebook
    from themisto.ingest.personal import mask_personal
    from themisto.runtime.outputs import output_text

    by_step = {s.step: s for s in steps}
    last: dict[str, int] = {}
    for index, execution in enumerate(trajectory.executions):
        last[execution.cell_id] = index
    last_by_code: dict[str, list[int]] = {}
    for index in sorted(last.values()):
        last_by_code.setdefault(trajectory.executions[index].code, []).append(index)
    notebook = load_notebook(notebook_path)
    report = NotebookFidelity(Path(notebook_path).name, 0)

    def count(table: dict, key: str) -> None:
        table[key] = table.get(key, 0) + 1

    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.outputs:
            continue
        report.cells_with_outputs += 1
        outputs = [dict(o) for o in cell.outputs]
        candidates = last_by_code.get(mask_personal(cell.source), [])
        owned = [i for i in candidates if _sizes_agree(trajectory.executions[i].outputs, outputs)]
        if not candidates:
            count(report.not_compared, "no_logged_run")
        elif not owned:
            count(report.not_compared, "other_run")
        elif trajectory.executions[owned[0]].code_state == "damaged":
            count(report.not_compared, "damaged")
        elif not output_text(outputs).strip() and _error_of(outputs) is None:
            count(report.not_compared, "no_text")
        else:
            step = by_step[owned[0]]
            replayed_error = (step.ename or "", step.evalue or "") if step.status == "error" else None
            kind = classify(step.output, replayed_error, mask_personal(output_text(outputs)), _error_of(outputs))
            count(report.compared, kind)
            report.steps.setdefault(kind, []).append(owned[0])
    report.compared = {k: report.compared[k] for k in CLASSES if k in report.compared}
    return report
