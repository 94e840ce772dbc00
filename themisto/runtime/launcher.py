"""Start an ipykernel under resource limits: the command line of the sandbox (host side) and the launcher (kernel side).

The kernel spec's argv is `[bwrap … --] python -m themisto.runtime.launcher <limits> -f {connection_file}`. The launcher
starts its own session, sets the rlimits, drops to an unprivileged uid when asked, and execs ipykernel, so the limits
and the uid hold for the kernel and everything it forks.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

# Set in the kernel's environment before anything is imported: glibc reads MALLOC_ARENA_MAX at its first malloc,
# BLAS libraries read their thread counts when they load.
KERNEL_ENV: dict[str, str] = {
    "MALLOC_ARENA_MAX": "2",
    # glibc asks for transparent huge pages for its heap: a branch forks the kernel, and a fork copies one page-table
    # entry per 2 MiB there instead of 512 (measured: a fork of a 190 MiB data-science kernel, 10.7 -> 5.9 ms;
    # resident memory the same). A write after the fork still copies only the 4 KiB page it hits.
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    # Headless, like Agg, but figures come back as display_data image/png as they did for the JuNE participants
    # (with plain Agg a plotting cell has no figure output at all).
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "PYTHONUNBUFFERED": "1",
    # Set iteration order (and all derived from str hashes) must be the same in the build's replay and the scorer's,
    # or state hashes and output targets drift; the release records it (kernel_environment()["hash_seed"]).
    "PYTHONHASHSEED": "0",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    # TensorFlow's C++ log lines (the wide kernel environment) carry the clock's time: an output target would differ
    # in every build. Errors still print.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}

_PR_SET_PDEATHSIG = 1
_STACK_BYTES = 64 << 20  # the stack of a kernel started with none set (8 MiB is the usual one)
# The module the kernel process runs (ipykernel's launcher without the debugger); its name is on its command line.
KERNEL_MAIN = "themisto.runtime.kernel_main"
# How the launcher tells the kernel-side output cap (the IPython extension below) its limit.
OUTPUT_CAP_ENV = "THEMISTO_KERNEL_OUTPUT_BYTES"
# The kernel keeps writing a little past the cap so the host sees the overflow and marks the cell truncated.
_OUTPUT_CAP_SLACK = 4096
# How many switches between stdout and stderr a cell's streams keep in order (_wrap_streams). Each is one IOPub
# message and one round trip to ipykernel's IO thread; past a few hundred unread messages zmq drops them (measured: a
# cell alternating 20,000 times lost 29 % of its text at load 5 and took 13 s, against 0.1 s). Past this many the
# kernel's own batching decides the order, as it did before.
ORDERED_SWITCHES = 500


@dataclass(frozen=True)
class SandboxPaths:
    """The folders of one session: `root` holds `work` (the workspace copy), `home` and `run` (connection file);
    `start` is the kernel's cwd (`work`, or a folder inside it)."""

    root: Path
    work: Path
    home: Path
    run: Path
    start: Path | None = None

    @property
    def cwd(self) -> Path:
        return self.start or self.work


def _needs_mask(path: Path) -> bool:
    """True when a user other than the owner cannot traverse `path` (e.g. /root is 0700)."""
    try:
        return not (path.stat().st_mode & stat.S_IXOTH)
    except OSError:
        return False


def readable_paths() -> list[Path]:
    """Folders the kernel must read: the interpreter, its prefixes, and the folder holding the `themisto` package."""
    package_parent = Path(__file__).resolve().parents[2]
    candidates = [
        Path(sys.executable).resolve().parent,
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.exec_prefix),
        Path(sys.base_prefix).resolve(),
        package_parent,
    ]
    candidates += [Path(p) for p in sys.path if p and Path(p).is_dir()]
    seen: list[Path] = []
    for path in candidates:
        path = path.absolute()
        if path not in seen:
            seen.append(path)
    return seen


def mask_untraversable(paths: list[Path]) -> list[str]:
    """Bubblewrap options that hide each folder others cannot traverse behind an empty tmpfs and bind back into it,
    read-only, just the given paths below it (with world-traversable folders in between)."""
    masked: list[Path] = []
    binds: list[Path] = []
    for path in sorted(paths, key=lambda p: len(p.parts)):
        if any(path == bound or bound in path.parents for bound in binds):
            continue
        for ancestor in reversed(path.parents):
            if ancestor != Path("/") and _needs_mask(ancestor):
                if ancestor not in masked:
                    masked.append(ancestor)
                binds.append(path)
                break
    options: list[str] = []
    for ancestor in masked:
        options += ["--perms", "0755", "--tmpfs", str(ancestor)]
    made: set[Path] = set()
    for path in binds:
        ancestor = next(a for a in masked if a in path.parents)
        for folder in reversed(path.parents):
            if ancestor in folder.parents and folder not in made:
                options += ["--perms", "0755", "--dir", str(folder)]
                made.add(folder)
        options += ["--ro-bind", str(path), str(path)]
    return options


