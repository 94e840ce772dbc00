"""Walls between a branch's candidate and its kernel: the candidate runs as the init of a pid namespace of its own,
inside a user and mount namespace with its own /tmp and /dev/shm, while the kernel and the branch's monitor are not
dumpable. Runs inside the kernel: standard library only.

Why namespaces rather than a uid per branch or a seccomp filter on kill/ptrace: a second uid needs the kernel to keep
CAP_SETUID (user code in the kernel could then become any uid, root included), and a filter on pids misses the ways
in that take no pid (the kernel's sockets through its connection folder, /proc/<pid>/mem, kill(-1)). An unprivileged
user namespace costs a millisecond and no privilege: the kernel's pid is not in the candidate's pid namespace (so no
signal, trace or pidfd reaches it), its connection folder is hidden under an empty tmpfs, /tmp is a tmpfs that
vanishes with the branch, and /proc/<pid>/mem of a non-dumpable process needs CAP_SYS_PTRACE, which nobody here has.
Where the host allows no user namespace, the branch runs without these walls and says so (`walled: false`).
"""

from __future__ import annotations

import ctypes
import os
import platform
import signal
import struct
import sys
import time

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000
_PRIVATE = ("/tmp", "/dev/shm")  # each branch gets its own, empty
# The variable that tells the kernel where its workspace's top is (set by themisto.runtime.kernel_setup): a branch's
# walls keep all of it.
WORKSPACE_ENV = "THEMISTO_WORKSPACE"
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _PR_SET_CHILD_SUBREAPER = 4, 38, 22, 36
_SECCOMP_MODE_FILTER = 2
_CAPABILITY_V3 = 0x20080522
# Per architecture: the audit arch, and the numbers of mremap and userfaultfd. Moving pages (mremap) could put
# pages shared with the kernel where a buffer was, which the pagemap check would take for unwritten ones; glibc's
# realloc copies instead when mremap fails.
_SYSCALLS = {"x86_64": (0xC000003E, 25, 323), "aarch64": (0xC00000B7, 216, 282)}
_REAP_S = 2.0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def _mount(libc: ctypes.CDLL, source: str, target: str, kind: str, flags: int, data: str | None = None) -> None:
    _check(libc.mount(source.encode(), target.encode(), kind.encode(), ctypes.c_ulong(flags),
                      None if data is None else data.encode()), f"mount {target}")


def set_dumpable(flag: bool) -> None:
    """Whether other processes of this uid may read this process's memory and /proc files (PR_SET_DUMPABLE)."""
    _libc().prctl(_PR_SET_DUMPABLE, 1 if flag else 0, 0, 0, 0)


def connection_folder() -> str | None:
    """The kernel's connection folder (its ipc sockets lie there), from the `-f` argument ipykernel was started with."""
    argv = sys.argv
    for index, arg in enumerate(argv[:-1]):
        if arg == "-f":
            return os.path.dirname(os.path.abspath(argv[index + 1]))
    return None


