"""Read a saved `.ipynb` through nbformat (it validates the notebook and upgrades old versions to nbformat 4), within
bounds: as a one-pass trajectory, its code cells in the order of their execution counts, or as its code cells'
texts (the evidence `themisto.ingest.repair` restores a damaged log line from).

A notebook only remembers the last run of each cell, so its trajectory is the order of the final runs, not the
whole development history a JuNE log holds. Output sizes follow the JuNE extension's rule (`output_size`), so the
two sources can be compared.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from themisto.errors import InputError
from themisto.bounded import BoundError, Bounds
from themisto.ingest.limits import NOTEBOOK, parse_json
from themisto.ingest.output_size import output_size
from themisto.ingest.personal import mask_personal
from themisto.ingest.trajectory import Execution, OutputSummary, SourceFile, Trajectory, task_of



class NotebookFormatError(InputError):
    """A notebook that cannot be read as a trajectory; the message names the file (and cell)."""


def load_notebook(path: str | Path, bounds: Bounds = NOTEBOOK):
    """The notebook as an nbformat-4 `NotebookNode`, validated; bad JSON, a bound passed or an invalid notebook
    raise `NotebookFormatError` naming the file."""
    import nbformat  # validation pulls in jsonschema: loaded only when a notebook is read

    path = Path(path)
    data = path.read_bytes()
    if len(data) > bounds.file_bytes:
        raise BoundError(path, None, f"{len(data):,} bytes, more than {bounds.file_bytes:,}", "file_bytes")
    try:
        raw = parse_json(data.decode("utf-8"), bounds, path=str(path))
    except UnicodeDecodeError as exc:
        raise NotebookFormatError(f"{path}: expected UTF-8 text (bad byte at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise NotebookFormatError(f"{path}:{exc.lineno}: expected a JSON notebook ({exc.msg})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", []), list):
        raise NotebookFormatError(f"{path}: expected a notebook (a JSON object with a list of cells)")
    try:
        major, minor = nbformat.reader.get_version(raw)
        notebook = nbformat.convert(nbformat.versions[major].to_notebook_json(raw, minor=minor), 4)
        with warnings.catch_warnings():
            # A 4.5 notebook without cell ids is read all the same: a cell without an id is named by its index.
            warnings.simplefilter("ignore", nbformat.warnings.MissingIDFieldWarning)
            nbformat.validate(notebook)
    except (KeyError, AttributeError, TypeError, ValueError, nbformat.ValidationError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise NotebookFormatError(f"{path}: not a valid notebook ({reason})") from None
    return notebook


def code_cells(notebook) -> list[tuple[int, str]]:
    """(index, text) of each code cell, unmasked: evidence for repair, never written anywhere."""
    return [(index, cell.source) for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"]


def _cell_execution(index: int, cell) -> Execution:
    summaries = [OutputSummary(str(out.output_type), output_size(out)) for out in cell.outputs]
    error = next((out for out in cell.outputs if out.output_type == "error"), None)
    ename = None if error is None else error.get("ename")
    evalue = None if error is None else error.get("evalue")
    return Execution(
        cell_id=str(cell.get("id") or f"cell-{index}"),
        code=mask_personal(cell.source),
        status="error" if error is not None else "ok",
        ename=None if ename is None else mask_personal(str(ename)),
        evalue=None if evalue is None else mask_personal(str(evalue)),
        outputs=summaries,
        cell_num=index,
        execution_count=int(cell.execution_count),
    )


def read_notebook(path: str | Path, *, name: str | None = None) -> Trajectory:
    """Code cells with an execution count, ordered by it; cells without one are skipped and counted.

    Raises NotebookFormatError naming the file when it is not a notebook or when no cell has an execution count.
    """
    import hashlib

    path = Path(path)
    notebook = load_notebook(path)
    executions: list[Execution] = []
    skipped = 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        if not isinstance(cell.get("execution_count"), int):
            skipped += 1
            continue
        executions.append(_cell_execution(index, cell))
    if not executions:
        raise NotebookFormatError(
            f"{path}: no code cell has an execution count ({skipped} code cell(s)); "
            "the order the cells ran in is unknown"
        )
    # sorted() is stable: equal counts (a copied cell) keep their notebook order.
    executions.sort(key=lambda ex: ex.execution_count)
    ignored = {"cell_without_execution_count": skipped} if skipped else {}
    name = mask_personal(name or path.name)
    source = SourceFile(file=name, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    # Its id is its name without the suffix: notebooks of one name in two folders stay two trajectories.
    return Trajectory(
        id=name[: -len(path.suffix)] if path.suffix and name.endswith(path.suffix) else name, notebook=path.name, source="notebook", executions=executions, task=task_of(path.name),
        ignored=ignored, sources=[source],
    )
