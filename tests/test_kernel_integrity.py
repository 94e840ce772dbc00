"""The kernel's life is its own: a uid no other session or process shares, a home nothing survives in, a fixed hash
seed, a timeout that times the cell only, and an install that runs kernels from its own environment."""

import os
import subprocess
import sys

import pytest
from _isolation import needs_isolation

from themisto.runtime import sandbox
from themisto.runtime.sandbox import KernelResources, KernelStartError, release_resources
from themisto.settings import settings


# With a single core a kernel gets the whole machine: there is nothing to pin it to.
_PINNED = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores or more")


@pytest.fixture
def kernel_uid(monkeypatch):
    """Set THEMISTO_KERNEL_UID for one test (settings are read once per process, so the cache is cleared)."""

    def configure(uid: int) -> None:
        monkeypatch.setenv("THEMISTO_KERNEL_UID", str(uid))
        settings.cache_clear()

    yield configure
    monkeypatch.delenv("THEMISTO_KERNEL_UID", raising=False)
    settings.cache_clear()


@pytest.mark.parametrize("uid", [0, os.geteuid()])
def test_a_privileged_or_own_uid_is_refused(kernel_uid, uid):
    kernel_uid(uid)
    with pytest.raises(KernelStartError, match="THEMISTO_KERNEL_UID"):
        sandbox.choose_uid(KernelResources())


@needs_isolation(os.geteuid() == 0, "needs root to start a process as another uid")
def test_a_uid_with_running_processes_is_refused(kernel_uid):
    uid = 1_234_321
    other = subprocess.Popen(["sleep", "30"], user=uid, group=uid)
    try:
        kernel_uid(uid)
        with pytest.raises(KernelStartError, match="processes of that uid"):
            sandbox.choose_uid(KernelResources())
    finally:
        other.kill()
        other.wait()


@_PINNED
def test_cores_are_shared_round_the_cores_once_all_are_held(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "_CORE_LOCKS", tmp_path / "cores")
    cores = sorted(os.sched_getaffinity(0))
    holders = [KernelResources() for _ in cores]
    assert sorted(c for h in holders for c in sandbox.claim_cores(1, h)) == cores  # each its own while they last
    extra = [sandbox.claim_cores(1, KernelResources()) for _ in cores]
    assert sorted(c for claimed in extra for c in claimed) == cores  # then each core once more, not all on one
    assert sandbox.claim_cores(None, KernelResources()) is None  # unpinned: every core
    for holder in holders:
        release_resources(holder)
    again = KernelResources()
    assert sandbox.claim_cores(1, again) == cores[:1] and again.core_locks  # held again once let go
    release_resources(again)


