"""JuNE readers: the real logs' figures, each pairing rule, the table reader, and every kind of bad input."""

import csv
import json
from dataclasses import replace
import random
from collections import Counter

import pytest

from themisto.ingest.june import JuneFormatError
from themisto.ingest.june_log import read_june_log, read_june_logs, read_log_file
from themisto.ingest.june_table import read_june_table
from themisto.ingest.june_format import decode_log_line, encode_log_line
from themisto.ingest.trajectory import anonymize

TASK1 = "bc147b33-fa74-4bff-9f48-c88809c5bdcd.log"
TASK2 = "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"
TASK1_ERRORS = {
    "AttributeError": 34, "KeyError": 28, "TypeError": 26, "SyntaxError": 13, "NameError": 12, "ValueError": 8,
    "ModuleNotFoundError": 6, "IndexError": 6, "KeyboardInterrupt": 6, "NotImplementedError": 5,
    "IntCastingNaNError": 1, "IndentationError": 1,
}


def _raw_events(path):
    with path.open(encoding="utf-8") as fh:
        return [decode_log_line(line) for line in fh]


def _logged_enames(path) -> Counter:
    return Counter(json.loads(ev["cell_source"])["ename"] for ev in _raw_events(path) if ev["event"] == "error")


# ---------------------------------------------------------------------------------------------------------------
# The real logs


@pytest.mark.parametrize("name, logged_execute", [(TASK1, 398), (TASK2, 180)])
def test_real_log_errors_match_the_logged_error_events(june_dir, name, logged_execute):
    path = june_dir / name
    traj = read_june_log(path)
    raw = _raw_events(path)
    summary = traj.summary()
    assert summary["logged_execute_events"] == logged_execute == sum(ev["event"] == "execute" for ev in raw)
    by_ename = traj.errors_by_ename()
    # Every `error` event is one errored execution with that ename; "<unknown>" are error outputs whose
    # `error` event is missing from the log.
    assert {k: v for k, v in by_ename.items() if k != "<unknown>"} == dict(_logged_enames(path))
    assert traj.id == raw[0]["kernel_id"] and traj.notebook == raw[0]["notebook_name"]
    assert traj.source == "june-log" and traj.participant is None
    # Every execute event became an execution, in order; the rest were logged without one.
    started = [ex for ex in traj.executions if ex.started_at is not None]
    assert [ex.code for ex in started] == [ev["cell_source"] for ev in raw if ev["event"] == "execute"]
    positions = [ex.started_at or ex.finished_at for ex in traj.executions]
    assert positions == sorted(positions)


def test_task1_log_figures(june_dir):
    traj = read_june_log(june_dir / TASK1)
    assert traj.task == "task1"
    assert traj.errors_by_ename() == dict(sorted({**TASK1_ERRORS, "<unknown>": 1}.items()))
    assert sum(TASK1_ERRORS.values()) == 146
    assert traj.count_events("restart") == 1 and traj.count_events("interrupt") == 5
    statuses = traj.count_statuses()
    assert statuses["ok"] == 368  # execute → finished pairs
    # 398 execute events + 145 errors logged without one + 1 error output whose error event is missing
    assert len(traj.executions) == 398 + 145 + 1 == 544
    assert traj.ignored["duplicate_finished_execute"] == 59
    assert traj.ignored["finished_without_execute"] == 21
    assert statuses["interrupted"] + statuses["unknown"] == 29  # 26 superseded by a re-run, 3 never finished
    restart = next(ev for ev in traj.events if ev.kind == "restart")
    assert restart.before == 2 and restart.time.startswith("2023-05-06T08:33:57")
    # The participant's first imports failed before `!pip install pandas` ran: kept as they happened.
    first_error = next(ex for ex in traj.executions if ex.status == "error")
    assert (first_error.ename, first_error.evalue) == ("ModuleNotFoundError", "No module named 'pandas'")


def test_task2_log_figures(june_dir):
    traj = read_june_log(june_dir / TASK2)
    assert traj.task == "task2"
    assert sum(traj.errors_by_ename().values()) == 40 and "<unknown>" not in traj.errors_by_ename()
    assert traj.count_statuses()["ok"] == 170
    assert len(traj.executions) == 180 + 40
    assert traj.events == []
    # One SyntaxError was logged as an `error` event only: its code is unknown, not guessed.
    (blind,) = [ex for ex in traj.executions if ex.code == ""]
    assert blind.ename == "SyntaxError" and blind.started_at is None