def enter(hide: list[str]) -> str | None:
    """In the branch's monitor (a fresh session, single-threaded): new user, mount and pid namespaces, a private /tmp
    and /dev/shm, and empty read-only tmpfs over `hide`. The monitor's next child is the pid namespace's init.
    Returns None when the walls are up, else why not (then nothing was changed that matters)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    set_dumpable(True)  # the maps below are /proc files that a non-dumpable process cannot open
    try:
        _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID), "unshare")
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        _mount(libc, "none", "/", "", _MS_REC | _MS_SLAVE)  # nothing mounted here reaches the kernel's namespace
        for target in hide:
            if target and os.path.isdir(target):
                _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | _MS_RDONLY, "size=4k")
        # The kernel's work folder, home and import path often lie under /tmp: bound back into the new /tmp at the
        # same paths (its connection folder is not, so it stays hidden).
        # The whole workspace, not only the working folder: a session started in a folder inside it reads its
        # siblings (`../data/…`).
        cwd = os.getcwd()
        wanted = {cwd, os.path.expanduser("~"), *(os.path.abspath(p) for p in sys.path if p)}
        workspace = os.environ.get(WORKSPACE_ENV)
        if workspace and (cwd == workspace or cwd.startswith(workspace.rstrip("/") + "/")):
            wanted.add(workspace)
        # Links resolved too: the kernel's import folder holds a link to the themisto package, which lies under /tmp
        # when the checkout does (a CI clone in a temp folder).
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        wanted |= {os.path.realpath(path) for path in wanted} | {package}
        keep = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in wanted
                if any(path == top or path.startswith(top + "/") for top in _PRIVATE) and os.path.isdir(path)}
        try:
            for target in _PRIVATE:
                if os.path.isdir(target):
                    _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=256m")
            for path, fd in sorted(keep.items()):
                os.makedirs(path, exist_ok=True)
                _mount(libc, f"/proc/self/fd/{fd}", path, "", _MS_BIND | _MS_REC)
        finally:
            for fd in keep.values():
                os.close(fd)
        os.chdir(cwd)  # the work folder as bound here, not the one under the old /tmp
    except OSError as error:
        return str(error)
    finally:
        set_dumpable(False)
    return None


def _seccomp_program() -> bytes | None:
    """A classic BPF filter: mremap fails with ENOMEM, userfaultfd with EPERM, foreign-ABI calls with ENOSYS."""
    found = _SYSCALLS.get(platform.machine())
    if found is None:
        return None
    arch, mremap, userfaultfd = found
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, errno = 0x7FFF0000, 0x00050000

    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    return b"".join([
        op(ld, 0, 0, 4),  # seccomp_data.arch
        op(jeq, 1, 0, arch),
        op(ret, 0, 0, errno | 38),  # ENOSYS: another ABI (int 0x80 from a 64-bit process)
        op(ld, 0, 0, 0),  # seccomp_data.nr
        op(jge, 3, 0, 0x40000000),  # x32 numbers
        op(jeq, 3, 0, mremap),
        op(jeq, 3, 0, userfaultfd),
        op(ret, 0, 0, allow),
        op(ret, 0, 0, errno | 38),
        op(ret, 0, 0, errno | 12),  # ENOMEM
        op(ret, 0, 0, errno | 1),  # EPERM
    ])


def seal_candidate() -> None:
    """In the candidate's process, before its code: no capabilities, no new privileges, no page moving, and the
    subreaper of its own processes. It stays not dumpable until its go (then `set_dumpable(True)`: it reads its own
    pagemap): a candidate forked ahead waits while another runs, whose code must not reach its memory."""
    libc = _libc()
    header = struct.pack("=Ii", _CAPABILITY_V3, 0)
    data = bytes(24)  # effective, permitted, inheritable: none, in both 32-bit halves
    libc.capset(ctypes.c_char_p(header), ctypes.c_char_p(data))  # fails harmlessly where there were none to drop
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    become_subreaper()
    program = _seccomp_program()
    if program is not None:
        filters = ctypes.create_string_buffer(program)
        fprog = struct.pack("@HP", len(program) // 8, ctypes.addressof(filters))
        _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def become_subreaper() -> None:
    """Make this process the reaper of every orphan among its descendants (they come back to it, not to init)."""
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def children_of(pid: int | str) -> list[int]:
    """The pids of a process's children (`"self"`: this one's), as its /proc lists them; [] where unreadable."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


def end_descendants() -> bool:
    """Kill every process this one started, theirs too, and reap them all: after it, no other process can share
    this one's pages. True when none is left."""
    deadline = time.monotonic() + _REAP_S
    while time.monotonic() < deadline:
        if os.getpid() == 1:  # the namespace's init: kill(-1) reaches every other process in it
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:  # orphans come back to this subreaper, so killing children level by level reaches them all
            for child in children_of("self"):
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
        except ChildProcessError:
            return True
        time.sleep(0.001)
    return False
