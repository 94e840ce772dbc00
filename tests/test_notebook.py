"""Notebook reader: the participant's final notebooks, sizes computed like the extension, and bad notebooks."""

import json

import pytest

from themisto.ingest.june import read_june_log
from themisto.ingest.notebook import NotebookFormatError, output_size, read_notebook

TASK_LOGS = {"task1": "bc147b33-fa74-4bff-9f48-c88809c5bdcd.log", "task2": "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"}


@pytest.mark.parametrize("task, code_cells", [("task1", 21), ("task2", 12)])
def test_final_notebooks(june_dir, task, code_cells):
    path = june_dir / f"participant-final-{task}.ipynb"
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    traj = read_notebook(path)
    assert len(traj.executions) == len(cells) == code_cells
    assert traj.source == "notebook" and traj.task == task and traj.ignored == {}
    counts = [ex.execution_count for ex in traj.executions]
    assert counts == sorted(c["execution_count"] for c in cells)
    by_count = {c["execution_count"]: "".join(c["source"]) for c in cells}
    assert [ex.code for ex in traj.executions] == [by_count[n] for n in counts]


@pytest.mark.parametrize("task", ["task1", "task2"])
def test_output_sizes_agree_with_what_the_extension_logged(june_dir, task):
    """The same code, run last in the log and saved in the notebook, has the same output sizes (mostly:
    a few outputs differ between runs, e.g. pip's messages)."""
    from_nb = read_notebook(june_dir / f"participant-final-{task}.ipynb")
    last_logged = {ex.code: ex for ex in read_june_log(june_dir / TASK_LOGS[task]).executions
                   if ex.status in ("ok", "error")}
    pairs = [(ex.outputs, last_logged[ex.code].outputs) for ex in from_nb.executions if ex.code in last_logged]
    assert len(pairs) >= 5
    same = sum(nb_out == log_out for nb_out, log_out in pairs)
    assert same >= len(pairs) - 1
    if task == "task1":  # its plots: image data is counted too
        assert any(out.size > 10_000 for nb_out, _ in pairs for out in nb_out)


def test_output_size_counts_text_and_data_like_json_stringify():
    assert output_size({"output_type": "stream", "text": ["a\n", "é"]}) == len('"a\\né"'.encode("utf-8"))
    data = {"text/plain": ["1"], "image/png": "iVBO"}
    assert output_size({"output_type": "execute_result", "data": data, "execution_count": 3}) == len(
        '{"text/plain":"1","image/png":"iVBO"}')
    assert output_size({"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["long"]}) == 0


def _write_nb(path, cells):
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}),
                    encoding="utf-8")
    return path


def _code(source, count, outputs=()):
    return {"cell_type": "code", "source": source, "execution_count": count, "outputs": list(outputs),
            "metadata": {}}


def test_order_skipped_cells_and_errors(tmp_path):
    error = {"output_type": "error", "ename": "KeyError", "evalue": "'x'", "traceback": ["..."]}
    path = _write_nb(tmp_path / "task2.ipynb", [
        _code("b = 2", 7),
        {"cell_type": "markdown", "source": "# notes", "metadata": {}},
        _code("never run", None),
        _code(["a = 1\n", "a"], 3, [{"output_type": "execute_result", "data": {"text/plain": "1"}}]),
        _code("d['x']", 9, [error]),
    ])
    traj = read_notebook(path)
    assert [(ex.code, ex.execution_count, ex.status) for ex in traj.executions] == [
        ("a = 1\na", 3, "ok"), ("b = 2", 7, "ok"), ("d['x']", 9, "error")]
    assert (traj.executions[2].ename, traj.executions[2].evalue) == ("KeyError", "'x'")
    assert traj.ignored == {"cell_without_execution_count": 1}
    assert traj.task == "task2" and traj.id == "task2"


def test_notebook_without_execution_counts_is_an_error(tmp_path):
    path = _write_nb(tmp_path / "fresh.ipynb", [_code("x = 1", None), _code("y = 2", None)])
    with pytest.raises(NotebookFormatError, match=r"fresh\.ipynb: no code cell has an execution count \(2"):
        read_notebook(path)


def test_broken_notebooks_name_the_file(tmp_path):
    path = tmp_path / "broken.ipynb"
    path.write_text('{"cells": [\n  {"cell_type": ', encoding="utf-8")
    with pytest.raises(NotebookFormatError, match=r"broken\.ipynb:2: expected a JSON notebook"):
        read_notebook(path)
    path.write_bytes(b'{"cells": ["\xff"]}')
    with pytest.raises(NotebookFormatError, match=r"broken\.ipynb: expected UTF-8"):
        read_notebook(path)
    path.write_text('{"worksheets": []}', encoding="utf-8")
    with pytest.raises(NotebookFormatError, match=r"broken\.ipynb: expected a notebook"):
        read_notebook(path)
