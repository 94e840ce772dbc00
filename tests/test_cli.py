"""The `themisto` command line: ingest on the real data, clean failures, and the workspace command."""

import hashlib
import json
import subprocess
import sys

import pytest

from themisto.cli import main
from themisto.ingest.june_log import read_june_log
from themisto.ingest.june_format import encode_log_line
from themisto.ingest.trajectory import read_jsonl

LOGS = ["bc147b33-fa74-4bff-9f48-c88809c5bdcd.log", "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"]


def test_ingest_real_logs_json(june_dir, tmp_path, capsys):
    out = tmp_path / "trajectories.jsonl"
    assert main(["ingest", *(str(june_dir / n) for n in LOGS), "-o", str(out), "--json"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed)  # exactly one JSON object, nothing else on stdout
    summaries = report["trajectories"]
    assert set(summaries) == {n[:-4] for n in LOGS} and set(report["files"]) == set(LOGS)
    assert [report["files"][n]["executions"] for n in LOGS] == [544, 220]
    assert report["files"][LOGS[0]]["damaged"] == [] and report["files"][LOGS[0]]["writer"] == "cmd"
    task1, task2 = summaries[LOGS[0][:-4]], summaries[LOGS[1][:-4]]
    assert (task1["logged_execute_events"], task2["logged_execute_events"]) == (398, 180)
    assert (task1["restarts"], task1["interrupts"]) == (1, 5)
    assert task1["errors_by_ename"]["AttributeError"] == 34 and task2["errors"] == 40
    written = {t.id: t for t in read_jsonl(out)}
    for name in LOGS:
        direct = read_june_log(june_dir / name)
        assert written[direct.id] == direct
        assert summaries[direct.id] == direct.summary()


def test_ingest_directory_prints_a_human_summary(june_dir, tmp_path, capsys):
    out = tmp_path / "all.jsonl"
    assert main(["ingest", str(june_dir), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "544 executions (398 logged execute events), 147 errors, 1 restarts, 5 interrupts" in printed
    assert "AttributeError 34" in printed
    # Every log of the folder, read recursively, one summary line each; the final notebooks beside the logs are
    # their evidence, not trajectories of their own.
    logs = sorted(june_dir.rglob("*.log"))
    assert len(logs) == 22 and all(f"{p.relative_to(june_dir).as_posix()} [" in printed for p in logs)
    written = read_jsonl(out)
    assert {t.source for t in written} == {"june-log"}
    assert sorted(s.file for t in written for s in t.sources) == sorted(p.relative_to(june_dir).as_posix()
                                                                         for p in logs)
    assert f"wrote {len(written)} trajectories to {out}" in printed


def _bad_log(tmp_path):
    good = encode_log_line({"time": "2023-05-06T10:00:00.000Z", "kernel_id": "k1", "event": "execute",
                            "cell_index": "c1", "cell_source": "x = 1"})
    path = tmp_path / "k1.log"
    path.write_text(good + "\n" + "not an event" + "\n", encoding="utf-8")
    return path


def test_ingest_bad_file_fails_cleanly_and_writes_nothing(tmp_path, capsys):
    bad = _bad_log(tmp_path)
    out = tmp_path / "out" / "t.jsonl"
    out.parent.mkdir()
    assert main(["ingest", str(bad), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: expected the line to start with" in err
    assert list(out.parent.iterdir()) == []
    # An earlier output stays as it was.
    out.write_text("previous\n", encoding="utf-8")
    assert main(["ingest", str(bad), "-o", str(out)]) == 2
    assert out.read_text(encoding="utf-8") == "previous\n"
    assert list(out.parent.iterdir()) == [out]


def test_ingest_skip_bad_lines_reports_them(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["ingest", str(_bad_log(tmp_path)), "-o", str(out), "--skip-bad-lines", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["trajectories"]["k1"]["ignored"] == {"bad_line": 1} and report["files"]["k1.log"]["skipped"] == [2]
    assert "k1: 1 bad line(s) skipped" in captured.err


def test_ingest_rejects_what_it_cannot_read(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("hi", encoding="utf-8")
    assert main(["ingest", str(other), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert "notes.txt: expected a .log, .csv, .ipynb file" in capsys.readouterr().err
    assert main(["ingest", str(tmp_path / "missing.log"), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert "missing.log: no such file" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


def test_ingest_refuses_the_same_kernel_twice(june_dir, tmp_path, capsys):
    copy = tmp_path / "copy.log"
    copy.write_bytes((june_dir / LOGS[1]).read_bytes())
    out = tmp_path / "t.jsonl"
    # Merged, the copy would run every event twice; refused instead, naming both places.
    assert main(["ingest", str(june_dir / LOGS[1]), str(copy), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{copy}:1: kernel {LOGS[1][:-4]} was already read from {june_dir / LOGS[1]}:1" in err
    assert not out.exists()


def test_import_does_no_work():
    code = "import sys, themisto.cli; print(sorted(m for m in ('pandas', 'themisto.ingest.june', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "ingest" in capsys.readouterr().out


def test_workspace_command(tmp_path, capsys):
    dest = tmp_path / "ws"
    assert main(["workspace", "--task", "task2", "-o", str(dest), "--workspace-seed", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["root"] == str(dest)
    assert printed["files"]
    for rel, digest in printed["files"].items():
        assert hashlib.sha256((dest / rel).read_bytes()).hexdigest() == digest
    # Not empty any more: refused without --overwrite, the files untouched.
    assert main(["workspace", "--task", "task2", "-o", str(dest), "--workspace-seed", "4"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert all(hashlib.sha256((dest / rel).read_bytes()).hexdigest() == d for rel, d in printed["files"].items())
