"""Hostile candidates run as branches: each ends in a closed outcome, the kernel's state hash is unchanged, the kernel
still answers, its workspace files are as they were, and no process or thread is left behind."""

import os
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from _isolation import isolation_unavailable

from themisto.runtime.branch import run_branches
from themisto.runtime.kernel import KernelSession
from themisto.runtime.snapshot import agent_call, take_snapshot

pytestmark = pytest.mark.slow

TIMEOUT_S = 1.5
BRANCH_MEMORY = 512 * 2**20  # far under the kernel's own 4 GiB cap, so a 2 GiB allocation proves the branch cap

_INPUTS = {"input.csv": "a,b\n1,2\n3,4\n", os.path.join("data", "raw.txt"): "raw data\n"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-workspace")
    for name, text in _INPUTS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


@pytest.fixture(scope="module")
def session(workspace):
    with KernelSession(workspace) as session:
        setup = session.execute("import numpy as np\nimport pandas as pd\n"
                                "frame = pd.DataFrame({'n': np.arange(200_000), 's': ['w'] * 200_000})\n"
                                "total = int(frame['n'].sum())\nwords = ['a', 'b']")
        assert setup.status == "ok", setup.traceback
        yield session


def _uid_processes(session) -> int:
    if session.kernel_uid is None:
        return 0
    return sum(1 for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == session.kernel_uid)


def _counts(session) -> tuple:
    # The kernel's own thread count is left out: ipykernel starts threads of its own when it likes.
    return agent_call(session, "process_count", timeout=30)["processes"], _uid_processes(session)


def _run_hostile(session, code: str, timeout_s: float = TIMEOUT_S, **kwargs):
    """Run one candidate; check what must hold after any candidate; return its result."""
    before = take_snapshot(session)
    counts = _counts(session)
    [result] = run_branches(session, [code], timeout_s=timeout_s, memory_bytes=BRANCH_MEMORY, **kwargs)
    assert result.status in ("ok", "error", "timeout", "kernel_died")
    assert session.alive
    assert take_snapshot(session).state_hash == before.state_hash
    check = session.execute("total + len(words)")
    assert check.status == "ok" and check.outputs[0]["data"]["text/plain"] == str(199_999 * 100_000 + 2)
    deadline = time.monotonic() + 5  # an orphaned child is reaped by the sandbox's init, not by the kernel
    while _counts(session) != counts and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _counts(session) == counts
    for name, text in _INPUTS.items():
        assert (session.workdir / name).read_text() == text
    return result


def test_busy_loop_times_out(session):
    result = _run_hostile(session, "print('started')\nwhile True:\n    pass")
    assert result.status == "timeout"
    assert result.outputs == [{"output_type": "stream", "name": "stdout", "text": "started\n"}]  # kept up to the end


def test_c_loop_that_ignores_signals_is_killed(session):
    result = _run_hostile(session, "sum(range(10**12))")
    assert result.status == "timeout" and result.state_hash_after is None


def test_replaced_signal_handlers_and_cancelled_timer_are_killed(session):
    code = ("import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 0)\nwhile True:\n    pass")
    assert _run_hostile(session, code).status == "timeout"


def test_fifty_gigabytes_fail_with_memory_error(session):
    result = _run_hostile(session, "block = bytearray(50 * 2**30)")
    assert (result.status, result.ename) == ("error", "MemoryError")


def test_the_branch_memory_cap_is_lower_than_the_kernels(session):
    result = _run_hostile(session, "block = bytearray(2 * 2**30)")
    assert (result.status, result.ename) == ("error", "MemoryError")


def test_fork_storm_hits_the_process_cap_and_leaves_no_children(session):
    if session.kernel_uid is None and os.geteuid() == 0:
        isolation_unavailable("the kernel runs as root, which the process cap does not bind")
    code = ("import os, time\nborn = 0\nfor _ in range(5000):\n    if os.fork() == 0:\n        time.sleep(600)\n"
            "        os._exit(0)\n    born += 1")
    result = _run_hostile(session, code, timeout_s=30)  # each fork copies the page tables: ~20 ms here
    assert (result.status, result.ename) == ("error", "BlockingIOError")


def test_the_candidates_after_a_fork_storm_still_run(session):
    # The next candidate is forked while this one runs; where the storm holds every process the uid may have, that
    # fork fails and is made again in its turn.
    if session.kernel_uid is None and os.geteuid() == 0:
        isolation_unavailable("the kernel runs as root, which the process cap does not bind")
    storm = ("import os, time\nfor _ in range(5000):\n    if os.fork() == 0:\n        time.sleep(600)\n"
             "        os._exit(0)")
    results = run_branches(session, [storm, "print(len(words))", "print(words[0])"], timeout_s=30,
                           memory_bytes=BRANCH_MEMORY)
    assert (results[0].status, results[0].ename) == ("error", "BlockingIOError")
    assert [r.outputs[0]["text"] for r in results[1:]] == ["2\n", "a\n"]


def test_the_next_candidate_sees_the_work_folder_restored(session):
    # It was forked while the one before it ran and changed the files; it runs only after they are restored.
    change = "open('input.csv', 'w').write('changed')\nimport time\ntime.sleep(0.3)"
    read = "print(open('input.csv').read(), end='')"
    changed, seen = run_branches(session, [change, read], timeout_s=TIMEOUT_S)
    assert changed.workdir_changes == {"modified": ["input.csv"]}
    assert seen.outputs[0]["text"] == _INPUTS["input.csv"]


def test_os_exit_is_a_dead_branch(session):
    result = _run_hostile(session, "import os\nos._exit(1)")
    assert result.status == "kernel_died" and "status 1" in result.evalue


def test_sys_exit_is_an_error(session):
    result = _run_hostile(session, "import sys\nsys.exit()")
    assert (result.status, result.ename) == ("error", "SystemExit")


def test_killing_the_parent_does_not_reach_the_kernel(session):
    result = _run_hostile(session, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')")
    assert result.status == "ok" and result.outputs[0]["text"] == "alive\n"
    assert result.suspicious == ["os.kill"]


@pytest.mark.parametrize("code", ["print('x' * 200_000_000)", "import os\nos.write(1, b'y' * 200_000_000)"],
                         ids=["python", "fd"])
def test_two_hundred_megabytes_are_cut_at_the_output_cap(session, code):
    result = _run_hostile(session, code, timeout_s=20, output_bytes=2**20)  # 200 MB take a while to write
    assert result.status == "ok" and result.truncated
    kept = sum(len(o["text"]) for o in result.outputs if o["output_type"] == "stream" and o["name"] == "stdout")
    assert 0 < kept <= 2**20
    assert "output truncated" in result.outputs[-1]["text"]


def test_workspace_files_deleted_or_overwritten_are_restored(session):
    code = ("import os\nos.remove('input.csv')\nopen('data/raw.txt', 'w').write('garbage')\n"
            "os.chmod('data/raw.txt', 0)\nopen('made.txt', 'w').write('new')\nos.makedirs('newdir/inner')")
    result = _run_hostile(session, code)
    assert result.status == "ok"
    assert result.workdir_changes == {"added": ["made.txt", "newdir", os.path.join("newdir", "inner")],
                                      "deleted": ["input.csv"], "modified": [os.path.join("data", "raw.txt")]}
    assert result.workdir_restored
    assert not (session.workdir / "made.txt").exists() and not (session.workdir / "newdir").exists()
    assert session.execute("open('data/raw.txt').read()").outputs[0]["data"]["text/plain"] == repr("raw data\n")


def test_writing_outside_the_workdir_fails(session):
    if not session.sandboxed:
        isolation_unavailable("no bubblewrap: the filesystem outside the workdir is not read-only")
    outside = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="themisto-outside-"))
    try:
        outside.chmod(0o777)  # writable by the kernel's uid, were the filesystem not read-only
        result = _run_hostile(session, f"open({str(outside / 'escaped.txt')!r}, 'w').write('x')")
        assert result.status == "error" and result.ename == "OSError" and "Read-only" in result.evalue
        assert not (outside / "escaped.txt").exists()
    finally:
        for child in outside.iterdir():
            child.unlink()
        outside.rmdir()


