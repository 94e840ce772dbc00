"""How a sandboxed kernel is laid out before it starts: the sandbox plan (bubblewrap, an unprivileged uid, its cores),
its folders (a copy of the workspace, a home per kernel life, the package alone on its path), its environment and the
kernel spec that runs the launcher. `KernelLayout` is that plan as one value, made by `lay_out` before the kernel
starts; the session (themisto.runtime.kernel) holds it and the process owner (themisto.runtime.kernel_process)
starts each kernel life from it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from themisto.runtime import launcher as kernel_launcher
from themisto.runtime.agent import skops_names as skops_table
from themisto.runtime.agent.values import VALUES_DIR_ENV
from themisto.runtime.agent.walls import WORKSPACE_ENV
from themisto.runtime.kernel_limits import Limits
from themisto.runtime.outputs import KERNEL_FOLDER_PREFIX
from themisto.runtime.sandbox import (KernelResources, SandboxWarning, bwrap_works, choose_uid, claim_cores,
                                      interpreter_paths, kernel_python, remove_tree, skops_names)
from themisto.settings import settings

KERNEL_NAME = "themisto-sandbox"
# What a kernel with the minimal view sees of the host (read-only; symlinks such as a merged /usr's /lib as links).
_SYSTEM_FOLDERS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
VALUES_FOLDER = "values"
# Where a kernel under bubblewrap sees its workspace copy and its home, whatever host folder holds them: a value
# made from the working folder (`os.getcwd()`, `%pwd`, `Path().resolve()`, a path joined to one) is then the same
# in the build's replay and in every later rebuild of that state, so state hashes and outputs do not differ by it.
# Under the sandbox's private /tmp, where nothing else is.
WORK_MOUNT = "/tmp/work"
HOME_MOUNT = "/tmp/home"


@dataclass(frozen=True)
class KernelLayout:
    """One session's sandbox and folders, fixed before its first kernel starts (a restarted kernel keeps them): the
    limits, the interpreter, bubblewrap (None: not used), the uid and gid it runs as (None: this process's), the
    cores it is pinned to (None: all) and its folders."""

    limits: Limits
    python: str
    paths: kernel_launcher.SandboxPaths
    bwrap: str | None = None
    uid: int | None = None
    gid: int | None = None
    cpus: list[int] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    start_dir: str | None = None  # the folder inside the workspace copy the kernel starts in (None: its top)

    @property
    def start(self) -> Path:
        """The kernel's working directory on the host: its copy of the workspace, or the `start_dir` inside it."""
        return self.paths.cwd

    @property
    def fixed_folders(self) -> bool:
        """Whether the kernel sees its workspace and home at WORK_MOUNT and HOME_MOUNT (bubblewrap with a private
        /tmp) rather than at their host paths."""
        return self.bwrap is not None and self.limits.isolate_fs

    @property
    def seen_work(self) -> Path:
        """The workspace copy's top as the kernel sees it."""
        return Path(WORK_MOUNT) if self.fixed_folders else self.paths.work

    @property
    def seen_start(self) -> Path:
        """The kernel's working directory as it sees it."""
        return self.seen_work / self.start_dir if self.start_dir else self.seen_work

    @property
    def seen_home(self) -> Path:
        """The kernel's home as it sees it."""
        return Path(HOME_MOUNT) if self.fixed_folders else self.paths.home

    @property
    def values_dir(self) -> Path:
        """The folder the kernel writes stored values into (outside its working directory; the host empties it)."""
        return self.paths.root / VALUES_FOLDER


def lay_out(workspace: Path | None, limits: Limits, extra_env: dict, resources: KernelResources, *,
            python: str | None = None, start_dir: str | None = None) -> KernelLayout:
    """Plan the sandbox and make the session's folders (registered in `resources`, which release them); `python`:
    another kernel environment's interpreter than the default one; `start_dir`: a folder inside the workspace to
    start in (made when the copy lacks it)."""
    python = python or kernel_python()
    bwrap, uid, cpus = _plan_sandbox(limits, resources)
    start_dir = _inside(start_dir)
    if start_dir and workspace is not None:
        (workspace / start_dir).resolve().relative_to(workspace.resolve())  # a link out of the workspace: refused
    paths = _prepare_folders(workspace, python, uid, resources, start_dir)
    return KernelLayout(limits=limits, python=python, paths=paths, bwrap=bwrap, uid=uid, gid=uid, cpus=cpus,
                        extra_env={str(k): str(v) for k, v in extra_env.items()}, start_dir=start_dir)


def _inside(start_dir: str | None) -> str | None:
    """`start_dir` as a relative path that stays inside the workspace; ValueError for one that leaves it."""
    if not start_dir or start_dir in (".", "./"):
        return None
    relative = Path(start_dir)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"start folder {start_dir!r}: expected a relative path inside the workspace")
    return relative.as_posix()