def test_logs_read_together_group_by_kernel(june_dir):
    trajs = read_june_logs([june_dir / TASK2, june_dir / TASK1])
    assert sorted(t.id for t in trajs) == sorted([TASK1[:-4], TASK2[:-4]])
    single = {t.id: t for t in (read_june_log(june_dir / TASK1), read_june_log(june_dir / TASK2))}
    assert all(t == single[t.id] for t in trajs)


# ---------------------------------------------------------------------------------------------------------------
# Pairing rules on small synthetic logs


def _ev(event, cell="c1", source="", t=0, output=None, kernel="k1", **extra):
    record = {
        "time": f"2023-05-06T10:00:{t:06.3f}Z", "kernel_id": kernel, "notebook_name": "task2.ipynb",
        "event": event, "cell_index": cell, "cell_num": 0, "cell_type": "code", "cell_source": source,
        "session_id": "s1", "cell_output": None if output is None else json.dumps(output),
    }
    record.update(extra)
    return record


def _err(ename, evalue, cell="c1", t=0):
    return _ev("error", cell, json.dumps({"output_type": "error", "ename": ename, "evalue": evalue}), t)


def _write_log(path, records, *, raw_lines=()):
    lines = [encode_log_line(r) for r in records] + list(raw_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


ERROR_OUT = [{"output_type": "error", "size": 0}]


def test_pairing_rules(tmp_path):
    records = [
        _ev("create", "c1", t=0),
        _ev("execute", "c1", "x = 1", t=1),
        _ev("finished_execute", "c1", "x = 1", t=2, output=[]),  # 0: ok
        _ev("finished_execute", "c1", "x = 1", t=3, output=[]),  # duplicate of the previous finish
        _ev("finished_execute", "c2", "1/0", t=4, output=ERROR_OUT),  # 1: error without execute
        _err("ZeroDivisionError", "division by zero", "c2", t=4),
        _ev("execute", "c3", "slow()", t=5),  # 2: superseded after an interrupt → interrupted
        _ev("kernel_interrupting", "", t=6),
        _ev("execute", "c3", "slow(1)", t=7),  # 3: error after its execute
        _ev("finished_execute", "c3", "slow(1)", t=8, output=ERROR_OUT),
        _err("KeyboardInterrupt", "", "c3", t=8),
        _ev("finished_execute", "c4", "later()", t=9, output=[]),  # aborted queued cell: not a run
        _ev("execute", "c5", "a", t=10),  # 4: superseded, no kernel event → unknown
        _ev("execute", "c5", "b", t=11),  # 5: ok
        _ev("finished_execute", "c5", "b", t=12, output=[{"output_type": "execute_result", "size": 3}]),
        _err("SyntaxError", "unterminated string literal", "c6", t=13),  # 6: finish line lost → code ""
        _ev("kernel_restarting", "", t=14),
        _ev("finished_execute", "c7", "boom()", t=15, output=ERROR_OUT),  # 7: error event lost → ename None
        _ev("execute", "c8", "print(2)", t=16),  # 8: never finished before the end of the log
        _ev("teleport", "c8", t=17),
    ]
    traj = read_june_log(_write_log(tmp_path / "k1.log", records))
    got = [(ex.cell_id, ex.code, ex.status, ex.ename) for ex in traj.executions]
    assert got == [
        ("c1", "x = 1", "ok", None),
        ("c2", "1/0", "error", "ZeroDivisionError"),
        ("c3", "slow()", "interrupted", None),
        ("c3", "slow(1)", "error", "KeyboardInterrupt"),
        ("c5", "a", "unknown", None),
        ("c5", "b", "ok", None),
        ("c6", "", "error", "SyntaxError"),
        ("c7", "boom()", "error", None),
        ("c8", "print(2)", "unknown", None),
    ]
    assert traj.executions[1].started_at is None and traj.executions[1].finished_at.endswith("04.000Z")
    assert traj.executions[1].evalue == "division by zero"
    assert traj.executions[5].outputs[0].size == 3
    assert [(ev.kind, ev.before) for ev in traj.events] == [("interrupt", 3), ("restart", 7)]
    assert traj.ignored == {
        "create": 1, "duplicate_finished_execute": 1, "finished_without_execute": 1, "unknown:teleport": 1,
    }
    assert traj.logged_events["execute"] == 6 and traj.logged_events["teleport"] == 1
    assert traj.errors_by_ename() == {
        "<unknown>": 1, "KeyboardInterrupt": 1, "SyntaxError": 1, "ZeroDivisionError": 1,
    }


def test_repeated_errored_finish_with_its_error_event_is_a_run(tmp_path):
    # The extension sends an `error` event after each errored finish, so an identical pair is a second run.
    pair = [_ev("finished_execute", "c1", "1/0", t=1, output=ERROR_OUT), _err("ZeroDivisionError", "x", t=1)]
    again = [_ev("finished_execute", "c1", "1/0", t=2, output=ERROR_OUT), _err("ZeroDivisionError", "x", t=2)]
    traj = read_june_log(_write_log(tmp_path / "k.log", pair + again))
    assert [ex.status for ex in traj.executions] == ["error", "error"]


# ---------------------------------------------------------------------------------------------------------------
# Bad input


def test_malformed_line_names_file_line_and_expectation(tmp_path):
    path = _write_log(tmp_path / "k1.log", [_ev("execute", t=1)], raw_lines=["not an event"])
    with pytest.raises(JuneFormatError, match=r"k1\.log:2: expected the line to start with"):
        read_june_log(path)
    traj = read_june_log(path, skip_bad_lines=True)
    assert traj.ignored["bad_line"] == 1 and len(traj.executions) == 1


def test_bad_json_inside_a_line_names_the_line(tmp_path):
    path = _write_log(tmp_path / "k1.log", [_ev("execute", t=1)], raw_lines=["'\"{not json\"[EVENT_SEPARATOR]' "])
    with pytest.raises(JuneFormatError, match=r"k1\.log:2: expected a twice-encoded JSON object"):
        read_june_log(path)


def test_missing_field_and_bad_cell_output_are_bad_lines(tmp_path):
    no_kernel = _ev("execute", t=1)
    del no_kernel["kernel_id"]
    path = _write_log(tmp_path / "a.log", [_ev("execute", t=0), no_kernel])
    with pytest.raises(JuneFormatError, match=r"a\.log:2: expected a non-empty 'kernel_id' field"):
        read_june_log(path)
    bad_output = _ev("finished_execute", t=1)
    bad_output["cell_output"] = "{oops"
    path = _write_log(tmp_path / "b.log", [_ev("execute", t=0), bad_output])
    with pytest.raises(JuneFormatError, match=r"b\.log:2: expected cell_output to be a JSON list"):
        read_june_log(path)
    bad_error = _ev("error", source="Traceback...", t=2)
    path = _write_log(tmp_path / "c.log", [_ev("execute", t=0), bad_error])
    with pytest.raises(JuneFormatError, match=r"c\.log:2: expected the error event's cell_source to be JSON"):
        read_june_log(path)


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "k1.log"
    good = encode_log_line(_ev("execute", "c1", "x = 1", t=1)).encode("utf-8")
    bad = encode_log_line(_ev("execute", "c1", "y = ?", t=2)).encode("utf-8").replace(b"?", b"\xff")
    path.write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(JuneFormatError, match=r"k1\.log:2: expected UTF-8 text, got byte 0xff"):
        read_june_log(path)
    assert read_june_log(path, skip_bad_lines=True).ignored == {"bad_line": 1}


def test_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.log"
    path.write_text("", encoding="utf-8")
    with pytest.raises(JuneFormatError, match=r"empty\.log:1: empty file"):
        read_june_log(path, skip_bad_lines=True)


def test_file_of_only_bad_lines_is_an_error_even_when_skipping(tmp_path):
    path = tmp_path / "junk.log"
    path.write_text("junk\nmore junk\n", encoding="utf-8")
    with pytest.raises(JuneFormatError, match=r"junk\.log:1: no readable JuNE event in 2 line"):
        read_june_log(path, skip_bad_lines=True)


def test_truncated_last_line_is_read_as_far_as_it_goes(tmp_path, june_dir):
    """A log copied while it was written ends in half a line: it is named as cut, and what survived is read."""
    lines = (june_dir / TASK2).read_text(encoding="utf-8").splitlines()
    path = tmp_path / "cut.log"
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2], encoding="utf-8")
    log = read_log_file(path)
    (damaged,) = log.damaged
    assert (damaged.line, damaged.kinds, damaged.repaired_from) == (len(lines), ("cut_line",), None)
    last = decode_log_line(lines[-1])
    assert damaged.event == last["event"] and len(log.events) == len(lines)
    assert log.events[-1].time == last["time"] and log.events[-1].damage[0].line == f"cut.log:{len(lines)}"
    whole = read_june_log(june_dir / TASK2)
    assert read_june_log(path).logged_events == whole.logged_events