def test_a_socket_to_localhost_is_refused(session):
    result = _run_hostile(session, "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)")
    assert result.status == "error" and result.ename in ("OSError", "ConnectionRefusedError")


def test_a_thread_left_running_dies_with_the_branch(session):
    result = _run_hostile(session, "import threading, time\n"
                                   "threading.Thread(target=time.sleep, args=(600,)).start()\nprint('started')")
    assert result.status == "ok" and result.outputs[0]["text"] == "started\n"


_WRITERS = ("import os, threading\n"
            "def write():\n"
            "    while True:\n"
            "        with open('input.csv', 'w') as f:\n"
            "            f.write('overwritten')\n"
            "for _ in range(3):\n"
            "    threading.Thread(target=write, daemon=True).start()\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        write()\n"
            "    os._exit(0)\n"
            "print('writing')")


def test_what_a_candidate_left_writing_cannot_reach_the_next_one(session):
    # The kernel goes on as soon as a candidate that reported can do nothing more (every thread exiting, no
    # process left in its pid namespace), not when its exit is over: threads and an escaped grandchild that keep
    # writing the work folder are all stopped before it is restored and the next candidate starts.
    reader = "print(open('input.csv').read(), end='')"
    results = run_branches(session, [_WRITERS, reader, _WRITERS, reader], timeout_s=TIMEOUT_S,
                           memory_bytes=BRANCH_MEMORY)
    assert [r.outputs[0]["text"] for r in results] == ["writing\n", _INPUTS["input.csv"]] * 2
    assert results[0].workdir_changes == {"modified": ["input.csv"]} and results[0].workdir_restored
    time.sleep(0.2)
    assert (session.workdir / "input.csv").read_text() == _INPUTS["input.csv"]