def _plan_sandbox(limits: Limits, resources: KernelResources) -> tuple[str | None, int | None, list[int] | None]:
    """(bubblewrap, uid, cores) for one session; warns where the sandbox is weaker than asked."""
    is_root = os.geteuid() == 0
    bwrap = settings().bwrap
    if bwrap is not None and not bwrap_works(bwrap):
        warnings.warn(f"bubblewrap at {bwrap} cannot create namespaces here; the kernel runs without filesystem, "
                      "network and pid isolation", SandboxWarning, stacklevel=4)
        bwrap = None
    elif bwrap is None and (limits.isolate_fs or not limits.network):
        warnings.warn("bubblewrap not found (apt-get install bubblewrap) or THEMISTO_SANDBOX=0: the kernel runs "
                      "without filesystem, network and pid isolation; only rlimits apply", SandboxWarning,
                      stacklevel=4)
    # Claimed once per session: a restarted kernel keeps its cores.
    cpus = claim_cores(limits.cores, resources)
    uid = None
    if is_root and bwrap is not None and limits.isolate_fs:
        uid = choose_uid(resources)
        resources.uid = uid
    elif is_root:
        warnings.warn("the kernel runs as root, which ignores the process cap (RLIMIT_NPROC); install bubblewrap "
                      "and keep isolate_fs=True to run it as an unprivileged uid", SandboxWarning, stacklevel=4)
    return bwrap, uid, cpus


def _prepare_folders(workspace: Path | None, python: str, uid: int | None,
                     resources: KernelResources, start_dir: str | None = None) -> kernel_launcher.SandboxPaths:
    root = Path(tempfile.mkdtemp(prefix=KERNEL_FOLDER_PREFIX, dir=settings().tmp_dir))
    resources.root = root
    paths = kernel_launcher.SandboxPaths(root=root, work=root / "work", home=root / "home", run=root / "run",
                                         start=root / "work" / start_dir if start_dir else None)
    if workspace is not None:
        shutil.copytree(workspace, paths.work, symlinks=True)
    else:
        paths.work.mkdir()
    if start_dir:
        (paths.work / start_dir).mkdir(parents=True, exist_ok=True)
    paths.run.mkdir()
    (root / VALUES_FOLDER).mkdir()  # where the kernel writes the values a snapshot stores (themisto.replay.values)
    # The kernel imports the agent and the launcher from here: a folder holding the themisto package alone. The
    # folder above the package is the host's site-packages in an installed copy, whose numpy 2 would shadow
    # the kernel environment's own.
    (root / "lib").mkdir()
    (root / "lib" / "themisto").symlink_to(Path(kernel_launcher.__file__).resolve().parents[1])
    names = skops_names(python)  # skops's trusted names, read by the kernel's agent (why: there)
    if names is not None:
        (root / "lib" / skops_table.FILE).write_text(names, encoding="utf-8")
    if uid is not None:
        os.chmod(root / "lib", 0o755)
        os.chmod(root, 0o711)  # the kernel's uid traverses the root but cannot write in it
        for folder in (paths.work, paths.run, root / VALUES_FOLDER):
            os.chmod(folder, 0o700)
            for dirpath, dirnames, filenames in os.walk(folder):
                os.lchown(dirpath, uid, uid)
                for name in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, name), uid, uid)
    return paths