def test_unknown_event_is_kept_counted_and_not_fatal(tmp_path):
    records = [_ev("execute", "c1", "x", t=1), _ev("cell_teleported", "c1", t=2),
               _ev("finished_execute", "c1", "x", t=3, output=[])]
    traj = read_june_log(_write_log(tmp_path / "k1.log", records))
    assert traj.ignored == {"unknown:cell_teleported": 1}
    assert [ex.status for ex in traj.executions] == ["ok"]


def test_one_log_with_two_kernels(tmp_path):
    records = [_ev("execute", t=1, kernel="k1"), _ev("execute", t=2, kernel="k2")]
    path = _write_log(tmp_path / "mixed.log", records)
    with pytest.raises(JuneFormatError, match=r"mixed\.log:2: kernel k2 in a log of kernel k1.*read_june_logs"):
        read_june_log(path)
    assert sorted(t.id for t in read_june_logs([path])) == ["k1", "k2"]


# ---------------------------------------------------------------------------------------------------------------
# The JuNE table


TABLE_HEADER = ["action_id", "time", "session_id", "kernel_id", "notebook_name", "event", "cell_index",
                "cell_num", "cell_type", "cell_source", "cell_output", "user_id"]


def _table_rows(raw_events, user_id):
    rows = []
    for action_id, ev in enumerate(raw_events):
        row = {key: ev.get(key) for key in TABLE_HEADER}
        row["action_id"], row["user_id"] = action_id, user_id
        rows.append({k: "" if v is None else v for k, v in row.items()})
    return rows


