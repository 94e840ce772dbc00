"""One writer per resumable folder or file (`themisto.resume.hold_folder` / `hold_file`): for each command that
appends and resumes — generate, replay -o, score (RUN/ and -o), leaderboard -o — a second process is refused with
exit 2 and the first one's pid before it writes anything, the first finishes, and a process killed mid-write leaves no
lock that blocks the rerun. Real processes (an flock is held per process): the first one runs the real command through
tests/_paused_writer.py, which pauses it at a known point (its lock taken, or its first line written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from themisto.resume import LOCK_FILE, FolderBusy, hold_folder, lock_path, writer_of
from themisto.release.folder import open_release

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).with_name("_paused_writer.py")
GENERATE = ["generate", "--task", "next_cell", "--context", "none", "variables", "--backend", "baseline",
            "--model", "previous-cell"]


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **extra}


def themisto(*args, **env) -> subprocess.CompletedProcess:
    """The real command line in a process of its own."""
    return subprocess.run([sys.executable, "-m", "themisto.cli", *map(str, args)], env=_env(**env), text=True,
                          capture_output=True, timeout=300)


class Paused:
    """A real `themisto` command in a process of its own, paused where tests/_paused_writer.py says."""

    count = 0

    def __init__(self, tmp: Path, *args, where: str = "line", **env: str) -> None:
        Paused.count += 1
        self.ready, self.go = tmp / f"ready-{Paused.count}", tmp / f"go-{Paused.count}"
        self.proc = subprocess.Popen([sys.executable, str(SHIM), str(self.ready), str(self.go), where, "--",
                                      *map(str, args)], env=_env(**env), text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        while not self.ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                out, err = self.proc.communicate()
                pytest.fail(f"the first writer never paused (exit {self.proc.returncode}): {out}\n{err}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def finish(self) -> subprocess.CompletedProcess:
        self.go.touch()
        out, err = self.proc.communicate(timeout=300)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # no handler, no finally: the kernel alone releases what it held
        self.proc.communicate(timeout=60)


def refused(result: subprocess.CompletedProcess, path: Path, pid: int) -> None:
    """Exit 2 with one line that names the folder or file and the holder's pid."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and str(path) in lines[0] and f"pid {pid})" in lines[0], lines


# ---------------------------------------------------------------------------------------------------------------
# The helper


