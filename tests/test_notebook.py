"""Notebook reader: the participant's final notebooks, sizes computed like the extension, and bad notebooks."""

import json

import pytest

from themisto.ingest.june_log import read_june_log
from themisto.ingest.notebook import NotebookFormatError, read_notebook
from themisto.ingest.output_size import output_size

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
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": cells}),
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
        _code(["a = 1\n", "a"], 3, [{"output_type": "execute_result", "data": {"text/plain": "1"}, "metadata": {},
                                     "execution_count": 3}]),
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
    with pytest.raises(NotebookFormatError, match=r"broken\.ipynb: not a valid notebook"):
        read_notebook(path)


def _chars(output: dict) -> int:
    def text(value):
        return "".join(value) if isinstance(value, list) else value

    if output["output_type"] == "stream":
        return len(json.dumps(text(output["text"]), ensure_ascii=False))
    if output["output_type"] in ("execute_result", "display_data"):
        data = {mime: text(value) for mime, value in output["data"].items()}
        return len(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return 0


def test_june_logged_utf8_bytes_not_characters(june_dir):
    """Which size rule the extension used, read off the real data: outputs holding a non-ASCII character, saved in
    a participant's final notebook, against the sizes the log recorded for the last run of that cell's code
    (same output types). Each agrees in UTF-8 bytes; none in characters."""
    from themisto.ingest.inputs import read_inputs

    folders = [june_dir, *sorted(p for p in (june_dir / "participants").iterdir() if p.is_dir())]
    in_bytes = in_chars = compared = 0
    for folder in folders:
        last = {}
        for traj in read_inputs(sorted(folder.glob("*.log"))).trajectories:
            for ex in traj.executions:
                if ex.status in ("ok", "error"):
                    last[ex.code] = ex.outputs
        for path in sorted(folder.glob("*final-task*.ipynb")):
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                logged = last.get("".join(cell["source"])) if cell["cell_type"] == "code" else None
                if logged is None or [o.output_type for o in logged] != [o["output_type"] for o in cell["outputs"]]:
                    continue
                for output, summary in zip(cell["outputs"], logged):
                    if json.dumps(output, ensure_ascii=False).isascii():
                        continue
                    utf8 = _chars(output) + sum(len(ch.encode("utf-8")) - 1 for ch in json.dumps(
                        output.get("text") or output.get("data"), ensure_ascii=False) if not ch.isascii())
                    compared += 1
                    in_bytes += summary.size == utf8
                    in_chars += summary.size == _chars(output)
                    assert output_size(output) == utf8
    assert compared >= 20 and in_bytes >= 10 and in_chars == 0
