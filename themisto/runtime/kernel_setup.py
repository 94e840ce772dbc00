"""How a sandboxed kernel is laid out before it starts: the sandbox plan (bubblewrap, an unprivileged uid), its
folders (a copy of the workspace, a home per kernel life, the package alone on its path), its environment and the
kernel spec that runs the launcher. `AsyncKernelSession` (themisto.runtime.kernel) inherits these steps.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from themisto.runtime import launcher as kernel_launcher
from themisto.runtime.agent import skops_names as skops_table
from themisto.runtime.agent.values import VALUES_DIR_ENV
from themisto.runtime.sandbox import (SandboxWarning, bwrap_works, choose_uid, claim_cores, interpreter_paths,
                                      kernel_python, remove_tree, skops_names)
from themisto.settings import settings

KERNEL_NAME = "themisto-sandbox"
# What a kernel with the minimal view sees of the host (read-only; symlinks such as a merged /usr's /lib as links).
_SYSTEM_FOLDERS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys")
VALUES_FOLDER = "values"


class KernelSetup:
    """The setup steps of a kernel session; they read and set the session's `limits`, `workspace`, `extra_env`,
    `kernel_python`, `_resources`, `_paths`, `_bwrap`, `_python`, `_uid`, `_gid` and `_cpus`."""

    def _plan_sandbox(self) -> None:
        self._python = kernel_python()
        is_root = os.geteuid() == 0
        bwrap = settings().bwrap
        if bwrap is not None and not bwrap_works(bwrap):
            warnings.warn(f"bubblewrap at {bwrap} cannot create namespaces here; the kernel runs without filesystem, "
                          "network and pid isolation", SandboxWarning, stacklevel=3)
            bwrap = None
        elif bwrap is None and (self.limits.isolate_fs or not self.limits.network):
            warnings.warn("bubblewrap not found (apt-get install bubblewrap) or THEMISTO_SANDBOX=0: the kernel runs "
                          "without filesystem, network and pid isolation; only rlimits apply", SandboxWarning,
                          stacklevel=3)
        self._bwrap = bwrap
        # Claimed once per session: a restarted kernel keeps its cores.
        self._cpus = claim_cores(self.limits.cores, self._resources)
        if is_root and bwrap is not None and self.limits.isolate_fs:
            self._uid = choose_uid(self._resources)
            self._gid = self._uid
            self._resources.uid = self._uid
        elif is_root:
            warnings.warn("the kernel runs as root, which ignores the process cap (RLIMIT_NPROC); install bubblewrap "
                          "and keep isolate_fs=True to run it as an unprivileged uid", SandboxWarning, stacklevel=3)

    def _prepare_folders(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="themisto-kernel-", dir=settings().tmp_dir))
        self._resources.root = root
        paths = kernel_launcher.SandboxPaths(root=root, work=root / "work", home=root / "home", run=root / "run")
        if self.workspace is not None:
            shutil.copytree(self.workspace, paths.work, symlinks=True)
        else:
            paths.work.mkdir()
        paths.run.mkdir()
        (root / VALUES_FOLDER).mkdir()  # where the kernel writes the values a snapshot stores (themisto.replay.values)
        # The kernel imports the agent and the launcher from here: a folder holding the themisto package alone. The
        # folder above the package is the host's site-packages in an installed copy, whose numpy 2 would shadow
        # the kernel environment's own.
        (root / "lib").mkdir()
        (root / "lib" / "themisto").symlink_to(Path(kernel_launcher.__file__).resolve().parents[1])
        names = skops_names(self.kernel_python)  # skops's trusted names, read by the kernel's agent (why: there)
        if names is not None:
            (root / "lib" / skops_table.FILE).write_text(names, encoding="utf-8")
        if self._uid is not None:
            os.chmod(root / "lib", 0o755)
            os.chmod(root, 0o711)  # the kernel's uid traverses the root but cannot write in it
            for folder in (paths.work, paths.run, root / VALUES_FOLDER):
                os.chmod(folder, 0o700)
                for dirpath, dirnames, filenames in os.walk(folder):
                    os.lchown(dirpath, self._uid, self._gid)
                    for name in dirnames + filenames:
                        os.lchown(os.path.join(dirpath, name), self._uid, self._gid)
        self._paths = paths

    def _kernel_env(self) -> dict[str, str]:
        assert self._paths is not None
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(self._paths.home),
            "USER": "themisto",
            "LOGNAME": "themisto",
            "IPYTHONDIR": str(self._paths.home / ".ipython"),
            "MPLCONFIGDIR": str(self._paths.home / ".config" / "matplotlib"),
            "PYTHONPATH": str(self._paths.root / "lib"),  # the themisto package alone (see _prepare_folders)
            "PYTHONNOUSERSITE": "1",
            VALUES_DIR_ENV: str(self._paths.root / VALUES_FOLDER),
            skops_table.ENV: str(self._paths.root / "lib" / skops_table.FILE),
            **kernel_launcher.KERNEL_ENV,
        }
        if self._bwrap is None:
            env["TMPDIR"] = str(self._paths.home)
        env.update({str(k): str(v) for k, v in self.extra_env.items()})
        return env

    def _write_spec(self) -> Path:
        assert self._paths is not None
        limits = self.limits
        argv = []
        if self._bwrap is not None:
            argv += self._bwrap_argv()
        launcher = kernel_launcher.launcher_argv(
            memory_bytes=limits.memory_bytes, max_processes=limits.max_processes,
            file_size_bytes=limits.file_size_bytes, cpu_seconds=limits.cpu_seconds, uid=self._uid, gid=self._gid,
            output_bytes=limits.output_bytes, cpus=self._cpus)
        # The launcher is written for the interpreter that runs it; the kernel's own interpreter runs it here (it
        # imports the standard library only) and execs ipykernel from the same environment.
        assert launcher[0] == sys.executable, launcher
        argv += [self.kernel_python] + launcher[1:]
        spec_dir = self._paths.root / "spec" / KERNEL_NAME
        spec_dir.mkdir(parents=True, exist_ok=True)
        spec = {"argv": argv, "display_name": "Themisto sandbox", "language": "python", "interrupt_mode": "signal",
                "env": {}}
        (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
        return spec_dir.parent

    def _bwrap_argv(self) -> list[str]:
        """The bubblewrap prefix, with the kernel interpreter's folders readable by the kernel's uid too."""
        assert self._bwrap is not None and self._paths is not None
        limits, drop_uid = self.limits, self._uid is not None
        if limits.isolate_fs and limits.view == "minimal":
            return self._minimal_view_argv()
        if not (drop_uid and limits.isolate_fs):
            return kernel_launcher.bwrap_argv(self._bwrap, self._paths, isolate_fs=limits.isolate_fs,
                                              network=limits.network, drop_uid=drop_uid)
        # kernel_launcher masks the folders only its own interpreter needs (e.g. a 0700 /root that holds the Python
        # install); the masks must cover the kernel's interpreter as well, and one tmpfs per folder, so they are
        # built here over both sets and put where bwrap_argv would put them (right after the root bind).
        argv = kernel_launcher.bwrap_argv(self._bwrap, self._paths, isolate_fs=True, network=limits.network,
                                          drop_uid=False)
        assert argv[1:4] == ["--ro-bind", "/", "/"], argv
        readable = kernel_launcher.readable_paths()
        readable += [path for path in interpreter_paths(self.kernel_python) if path not in readable]
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
        masks = kernel_launcher._mask_untraversable([path for path in readable if path not in under_tmp])
        flags = argv.index("--unshare-pid")
        return argv[:4] + masks + argv[4:flags] + binds + argv[flags:]

    def _minimal_view_argv(self) -> list[str]:
        """The bubblewrap prefix of `Limits(view="minimal")`: a fresh root holding, read-only, only the system folders,
        the kernel interpreter's folders and the themisto package; then its own folder, a private /tmp, /dev and
        /proc. Whatever else the host holds (the project's checkout and data, releases, run folders) is not there."""
        assert self._bwrap is not None and self._paths is not None
        argv = [self._bwrap]
        for top in _SYSTEM_FOLDERS:
            path = Path(top)
            if path.is_symlink():
                argv += ["--symlink", os.readlink(path), top]
            elif path.is_dir():
                argv += ["--ro-bind", top, top]
        argv += ["--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
        argv += ["--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp"]
        package = Path(kernel_launcher.__file__).resolve().parents[1]
        wanted = [*interpreter_paths(self.kernel_python), package]
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
        argv += ["--bind", str(self._paths.root), str(self._paths.root)]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--chdir",
                 str(self._paths.work)]
        if not self.limits.network:
            argv.append("--unshare-net")
        return argv + ["--"]

    def _fresh_home(self) -> None:
        """An empty home (and IPYTHONDIR, MPLCONFIGDIR below it) for each kernel life: a startup file or an rc file
        planted in the last life must not run in this one."""
        assert self._paths is not None
        home = self._paths.home
        if home.exists():
            remove_tree(home)
        home.mkdir()
        if self._uid is not None:
            os.chmod(home, 0o700)
            os.chown(home, self._uid, self._gid)