def kernel_env(layout: KernelLayout) -> dict[str, str]:
    """The kernel's environment: its own home, the package alone on its path, the values folder, the launcher's
    settings and the session's extra variables."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "HOME": str(layout.seen_home),
        "USER": "themisto",
        "LOGNAME": "themisto",
        "IPYTHONDIR": str(layout.seen_home / ".ipython"),
        "MPLCONFIGDIR": str(layout.seen_home / ".config" / "matplotlib"),
        WORKSPACE_ENV: str(layout.seen_work),
        "PYTHONPATH": str(layout.paths.root / "lib"),  # the themisto package alone (see _prepare_folders)
        "PYTHONNOUSERSITE": "1",
        VALUES_DIR_ENV: str(layout.paths.root / VALUES_FOLDER),
        skops_table.ENV: str(layout.paths.root / "lib" / skops_table.FILE),
        **kernel_launcher.KERNEL_ENV,
    }
    if layout.bwrap is None:
        env["TMPDIR"] = str(layout.paths.home)
    env.update({str(k): str(v) for k, v in layout.extra_env.items()})
    return env


def write_spec(layout: KernelLayout) -> Path:
    """The kernel spec that runs the launcher (under bubblewrap where used); the folder that holds it."""
    limits = layout.limits
    argv = []
    if layout.bwrap is not None:
        argv += _bwrap_argv(layout)
    launcher = kernel_launcher.launcher_argv(
        memory_bytes=limits.memory_bytes, max_processes=limits.max_processes,
        file_size_bytes=limits.file_size_bytes, cpu_seconds=limits.cpu_seconds, uid=layout.uid, gid=layout.gid,
        output_bytes=limits.output_bytes, cpus=layout.cpus)
    # The launcher is written for the interpreter that runs it; the kernel's own interpreter runs it here (it
    # imports the standard library only) and execs ipykernel from the same environment.
    assert launcher[0] == sys.executable, launcher
    argv += [layout.python] + launcher[1:]
    spec_dir = layout.paths.root / "spec" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": argv, "display_name": "Themisto sandbox", "language": "python", "interrupt_mode": "signal",
            "env": {}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir.parent


def _bwrap_argv(layout: KernelLayout) -> list[str]:
    """The bubblewrap prefix, with the workspace and home bound at their fixed paths where the kernel has a private
    /tmp (and starting in the first)."""
    argv = _sandbox_argv(layout)
    if not layout.fixed_folders:
        return argv
    chdir = argv.index("--chdir")
    binds = ["--bind", str(layout.paths.work), WORK_MOUNT, "--bind", str(layout.paths.home), HOME_MOUNT]
    return argv[:chdir] + binds + ["--chdir", str(layout.seen_start)] + argv[chdir + 2:]


def _sandbox_argv(layout: KernelLayout) -> list[str]:
    """The bubblewrap prefix, with the kernel interpreter's folders readable by the kernel's uid too."""
    assert layout.bwrap is not None
    limits, drop_uid = layout.limits, layout.uid is not None
    if limits.isolate_fs and limits.view == "minimal":
        return _minimal_view_argv(layout)
    if not (drop_uid and limits.isolate_fs):
        return kernel_launcher.bwrap_argv(layout.bwrap, layout.paths, isolate_fs=limits.isolate_fs,
                                          network=limits.network, drop_uid=drop_uid)
    # kernel_launcher masks the folders only its own interpreter needs (e.g. a 0700 /root that holds the Python
    # install); the masks must cover the kernel's interpreter as well, and one tmpfs per folder, so they are
    # built here over both sets and put where bwrap_argv would put them (right after the root bind).
    argv = kernel_launcher.bwrap_argv(layout.bwrap, layout.paths, isolate_fs=True, network=limits.network,
                                      drop_uid=False)
    assert argv[1:4] == ["--ro-bind", "/", "/"], argv
    readable = kernel_launcher.readable_paths()
    readable += [path for path in interpreter_paths(layout.python) if path not in readable]
    # The sandbox's /tmp is a fresh tmpfs: an interpreter kept under the host's /tmp is bound in after it.
    under_tmp = [path for path in readable if Path("/tmp") in path.parents]
    binds: list[str] = []
    made: set[Path] = set()
    for path in sorted(under_tmp, key=lambda p: len(p.parts)):
        if any(bound in path.parents for bound in under_tmp):
            continue
        # bwrap would make the missing folders 0700, closed to the kernel's uid.
        for folder in reversed(path.parents):
            if Path("/tmp") in folder.parents and folder not in made:
                binds += ["--perms", "0755", "--dir", str(folder)]
                made.add(folder)
        binds += ["--ro-bind", str(path), str(path)]
    masks = kernel_launcher.mask_untraversable([path for path in readable if path not in under_tmp])
    flags = argv.index("--unshare-pid")
    return argv[:4] + masks + argv[4:flags] + binds + argv[flags:]


def _minimal_view_argv(layout: KernelLayout) -> list[str]:
    """The bubblewrap prefix of `Limits(view="minimal")`: a fresh root holding, read-only, only the system folders,
    the kernel interpreter's folders and the themisto package; then its own folder, a private /tmp, /dev and
    /proc. Whatever else the host holds (the project's checkout and data, releases, run folders) is not there."""
    assert layout.bwrap is not None
    argv = [layout.bwrap]
    for top in _SYSTEM_FOLDERS:
        path = Path(top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            argv += ["--ro-bind", top, top]
    argv += ["--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    argv += ["--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
    package = Path(kernel_launcher.__file__).resolve().parents[1]
    wanted = [*interpreter_paths(layout.python), package]
    system = [Path(top) for top in _SYSTEM_FOLDERS]
    bound: list[Path] = []
    made: set[Path] = set()
    for path in sorted({p.absolute() for p in wanted}, key=lambda p: len(p.parts)):
        if any(path == b or b in path.parents for b in system + bound):
            continue
        for folder in reversed(path.parents):  # bwrap would make the missing folders 0700
            if folder != Path("/") and folder not in made:
                argv += ["--perms", "0755", "--dir", str(folder)]
                made.add(folder)
        argv += ["--ro-bind", str(path), str(path)]
        bound.append(path)
    argv += ["--bind", str(layout.paths.root), str(layout.paths.root)]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir",
             str(layout.start)]
    if not layout.limits.network:
        argv.append("--unshare-net")
    return argv + ["--"]


def fresh_home(layout: KernelLayout) -> None:
    """An empty home (and IPYTHONDIR, MPLCONFIGDIR below it) for each kernel life: a startup file or an rc file
    planted in the last life must not run in this one."""
    home = layout.paths.home
    if home.exists():
        remove_tree(home)
    home.mkdir()
    if layout.uid is not None:
        os.chmod(home, 0o700)
        os.chown(home, layout.uid, layout.gid)
