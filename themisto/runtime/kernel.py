"""The sandboxed kernel session: the one module that owns a Jupyter kernel, its limits, its watchdog and its cleanup.

(Over 400 lines on purpose: `AsyncKernelSession` is one object whose methods share the kernel's life — start, the
watchdog, restarts, cleanup — and splitting it further would spread that state over modules. Its setup steps live in
`kernel_setup`, host probes, uids and process cleanup in `sandbox`, IOPub messages into outputs in `collector`.)

Every cell ends in a closed outcome (ok, error, timeout, kernel_died). A cell past its timeout is interrupted, and
the kernel is restarted when the interrupt does not end it; a dead kernel is replaced by a fresh one. The kernel runs
in a temporary copy of the workspace, under bubblewrap where it is available (read-only filesystem, private /tmp and
pids, no network) and, when the host is root, as an unprivileged uid so that the process cap binds. This is a
best-effort guard for replaying notebooks and scoring model-written code, not a security boundary.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from themisto.runtime import launcher as kernel_launcher
from themisto.runtime.outputs import strip_ansi
from themisto.settings import settings
from themisto.vocabulary import CellStatus
from themisto.runtime.agent.recorder import cut_text, text_bytes
from themisto.runtime.collector import OutputCollector
from themisto.runtime.kernel_setup import KERNEL_NAME, KernelSetup
from themisto.runtime.sandbox import (KernelResources, KernelStartError, SandboxWarning, is_running, kernel_python,
                                      kill_all, processes_of_uid, release_resources)


# After an interrupt, how long the cell gets to end before the kernel is restarted.
INTERRUPT_GRACE_S = 1.5
# Once a cell has ended within its timeout, how long the user expressions on its request (a snapshot) may take.
EXPRESSIONS_TIMEOUT_S = 120.0
# Longest wait for jupyter_client to stop a kernel's channels, or to shut the kernel down, before we do it ourselves.
_STOP_S = 10.0
# How often the kernel process is checked for life while a cell runs.
_LIVENESS_PERIOD_S = 0.2
_STDERR_TAIL_BYTES = 8192


@dataclass(frozen=True)
class Limits:
    """Resource limits of one kernel; they hold for the kernel and everything it forks."""

    memory_bytes: int = 4 * 2**30  # RLIMIT_DATA in the kernel (MemoryError, kernel lives on)
    max_processes: int = 256  # RLIMIT_NPROC for the kernel's own uid (threads count too)
    file_size_bytes: int = 2**30  # RLIMIT_FSIZE
    cpu_seconds: int | None = None  # RLIMIT_CPU counts the kernel's whole life: off by default
    cell_timeout_s: float = 120.0
    output_bytes: int = 2**20  # per cell; beyond it outputs are cut with a visible marker
    network: bool = False
    isolate_fs: bool = True  # bubblewrap: rest of the filesystem read-only, private /tmp, private pids


@dataclass
class CellResult:
    """What one executed cell produced: a closed status, nbformat v4 outputs, and the error if any."""

    status: CellStatus
    outputs: list[dict]  # nbformat v4 output dicts: stream / execute_result / display_data / error
    ename: str | None = None
    evalue: str | None = None
    traceback: list[str] = field(default_factory=list)  # ANSI-free
    execution_count: int | None = None
    duration_s: float = 0.0  # the cell's own: until the kernel announced its end, before any user expressions ran
    truncated: bool = False
    kernel_restarted: bool = False  # the namespace was lost (timeout escalated to restart, or the kernel died)
    user_expressions: dict = field(default_factory=dict)  # evaluated after the cell (IPython: only when it succeeded)


class AsyncKernelSession(KernelSetup):
    """One sandboxed kernel; the coroutine twin of `KernelSession` (use one or the other, from one event loop)."""

    def __init__(self, workspace: str | Path | None = None, limits: Limits = Limits(), *,
                 extra_env: dict | None = None):
        self.workspace = None if workspace is None else Path(workspace).resolve()
        if self.workspace is not None and not self.workspace.is_dir():
            raise FileNotFoundError(f"workspace folder not found: {self.workspace}")
        self.limits = limits
        self.extra_env = dict(extra_env or {})
        self._paths: kernel_launcher.SandboxPaths | None = None
        self._resources = KernelResources()
        self._finalizer = weakref.finalize(self, release_resources, self._resources)
        self._km: Any = None
        self._kc: Any = None
        self._kernel_pid: int | None = None
        self._starts = 0
        self._lock = asyncio.Lock()  # one request at a time; bound to a loop only when first awaited
        self._bwrap: str | None = None
        self._uid: int | None = None
        self._gid: int | None = None
        self._stderr = bytearray()
        self._stderr_fd: int | None = None
        self._python: str | None = None

    # ----- lifecycle -------------------------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """The kernel's own copy of the workspace and its working directory."""
        if self._paths is None:
            raise RuntimeError("the kernel session is not started")
        return self._paths.work

    @property
    def alive(self) -> bool:
        """Whether the kernel process is running."""
        process = self._process()
        return process is not None and process.poll() is None

    @property
    def sandboxed(self) -> bool:
        """Whether the kernel runs under bubblewrap."""
        return self._bwrap is not None

    @property
    def kernel_uid(self) -> int | None:
        """The uid the kernel runs as when it was dropped from root, else None."""
        return self._uid

    @property
    def kernel_python(self) -> str:
        """The interpreter the kernel runs (see `kernel_environment()` for its versions)."""
        return self._python or kernel_python()

    async def start(self) -> None:
        """Copy the workspace, start the kernel and wait until it answers."""
        if self._km is not None:
            return
        self._plan_sandbox()
        self._prepare_folders()
        try:
            await self._start_kernel()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Kill the kernel and everything it started, and remove the session's folders."""
        try:
            await self._stop_kernel()
        finally:
            release_resources(self._resources)
            self._paths = None

    async def __aenter__(self) -> AsyncKernelSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
            await kc.wait_for_ready(timeout=settings().kernel_start_timeout_s)
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
                if "ipykernel_launcher" in " ".join(proc.cmdline()):
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

    async def restart(self) -> None:
        """Kill the kernel and start a fresh one: empty namespace, same workdir."""
        if self._paths is None:
            raise RuntimeError("the kernel session is not started (call start() or use it as a context manager)")
        async with self._lock:
            await self._restart_now()

    async def _restart_now(self) -> None:
        await self._stop_kernel()
        await self._start_kernel()

    async def _ensure_started(self) -> bool:
        """Start a fresh kernel if the last one died between calls; True when that happened (state lost)."""
        if self._paths is None:
            raise RuntimeError("the kernel session is not started (call start() or use it as a context manager)")
        if self._km is None or not self.alive:
            await self._stop_kernel()
            await self._start_kernel()
            return True
        return False

    def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group, as Jupyter's interrupt button does."""
        pid = self._kernel_pid
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

    # ----- execution -------------------------------------------------------------------------------------------

    async def execute(self, code: str, *, timeout: float | None = None,
                      user_expressions: dict[str, str] | None = None) -> CellResult:
        """Run one cell as a notebook would (stored in history, counted) and return its outcome.

        `user_expressions` are evaluated in the same request once the cell succeeded (IPython skips them after an
        error); their results land in `CellResult.user_expressions`.
        """
        async with self._lock:
            replaced = await self._ensure_started()
            collector = OutputCollector(self.limits.output_bytes)
            outcome = await self._request(code, collector, timeout, silent=False,
                                          user_expressions=dict(user_expressions or {}))
        result = self._cell_result(outcome, collector)
        result.kernel_restarted = result.kernel_restarted or replaced
        return result

    async def execute_silent(self, code: str = "", *, user_expressions: dict[str, str] | None = None,
                             timeout: float | None = None, metadata: dict | None = None) -> dict:
        """Run code without touching In/Out or the execution count; returns the execute_reply content.

        `metadata` rides on the request message as JSON (the kernel reads it as its parent's metadata): how the host
        hands the agent data, never pasted into source.

        The content's `status` is "ok" or "error" as the kernel said, or "timeout" / "kernel_died" when the watchdog
        ended the request (then `evalue` says whether the state was lost); `kernel_restarted: True` is added when
        the namespace was lost (the kernel had died before the call, or was restarted during it).
        """
        async with self._lock:
            replaced = await self._ensure_started()
            collector = OutputCollector(self.limits.output_bytes)
            outcome = await self._request(code, collector, timeout, silent=True,
                                          user_expressions=dict(user_expressions or {}), metadata=metadata)
        if outcome.reply is not None and outcome.kind == "done":
            reply = outcome.reply
        else:
            reply = {"status": outcome.status, "ename": outcome.ename, "evalue": outcome.evalue,
                     "user_expressions": {}}
        if replaced or outcome.restarted:
            reply["kernel_restarted"] = True
        return reply

    def _cell_result(self, outcome: _Outcome, collector: OutputCollector) -> CellResult:
        outputs = collector.finish()
        reply = outcome.reply or {}
        result = CellResult(status=outcome.status, outputs=outputs, execution_count=reply.get("execution_count"),
                            duration_s=outcome.duration_s, truncated=collector.truncated,
                            kernel_restarted=outcome.restarted)
        if outcome.kind == "done":
            result.user_expressions = dict(reply.get("user_expressions") or {})
            if reply.get("status") != "ok":
                result.status = "error"
                result.ename = reply.get("ename", "Aborted" if reply.get("status") == "aborted" else None)
                # The reply repeats the error output in full; what is kept of it obeys the output cap too.
                evalue = str(reply.get("evalue", ""))
                if text_bytes(evalue) > self.limits.output_bytes:
                    evalue, result.truncated = cut_text(evalue, self.limits.output_bytes), True
                result.evalue = evalue
                errors = [o for o in outputs if o["output_type"] == "error"]
                traceback = errors[-1]["traceback"] if errors else reply.get("traceback", [])
                result.traceback = [strip_ansi(line) for line in traceback]
        else:
            result.ename, result.evalue = outcome.ename, outcome.evalue
            errors = [o for o in outputs if o["output_type"] == "error"]
            if errors:
                result.traceback = [strip_ansi(line) for line in errors[-1].get("traceback", [])]
        return result

    async def _request(self, code: str, collector: OutputCollector, timeout: float | None, *, silent: bool,
                       user_expressions: dict | None, metadata: dict | None = None) -> _Outcome:
        await self._drain_iopub()
        timeout = self.limits.cell_timeout_s if timeout is None else timeout
        started = time.monotonic()
        # jupyter_client's `execute`, with the message's metadata (which it cannot set)
        content = {"code": code, "silent": silent, "store_history": not silent,
                   "user_expressions": dict(user_expressions or {}), "allow_stdin": False, "stop_on_error": False}
        request = self._kc.session.msg("execute_request", content, metadata=dict(metadata or {}))
        self._kc.shell_channel.send(request)
        msg_id = request["header"]["msg_id"]
        # A silent request's expressions are its work (an agent call): its timeout times them. A cell's times the cell.
        wait = _Wait(msg_id, expressions_s=EXPRESSIONS_TIMEOUT_S if user_expressions and not silent else 0.0)
        kind = await self._wait(wait, started + timeout, collector, extend=not silent)
        in_time = not silent and wait.cell_done is not None and wait.cell_done <= started + timeout
        outcome = _Outcome(kind=kind, reply=wait.reply, duration_s=(wait.cell_done or time.monotonic()) - started)
        if kind == "done":
            outcome.status = "ok" if (wait.reply or {}).get("status") == "ok" else "error"
            return outcome
        interrupted = kind == "deadline"
        if interrupted:
            self.interrupt()
            kind = await self._wait(wait, time.monotonic() + INTERRUPT_GRACE_S, collector, extend=False)
            outcome.reply = wait.reply
        if kind == "done" and in_time:  # the snapshot ran long, not the cell: the cell's own outcome stands
            outcome.status = "ok" if (wait.reply or {}).get("status") == "ok" else "error"
        elif kind == "done":
            outcome.kind, outcome.status, outcome.ename = "timeout", "timeout", "CellTimeout"
            outcome.evalue = f"the cell ran past its {timeout:g} s timeout; interrupted, state kept"
        elif kind == "deadline" and not in_time:
            await self._restart_now()
            outcome.kind, outcome.status, outcome.ename, outcome.restarted = "timeout", "timeout", "CellTimeout", True
            outcome.evalue = (f"the cell ran past its {timeout:g} s timeout and ignored the interrupt; "
                              "kernel restarted after timeout, state lost")
        else:  # it died (perhaps of the interrupt), or what hung was the snapshot after a cell that ended in time
            outcome.kind, outcome.status, outcome.ename = "died", "kernel_died", "KernelDied"
            outcome.evalue = await self._replace_dead_kernel(timeout if interrupted else None, in_time)
            outcome.restarted = True
        return outcome

    async def _replace_dead_kernel(self, interrupted_after: float | None, in_time: bool) -> str:
        """Restart a kernel that died (or hung past the interrupt after its cell ended), once; why, for `evalue`."""
        process = self._process()
        code_ = process.poll() if process is not None else None
        await self._restart_now()
        if code_ is None and in_time:
            return ("the user expressions after the cell (a snapshot) ignored the interrupt; a fresh kernel was "
                    "started, state lost")
        when = "" if interrupted_after is None else f" when interrupted after its {interrupted_after:g} s timeout"
        return f"the kernel died{when} (exit status {code_}); a fresh kernel was started, state lost"

    async def _wait(self, wait: _Wait, deadline: float, collector: OutputCollector, *, extend: bool) -> str:
        """Read messages of `wait.msg_id` until its reply and idle status arrive ("done"), the deadline passes
        ("deadline") or the kernel dies ("died"). With `extend`, a cell that ended before the deadline gives its
        user expressions `wait.expressions_s` more."""
        import zmq
        import zmq.asyncio

        iopub = self._kc.iopub_channel.socket
        shell = self._kc.shell_channel.socket
        poller = zmq.asyncio.Poller()
        poller.register(iopub, zmq.POLLIN)
        poller.register(shell, zmq.POLLIN)
        last_check = time.monotonic()
        while not (wait.idle and wait.reply is not None):
            now = time.monotonic()
            limit = deadline
            if extend and wait.cell_done is not None and wait.cell_done <= deadline:
                limit = max(deadline, wait.cell_done + wait.expressions_s)
            if now >= limit:
                return "deadline"
            events = dict(await poller.poll(int(min(limit - now, _LIVENESS_PERIOD_S) * 1000) + 1))
            if iopub in events:
                await self._read_iopub(wait, collector)
            if shell in events:
                msg = await self._kc.shell_channel.get_msg(timeout=0)
                if msg.get("parent_header", {}).get("msg_id") == wait.msg_id:
                    wait.reply = msg["content"]
            if time.monotonic() - last_check >= _LIVENESS_PERIOD_S or not events:
                last_check = time.monotonic()
                if not self.alive:
                    await self._read_iopub(wait, collector)
                    return "died"
        return "done"

    async def _read_iopub(self, wait: _Wait | None, collector: OutputCollector | None, limit: int = 1000) -> None:
        """Read the iopub messages ready now (at most `limit`), without decoding any content over the output cap."""
        kc = self._kc
        socket = kc.iopub_channel.socket
        session = kc.session
        cap = self.limits.output_bytes + 65536
        for _ in range(limit):
            if not await socket.poll(0):
                return
            frames = await socket.recv_multipart()
            _, msg_list = session.feed_identities(frames)
            try:
                msg = session.deserialize(msg_list, content=False)
            except (ValueError, TypeError):
                continue  # unsigned or malformed: not from our kernel
            if wait is None or collector is None or msg["parent_header"].get("msg_id") != wait.msg_id:
                continue
            raw = msg["content"]
            raw = raw.bytes if hasattr(raw, "bytes") else bytes(raw)
            msg_type = msg["msg_type"]
            if len(raw) > cap:
                # Decoding a 200 MB message would copy it several times over; keep a prefix of a stream's text.
                collector.add_oversized(msg_type, raw)
                continue
            if msg_type == kernel_launcher.CELL_DONE_MSG:
                wait.cell_done = wait.cell_done or time.monotonic()
                continue
            content = session.unpack(raw)
            if msg_type == "status":
                if content.get("execution_state") == "idle":
                    wait.idle = True
            else:
                collector.add(msg_type, content)

    async def _drain_iopub(self) -> None:
        if self._kc is not None:
            await self._read_iopub(None, None, limit=100_000)


