"""The sandboxed kernel session with real ipykernel kernels: outcomes, silent execution, workspace copy, limits,
timeouts, and cleanup (no process, connection file or temporary folder left behind)."""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest
from _isolation import needs_isolation
from _processes import live_children

from themisto import settings as settings_module
from themisto.runtime.kernel import KernelSession, Limits
from themisto.runtime.kernel_setup import WORK_MOUNT
from themisto.runtime import sandbox
from themisto.runtime.sandbox import SandboxWarning, sandbox_available

pytestmark = pytest.mark.slow

SANDBOX = sandbox_available()



def _wait_gone(pids: set[int], timeout: float = 5.0) -> set[int]:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return {p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE}


@pytest.fixture(scope="module")
def session():
    with KernelSession(limits=Limits(cell_timeout_s=30)) as kernel:
        yield kernel


def test_cell_outputs_and_execution_count(session):
    first = session.execute("print('hello'); 6 * 7")
    assert first.status == "ok"
    assert first.outputs[0] == {"output_type": "stream", "name": "stdout", "text": "hello\n"}
    assert first.outputs[1]["output_type"] == "execute_result"
    assert first.outputs[1]["data"]["text/plain"] == "42"
    second = session.execute("x = 1")
    assert second.execution_count == first.execution_count + 1
    assert second.outputs == []


def test_error_outcome_has_ansi_free_traceback(session):
    result = session.execute("def f():\n    return 1 / 0\nf()")
    assert result.status == "error"
    assert (result.ename, result.evalue) == ("ZeroDivisionError", "division by zero")
    assert result.traceback and not any("\x1b" in line for line in result.traceback)
    assert any("return 1 / 0" in line for line in result.traceback)
    assert [o["output_type"] for o in result.outputs] == ["error"]


def test_execute_silent_leaves_history_alone(session):
    session.execute("y = [1, 2, 3]")
    before = session.execute_silent("", user_expressions={"n": "len(In)", "count": "get_ipython().execution_count"})
    reply = session.execute_silent("z = sum(y)", user_expressions={"z": "z", "bad": "undefined_name"})
    after = session.execute_silent("", user_expressions={"n": "len(In)", "count": "get_ipython().execution_count"})
    assert reply["status"] == "ok"
    assert reply["user_expressions"]["z"]["data"]["text/plain"] == "6"
    assert reply["user_expressions"]["bad"]["status"] == "error"
    assert before["user_expressions"] == after["user_expressions"]
    assert session.execute("z").outputs[0]["data"]["text/plain"] == "6"


def test_kernel_can_import_themisto_and_fork(session):
    code = (
        "import os, themisto\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, b'child'); os._exit(0)\n"
        "os.waitpid(pid, 0); print(themisto.__name__, os.read(r, 5).decode())"
    )
    result = session.execute(code)
    assert result.status == "ok", result
    assert result.outputs[0]["text"] == "themisto child\n"


def test_the_kernel_starts_without_the_debugger_and_a_cell_can_still_import_it(session):
    # themisto.runtime.kernel_main: ipykernel would load debugpy (and pydevd) at start-up, IPython's completer jedi;
    # no client here debugs or completes. A cell sees ipykernel_launcher's argv (argparse in a cell names it in its
    # usage line, as in the logs).
    code = ("import sys, os\nloaded = [m in sys.modules for m in ('debugpy', 'jedi', 'parso')]\nimport debugpy, jedi\n"
            "print(loaded, debugpy.__name__, jedi.__name__, hasattr(get_ipython().kernel, 'debugger'),\n"
            "      os.path.basename(sys.argv[0]))")
    result = session.execute(code)
    assert result.status == "ok", result
    assert result.outputs[0]["text"] == "[False, False, False] debugpy jedi False ipykernel_launcher.py\n"


