"""The kernel's process and its owner, `KernelProcess`: each kernel life started from the session's layout
(themisto.runtime.kernel_setup) under its kernel spec and waited for until it answers, the tail of its stderr kept,
the ipykernel's own pid found inside the sandbox, an interrupt sent to its process group, and each life stopped
with everything it started. The session (themisto.runtime.kernel) holds one; the request runner
(themisto.runtime.kernel_requests) talks to the kernel through its `client`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import warnings
from typing import Any

import psutil

from themisto.runtime.kernel_setup import KERNEL_NAME, KernelLayout, fresh_home, kernel_env, write_spec
from themisto.runtime.launcher import KERNEL_MAIN
from themisto.runtime.sandbox import (KernelResources, KernelStartError, SandboxWarning, is_running, kill_all,
                                      processes_of_uid)
from themisto.settings import settings

# Longest wait for jupyter_client to stop a kernel's channels, or to shut the kernel down, before we do it ourselves.
_STOP_S = 10.0
_STDERR_TAIL_BYTES = 8192
# How long a kernel that answered on its shell channel gets to be heard on IOPub before it is asked again.
_IOPUB_HEARD_S = 0.5
# Meanwhile it is asked again this often: the status messages of a request the kernel answered before our IOPub
# subscription had joined are lost, and a start waited out the whole half second for most kernels (a restart
# 0.80 s instead of 0.31 s).
_IOPUB_ASK_AGAIN_S = 0.02


async def _until_ready(kc, timeout: float) -> None:
    """Return once the kernel has answered a kernel_info request on its shell channel and a message of one of those
    requests has come through IOPub (so the subscription is live), as jupyter_client's `wait_for_ready` does; that
    one then also waits for 0.2 s of IOPub silence, a fifth of a quiet start, and nothing here needs it: every read
    keeps only the messages of its own request. RuntimeError when the kernel dies or stays silent past `timeout`."""
    from queue import Empty

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    asked: set[str] = set()
    while loop.time() < deadline:
        asked.add(kc.kernel_info())
        try:
            reply = await kc.shell_channel.get_msg(timeout=max(0.0, min(1.0, deadline - loop.time())))
        except Empty:
            reply = None
        if reply is not None and reply["msg_type"] == "kernel_info_reply":
            heard_by = loop.time() + _IOPUB_HEARD_S
            while (left := heard_by - loop.time()) > 0:
                try:
                    message = await kc.iopub_channel.get_msg(timeout=min(left, _IOPUB_ASK_AGAIN_S))
                except Empty:
                    asked.add(kc.kernel_info())
                    continue
                if message["parent_header"].get("msg_id") in asked:
                    return
        if not await kc.is_alive():
            raise RuntimeError("Kernel died before replying to kernel_info")
    raise RuntimeError(f"Kernel didn't respond in {timeout:g} seconds")


class KernelProcess:
    """The owner of one session's kernel process, life after life: a new life starts from the same layout (same
    folders, uid and cores, a fresh home); `starts` counts them."""

    def __init__(self, resources: KernelResources) -> None:
        self._resources = resources  # the process groups it starts are registered here (released even if dropped)
        self._layout: KernelLayout | None = None
        self._km: Any = None
        self._kc: Any = None
        self._pid: int | None = None
        self._starts = 0
        self._stderr = bytearray()
        self._stderr_fd: int | None = None

    @property
    def started(self) -> bool:
        """Whether a kernel life was started and not stopped (it may have died since)."""
        return self._km is not None

    @property
    def starts(self) -> int:
        """How many kernel lives were started: a new count means a fresh kernel, which knows nothing the last one was
        told."""
        return self._starts

    @property
    def client(self) -> Any:
        """The jupyter_client client of the running life (None while none runs)."""
        return self._kc

    @property
    def pid(self) -> int | None:
        """The kernel process's pid on this host (its /proc entry), None while none runs."""
        return self._pid

    @property
    def alive(self) -> bool:
        """Whether the kernel process is running."""
        process = self.popen()
        return process is not None and process.poll() is None

    def cpu_seconds(self) -> float | None:
        """CPU seconds this life's processes have used: the process jupyter_client started and all it started (the
        kernel, its workers, what they reaped); None while none runs or when /proc cannot tell."""
        process = self.popen()
        if process is None:
            return None
        try:
            top = psutil.Process(process.pid)
            tree = [top] + top.children(recursive=True)
        except psutil.Error:
            return None
        total = 0.0
        for proc in tree:
            try:
                times = proc.cpu_times()
            except psutil.Error:  # ended since the listing: its parent's children_* count it once it is reaped
                continue
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def queued_seconds(self) -> float | None:
        """Seconds the kernel's main thread has spent runnable but waiting for a core (/proc/PID/schedstat: the
        host's load, not the cell's work); None where the kernel has no schedstat."""
        if self._pid is None:
            return None
        try:
            with open(f"/proc/{self._pid}/schedstat", encoding="ascii") as handle:
                return int(handle.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def popen(self) -> subprocess.Popen | None:
        """The process jupyter_client started (the launcher, or bubblewrap around it), None while none runs."""
        provisioner = getattr(self._km, "provisioner", None)
        return getattr(provisioner, "process", None)

    def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group, as Jupyter's interrupt button does."""
        pid = self._pid
        if pid is None:
            return
        try:
            pgid = os.getpgid(pid)
            if pgid != os.getpgrp():
                os.killpg(pgid, signal.SIGINT)
            else:
                os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    async def restart(self) -> None:
        """Stop this life and start a fresh one from the same layout."""
        assert self._layout is not None
        await self.stop()
        await self.start(self._layout)

    async def start(self, layout: KernelLayout) -> None:
        """Start a kernel life from `layout` and return once it answers (KernelStartError, with its stderr's tail,
        when it does not)."""
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager

        self._layout = layout
        paths = layout.paths
        self._starts += 1
        fresh_home(layout)
        connection_file = paths.run / f"kernel-{self._starts}.json"
        km = AsyncKernelManager(
            transport="ipc", kernel_name=KERNEL_NAME, connection_file=str(connection_file),
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(write_spec(layout))]),
        )
        km.write_connection_file()
        if layout.uid is not None:
            os.chown(connection_file, layout.uid, layout.gid)
        self._km = km
        await km.start_kernel(env=kernel_env(layout), cwd=str(layout.start), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        process = self.popen()
        if process is not None:
            self._resources.pgids.add(process.pid)
            self._stderr.clear()
            self._watch_stderr(process)
        kc = km.client()
        kc.start_channels()
        self._kc = kc
        try:
            await _until_ready(kc, settings().kernel_start_timeout_s)
        except RuntimeError as exc:
            await asyncio.sleep(0.05)  # let the last lines of the kernel's stderr arrive
            tail = self._stderr.decode("utf-8", "replace")
            raise KernelStartError(f"the kernel did not start ({exc}); its stderr ends with:\n{tail}") from exc
        self._pid = self._find_kernel_pid()

    def _watch_stderr(self, process: subprocess.Popen) -> None:
        """Keep the last few KB of the kernel's stderr (startup errors; fd-level output echoed by ipykernel) in
        memory: a file would grow with whatever the cell writes to fd 2."""
        loop = asyncio.get_running_loop()
        fd = process.stderr.fileno()

        def on_readable() -> None:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(fd)
                return
            self._stderr += data
            del self._stderr[:-_STDERR_TAIL_BYTES]

        loop.add_reader(fd, on_readable)
        self._stderr_fd = fd

    def _unwatch_stderr(self) -> None:
        if self._stderr_fd is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._stderr_fd)
            except (RuntimeError, ValueError):
                pass
            self._stderr_fd = None

    def _find_kernel_pid(self) -> int | None:
        process = self.popen()
        if process is None:
            return None
        try:
            top = psutil.Process(process.pid)
            for proc in [top] + top.children(recursive=True):
                if KERNEL_MAIN in proc.cmdline():
                    return proc.pid
        except psutil.Error:
            return None
        return process.pid

    async def stop(self) -> None:
        """Stop this life (if one runs) and kill everything it started."""
        kc, km = self._kc, self._km
        self._kc = self._km = None
        self._unwatch_stderr()
        self._pid = None
        if kc is not None:
            # jupyter_client joins its channel threads (the heartbeat's included) without a bound; a kernel that
            # wrote garbage on its sockets must not hang the host, so the wait is bounded and the thread left behind.
            try:
                await asyncio.wait_for(asyncio.to_thread(kc.stop_channels), _STOP_S)
            except asyncio.TimeoutError:
                warnings.warn(f"the kernel client's channels did not stop within {_STOP_S:g} s; left behind",
                              SandboxWarning, stacklevel=2)
        if km is None:
            return
        process = km.provisioner.process if km.provisioner is not None else None
        descendants: list[psutil.Process] = []
        if process is not None:
            try:
                descendants = psutil.Process(process.pid).children(recursive=True)
            except psutil.Error:
                pass
        try:
            await asyncio.wait_for(km.shutdown_kernel(now=True), _STOP_S)
        except asyncio.TimeoutError:
            if process is not None and process.poll() is None:
                process.kill()  # what shutdown_kernel(now=True) would have done; the leftovers go below
        finally:
            leftovers = [p for p in descendants if is_running(p)]
            if self._layout is not None and self._layout.uid is not None:
                leftovers += processes_of_uid(self._layout.uid)
            if leftovers:
                kill_all(leftovers)
            if process is not None:
                self._resources.pgids.discard(process.pid)