def test_a_hold_is_free_when_nested_and_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "run"
    with hold_folder(folder, "run folder"):
        assert writer_of(folder) is None or writer_of(folder) == os.getpid()
        with hold_folder(folder, "run folder"):  # the same process again: free
            assert (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        assert (folder / LOCK_FILE).exists()
        (folder / "kept").write_text("x")
    assert sorted(p.name for p in folder.iterdir()) == ["kept"] and writer_of(folder) is None
    with hold_folder(tmp_path / "unused"):
        pass
    assert not (tmp_path / "unused").exists()  # made for the hold and left empty: removed again


def test_a_stale_lock_file_is_taken_over_and_a_planted_link_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_FILE).write_text("999999999\n")  # a killed writer's: no process holds its lock
    assert writer_of(folder) is None
    with hold_folder(folder):
        assert (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(Exception, match="cannot be used as the lock"):
        with hold_folder(other):
            pass
    assert not (tmp_path / "elsewhere").exists() and writer_of(other) is None


def test_another_process_holding_is_named_by_pid(tmp_path):
    folder = tmp_path / "run"
    code = ("import sys, time; from themisto.resume import hold_folder\n"
            f"with hold_folder({str(folder)!r}):\n    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert writer_of(folder) == holder.pid
        with pytest.raises(FolderBusy) as busy:
            with hold_folder(folder, "run folder"):
                pytest.fail("a second holder got the lock")
        assert busy.value.pid == holder.pid and str(folder) in str(busy.value) and "run folder" in str(busy.value)
    finally:
        holder.kill()
        holder.wait()
    with hold_folder(folder):  # killed: the kernel released its lock
        assert (folder / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert lock_path(folder / "steps.jsonl", folder=False).name == ".steps.jsonl.lock"


# ---------------------------------------------------------------------------------------------------------------
# generate


def cli(capsys, *args) -> tuple[int, str, str]:
    """The real command line in this process (the paused first writer is another one)."""
    from themisto.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused_here(result: tuple[int, str, str], path: Path, pid: int) -> None:
    refused(subprocess.CompletedProcess([], result[0], result[1], result[2]), path, pid)


@pytest.mark.slow
def test_two_generates_into_one_run_folder(small_release, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*GENERATE, "--release", small_release, "-o", run]
    first = Paused(tmp_path, *args)  # paused after its first line
    written = (run / "generations.jsonl").read_bytes()
    refused_here(cli(capsys, *args), run, first.pid)
    assert (run / "generations.jsonl").read_bytes() == written  # the second wrote nothing
    refused_here(cli(capsys, "score", run), run, first.pid)  # a reader of the unfinished folder: being written
    code, out, _ = cli(capsys, "leaderboard", run, "--release", small_release, "-o", tmp_path / "board")
    assert code == 2 and f"being written by another process (pid {first.pid})" in out  # a submission, refused
    done = first.finish()
    assert done.returncode == 0, done.stderr
    lines = (run / "generations.jsonl").read_text().splitlines()
    keys = [(r["id"], r["context"], r["sample"]) for r in map(json.loads, lines)]
    assert len(keys) == len(set(keys)) > 1 and not (run / LOCK_FILE).exists()
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0 and json.loads(out)["written"] == 0, err
    assert cli(capsys, "score", run)[0] == 0

    # Killed mid-write (after its first line): nothing blocks the rerun, which resumes and finishes.
    killed = tmp_path / "killed"
    args = [a if a != run else killed for a in args]
    victim = Paused(tmp_path, *args)
    victim.kill()
    assert (killed / LOCK_FILE).exists() and writer_of(killed) is None
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0 and json.loads(out)["resumed"] == 1 and json.loads(out)["written"] == len(keys) - 1, err
    assert cli(capsys, "score", killed)[0] == 0


# ---------------------------------------------------------------------------------------------------------------
# replay -o


def _notebook(path: Path, cells: list[str]) -> Path:
    cells = [{"cell_type": "code", "execution_count": i + 1, "id": f"c{i}", "metadata": {}, "outputs": [],
              "source": code} for i, code in enumerate(cells)]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


@pytest.mark.slow
def test_two_replays_into_one_steps_file(tmp_path, capsys):
    # One process here (each replay starts a kernel): the second writer is refused while the first is mid-write,
    # then the first is killed there, and the rerun is not blocked and writes every step.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    notebook = _notebook(tmp_path / "task1.ipynb", ["x = 1", "y = x + 1", "print(y)"])
    steps = tmp_path / "out" / "steps.jsonl"
    args = ["replay", notebook, "--workspace", workspace, "--no-values", "-o", steps]
    first = Paused(tmp_path, *args)  # paused after its first step's line
    partial = steps.with_name("steps.jsonl.partial")
    written = partial.read_bytes()
    refused_here(cli(capsys, *args), steps, first.pid)
    assert partial.read_bytes() == written and len(written.splitlines()) == 1  # the second wrote nothing
    first.kill()
    assert lock_path(steps, folder=False).exists() and writer_of(steps, folder=False) is None
    code, out, err = cli(capsys, *args)
    assert code == 0 and "wrote 3 steps" in out, err
    assert len(steps.read_text().splitlines()) == 1 + 3 and not partial.exists()  # the header and three steps
    assert not lock_path(steps, folder=False).exists()


# ---------------------------------------------------------------------------------------------------------------
# score RUN/ --execute


@pytest.mark.slow
def test_two_executing_scorers_into_one_run_folder(probe_release, tmp_path, capsys, allow_execution):
    # As for replay, one process of its own: refused while it writes, then killed mid-write; the rerun resumes.
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run

    release, workspace = probe_release
    run = tmp_path / "run"
    generate_run(open_release(release), run, RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("none",), limit=2),
                                           backend="baseline", model="previous-cell"), progress=False)
    args = ["score", run, "--execute", "--workspace", workspace]
    first = Paused(tmp_path, *args, HF_ALLOW_CODE_EVAL="1")  # paused after its trajectory's verdicts line
    partial = run / "scorer_records.json.partial.jsonl"
    written = partial.read_bytes()
    refused_here(cli(capsys, *args), run, first.pid)
    refused_here(cli(capsys, *GENERATE[:-4], "--backend", "baseline", "--model", "previous-cell", "--release",
                     release, "-o", run), run, first.pid)  # nor may generate write into it meanwhile
    assert partial.read_bytes() == written
    first.kill()  # its trajectory's line written, results not yet
    assert (run / LOCK_FILE).exists() and writer_of(run) is None
    code, out, err = cli(capsys, *args, "--json")
    assert code == 0 and "kept from the earlier run" in err, err  # resumed: nothing executed again
    executed = json.loads((run / "results.json").read_text())
    assert executed["executed"] is True and executed["counts"]["execution"] == {"scored": 2}
    assert not partial.exists() and not (run / LOCK_FILE).exists()


# ---------------------------------------------------------------------------------------------------------------
# leaderboard -o


@pytest.mark.slow
def test_two_leaderboards_into_one_board_folder(small_release, tmp_path, capsys):
    from _leaderboard import write_run

    good = write_run(tmp_path / "subs" / "good", small_release, model="org/good")
    board = tmp_path / "board"
    args = ["leaderboard", good, "--release", small_release, "-o", board]
    first = Paused(tmp_path, *args, where="hold")  # paused with the board folder held, nothing written yet
    refused_here(cli(capsys, *args), board, first.pid)
    assert sorted(p.name for p in board.iterdir()) == [LOCK_FILE]
    done = first.finish()
    assert done.returncode == 0 and "1 submission(s) on the board, 0 refused" in done.stdout, done.stderr
    assert not (board / LOCK_FILE).exists()

    victim = Paused(tmp_path, *args, where="hold")
    victim.kill()
    code, out, err = cli(capsys, *args)
    assert code == 0 and "1 submission(s) on the board, 0 refused" in out, err
    assert "scores from the cache" in err  # the first one's cached scores, reused


# ---------------------------------------------------------------------------------------------------------------
# Text that is not Unicode

SURROGATE = "x = 1  # \ud800"  # valid JSON once written (json.dumps escapes it), not text UTF-8 can encode


def test_a_lone_surrogate_costs_only_its_submission(small_release, tmp_path, capsys):
    from _leaderboard import task_rows, write_run

    bad_id = task_rows(small_release, "next_cell")[2]["id"]
    good = write_run(tmp_path / "subs" / "good", small_release, model="org/good")
    bad = write_run(tmp_path / "subs" / "surrogate", small_release, model="org/surrogate",
                    predict=lambda row, context, sample: SURROGATE if row["id"] == bad_id else "x")
    line = next(n for n, text in enumerate((bad / "generations.jsonl").read_text().splitlines(), start=1)
                if "\\ud800" in text)
    code, out, err = cli(capsys, "leaderboard", good, bad, "--release", small_release, "-o", tmp_path / "board")
    assert code == 2 and "1 submission(s) on the board, 1 refused" in out, err
    refusal = f"refused: surrogate/generations.jsonl:{line}: text that is not Unicode: a lone surrogate U+D800 in " \
              "prediction, character 10 (UTF-8 cannot encode it)"
    assert refusal in out.splitlines()
    entries = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert "org/good" in json.dumps(entries) and "Traceback" not in err

    code, out, err = cli(capsys, "score", bad)  # the run folder: one line, exit 2
    assert code == 2 and err.strip().splitlines() == [
        f"themisto score: error: {bad}/generations.jsonl:{line}: text that is not Unicode: a lone surrogate U+D800 "
        "in prediction, character 10 (UTF-8 cannot encode it)"]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(json.dumps({"id": bad_id, "prediction": ["ok", SURROGATE]}) + "\n")
    code, out, err = cli(capsys, "score", "--release", small_release, "--predictions", predictions, "-o",
                         tmp_path / "results.json")
    assert code == 2 and err.strip().splitlines() == [
        f"themisto score: error: {predictions}:1: text that is not Unicode: a lone surrogate U+D800 in "
        "prediction[1], character 10 (UTF-8 cannot encode it)"]
    assert not (tmp_path / "results.json").exists()


def test_a_backend_answering_a_lone_surrogate_fails_that_generation_only(small_release, tmp_path):
    from test_generation_openai import FlakyEndpointStandIn

    from themisto.generation.backends import make_backend
    from themisto.generation.run_folder import read_run
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run
    from themisto.scoring.run_scores import score_run

    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("none",), limit=2), backend="openai",
                           model="stand-in-model")
    with FlakyEndpointStandIn([200], content="```python\n" + SURROGATE + "\n```") as endpoint:
        report = generate_run(open_release(small_release), tmp_path / "run", settings, progress=False,
                              backend=make_backend("openai", "stand-in-model", base_url=endpoint.url))
    assert report.counts == {"generations": 2, "failed": 2}
    records = list(read_run(tmp_path / "run").generations.values())  # the file is UTF-8 and reads back
    for record in records:
        assert record.status == "failed" and record.prediction == ""
        assert record.reason.startswith("the backend's text is not Unicode: a lone surrogate U+D800 in raw")
        assert record.raw == "```python\nx = 1  # \\ud800\n```"  # kept, the surrogate escaped
    results = score_run(tmp_path / "run")
    assert results["counts"]["by_context"]["none"]["failed"] == 2


def test_a_stored_value_keeps_its_lone_surrogate_and_a_yaml_escape_is_refused():
    from themisto.bounded import BoundError, loads_yaml
    from themisto.release.values import check_value
    from themisto.runtime.agent.formats import read_value

    # A developer's `s = "\ud800"` is a Python str: its value document (ASCII JSON) is read back as it was.
    data = b'{"themisto_value": 1, "type": "builtins.str", "value": "\\ud800"}'
    check_value("json", data)
    assert read_value(data, "json", lambda digest: None) == "\ud800"
    with pytest.raises(BoundError, match=r"card.md:3: text that is not Unicode: a lone surrogate U\+DC00 in b"):
        loads_yaml('a: 1\nb: "x\\udc00"\n', path="card.md", first_line=2)
