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


def test_two_generates_into_one_run_folder(small_release, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*GENERATE, "--release", small_release, "-o", run]
    first = Paused(tmp_path, *args)  # paused after its first line
    written = (run / "generations.jsonl").read_bytes()
    refused_here(cli(capsys, *args), run, first.pid)
    assert (run / "generations.jsonl").read_bytes() == written  # the second wrote nothing
    refused_here(cli(capsys, "score", run), run, first.pid)  # a reader of the unfinished folder: being written
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