@dataclass
class _Wait:
    msg_id: str
    reply: dict | None = None
    idle: bool = False
    cell_done: float | None = None  # when the kernel said the cell itself ended (before its user expressions)
    expressions_s: float = 0.0  # how long the user expressions may take once the cell ended in time


@dataclass
class _Outcome:
    kind: str  # done | timeout | died
    reply: dict | None
    duration_s: float
    status: CellStatus = "ok"
    ename: str | None = None
    evalue: str | None = None
    restarted: bool = False


def _abandon(loop: asyncio.AbstractEventLoop, resources: KernelResources) -> None:
    """A started `KernelSession` was dropped (or the interpreter exits) without close(): kill, remove, stop."""
    release_resources(resources)
    loop.call_soon_threadsafe(loop.stop)


class KernelSession:
    """A sandboxed kernel with a blocking API; use it as a context manager so the kernel always shuts down."""

    def __init__(self, workspace: str | Path | None = None, limits: Limits = Limits(), *,
                 extra_env: dict | None = None):
        self._session = AsyncKernelSession(workspace, limits, extra_env=extra_env)
        self.limits = limits
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None

    def _call(self, coroutine_function: Any, *args: Any, **kwargs: Any) -> Any:
        if self._loop is None:
            raise RuntimeError("the kernel session is not started (call start() or use it as a context manager)")
        future = asyncio.run_coroutine_threadsafe(coroutine_function(*args, **kwargs), self._loop)
        try:
            # Timed waits: an interrupt that only sets Python's flag (a cancelled Ray task, _thread.interrupt_main)
            # is raised here within a quarter second; an untimed wait would sleep through it until the cell ends.
            while not future.done():
                concurrent.futures.wait([future], timeout=0.25)
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            self._session.interrupt()
            raise

    def start(self) -> None:
        """Start the kernel (and the private event loop thread that talks to it)."""
        if self._loop is not None:
            return
        loop = asyncio.new_event_loop()
        # The kernel's launcher dies with the thread that forked it (bubblewrap's --die-with-parent), so the loop
        # thread lives as long as the session.
        thread = threading.Thread(target=loop.run_forever, name="themisto-kernel-loop", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        self._finalizer = weakref.finalize(self, _abandon, loop, self._session._resources)
        try:
            self._call(self._session.start)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill the kernel and its processes, remove the session's folders, stop the loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self._session.close(), loop)
            future.result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=10)
            if not loop.is_running():
                loop.close()
            if self._finalizer is not None:
                self._finalizer.detach()
            self._loop = self._thread = self._finalizer = None

    def __enter__(self) -> KernelSession:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def workdir(self) -> Path:
        """The kernel's own copy of the workspace and its working directory."""
        return self._session.workdir

    @property
    def alive(self) -> bool:
        """Whether the kernel process is running."""
        return self._session.alive

    @property
    def sandboxed(self) -> bool:
        """Whether the kernel runs under bubblewrap."""
        return self._session.sandboxed

    @property
    def kernel_uid(self) -> int | None:
        """The uid the kernel runs as when it was dropped from root, else None."""
        return self._session.kernel_uid

    @property
    def kernel_python(self) -> str:
        """The interpreter the kernel runs (see `kernel_environment()` for its versions)."""
        return self._session.kernel_python

    def execute(self, code: str, *, timeout: float | None = None,
                user_expressions: dict[str, str] | None = None) -> CellResult:
        """Run one cell as a notebook would and return its outcome (and `user_expressions`, evaluated after it)."""
        return self._call(self._session.execute, code, timeout=timeout, user_expressions=user_expressions)

    def execute_silent(self, code: str = "", *, user_expressions: dict[str, str] | None = None,
                       timeout: float | None = None, metadata: dict | None = None) -> dict:
        """Run code silently (no history, no execution count); returns the execute_reply content. `metadata` rides
        on the request as JSON (see `AsyncKernelSession.execute_silent`)."""
        return self._call(self._session.execute_silent, code, user_expressions=user_expressions, timeout=timeout,
                          metadata=metadata)

    def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group."""
        self._session.interrupt()

    def restart(self) -> None:
        """Kill the kernel and start a fresh one: empty namespace, same workdir."""
        self._call(self._session.restart)
