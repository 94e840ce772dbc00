"""Read a saved `.ipynb` into a one-pass trajectory: its code cells in the order of their execution counts.

A notebook only remembers the last run of each cell, so this is the order of the final runs, not the whole
development history a JuNE log holds. Output sizes are computed as the JuNE extension computed them, so the
two sources can be compared.
"""

from __future__ import annotations

import json
from pathlib import Path

from themisto.errors import InputError
from themisto.ingest.trajectory import Execution, OutputSummary, Trajectory, task_of


class NotebookFormatError(InputError):
    """A notebook that cannot be read as a trajectory; the message names the file (and cell)."""


def _joined(value: object) -> object:
    # nbformat stores multi-line strings as lists of lines; the browser (and the extension) saw one string.
    return "".join(value) if isinstance(value, list) else value


def _json_len(value: object) -> int:
    # JSON.stringify in the browser: no spaces, non-ASCII kept as is, length counted in UTF-8 bytes.
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def output_size(output: dict) -> int:
    """Serialized size of one output as the JuNE extension logged it (text plus data, never the traceback).

    >>> output_size({"output_type": "stream", "name": "stdout", "text": ["hi\\n"]})
    6
    """
    size = 0
    if output.get("text") is not None:
        size += _json_len(_joined(output["text"]))
    if output.get("data") is not None:
        size += _json_len({mime: _joined(value) for mime, value in output["data"].items()})
    return size


def _cell_execution(path: Path, index: int, cell: dict) -> Execution:
    outputs = cell.get("outputs") or []
    if not isinstance(outputs, list):
        raise NotebookFormatError(f"{path}: cell {index}: expected a list of outputs")
    summaries = []
    ename = evalue = None
    for out in outputs:
        if not isinstance(out, dict) or "output_type" not in out:
            raise NotebookFormatError(f"{path}: cell {index}: expected outputs with an output_type")
        summaries.append(OutputSummary(str(out["output_type"]), output_size(out)))
        if out["output_type"] == "error" and ename is None:
            ename, evalue = out.get("ename"), out.get("evalue")
    return Execution(
        cell_id=str(cell.get("id") or f"cell-{index}"),
        code=str(_joined(cell.get("source", ""))),
        status="error" if ename is not None or any(s.output_type == "error" for s in summaries) else "ok",
        ename=None if ename is None else str(ename),
        evalue=None if evalue is None else str(evalue),
        outputs=summaries,
        cell_num=index,
        execution_count=int(cell["execution_count"]),
    )


def read_notebook(path: str | Path) -> Trajectory:
    """Code cells with an execution count, ordered by it; cells without one are skipped and counted.

    Raises NotebookFormatError naming the file when it is not a notebook or when no cell has an execution count.
    """
    path = Path(path)
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise NotebookFormatError(f"{path}: expected UTF-8 text (bad byte at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise NotebookFormatError(f"{path}:{exc.lineno}: expected a JSON notebook ({exc.msg})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookFormatError(f"{path}: expected a notebook (nbformat 4) with a list of cells")
    executions: list[Execution] = []
    skipped = 0
    for index, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        if not isinstance(cell.get("execution_count"), int):
            skipped += 1
            continue
        executions.append(_cell_execution(path, index, cell))
    if not executions:
        raise NotebookFormatError(
            f"{path}: no code cell has an execution count ({skipped} code cell(s)); "
            "the order the cells ran in is unknown"
        )
    # sorted() is stable: equal counts (a copied cell) keep their notebook order.
    executions.sort(key=lambda ex: ex.execution_count)
    ignored = {"cell_without_execution_count": skipped} if skipped else {}
    return Trajectory(
        id=path.stem, notebook=path.name, source="notebook", executions=executions, task=task_of(path.name),
        ignored=ignored,
    )
