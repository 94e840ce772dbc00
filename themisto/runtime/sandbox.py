"""What the sandbox needs from the host: whether bubblewrap works, the kernel's interpreter and its
versions, an unprivileged uid and cores of its own, and killing and removing what a kernel leaves behind.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from themisto.resume import write_text_atomic
from themisto.settings import settings


class SandboxWarning(UserWarning):
    """The sandbox is weaker than asked (no bubblewrap, or the process cap cannot bind)."""


class KernelStartError(RuntimeError):
    """The kernel did not become ready; the message carries the end of its log."""


@functools.lru_cache(maxsize=4)
def bwrap_works(bwrap: str) -> bool:
    """Whether bubblewrap can create the namespaces here (it cannot in some unprivileged containers)."""
    try:
        probe = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--unshare-net",
             "--die-with-parent", "true"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def sandbox_available() -> bool:
    """Whether kernels will run under bubblewrap here (installed, not disabled, and able to create namespaces)."""
    bwrap = settings().bwrap
    return bwrap is not None and bwrap_works(bwrap)


# Run by the kernel's interpreter with -I: where it lives and which versions of the stack it would import. Versions
# come from the installed metadata, so nothing heavy is imported.
_PROBE = """
import importlib.metadata as m, json, platform, sys
names = ("numpy", "pandas", "scipy", "matplotlib", "seaborn", "scikit-learn", "lightgbm", "catboost", "xgboost",
         "statsmodels", "ipykernel", "ipython", "psutil", "pyarrow", "skops")
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"python": platform.python_version(), "executable": sys.executable, "prefix": sys.prefix,
                  "base_prefix": sys.base_prefix, "exec_prefix": sys.exec_prefix,
                  "path": [p for p in sys.path if p], "packages": {n: version(n) for n in names}}))
"""


@functools.lru_cache(maxsize=8)
def _probe(python: str) -> dict:
    try:
        done = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelStartError(f"the kernel interpreter {python} cannot be run: {exc}") from exc
    if done.returncode != 0:
        raise KernelStartError(f"the kernel interpreter {python} failed (exit status {done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


@functools.lru_cache(maxsize=1)
def kernel_python() -> str:
    """The interpreter every kernel runs (THEMISTO_KERNEL_PYTHON, else the repo's .venv-kernel, else this one)."""
    chosen = settings()
    if chosen.kernel_python_source == "host":
        # Once per process: every session would repeat it.
        warnings.warn(f"no kernel environment ({chosen.kernel_python} runs the kernels): replay fidelity needs the "
                      "2023 stack of requirements-kernel.txt (scripts/install.sh makes .venv-kernel)",
                      SandboxWarning, stacklevel=2)
    return chosen.kernel_python


def environment_python(name: str | None) -> str | None:
    """The interpreter of the kernel environment `name` (`themisto.settings.KERNEL_ENVIRONMENTS`; None for the
    default one, which `kernel_python` picks); KernelStartError when it is unknown or not installed."""
    from themisto.settings import DEFAULT_ENVIRONMENT, KERNEL_ENVIRONMENTS, environment_interpreter

    if name is None or name == DEFAULT_ENVIRONMENT:
        return None
    if name not in KERNEL_ENVIRONMENTS:
        raise KernelStartError(f"unknown kernel environment {name!r} (known: {', '.join(KERNEL_ENVIRONMENTS)})")
    python = environment_interpreter(name)
    if not python.exists():
        raise KernelStartError(f"the kernel environment {name!r} is not installed: {python} is missing "
                               "(bash scripts/install.sh makes it)")
    return str(python)


def kernel_environment(python: str | None = None) -> dict[str, str | None]:
    """Versions the kernel runs with, read once per interpreter: {"interpreter", "python", "hash_seed", "numpy",
    "pandas", ...}; a package that is not installed maps to None."""
    from themisto.runtime.launcher import KERNEL_ENV

    python = kernel_python() if python is None else python
    probe = _probe(python)
    return {"interpreter": python, "python": probe["python"], "hash_seed": KERNEL_ENV["PYTHONHASHSEED"],
            **probe["packages"]}


def _cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "themisto"


def read_cache(name: str) -> str | None:
    """The text of the user's cache file `name`, or None when there is none or it is not a file of our own that no
    one else may have written."""
    cached = _cache_folder() / name
    try:
        info = cached.stat()
        if info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return cached.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    return None


def write_cache(name: str, text: str) -> None:
    """Write the user's cache file `name` whole; a cache that cannot be written is computed again next time."""
    cached = _cache_folder() / name
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cached, text)
    except OSError:
        pass