def test_limits_hold_inside_the_kernel():
    limits = Limits(memory_bytes=2 * 2**30, max_processes=100, file_size_bytes=2**20, cpu_seconds=600)
    with KernelSession(limits=limits) as kernel:
        code = ("import resource, os\n"
                "print([resource.getrlimit(k)[0] for k in (resource.RLIMIT_DATA, resource.RLIMIT_FSIZE, "
                "resource.RLIMIT_CPU)], os.environ['MALLOC_ARENA_MAX'], os.environ['OMP_NUM_THREADS'], "
                "os.environ['MPLBACKEND'])")
        printed = kernel.execute(code).outputs[0]["text"].split()
        assert printed[:3] == ["[2147483648,", "1048576,", "600]"]
        assert printed[3:] == ["2", "1", "module://matplotlib_inline.backend_inline"]
        too_big = kernel.execute("open('big.bin', 'wb').write(b'x' * (2 * 2**20))")
        assert too_big.status == "error" and too_big.ename in ("OSError", "OverflowError")
        if SANDBOX and os.geteuid() == 0:
            uid = kernel.execute("import os; print(os.getuid())").outputs[0]["text"].strip()
            assert int(uid) == kernel.kernel_uid != 0
            nproc = kernel.execute("print(resource.getrlimit(resource.RLIMIT_NPROC)[0])").outputs[0]["text"]
            assert int(nproc) == 100


_CORES = "import os, joblib; print(sorted(os.sched_getaffinity(0)), joblib.cpu_count())"


def _cores_seen(session) -> tuple[list[int], int]:
    result = session.execute(_CORES)
    assert result.status == "ok", result.traceback
    cores, joblib_count = result.outputs[0]["text"].rsplit(" ", 1)
    return json.loads(cores), int(joblib_count)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two kernels on cores apart need two cores")
def test_each_kernel_runs_on_a_core_of_its_own(tmp_path, monkeypatch):
    # Lock files of this test's own: kernels that other processes run on this host do not change the answer.
    monkeypatch.setattr(sandbox, "_CORE_LOCKS", tmp_path / "cores")
    with KernelSession() as first, KernelSession() as second:
        (core_a,), jobs_a = _cores_seen(first)
        (core_b,), jobs_b = _cores_seen(second)
        assert core_a != core_b
        assert jobs_a == jobs_b == 1  # n_jobs=-1 means one worker, whatever the host has
        first.restart()
        assert _cores_seen(first)[0] == [core_a]  # a restarted kernel keeps its core
    for core in (core_a, core_b):  # given back on close
        lock = sandbox._lock_core(core)
        assert lock is not None
        os.close(lock)
    with KernelSession(limits=Limits(cores=None)) as unpinned:
        assert _cores_seen(unpinned) == (sorted(os.sched_getaffinity(0)), len(os.sched_getaffinity(0)))


def test_the_kernels_heap_asks_for_huge_pages(session):
    # A branch forks the kernel; glibc's tunable makes its heap 2 MiB pages, so a fork copies far fewer page-table
    # entries (bench/branch_vs_replay.py). Seen as the `hg` flag (MADV_HUGEPAGE) on a large allocation's mapping.
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if not libc.startswith("glibc ") or tuple(map(int, libc.split()[1].split(".")[:2])) < (2, 35):
        pytest.skip(f"{libc or 'this C library'} has no glibc.malloc.hugetlb tunable (glibc 2.35 added it)")
    code = ("import ctypes\nblock = bytearray(16 * 2**20)\n"
            "address = ctypes.addressof((ctypes.c_char * len(block)).from_buffer(block))\nflags = None\n"
            "for line in open('/proc/self/smaps'):\n"
            "    head = line.split()[0]\n"
            "    if '-' in head and not head.endswith(':'):\n"
            "        low, high = (int(x, 16) for x in head.split('-'))\n"
            "        inside = low <= address < high\n"
            "    elif inside and line.startswith('VmFlags'):\n"
            "        flags = line.split()[1:]\n"
            "print('hg' in flags)")
    result = session.execute(code)
    assert result.status == "ok", result.traceback
    assert result.outputs[0]["text"] == "True\n"


