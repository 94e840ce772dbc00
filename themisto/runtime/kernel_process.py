"""The kernel's process: starting it under its kernel spec and waiting until it answers, keeping the tail of its
stderr, finding the ipykernel's own pid inside the sandbox, and stopping it with everything it started.
`AsyncKernelSession` (themisto.runtime.kernel) inherits these steps, after `KernelSetup`'s layout.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import warnings

import psutil

from themisto.runtime.kernel_setup import KERNEL_NAME, KernelSetup
from themisto.runtime.launcher import KERNEL_MAIN
from themisto.runtime.sandbox import KernelStartError, SandboxWarning, is_running, kill_all, processes_of_uid
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


class KernelProcess(KernelSetup):
    """Start and stop the kernel process; they read and set the session's `_km`, `_kc`, `_kernel_pid`, `_starts`,
    `_stderr`, `_stderr_fd`, `_paths`, `_uid`, `_gid` and `_resources`."""

    async def _start_kernel(self) -> None:
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import AsyncKernelManager

        assert self._paths is not None
        self._starts += 1
        self._fresh_home()
        connection_file = self._paths.run / f"kernel-{self._starts}.json"
        km = AsyncKernelManager(
            transport="ipc", kernel_name=KERNEL_NAME, connection_file=str(connection_file),
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self._write_spec())]),
        )
        km.write_connection_file()
        if self._uid is not None:
            os.chown(connection_file, self._uid, self._gid)
        self._km = km
        await km.start_kernel(env=self._kernel_env(), cwd=str(self._paths.work), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        process = self._process()
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
        self._kernel_pid = self._find_kernel_pid()
        await self._drain_iopub()

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

    def _process(self) -> subprocess.Popen | None:
        provisioner = getattr(self._km, "provisioner", None)
        return getattr(provisioner, "process", None)

    def _find_kernel_pid(self) -> int | None:
        process = self._process()
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

    async def _stop_kernel(self) -> None:
        kc, km = self._kc, self._km
        self._kc = self._km = None
        self._unwatch_stderr()
        self._kernel_pid = None
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
            if self._uid is not None:
                leftovers += processes_of_uid(self._uid)
            if leftovers:
                kill_all(leftovers)
            if process is not None:
                self._resources.pgids.discard(process.pid)