def test_a_candidate_that_floods_or_closes_its_go_socket_costs_only_itself(session):
    # Its word that it reported is only a reason to look at the report mapping; lies and floods change nothing.
    flood = ("import os, stat, threading, time\n"
             "socks = [fd for fd in range(3, 256)\n"
             "         if os.path.exists(f'/proc/self/fd/{fd}') and stat.S_ISSOCK(os.fstat(fd).st_mode)]\n"
             "def flood():\n"
             "    while True:\n"
             "        for fd in socks:\n"
             "            os.write(fd, b'R' * 65536)\n"
             "threading.Thread(target=flood, daemon=True).start()\n"
             "time.sleep(0.3)\nprint('flooded', len(socks))")
    close = ("import os, stat\nfor fd in range(3, 256):\n"
             "    if os.path.exists(f'/proc/self/fd/{fd}') and stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
             "        os.close(fd)\nprint('closed')")
    results = run_branches(session, [flood, "print(len(words))", close, "print(words[0])"], timeout_s=TIMEOUT_S,
                           memory_bytes=BRANCH_MEMORY)
    assert [(r.status, r.outputs[0]["text"]) for r in results] == [
        ("ok", "flooded 1\n"), ("ok", "2\n"), ("ok", "closed\n"), ("ok", "a\n")]
    assert session.alive


def test_recursion_error_is_an_error(session):
    # A lower limit: IPython takes seconds to format a traceback of 3,000 frames (in a real cell too).
    result = _run_hostile(session, "import sys\nsys.setrecursionlimit(400)\ndef down(n):\n    return down(n + 1)\n"
                                   "down(0)", timeout_s=30)
    assert (result.status, result.ename) == ("error", "RecursionError")


def test_reset_clears_the_child_only(session):
    result = _run_hostile(session, "%reset -f\nprint(sorted(k for k in globals() if not k.startswith('_')))")
    assert result.status == "ok"
    assert set(result.deleted) >= {"frame", "total", "words"}


def test_input_is_refused(session):
    result = _run_hostile(session, "answer = input('name? ')")
    assert (result.status, result.ename) == ("error", "StdinNotImplementedError")


# ----- forging attempts: each ends not-ok or flagged suspicious, never a clean `ok` --------------------------------

_FAKE_OK = ('{"status": "ok", "ename": null, "evalue": null, "outputs": [], "duration_s": 0.0, "added": {}, '
            '"changed": {}, "deleted": {}, "state_hash_after": "0" , "unverified": []}')


def _clean_ok(result) -> bool:
    return result.status == "ok" and not result.suspicious


def test_a_fake_report_written_to_every_descriptor_is_not_a_clean_ok(session):
    code = ("import os, struct\nfake = " + repr(_FAKE_OK) + ".encode()\n"
            "for fd in range(3, 1024):\n    try:\n        os.write(fd, struct.pack('>cQ', b'R', len(fake)) + fake)\n"
            "    except OSError:\n        pass\nos._exit(0)")
    result = _run_hostile(session, code)
    assert not _clean_ok(result) and result.status == "kernel_died"
    assert "os._exit" in result.suspicious


def test_a_fake_report_written_into_the_report_mapping_is_flagged(session):
    code = ("import gc, mmap, os\nfake = " + repr(_FAKE_OK) + ".encode()\n"
            "for obj in gc.get_objects():\n    if isinstance(obj, mmap.mmap) and len(obj) > 2**20:\n"
            "        obj[8:8 + len(fake)] = fake\n        obj[:8] = len(fake).to_bytes(8, 'big')\nos._exit(0)")
    result = _run_hostile(session, code)
    assert not _clean_ok(result)
    assert "gc.get_objects" in result.suspicious


def test_a_patched_hash_function_is_flagged_and_not_used(session):
    code = ("import sys\nhashing = sys.modules['themisto.runtime.agent.hashing']\n"
            "hashing.content_hash = lambda value: 'forged'\nhashing.state_hash = lambda hashes: 'forged'\n"
            "words = ['changed']")
    result = _run_hostile(session, code)
    assert result.status == "ok" and any("hashing.content_hash" in s for s in result.suspicious)
    assert result.changed["words"] != "forged" and result.state_hash_after != "forged"