def _write_table(path, rows):
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=TABLE_HEADER)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_table_yields_the_same_trajectories_as_the_logs(tmp_path, june_dir):
    rows = (_table_rows(_raw_events(june_dir / TASK1), "student_7")
            + _table_rows(_raw_events(june_dir / TASK2), "student_7"))
    # Shuffled: the reader must restore the order from time, then action_id (finish and error share a time).
    random.Random(0).shuffle(rows)
    trajs = {t.id: t for t in read_june_table(_write_table(tmp_path / "dataset.csv", rows))}
    for name in (TASK1, TASK2):
        from_log = read_june_log(june_dir / name)
        from_table = trajs[from_log.id]
        assert from_table.source == "june-table"
        assert from_table.participant == anonymize("student_7") != "student_7"
        # The same executions; each names the lines it came from in its own file.
        def unplaced(executions):
            return [replace(ex, origin=None, damage=[replace(d, line="") for d in ex.damage]) for ex in executions]

        assert unplaced(from_table.executions) == unplaced(from_log.executions)
        assert from_table.executions[0].origin.startswith("dataset.csv:")
        assert from_table.events == from_log.events
        assert from_table.ignored == from_log.ignored
        assert from_table.logged_events == from_log.logged_events


def test_table_bad_rows_name_file_and_line(tmp_path):
    raw = [_ev("execute", "c1", "x = 1", t=1), _ev("finished_execute", "c1", "x = 1", t=2, output=[])]
    path = _write_table(tmp_path / "t.csv", _table_rows(raw, "u1"))
    text = path.read_text(encoding="utf-8")
    path.write_text(text + "7,2023-05-06T10:00:03.000Z,s1,k1\n", encoding="utf-8")
    with pytest.raises(JuneFormatError, match=r"t\.csv:4: expected 12 fields, got 4"):
        read_june_table(path)
    (traj,) = read_june_table(path, skip_bad_lines=True)
    assert traj.ignored == {"bad_line": 1} and len(traj.executions) == 1
    path.write_bytes(text.encode("utf-8").replace(b"x = 1", b"x = \xff", 1))
    with pytest.raises(JuneFormatError, match=r"t\.csv:2: expected UTF-8"):
        read_june_table(path)


def test_table_without_the_columns_is_an_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(JuneFormatError, match=r"t\.csv:1: expected the columns action_id, time"):
        read_june_table(path)
    path.write_text("", encoding="utf-8")
    with pytest.raises(JuneFormatError, match=r"t\.csv:1: empty file"):
        read_june_table(path)


def test_table_written_by_pandas_reads_back(tmp_path):
    import pandas as pd

    raw = [_ev("execute", "c1", "x = 1", t=1), _ev("finished_execute", "c1", "x = 1", t=2, output=[]),
           _ev("kernel_restarting", "", t=3, cell_num=None)]
    frame = pd.DataFrame(_table_rows(raw, "u1"))
    frame["cell_num"] = pd.to_numeric(frame["cell_num"]).astype(float)  # NaN where missing, "0.0" otherwise
    frame.to_csv(tmp_path / "t.csv", index=False)
    (traj,) = read_june_table(tmp_path / "t.csv")
    assert [(ex.code, ex.status, ex.cell_num) for ex in traj.executions] == [("x = 1", "ok", 0)]
    assert [ev.kind for ev in traj.events] == ["restart"]