def test_workspace_is_copied_and_the_source_left_alone(tmp_path):
    source = tmp_path / "ws"
    (source / "data").mkdir(parents=True)
    (source / "data" / "input.csv").write_text("a,b\n1,2\n")
    with KernelSession(source) as kernel:
        assert kernel.workdir != source
        result = kernel.execute("import os, pandas as pd\n"
                                "df = pd.read_csv('data/input.csv'); print(os.getcwd()); print(int(df.b.sum()))\n"
                                "open('data/input.csv', 'w').write('changed'); open('new.txt', 'w').write('n')")
        assert result.status == "ok", result
        cwd, total = result.outputs[0]["text"].split()
        # Under the sandbox the copy is seen at one fixed path (the same in every run), elsewhere at its own.
        assert Path(cwd) == (Path(WORK_MOUNT) if SANDBOX else kernel.workdir) and total == "2"
        assert (kernel.workdir / "new.txt").read_text() == "n"
        kernel.restart()
        assert kernel.execute("'df' in dir()").outputs[0]["data"]["text/plain"] == "False"
        assert kernel.execute("open('new.txt').read()").outputs[0]["data"]["text/plain"] == "'n'"
    assert (source / "data" / "input.csv").read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in source.rglob("*")) == ["data", "input.csv"]


def test_missing_workspace_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        KernelSession(tmp_path / "no-such-folder")


def test_timeout_interrupts_and_keeps_state(session):
    session.execute("kept = 'yes'")
    result = session.execute("while True:\n    pass", timeout=1)
    assert result.status == "timeout" and not result.kernel_restarted
    assert "state kept" in result.evalue
    assert session.execute("kept").outputs[0]["data"]["text/plain"] == "'yes'"


def test_a_cell_that_honours_its_interrupt_late_keeps_the_state(session):
    # SIGINT is blocked in the cell's thread until 2.5 s after its timeout: the interrupt lands late, as it does on a
    # loaded machine; the kernel must not be taken for hung and restarted (it was, with a 1.5 s grace)
    late = ("import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
            "try:\n    time.sleep(3.5)\nfinally:\n    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})")
    session.execute("kept = 'late'")
    result = session.execute(late, timeout=1)
    assert result.status == "timeout" and not result.kernel_restarted and "state kept" in result.evalue
    assert session.execute("kept").outputs[0]["data"]["text/plain"] == "'late'"


def test_output_over_the_cap_is_cut_with_a_marker():
    with KernelSession(limits=Limits(output_bytes=10_000)) as kernel:
        result = kernel.execute("for i in range(3000):\n    print('line', i, 'x' * 40)\n'done'")
        assert result.status == "ok" and result.truncated
        streams = [o for o in result.outputs if o["output_type"] == "stream"]
        kept = "".join(o["text"] for o in streams if o["name"] == "stdout")
        assert kept.startswith("line 0 ") and len(kept.encode()) <= 10_000
        assert "output truncated" in streams[-1]["text"]
        small = kernel.execute("print('short')")
        assert not small.truncated and small.outputs[0]["text"] == "short\n"