@_PINNED
def test_a_planted_link_for_the_core_locks_is_not_followed(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cores").symlink_to(elsewhere)
    monkeypatch.setattr(sandbox, "_CORE_LOCKS", tmp_path / "cores")
    resources = KernelResources()
    assert len(sandbox.claim_cores(1, resources)) == 1  # the kernel still runs, on a shared core
    assert resources.core_locks == [] and list(elsewhere.iterdir()) == []


def test_a_configured_uid_belongs_to_one_session_at_a_time(kernel_uid):
    kernel_uid(1_234_322)
    first = KernelResources()
    assert sandbox.choose_uid(first) == 1_234_322
    with pytest.raises(KernelStartError, match="another kernel session"):
        sandbox.choose_uid(KernelResources())
    release_resources(first)
    second = KernelResources()
    assert sandbox.choose_uid(second) == 1_234_322  # free again once the first session let it go
    release_resources(second)


def test_a_uid_another_process_holds_is_never_picked(kernel_uid, tmp_path):
    # A session in another process (here a child holding the lock) owns its uid: this process may not take it.
    kernel_uid(1_234_323)
    script = ("import sys, time\nfrom themisto.runtime import sandbox\nfrom themisto.runtime.sandbox import "
              "KernelResources\nsandbox.choose_uid(KernelResources())\nprint('held', flush=True)\ntime.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "THEMISTO_KERNEL_UID": "1234323"})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KernelStartError, match="another kernel session"):
            sandbox.choose_uid(KernelResources())
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture(scope="module")
def session():
    from themisto.runtime.kernel import KernelSession

    with KernelSession() as session:
        yield session


_PLANT = ("import os\nstartup = os.path.join(os.environ['IPYTHONDIR'], 'profile_default', 'startup')\n"
          "os.makedirs(startup, exist_ok=True)\n"
          "open(os.path.join(startup, '00-planted.py'), 'w').write('planted = 1')\n"
          "open(os.path.expanduser('~/note.txt'), 'w').write('left for the next one')")


@pytest.mark.slow
def test_nothing_planted_in_the_home_survives_a_restart(session):
    assert session.execute(_PLANT).status == "ok"
    session.restart()
    check = session.execute("import os\n('planted' in globals(), os.path.exists(os.path.expanduser('~/note.txt')))")
    assert check.outputs[0]["data"]["text/plain"] == "(False, False)"


@pytest.mark.slow
def test_nothing_a_branch_writes_in_the_home_reaches_the_next_prediction(session):
    from themisto.runtime.branch import run_branches

    planted, seen = run_branches(session, [_PLANT, "import os\nprint(os.path.exists(os.path.expanduser('~/note.txt')))"],
                                 timeout_s=10)
    # Where the branch's writes reach the kernel's own home, they are listed and undone after it.
    assert planted.status == "ok" and planted.workdir_restored
    assert seen.status == "ok" and seen.outputs[0]["text"] == "False\n"
    assert session.execute("import os\nos.listdir(os.path.expanduser('~'))").outputs[0]["data"]["text/plain"] \
        in ("[]", "['.ipython']", "['.ipython', '.config']", "['.config', '.ipython']")


@pytest.mark.slow
def test_the_hash_seed_is_fixed_and_recorded(session):
    from themisto.runtime.sandbox import kernel_environment

    probe = "hash('themisto'), list({'alpha', 'beta', 'gamma', 'delta', 'epsilon'})"
    first = session.execute(probe).outputs[0]["data"]["text/plain"]
    session.restart()  # a new kernel process: a random seed would give another hash and most likely another order
    assert session.execute(probe).outputs[0]["data"]["text/plain"] == first
    assert kernel_environment()["hash_seed"] == "0"
    from themisto.release.parquet import _library_versions

    assert _library_versions()["kernel_hash_seed"] == "0"  # what a release's themisto_build.json records


@pytest.mark.slow
def test_a_cell_that_ends_in_time_is_not_a_timeout_because_of_its_snapshot(session):
    # The user expression stands for a slow snapshot riding on the cell's request.
    result = session.execute("import time\ntime.sleep(0.5)\ndone = 1", timeout=1.0,
                             user_expressions={"slow": "__import__('time').sleep(1.5) or 7"})
    assert result.status == "ok" and not result.kernel_restarted
    assert result.user_expressions["slow"]["data"]["text/plain"] == "7"
    assert 0.5 <= result.duration_s < 1.0  # the cell's own time


@pytest.mark.slow
def test_a_kernel_that_dies_of_the_interrupt_is_restarted_once_with_its_exit_status(session):
    starts = session.kernel_starts
    code = ("import os, signal, time\nsignal.signal(signal.SIGINT, lambda *args: os._exit(3))\n"
            "while True:\n    time.sleep(0.01)")
    result = session.execute(code, timeout=0.5)
    assert result.status == "kernel_died" and result.kernel_restarted
    assert "exit status 3" in result.evalue and "interrupted" in result.evalue
    assert session.kernel_starts == starts + 1
    assert session.execute("1 + 1").outputs[0]["data"]["text/plain"] == "2"


@pytest.mark.slow
def test_a_snapshot_from_a_patched_agent_is_an_agent_error(session):
    # In the replay fallback a prediction runs in the kernel itself and may replace the agent's answers.
    from themisto.runtime.snapshot import AgentError, take_snapshot

    session.execute("import themisto.runtime.agent.snapshots as s\ns.snapshot = lambda shell=None: '[1, 2]'\n"
                    "import themisto.runtime.agent as a\na.snapshot = s.snapshot")
    try:
        with pytest.raises(AgentError, match="malformed"):
            take_snapshot(session)
    finally:
        session.restart()
