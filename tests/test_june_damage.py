"""Both writers' line formats, the damage cmd.exe did, repairs only where proven, several kernels on one notebook,
masking, and bounds, on small synthetic logs (the real logs are in test_june_participants.py)."""

from __future__ import annotations

import json

import pytest

from themisto.bounded import BoundError
from themisto.cli import main
from themisto.ingest import cmd_shell
from themisto.ingest.inputs import read_inputs
from themisto.ingest.june_format import decode_log_line, detect_writer, encode_log_line, read_log_line
from themisto.ingest.june_log import read_june_log, read_log_file
from themisto.ingest.personal import mask_personal


def _ev(event, cell="c1", source="", t=0, output=None, kernel="k1", notebook="task1.ipynb", **extra):
    record = {
        "ip_address": None, "time": f"2023-05-06T10:{t // 60:02d}:{t % 60:02d}.000Z", "kernel_id": kernel,
        "notebook_name": notebook, "event": event, "cell_index": cell, "cell_num": 0, "cell_source": source,
        "cell_type": "code", "session_id": "s1", "cell_output": None if output is None else json.dumps(output),
    }
    record.update(extra)
    return record


def _write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _save(cells, t=0, kernel="k1"):
    record = _ev("save_notebook", t=t, kernel=kernel)
    for key in ("cell_index", "cell_num", "cell_type", "cell_output"):
        del record[key]
    record["cell_source"] = json.dumps(cells, indent=2)
    return record


def _cell(cell_id, source, kind="code"):
    return {"id": cell_id, "cell_type": kind, "source": source, "execution_count": None}