def test_dead_kernel_is_replaced():
    with KernelSession() as kernel:
        kernel.execute("state = 1")
        result = kernel.execute("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        assert result.status == "kernel_died" and result.kernel_restarted
        assert kernel.alive
        after = kernel.execute("'state' in dir()")
        assert after.status == "ok" and after.outputs[0]["data"]["text/plain"] == "False"


def test_death_between_cells_is_reported_on_the_next_one():
    with KernelSession() as kernel:
        kernel.execute("import os, threading\nstate = 1\nthreading.Timer(0.2, os._exit, (3,)).start()")
        deadline = time.monotonic() + 10
        while kernel.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not kernel.alive
        result = kernel.execute("'state' in dir()")
        assert result.status == "ok" and result.kernel_restarted
        assert result.outputs[0]["data"]["text/plain"] == "False"
        assert not kernel.execute("1").kernel_restarted


def test_a_kernel_that_dies_while_starting_is_named_with_its_stderr(tmp_path):
    # the start waits for the kernel's answer itself (kernel_process._until_ready); a dead kernel ends the wait
    # with its last stderr lines rather than after the start timeout, and leaves nothing behind
    from themisto.runtime.sandbox import KernelStartError

    kernel = KernelSession(extra_env={"PYTHONHOME": str(tmp_path / "no-such-python")})
    with pytest.raises(KernelStartError, match=r"(?s)died before replying.*PYTHONHOME"):
        kernel.start()
    assert not kernel.alive


def test_not_started_is_a_clear_error():
    with pytest.raises(RuntimeError, match="not started"):
        KernelSession().execute("1")


def test_close_leaves_no_process_or_folder(tmp_path):
    before = live_children()
    kernel = KernelSession()
    kernel.start()
    root = kernel.workdir.parent
    started = live_children() - before
    assert started, "the kernel should be a child of this process"
    kernel.execute("import subprocess\np = subprocess.Popen(['sleep', '60'])")
    connection_files = list((root / "run").glob("kernel-*.json"))
    assert connection_files
    kernel.close()
    assert not root.exists()
    assert _wait_gone(live_children() - before) == set()
    kernel.close()  # closing twice is harmless


def test_exception_inside_with_still_cleans_up():
    before = live_children()
    with pytest.raises(ZeroDivisionError):
        with KernelSession() as kernel:
            root = kernel.workdir.parent
            kernel.execute("1")
            1 / 0
    assert not root.exists()
    assert _wait_gone(live_children() - before) == set()


def test_keyboard_interrupt_during_a_cell_cleans_up():
    before = live_children()
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        with KernelSession() as kernel:
            root = kernel.workdir.parent
            timer.start()
            kernel.execute("import time\ntime.sleep(30)")
    timer.join()
    assert not root.exists()
    assert _wait_gone(live_children() - before) == set()


def test_a_dropped_session_is_cleaned_up():
    before = live_children()
    kernel = KernelSession()
    kernel.start()
    root = kernel.workdir.parent
    kernel.execute("import subprocess\np = subprocess.Popen(['sleep', '60'])")
    del kernel
    gc.collect()
    assert not root.exists()
    assert _wait_gone(live_children() - before) == set()


@needs_isolation(SANDBOX, "bubblewrap is missing or cannot create namespaces here")
def test_network_only_when_asked():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    code = ("import socket\ns = socket.socket()\ns.settimeout(3)\n"
            f"try:\n    s.connect(('127.0.0.1', {listener.getsockname()[1]})); print('connected')\n"
            "except OSError as exc:\n    print(type(exc).__name__)")
    try:
        with KernelSession(limits=Limits(network=True)) as kernel:
            assert kernel.execute(code).outputs[0]["text"] == "connected\n"
        with KernelSession(limits=Limits(network=False)) as kernel:
            assert kernel.execute(code).outputs[0]["text"] != "connected\n"
    finally:
        listener.close()


def test_without_bubblewrap_it_warns_and_still_limits(monkeypatch):
    monkeypatch.setenv("THEMISTO_SANDBOX", "0")
    settings_module.settings.cache_clear()
    try:
        with pytest.warns(SandboxWarning, match="bubblewrap"):
            kernel = KernelSession(limits=Limits(memory_bytes=2**30))
            kernel.start()
        try:
            assert not kernel.sandboxed
            result = kernel.execute("import resource; resource.getrlimit(resource.RLIMIT_DATA)[0]")
            assert result.outputs[0]["data"]["text/plain"] == str(2**30)
            assert kernel.execute("b = bytearray(3 * 2**30)").ename == "MemoryError"
        finally:
            kernel.close()
    finally:
        settings_module.settings.cache_clear()


def test_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("THEMISTO_KERNEL_UID", "abc")
    settings_module.settings.cache_clear()
    try:
        with pytest.raises(ValueError, match="THEMISTO_KERNEL_UID"):
            settings_module.settings()
    finally:
        settings_module.settings.cache_clear()


def test_host_rlimits_untouched():
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with KernelSession(limits=Limits(memory_bytes=2**30)) as kernel:
        kernel.execute("1")
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