@functools.lru_cache(maxsize=8)
def skops_names(python: str) -> str | None:
    """skops's table of trusted type names as the kernel interpreter `python` computes it (JSON; None without skops
    there): run once per environment, kept in the user's cache folder under the versions it holds for
    (themisto.runtime.agent.skops_names says why)."""
    from themisto.runtime.agent.skops_names import COMPUTE, parse

    probe = _probe(python)
    key = hashlib.sha256(json.dumps([os.path.realpath(python), probe["python"], probe["packages"]],
                                    sort_keys=True).encode()).hexdigest()[:24]
    cached = f"skops-names-{key}.json"
    text = read_cache(cached)
    if text is not None and parse(text) is not None:
        return text
    if probe["packages"].get("skops") is None:
        return None
    try:
        done = subprocess.run([python, "-I", "-c", COMPUTE], capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    table = parse(done.stdout) if done.returncode == 0 else None
    if table is None:
        return None
    text = json.dumps(table, sort_keys=True)
    write_cache(cached, text)
    return text


def interpreter_paths(python: str) -> list[Path]:
    """Folders `python` reads when it starts: its venv, the base installation it links to, its import path."""
    probe = _probe(python)
    paths = [Path(python).parent, Path(python).resolve().parent]
    paths += [Path(probe[key]) for key in ("prefix", "base_prefix", "exec_prefix")]
    paths += [Path(p) for p in probe["path"] if Path(p).is_dir()]
    return paths


def _uid_in_use(uid: int) -> bool:
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uid in (uids.real, uids.effective, uids.saved):
            return True
    return False


# One lock file per uid a kernel runs as: the session holding it owns every process of that uid, and kills them all
# on close, so no two sessions (in this process or another) may share one.
_UID_LOCKS = Path(tempfile.gettempdir()) / "themisto-kernel-uids"


def _locked(path: Path, flags: int = 0) -> int | None:
    """The lock file at `path`, open and exclusively locked, or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lock_uid(uid: int) -> int | None:
    """An open, exclusively locked lock file for `uid`, or None when another session holds it."""
    _UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    return _locked(_UID_LOCKS / f"{uid}.lock")


def _claim(uid: int, resources: KernelResources) -> str | None:
    """Lock `uid` for this session and check that no process uses it; why not, or None once it is claimed."""
    fd = _lock_uid(uid)
    if fd is None:
        return "another kernel session holds it"
    if _uid_in_use(uid):
        os.close(fd)
        return "processes of that uid are running"
    resources.uid, resources.uid_lock = uid, fd
    return None


def choose_uid(resources: KernelResources) -> int:
    """A uid no process uses and no other session holds, claimed for this session (`resources`), so the process cap
    counts this kernel's processes only and closing the session kills only its own processes."""
    configured = settings().kernel_uid
    if configured is not None:
        if configured <= 0 or configured == os.geteuid() or configured >= 2**32 - 1:
            raise KernelStartError(f"THEMISTO_KERNEL_UID={configured} cannot be a kernel's uid: it must be an unused, "
                                   "unprivileged uid (closing a session kills every process of it)")
        problem = _claim(configured, resources)
        if problem is not None:
            raise KernelStartError(f"THEMISTO_KERNEL_UID={configured} cannot be used: {problem} (unset it to pick "
                                   "a free uid per session)")
        return configured
    rng = random.SystemRandom()
    for _ in range(50):
        uid = rng.randrange(200_000, 2_000_000_000)
        if _claim(uid, resources) is None:
            return uid
    raise RuntimeError("no free uid found for the kernel (50 tries)")


# One lock file per core a kernel is pinned to: kernels of this user, in this process or another (two scorers, a
# build beside a scorer), take cores no other holds while there are some. The files stay (one per core).
_CORE_LOCKS = Path(tempfile.gettempdir()) / "themisto-kernel-cores"
# Where the next kernel that finds every core taken shares one: round the cores, not all on the first.
_shared_core = itertools.count()


def _lock_core(core: int) -> int | None:
    """An open, exclusively locked lock file for `core`, or None when another kernel holds it (or none can be made
    in a folder of this user's own: one another user made, or a link planted in its place)."""
    try:
        _CORE_LOCKS.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(_CORE_LOCKS)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return None
        return _locked(_CORE_LOCKS / f"{core}.lock", os.O_NOFOLLOW)
    except OSError:
        return None


def claim_cores(count: int | None, resources: KernelResources) -> list[int] | None:
    """`count` of this process's cores for one kernel (`Limits.cores`), those no other kernel holds first, locked
    for the session (`resources`); None when the kernel may use them all (count None, or no fewer than there are).

    Why one core by default: a cell's results and time must not depend on how many cores the host has or how many
    kernels share it (joblib's n_jobs=-1, catboost and LightGBM size their thread pools by the cores they may use),
    and kernels that run at once must not slow each other down. Pinning is an affinity, which a process may widen
    again (os.sched_setaffinity): it makes runs repeatable and fair, it is not a limit against a hostile cell.
    """
    available = sorted(os.sched_getaffinity(0))
    if count is None or count >= len(available):
        return None
    if count < 1:
        raise ValueError(f"a kernel needs at least one core, got cores={count}")
    chosen: list[int] = []
    for core in available:
        fd = _lock_core(core)
        if fd is not None:
            chosen.append(core)
            resources.core_locks.append(fd)
            if len(chosen) == count:
                return chosen
    # More kernels than cores: share, taking turns so that they spread over the cores.
    rest = [core for core in available if core not in chosen]
    start = next(_shared_core)
    chosen += [rest[(start + i) % len(rest)] for i in range(count - len(chosen))]
    return sorted(chosen)


def processes_of_uid(uid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uid in (uids.real, uids.effective):
            found.append(proc)
    return found


def is_running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a dead sandbox's init is reaped by the host's init, on its own schedule)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all(processes: list[psutil.Process], timeout: float = 5.0) -> list[psutil.Process]:
    """SIGKILL the processes and wait for them; returns those still alive."""
    processes = [proc for proc in processes if is_running(proc)]
    if not processes:
        return []
    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes = [proc for proc in processes if is_running(proc)]
        if not processes:
            break
        time.sleep(0.01)
    return processes


def remove_tree(path: Path) -> None:
    """Remove a folder a kernel wrote, read-only files and folders included."""
    def retry_writable(func: Any, target: str, _exc: Any) -> None:
        # The kernel may have made its files read-only; the owner (or root) can undo that.
        try:
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry_writable)


@dataclass
class KernelResources:
    """What must be released even when the session object is dropped without close()."""

    root: Path | None = None
    pgids: set[int] = field(default_factory=set)
    uid: int | None = None
    uid_lock: int | None = None  # the open lock file that makes `uid` this session's own
    core_locks: list[int] = field(default_factory=list)  # the open lock files of the cores it is pinned to


def release_resources(resources: KernelResources) -> None:
    """Last-resort cleanup (garbage collection or interpreter exit): kill process groups, remove the folders."""
    for pgid in list(resources.pgids):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    resources.pgids.clear()
    if resources.uid is not None:
        kill_all(processes_of_uid(resources.uid), timeout=2.0)
    if resources.uid_lock is not None:
        # The uid is free for another session once its processes are gone; the file goes too (no pile of them).
        try:
            os.unlink(_UID_LOCKS / f"{resources.uid}.lock")
        except OSError:
            pass
        os.close(resources.uid_lock)
        resources.uid_lock = None
    # Its processes are gone: its cores are free for the next kernel.
    while resources.core_locks:
        os.close(resources.core_locks.pop())
    if resources.root is not None and resources.root.exists():
        remove_tree(resources.root)
    resources.root = None