def _notebook(path, sources):
    cells = [{"cell_type": "code", "source": s, "execution_count": i + 1, "outputs": [], "metadata": {}}
             for i, s in enumerate(sources)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": cells}),
                    encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------------
# The two writers


TRICKY = 'print("a\\\\b", \'it\'s\', "\\"q\\"")\nx = r"\\d+" if y else "\\\\"'


def test_sh_and_cmd_lines_read_back_every_quote_and_backslash():
    record = _ev("execute", source=TRICKY)
    for writer in ("cmd", "sh"):
        line = encode_log_line(record, writer)
        assert detect_writer(line) == writer and decode_log_line(line, writer) == record
    sh = encode_log_line(record, "sh")
    # What sh's echo did: no single quotes, no trailing space, every pair of backslashes halved.
    assert sh.startswith('"{') and sh.endswith('"[EVENT_SEPARATOR]') and "'" not in sh
    assert sh.count("\\") < encode_log_line(record, "cmd").count("\\")


def test_an_sh_log_gives_the_trajectory_its_cmd_twin_gives(tmp_path):
    records = [_ev("execute", "c1", TRICKY, t=1), _ev("finished_execute", "c1", TRICKY, t=2, output=[]),
               _ev("execute", "c2", "1/0", t=3)]
    cmd = read_june_log(_write(tmp_path / "cmd" / "k1.log", [encode_log_line(r) for r in records]))
    sh = read_june_log(_write(tmp_path / "sh" / "k1.log", [encode_log_line(r, "sh") for r in records]))
    assert sh.executions == cmd.executions and sh.executions[0].code == TRICKY
    assert (sh.sources[0].writer, cmd.sources[0].writer) == ("sh", "cmd")


def test_a_file_of_mixed_writers_names_the_line(tmp_path):
    path = _write(tmp_path / "k1.log", [encode_log_line(_ev("execute", t=1), "sh"),
                                        encode_log_line(_ev("execute", t=2), "cmd")])
    with pytest.raises(Exception, match=r"k1\.log:2: expected the line to start with '\"' \(a sh log\)"):
        read_june_log(path)


# ---------------------------------------------------------------------------------------------------------------
# cmd.exe's damage


def test_cmd_rule_on_the_shapes_of_the_real_damage():
    line = encode_log_line(_ev("execute", source="if i >= 100:\n        break"))
    kept = decode_log_line(cmd_shell.echoed(line).text)["cell_source"]
    assert kept == "if i         break"  # the MANIFEST's example: `>`, its delimiters and the file name gone
    cut = cmd_shell.echoed(encode_log_line(_ev("execute", source="df[df.a > 5]\ndf")))
    assert read_log_line(cut.text, "cmd").cut_field == "cell_source"  # no delimiter left: the rest was the name
    assert cmd_shell.echoed(encode_log_line(_ev("execute", source="a | b"))).text is None  # never logged
    assert cmd_shell.echoed(encode_log_line(_ev("execute", source='s = "x > y"'))).text == encode_log_line(
        _ev("execute", source='s = "x > y"'))  # inside Python's quotes is inside cmd's


def _damaged_execute(source, t, cell="c1"):
    """The line cmd.exe wrote for an `execute` of `source`, written out here: that event with `source` less what
    cmd.exe ate (for a line that parsed), so the reader is checked against a line it did not make."""
    return encode_log_line(_ev("execute", cell, source, t=t))


def test_lost_text_is_repaired_from_a_save_notebook_that_kept_the_cell_whole(tmp_path):
    """A save_notebook holds the cells one JSON level deeper, inside cmd.exe's quotes: the code cell's `>`
    survived there (the notebook as it was loaded) while the cell's `execute` line lost `> 1:\\n`."""
    full = "if x > 1:\n    y = 2"
    save = _save([_cell("m1", "Start here", "markdown"), _cell("c1", full)], t=0)
    assert cmd_shell.echoed(encode_log_line(save)).text == encode_log_line(save)  # that line came through whole
    assert decode_log_line(cmd_shell.echoed(encode_log_line(_ev("execute", source=full, t=1))).text)[
        "cell_source"] == "if x     y = 2"
    path = _write(tmp_path / "k1.log", [encode_log_line(save), _damaged_execute("if x     y = 2", t=1),
                                        encode_log_line(_ev("finished_execute", source="if x     y = 2", t=2,
                                                            output=[]))])
    log = read_log_file(path)
    (execution,) = read_june_log(path).executions
    assert execution.code == full and execution.code_state == "repaired"
    assert execution.repaired_from == "k1.log:1 (save_notebook)" and execution.status == "ok"
    assert [(d.line, d.kinds, d.repaired_from) for d in log.damaged] == [
        (2, ("lost_text",), "k1.log:1 (save_notebook)"), (3, ("lost_text",), "k1.log:1 (save_notebook)")]


def test_two_texts_that_both_explain_a_line_prove_nothing(tmp_path):
    folder = tmp_path / "participants" / "p1"
    _notebook(folder / "final-task1.ipynb", ["if x > 1:\n    y = 2", "if x > 9:\n    y = 2"])
    _write(folder / "k1.log", [_damaged_execute("if x     y = 2", t=1)])
    (traj,) = read_inputs([folder]).trajectories
    (execution,) = traj.executions
    assert execution.code == "if x     y = 2" and execution.code_state == "damaged"
    assert "2 different texts agree with what survived: none is proven" in " ".join(d.note for d in
                                                                                   execution.damage)


def test_a_cut_line_is_repaired_from_the_final_notebook_and_its_lost_outputs_stay_unknown(tmp_path):
    folder = tmp_path / "participants" / "p1"
    full = "df_stats['weekend'] = df_stats['weekday'] >= 5\ndf_stats"
    _notebook(folder / "final-task1.ipynb", ["import pandas as pd", full])
    execute = cmd_shell.echoed(encode_log_line(_ev("execute", "c1", full, t=1))).text
    finished = cmd_shell.echoed(encode_log_line(_ev("finished_execute", "c1", full, t=2,
                                                    output=[{"output_type": "execute_result", "size": 12}]))).text
    first = [encode_log_line(_ev("execute", "c0", "import pandas as pd", t=0)),
             encode_log_line(_ev("finished_execute", "c0", "import pandas as pd", t=0, output=[]))]
    _write(folder / "k1.log", [*first, execute, finished])
    got = read_inputs([folder])
    kinds = [(d["line"], d["kinds"], d["fields"]) for d in got.files["k1.log"]["damaged"]]
    assert kinds == [(3, ["cut_line"], ["cell_source"]), (4, ["lost_fields"], ["cell_source"])]
    execution = got.trajectories[0].executions[1]
    assert execution.code == full and execution.code_state == "repaired"
    assert execution.repaired_from == "final-task1.ipynb (cell 1)"
    assert execution.status == "unknown"  # the finished line lost its outputs with the fields it swallowed
    assert got.files["k1.log"]["repaired"] == 1 and got.files["k1.log"]["unrepaired"] == 0


def test_an_edit_elsewhere_names_the_loss_but_repairs_nothing(tmp_path):
    """The final cell agrees with the line around the place cmd.exe ate, but the developer changed the cell later:
    the loss is proven there, the text is not."""
    folder = tmp_path / "participants" / "p1"
    _notebook(folder / "final-task1.ipynb", ["def f(a) -> int:\n    return a + 1\n"])
    _write(folder / "k1.log", [_damaged_execute("def f(a) -    return a\n", t=1)])
    (execution,) = read_inputs([folder]).trajectories[0].executions
    assert execution.code_state == "damaged" and execution.status == "unknown"
    assert "agrees around it, not in full" in execution.damage[0].note


def test_an_undamaged_cmd_line_is_left_as_it_is(tmp_path):
    folder = tmp_path / "participants" / "p1"
    _notebook(folder / "final-task1.ipynb", ["x = 1 > 0", "s = 'a > b'"])
    _write(folder / "k1.log", [encode_log_line(_ev("execute", "c1", "s = 'a > b'", t=1)),
                               encode_log_line(_ev("finished_execute", "c1", "s = 'a > b'", t=2, output=[]))])
    got = read_inputs([folder])
    assert got.files["k1.log"]["damaged"] == []
    assert [(e.code, e.code_state, e.status) for e in got.trajectories[0].executions] == [
        ("s = 'a > b'", "as_logged", "ok")]


def test_an_execute_without_its_finish_is_named_by_its_line(tmp_path):
    path = _write(tmp_path / "k1.log", [encode_log_line(_ev("execute", "c1", "a", t=1)),
                                        encode_log_line(_ev("execute", "c1", "b", t=2)),
                                        encode_log_line(_ev("finished_execute", "c1", "b", t=3, output=[]))])
    got = read_inputs([path])
    assert got.files["k1.log"]["no_finish"] == [1]
    first = got.trajectories[0].executions[0]
    assert [(d.kind, d.line) for d in first.damage] == [("no_finish", "k1.log:1")]


def test_a_cell_logged_ok_whose_code_does_not_compile_is_damaged_and_no_target(tmp_path):
    """cmd.exe ate `>= 1:` and no other text of the cell shows it: the log says the cell ran ok, so the text it kept
    is not what ran. An automagic line that ran ok and a developer's own SyntaxError are not damage."""
    lost = "for i in range(3):\n    if i                 break"
    error = json.dumps({"output_type": "error", "ename": "SyntaxError", "evalue": "'(' was never closed"})
    path = _write(tmp_path / "k1.log", [
        encode_log_line(_ev("execute", "c1", lost, t=1)),
        encode_log_line(_ev("finished_execute", "c1", lost, t=2, output=[])),
        encode_log_line(_ev("execute", "c2", "pip install alive-progress", t=3)),
        encode_log_line(_ev("finished_execute", "c2", "pip install alive-progress", t=4, output=[])),
        encode_log_line(_ev("execute", "c3", "x = (", t=5)),
        encode_log_line(_ev("finished_execute", "c3", "x = (", t=6, output=[{"output_type": "error", "size": 0}])),
        encode_log_line(_ev("error", "c3", error, t=6)),
    ])
    got = read_inputs([path])
    assert got.files["k1.log"]["uncompilable"] == [1] and got.files["k1.log"]["unrepaired"] == 1
    first, magic, mistake = got.trajectories[0].executions
    assert (first.code_state, first.status, first.ename) == ("damaged", "unknown", None)
    assert [(d.kind, d.line) for d in first.damage] == [("uncompilable", "k1.log:1")]
    assert "does not compile" in first.damage[0].note and "the log recorded ok" in first.damage[0].note
    assert (magic.code_state, magic.status) == ("as_logged", "ok")
    assert (mistake.code_state, mistake.status, mistake.ename) == ("as_logged", "error", "SyntaxError")


# ---------------------------------------------------------------------------------------------------------------
# Several kernels, one notebook


def test_kernels_join_when_they_follow_one_another_and_stay_apart_when_they_overlap(tmp_path):
    folder = tmp_path / "participants" / "p1"
    _write(folder / "ka.log", [encode_log_line(_ev("execute", "c1", "a = 1", t=1, kernel="ka")),
                               encode_log_line(_ev("finished_execute", "c1", "a = 1", t=2, kernel="ka", output=[]))])
    _write(folder / "kb.log", [encode_log_line(_ev("execute", "c2", "b = 1", t=10, kernel="kb")),
                               encode_log_line(_ev("finished_execute", "c2", "b = 1", t=11, kernel="kb", output=[]))])
    (joined,) = read_inputs([folder]).trajectories
    assert joined.id == "ka" and [s.kernel_id for s in joined.sources] == ["ka", "kb"]
    assert [(e.kind, e.before, e.kernel_id) for e in joined.events] == [("restart", 1, "kb")]
    _write(folder / "kc.log", [encode_log_line(_ev("execute", "c3", "c = 1", t=5, kernel="kc")),
                               encode_log_line(_ev("finished_execute", "c3", "c = 1", t=12, kernel="kc", output=[]))])
    trajectories = read_inputs([folder]).trajectories
    assert sorted(len(t.executions) for t in trajectories) == [1, 2]  # kc ran while ka's successor kb did
    # Without a known participant nothing is joined: everyone's notebook is task1.ipynb.
    assert len(read_inputs([folder / "ka.log", folder / "kb.log"]).trajectories) == 1
    loose = tmp_path / "loose"
    for name in ("ka.log", "kb.log"):
        _write(loose / name, (folder / name).read_text(encoding="utf-8").splitlines())
    assert len(read_inputs([loose]).trajectories) == 2


# ---------------------------------------------------------------------------------------------------------------
# Personal data and bounds


def test_names_and_addresses_are_masked_the_same_way_in_every_field(tmp_path):
    code = 'open(r"C:\\Users\\Jane Roe\\data.txt")  # ask jane.roe@example.org'
    error = json.dumps({"output_type": "error", "ename": "FileNotFoundError",
                        "evalue": "No such file: '/home/jroe/data.txt' on 10.0.0.7"})
    path = _write(tmp_path / "k1.log", [
        encode_log_line(_ev("finished_execute", "c1", code, t=1, output=[{"output_type": "error", "size": 0}],
                            ip_address="192.168.7.9")),
        encode_log_line(_ev("error", "c1", error, t=1)),
    ])
    (execution,) = read_june_log(path).executions
    assert execution.code == 'open(r"C:\\Users\\<user>\\data.txt")  # ask <email>'
    assert execution.evalue == "No such file: '/home/<user>/data.txt' on <ip>"
    written = json.dumps(read_june_log(path).to_dict())
    for personal in ("Jane", "Roe", "jroe", "example.org", "10.0.0.7", "192.168"):
        assert personal not in written
    assert mask_personal('check_logging("http://203.0.113.5:9999")') == 'check_logging("http://203.0.113.5:9999")'


def _nested(depth):
    return "[" * depth + "]" * depth


def test_a_deeply_nested_log_line_is_refused_with_its_file_and_line(tmp_path, capsys):
    deep = _ev("finished_execute", t=2)
    deep["cell_output"] = _nested(100_000)
    path = _write(tmp_path / "k1.log", [encode_log_line(_ev("execute", t=1)), encode_log_line(deep)])
    with pytest.raises(BoundError, match=r"k1\.log:2: nested deeper than 64 levels"):
        read_june_log(path)
    line = encode_log_line(_ev("execute", t=1))
    whole = line[: line.index("{")] + _nested(100_000).replace('"', "\\\"") + line[line.rindex("}") + 1:]
    _write(tmp_path / "k2.log", [whole])
    for name, number in (("k1.log", 2), ("k2.log", 1)):
        assert main(["ingest", str(tmp_path / name), "-o", str(tmp_path / "t.jsonl")]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / name}:{number}: nested deeper than 64 levels (bound: depth)" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.jsonl").exists()


def test_a_deeply_nested_notebook_is_refused_with_its_file_and_line(tmp_path, capsys):
    path = tmp_path / "deep.ipynb"
    path.write_text('{"cells": [],\n "metadata": ' + _nested(100_000) + ', "nbformat": 4, "nbformat_minor": 4}',
                    encoding="utf-8")
    assert main(["ingest", str(path), "-o", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: nested deeper than 64 levels (bound: depth)" in err and "Traceback" not in err