def bwrap_argv(bwrap: str, paths: SandboxPaths, *, isolate_fs: bool, network: bool, drop_uid: bool) -> list[str]:
    """The bubblewrap prefix: read-only filesystem (or the real one), private /tmp and pids, no network unless asked.

    When the kernel will run as another uid, folders it cannot traverse on the host (such as a 0700 /root that holds
    the Python install) are replaced by an empty tmpfs into which only the needed folders are bound read-only.
    """
    argv = [bwrap]
    if isolate_fs:
        argv += ["--ro-bind", "/", "/"]
        if drop_uid:
            argv += mask_untraversable(readable_paths())
        argv += ["--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
        argv += ["--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
        argv += ["--bind", str(paths.root), str(paths.root)]
    else:
        argv += ["--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir", str(paths.cwd)]
    if not network:
        argv.append("--unshare-net")
    return argv + ["--"]


def launcher_argv(
    *,
    memory_bytes: int,
    max_processes: int,
    file_size_bytes: int,
    cpu_seconds: int | None,
    uid: int | None,
    gid: int | None,
    output_bytes: int | None = None,
    cpus: list[int] | None = None,
) -> list[str]:
    """The command that runs this module with the given limits; `{connection_file}` is filled in by jupyter_client."""
    argv = [sys.executable, "-m", "themisto.runtime.launcher", "--memory-bytes", str(memory_bytes),
            "--max-processes", str(max_processes), "--file-size-bytes", str(file_size_bytes)]
    if cpu_seconds is not None:
        argv += ["--cpu-seconds", str(cpu_seconds)]
    if uid is not None and gid is not None:
        argv += ["--uid", str(uid), "--gid", str(gid)]
    if output_bytes is not None:
        argv += ["--output-bytes", str(output_bytes)]
    if cpus is not None:
        argv += ["--cpus", ",".join(map(str, cpus))]
    return argv + ["-f", "{connection_file}"]


def _set_limit(kind: int, soft: int, hard: int | None = None) -> None:
    _, current_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    resource.setrlimit(kind, (soft, hard))


def _tasks_of_uid(uid: int) -> int:
    """Threads of all processes of `uid`: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:
            continue
    return count


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m themisto.runtime.launcher", description=__doc__)
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--max-processes", type=int, required=True)
    parser.add_argument("--file-size-bytes", type=int, required=True)
    parser.add_argument("--cpu-seconds", type=int, default=None)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--gid", type=int, default=None)
    parser.add_argument("--output-bytes", type=int, default=None)
    parser.add_argument("--cpus", type=lambda text: {int(core) for core in text.split(",")}, default=None)
    parser.add_argument("-f", dest="connection_file", required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Apply the limits to this process, drop privileges if asked, and become the ipykernel."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    # Its own session and process group: an interrupt or kill of the group reaches the kernel and its children only.
    try:
        os.setsid()
    except OSError:
        pass
    if args.cpus is not None:
        # Before anything starts: every thread and process the kernel makes inherits it, and thread pools (BLAS,
        # joblib, catboost) size themselves by it.
        os.sched_setaffinity(0, args.cpus)
    _set_limit(resource.RLIMIT_DATA, args.memory_bytes)
    _set_limit(resource.RLIMIT_FSIZE, args.file_size_bytes)
    if resource.getrlimit(resource.RLIMIT_STACK)[0] == resource.RLIM_INFINITY:
        # An unlimited stack makes Linux lay shared libraries out from the bottom of the address space, where the
        # rule that tells addresses in values (themisto.runtime.agent.addresses) does not look.
        resource.setrlimit(resource.RLIMIT_STACK, (_STACK_BYTES, resource.getrlimit(resource.RLIMIT_STACK)[1]))
    if args.cpu_seconds is not None:
        # SIGXCPU at the soft limit, SIGKILL a little later.
        _set_limit(resource.RLIMIT_CPU, args.cpu_seconds, args.cpu_seconds + 5)
    if args.uid is not None:
        _set_limit(resource.RLIMIT_NPROC, args.max_processes)
        os.setgroups([])
        os.setgid(args.gid)
        os.setuid(args.uid)
    else:
        # Without a uid of its own the cap counts every task of this user, so leave room for those already running.
        _set_limit(resource.RLIMIT_NPROC, _tasks_of_uid(os.getuid()) + args.max_processes)
    try:
        # Die with the process that started us (set after setuid, which clears it).
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    for name, value in KERNEL_ENV.items():
        os.environ.setdefault(name, value)  # the session's extra_env may override them
    # ipykernel polls for the parent named here and quits when getppid() is 1, which in a pid namespace it always is;
    # PR_SET_PDEATHSIG above does that job instead.
    os.environ.pop("JPY_PARENT_PID", None)
    kernel = [sys.executable, "-m", KERNEL_MAIN, "-f", args.connection_file,
              "--HistoryManager.hist_file=:memory:"]
    if args.output_bytes is not None:
        os.environ[OUTPUT_CAP_ENV] = str(args.output_bytes)
    # Always: the host times a cell up to the end it announces (CELL_DONE_MSG), not up to the reply, which comes
    # after the user expressions (a snapshot) riding on the same request.
    kernel.append("--IPKernelApp.extensions=themisto.runtime.launcher")
    os.execv(sys.executable, kernel)


# The IOPub message that says the cell itself has ended (user expressions, a snapshot say, run after it).
CELL_DONE_MSG = "themisto_cell_done"
# The user expression of a cell's request that carries the snapshot replay takes after every step: the kernel
# evaluates it after a failed cell too (IPython evaluates user expressions only after a cell that succeeded), and
# whatever it writes (a warning pyarrow raises while a frame is stored) is not the cell's output.
SNAPSHOT_EXPRESSION = "themisto_snapshot"


def _announce_cell_done(ipython: object) -> None:
    """Send CELL_DONE_MSG on IOPub after every cell, so the host's timeout times the cell and not the snapshot
    that rides on its request."""
    kernel = getattr(ipython, "kernel", None)
    if kernel is None:
        return

    pid = os.getpid()

    def done(*_: object) -> None:
        if os.getpid() != pid:
            return  # a branch child: its IOPub is not its own (and its sockets are closed)
        sys.stdout.flush()  # the cell's last output goes out before the marker
        sys.stderr.flush()
        kernel.session.send(kernel.iopub_socket, CELL_DONE_MSG, {}, parent=kernel.get_parent("shell"))

    ipython.events.register("post_run_cell", done)  # type: ignore[attr-defined]


def _snapshot_after_every_cell(ipython: object) -> None:
    """Evaluate a request's SNAPSHOT_EXPRESSION after the cell whether it failed or not, with its writes discarded:
    the snapshot after a step that raised costs no second request (a third of the real logs' steps raise), and no
    step's output holds what the snapshot wrote."""
    kernel = getattr(ipython, "kernel", None)
    if kernel is None:
        return
    import contextlib
    import inspect
    import io

    original = kernel.do_execute
    passes_cell_id = "cell_id" in inspect.signature(original).parameters

    async def do_execute(code, silent, store_history=True, user_expressions=None, allow_stdin=False, *,
                         cell_id=None):
        expressions = dict(user_expressions or {})
        snapshot = {key: expressions.pop(key) for key in [SNAPSHOT_EXPRESSION] if key in expressions}
        extra = {"cell_id": cell_id} if passes_cell_id else {}
        reply = original(code, silent, store_history, expressions, allow_stdin, **extra)
        if inspect.isawaitable(reply):
            reply = await reply
        if snapshot:
            sink = io.StringIO()
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                reply.setdefault("user_expressions", {}).update(
                    ipython.user_expressions(snapshot))  # type: ignore[attr-defined]
        return reply

    kernel.do_execute = do_execute


def _wrap_streams(ipython: object) -> None:
    """Keep stdout and stderr in the order the cell wrote them, and stop forwarding them once a cell has written
    past its cap (OUTPUT_CAP_ENV).

    ipykernel buffers each stream apart and sends each buffer a moment after its first write, so three prints and a
    warning arrive in either order depending on the host's load (the same real cell came out both ways in two
    builds). A write to one stream after the other therefore first sends what the other holds, and waits until it is
    sent: a flush only handed to ipykernel's IO thread runs when that thread gets to it, on a loaded host after the
    next writes, and then sends them too (measured: 31 of 40 cells out of order at load 5). One round trip to that
    thread per switch, not per write, for the first ORDERED_SWITCHES switches of a cell. The cap spares the transfer
    of a cell printing 200 MB; the host cuts precisely and marks the cut."""
    cap = int(os.environ.get(OUTPUT_CAP_ENV, "0") or 0)
    room_for = cap + _OUTPUT_CAP_SLACK if cap > 0 else None
    written, switches = [0], [0]
    last: list[object] = [None]
    pid = os.getpid()

    def reset(*_: object) -> None:
        written[0] = switches[0] = 0

    ipython.events.register("pre_execute", reset)  # type: ignore[attr-defined]
    streams = (sys.stdout, sys.stderr)
    for stream, other in (streams, streams[::-1]):
        original = stream.write

        # The other stream's own flush, taken now: a cell that replaces `sys.stderr.flush` does not break the order.
        def write(text: str, _original=original, _stream=stream, _other=other, _flush=other.flush) -> int:
            if last[0] is _other and switches[0] < ORDERED_SWITCHES and os.getpid() == pid:  # a branch child has no
                switches[0] += 1  # IO thread of its own
                _flush()
            last[0] = _stream
            if room_for is None:
                return _original(text)
            room = room_for - written[0]
            written[0] += len(text)
            if room > 0:
                _original(text if len(text) <= room else text[:room])
            return len(text)

        stream.write = write  # type: ignore[method-assign]


def load_ipython_extension(ipython: object) -> None:
    """Kernel side: announce the end of each cell (CELL_DONE_MSG) and evaluate its snapshot after a failed cell too
    (SNAPSHOT_EXPRESSION); keep stdout and stderr in the order they were written and cap them (_wrap_streams); stop
    a cell whose request carries a line budget once it has run that many lines (themisto.runtime.line_budget)."""
    from themisto.runtime import line_budget

    line_budget.install(ipython)
    _announce_cell_done(ipython)
    _snapshot_after_every_cell(ipython)
    _wrap_streams(ipython)


if __name__ == "__main__":
    main()
