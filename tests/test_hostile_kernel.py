"""Hostile cells replayed through `KernelSession.execute`: each ends in a closed outcome, the session stays usable,
no process is left behind, and nothing changes outside the kernel's workdir.

Most cells share one module-scoped kernel (and check that earlier variables survive); cells that restart or
damage the kernel get a fresh one.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import psutil
import pytest
from _isolation import isolation_unavailable, needs_isolation
from _processes import live_children

from themisto.runtime.kernel import KernelSession, Limits
from themisto.vocabulary import CELL_STATUSES
from themisto.runtime.sandbox import sandbox_available

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]
SANDBOX = sandbox_available()
needs_sandbox = needs_isolation(
    SANDBOX, "bubblewrap is missing or cannot create namespaces here (apt-get install bubblewrap)")



def _assert_no_strays(before: set[int], uid: int | None = None) -> None:
    procs = []
    for pid in live_children() - before:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    if uid is not None:
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        assert left == []


def _value(session: KernelSession, expression: str) -> str:
    result = session.execute(expression)
    assert result.status == "ok", result
    return result.outputs[-1]["data"]["text/plain"]


@pytest.fixture(scope="module")
def shared():
    before = live_children()
    with KernelSession(limits=Limits(cell_timeout_s=20)) as kernel:
        kernel.execute("survivor = 'still here'")
        yield kernel
        assert _value(kernel, "survivor") == "'still here'"
    _assert_no_strays(before)


@pytest.fixture
def fresh():
    before = live_children()
    kernel = KernelSession(limits=Limits(cell_timeout_s=20, max_processes=64))
    kernel.start()
    uid = kernel.kernel_uid
    try:
        yield kernel
    finally:
        kernel.close()
    _assert_no_strays(before, uid)


def test_busy_loop_times_out_and_keeps_state(shared):
    result = shared.execute("while True:\n    pass", timeout=2)
    assert result.status == "timeout" and not result.kernel_restarted
    assert _value(shared, "survivor") == "'still here'"


def test_uninterruptible_c_loop_is_ended_by_restart(fresh):
    fresh.execute("lost = 1")
    result = fresh.execute("sum(range(10**12))", timeout=1)
    assert result.status == "timeout" and result.kernel_restarted
    assert "restarted after timeout" in result.evalue
    assert _value(fresh, "1 + 1") == "2"
    assert _value(fresh, "'lost' in dir()") == "False"


def test_huge_allocation_raises_memory_error(shared):
    result = shared.execute("b = bytearray(50 * 2**30)")
    assert (result.status, result.ename) == ("error", "MemoryError")
    assert _value(shared, "survivor") == "'still here'"


def test_fork_storm_hits_the_process_cap(fresh):
    if fresh.kernel_uid is None and os.geteuid() == 0:
        isolation_unavailable("as root without bubblewrap the kernel keeps uid 0, which RLIMIT_NPROC does not bind")
    code = (
        "import os, time\n"
        "pids, failure = [], None\n"
        "try:\n"
        "    for _ in range(5000):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        pids.append(pid)\n"
        "except OSError as exc:\n"
        "    failure = type(exc).__name__\n"
        "print(len(pids), failure)"
    )
    result = fresh.execute(code)
    assert result.status == "ok", result
    forked, failure = result.outputs[0]["text"].split()
    assert failure == "BlockingIOError"
    assert 0 < int(forked) < 64
    assert _value(fresh, "1 + 1") == "2"
    assert _value(fresh, "len(pids)") == forked  # no restart was needed; the `fresh` fixture checks they all die


def test_os_exit_is_kernel_died_then_a_fresh_kernel(fresh):
    result = fresh.execute("import os\nos._exit(1)")
    assert result.status == "kernel_died" and result.kernel_restarted
    assert _value(fresh, "1 + 1") == "2"


def test_sys_exit_does_not_end_the_kernel(shared):
    result = shared.execute("import sys\nsys.exit()")
    assert result.status in ("ok", "error")
    assert shared.alive
    assert _value(shared, "survivor") == "'still here'"


@needs_sandbox
def test_killing_the_parent_cannot_reach_the_host(fresh):
    host = psutil.Process()
    result = fresh.execute("import os\nprint(os.getppid())\nos.kill(os.getppid(), 9)")
    assert result.status in CELL_STATUSES
    assert host.is_running()
    assert _value(fresh, "1 + 1") == "2"


def test_printing_200_mb_is_truncated_and_host_memory_bounded(fresh):
    host = psutil.Process()
    peak = [host.memory_info().rss]
    before = peak[0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], host.memory_info().rss)
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        burst = fresh.execute("print('x' * (200 * 2**20))")
        lines = fresh.execute("line = 'y' * 1023\nfor _ in range(200 * 1024):\n    print(line)")
    finally:
        done.set()
        sampler.join()
    for result in (burst, lines):
        assert result.status == "ok" and result.truncated
        kept = sum(len(o["text"].encode()) for o in result.outputs if o["output_type"] == "stream")
        assert kept <= fresh.limits.output_bytes + 200
    assert peak[0] - before < 100 * 2**20, f"host grew by {(peak[0] - before) / 2**20:.0f} MB"
    assert _value(fresh, "len(line)") == "1023"


def test_deleting_the_workspace_changes_only_the_copy(tmp_path):
    source = tmp_path / "ws"
    source.mkdir()
    (source / "input.csv").write_text("a\n1\n")
    before = live_children()
    with KernelSession(source) as kernel:
        result = kernel.execute("import os, shutil\nopen('input.csv', 'w').write('overwritten')\n"
                                "shutil.rmtree(os.getcwd(), ignore_errors=True)\nprint(os.path.exists('input.csv'))")
        assert result.status == "ok" and result.outputs[0]["text"] == "False\n"
        assert _value(kernel, "1 + 1") == "2"
    assert (source / "input.csv").read_text() == "a\n1\n"
    _assert_no_strays(before)


@needs_sandbox
def test_writes_outside_the_workdir_fail(shared):
    targets = [REPO_ROOT / "themisto-hostile-probe", Path.home() / "themisto-hostile-probe",
               Path("/themisto-hostile-probe")]
    code = (
        "import errno\n"
        f"targets = {[str(t) for t in targets]!r}\n"
        "outcome = []\n"
        "for t in targets:\n"
        "    try:\n"
        "        open(t, 'w').write('x'); outcome.append('written')\n"
        "    except OSError as exc:\n"
        "        outcome.append(errno.errorcode[exc.errno])\n"
        "open('/tmp/private-tmp-ok', 'w').write('fine')\n"
        "print(outcome)"
    )
    result = shared.execute(code)
    assert result.status == "ok", result
    assert "written" not in result.outputs[0]["text"]
    for target in targets:
        assert not target.exists()
    assert not Path("/tmp/private-tmp-ok").exists()  # the kernel's /tmp is its own


@needs_sandbox
def test_no_network_to_the_host(shared):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        code = (f"import socket\ns = socket.socket()\ns.settimeout(3)\n"
                f"try:\n    s.connect(('127.0.0.1', {port})); print('connected')\n"
                f"except OSError as exc:\n    print(type(exc).__name__)")
        result = shared.execute(code)
        assert result.status == "ok", result
        assert result.outputs[0]["text"].strip() in ("ConnectionRefusedError", "OSError", "TimeoutError")
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


def test_ignored_sigint_is_ended_by_the_watchdog(fresh):
    result = fresh.execute("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
                           timeout=1)
    assert result.status == "timeout" and result.kernel_restarted
    assert _value(fresh, "1 + 1") == "2"


def test_runaway_thread_does_not_block_cells_or_close(fresh):
    code = ("import threading, time, itertools\n"
            "def spin():\n"
            "    for i in itertools.count():\n"
            "        print('tick', i)\n"
            "        time.sleep(0.001)\n"
            "threading.Thread(target=spin, daemon=True).start()\n"
            "kept = 5")
    assert fresh.execute(code).status == "ok"
    for _ in range(3):
        result = fresh.execute("kept * 2")
        assert result.status == "ok"
        assert [o["data"]["text/plain"] for o in result.outputs if o["output_type"] == "execute_result"] == ["10"]


def test_recursion_error(shared):
    result = shared.execute("def f(n):\n    return f(n + 1)\nf(0)")
    assert (result.status, result.ename) == ("error", "RecursionError")
    assert _value(shared, "survivor") == "'still here'"


def test_reset_empties_the_namespace(fresh):
    fresh.execute("gone = 1")
    assert fresh.execute("%reset -f").status == "ok"
    assert _value(fresh, "'gone' in dir()") == "False"


def test_input_fails_at_once(shared):
    result = shared.execute("value = input('name? ')", timeout=10)
    assert result.status == "error"
    assert result.ename == "StdinNotImplementedError"
    assert _value(shared, "survivor") == "'still here'"