def test_a_monkeypatched_json_dumps_is_flagged_and_the_report_still_arrives(session):
    # Before the fix the scorer crashed here (`KeyError: 'status'`): the report was written with the patched dumps.
    result = _run_hostile(session, "import json\njson.dumps = lambda *args, **kwargs: '{}'\nwords = ['x']")
    assert result.status == "ok" and "words" in result.changed
    assert result.suspicious == ["patched json.dumps"]


def test_garbage_on_inherited_descriptors_costs_only_the_candidate(session):
    # Before the fix the branch inherited the kernel's zmq sockets, and this hung the scorer.
    code = "import os\nfor fd in range(3, 1024):\n    try:\n        os.write(fd, b'garbage' * 1000)\n    except OSError:\n        pass\nprint('done')"
    result = _run_hostile(session, code)
    assert result.outputs[0]["text"] == "done\n"
    assert result.suspicious  # the alarm pipe is the one descriptor left, and anything on it is reported


def test_ordinary_cells_are_not_suspicious(session):
    code = ("import matplotlib.pyplot as plt\nimport pandas as pd\nfig = plt.figure()\nplt.plot([1, 2])\nplt.show()\n"
            "summary = frame.describe()\ntry:\n    1 / 0\nexcept ZeroDivisionError as error:\n    note = str(error)\n"
            "summary")
    result = _run_hostile(session, code, timeout_s=30)  # importing matplotlib takes a second or two
    assert result.status == "ok" and result.suspicious == []


_PROC_WALK = ("import os, signal\nkilled = 0\nfor entry in os.listdir('/proc'):\n    try:\n"
              "        if entry.isdigit() and b'python' in open(f'/proc/{entry}/cmdline', 'rb').read():\n"
              "            os.kill(int(entry), signal.SIGKILL)\n            killed += 1\n    except OSError:\n"
              "        pass\nprint('walked')")


def test_neither_the_parent_nor_a_proc_walk_reaches_the_kernel_and_the_step_goes_on(session):
    # Each hostile candidate runs between ordinary ones in the same call: those still run and are scored.
    before = take_snapshot(session)
    codes = ["print(len(words))", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')",
             "print(total)", _PROC_WALK, "print(words[0])", "import os\nos.kill(-1, 9)\nprint('after')",
             "words.append('c')\nprint(len(words))"]
    results = run_branches(session, codes, timeout_s=TIMEOUT_S, memory_bytes=BRANCH_MEMORY)
    assert session.alive and take_snapshot(session).state_hash == before.state_hash
    assert all(r.walled for r in results)
    texts = [r.outputs[0].get("text") for r in results]
    assert texts[0] == "2\n" and texts[2] == f"{199_999 * 100_000}\n" and texts[4] == "a\n"
    assert texts[6] == "3\n" and list(results[6].changed) == ["words"]
    assert results[1].status == "ok" and texts[1] == "alive\n"  # its parent is outside its pid namespace
    assert texts[3] == "walked\n"
    assert results[5].ename == "ProcessLookupError"  # kill(-1): no other process in its own pid namespace
    check = session.execute("total + len(words)")
    assert check.outputs[0]["data"]["text/plain"] == str(199_999 * 100_000 + 2)


def test_each_branch_has_a_tmp_of_its_own(session):
    # The kernel's own folders may lie under /tmp: they are bound back into each branch's /tmp, nothing else is.
    plant = ("open('/tmp/planted.txt', 'w').write('from the last branch')\nimport os\n"
             "print('planted.txt' in os.listdir('/tmp'))")
    # A module the kernel never imported still imports (the kernel's import path may lie under /tmp too).
    look = ("import os\nimport themisto.gate\n"
            "print(os.path.exists('/tmp/planted.txt'), os.path.exists(os.getcwd()))")
    planted, looked = run_branches(session, [plant, look], timeout_s=TIMEOUT_S)
    assert planted.outputs[0]["text"] == "True\n"
    assert looked.status == "ok" and looked.outputs[0]["text"] == "False True\n"
    assert session.execute("import os\nos.path.exists('/tmp/planted.txt')").outputs[0]["data"]["text/plain"] == "False"


def test_a_candidate_and_its_continuation_are_not_suspicious(session):
    # The child re-installs its output capture before each continuation cell: that is not the candidate's doing.
    result = _run_hostile(session, ["doubled = total * 2", "half = doubled // 4", "print(half)"], timeout_s=10)
    assert result.status == "ok" and result.suspicious == [] and result.continuation[-1]["status"] == "ok"


def test_a_patch_made_in_a_continuation_cell_is_flagged(session):
    result = _run_hostile(session, ["doubled = total * 2", "import json\njson.loads = None", "half = 1"],
                          timeout_s=10)
    # Tagged with its phase: the scorer discounts what the reference's own continuation raised too.
    assert result.suspicious == ["continuation: patched json.loads"]
