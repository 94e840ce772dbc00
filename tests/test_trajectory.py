"""The trajectory model: JSONL round trip, summaries, task names, and nothing half-written."""

import json

import pytest

from themisto.ingest.trajectory import (
    Execution,
    KernelEvent,
    OutputSummary,
    Trajectory,
    TrajectoryFormatError,
    anonymize,
    read_jsonl,
    task_of,
    write_jsonl,
)


def _sample() -> Trajectory:
    return Trajectory(
        id="k-1",
        notebook="task1.ipynb",
        source="june-log",
        task="task1",
        participant=anonymize("student_7"),
        executions=[
            Execution(cell_id="c1", code="print('héllo — 世界')", status="ok",
                      outputs=[OutputSummary("stream", 21)], started_at="2023-05-06T08:00:00.000Z",
                      finished_at="2023-05-06T08:00:00.100Z", cell_num=0),
            Execution(cell_id="c2", code="1/0", status="error", ename="ZeroDivisionError",
                      evalue="division by zero", outputs=[OutputSummary("error", 0)]),
            Execution(cell_id="c3", code="while True: pass", status="interrupted"),
            Execution(cell_id="c4", code="", status="error", ename="SyntaxError", evalue="unterminated 'string"),
        ],
        events=[KernelEvent("interrupt", 3, "2023-05-06T08:01:00.000Z"), KernelEvent("restart", 3)],
        ignored={"create": 2, "unknown:weird": 1},
        logged_events={"execute": 2, "finished_execute": 2, "error": 2},
    )


def test_jsonl_round_trip_keeps_unicode_errors_and_events(tmp_path):
    path = tmp_path / "t.jsonl"
    other = Trajectory(id="nb", notebook="x.ipynb", source="notebook")
    assert write_jsonl([_sample(), other], path) == 2
    text = path.read_text(encoding="utf-8")
    assert "世界" in text  # written as UTF-8, not escaped
    assert read_jsonl(path) == [_sample(), other]


def test_summary_counts_statuses_errors_and_raw_execute_events():
    summary = _sample().summary()
    assert summary["executions"] == 4
    assert summary["logged_execute_events"] == 2
    assert summary["errors"] == 2
    assert summary["errors_by_ename"] == {"SyntaxError": 1, "ZeroDivisionError": 1}
    assert summary["statuses"] == {"ok": 1, "error": 2, "interrupted": 1, "unknown": 0}
    assert summary["executions_without_code"] == 1
    assert (summary["restarts"], summary["interrupts"]) == (1, 1)
    assert summary["participant"] == anonymize("student_7") != "student_7"
    assert Trajectory(id="nb", notebook="x.ipynb", source="notebook").summary()["logged_execute_events"] is None


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_jsonl([_sample()], path)
    record = json.loads(path.read_text(encoding="utf-8"))
    record["executions"][0]["status"] = "exploded"
    path.write_text(path.read_text(encoding="utf-8") + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(TrajectoryFormatError, match=rf"{path.name}:3: .*exploded"):
        read_jsonl(path)


def test_write_jsonl_leaves_nothing_when_interrupted(tmp_path):
    path = tmp_path / "t.jsonl"

    def broken():
        yield _sample()
        raise RuntimeError("reader failed half way")

    with pytest.raises(RuntimeError):
        write_jsonl(broken(), path)
    assert list(tmp_path.iterdir()) == []


def test_task_of_finds_the_task_as_a_word():
    assert task_of("task1.ipynb") == "task1"
    assert task_of("participant-final-task2.ipynb") == "task2"
    assert task_of("subtask1.ipynb") is None
    assert task_of("task12.ipynb") is None
    assert task_of("analysis.ipynb") is None


def test_anonymize_is_stable_and_hides_the_name():
    assert anonymize("student_7") == anonymize("student_7") != anonymize("student_8")
    assert "student" not in anonymize("student_7")
    assert anonymize("") is None and anonymize(None) is None
