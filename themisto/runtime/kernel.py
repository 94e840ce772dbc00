"""The sandboxed kernel session: the one object that owns a Jupyter kernel, its limits, its watchdog and its cleanup.

`AsyncKernelSession` holds three parts, each in a module of its own that reads alone: the layout made before it starts
(`kernel_setup.KernelLayout`: folders, uid, cores, sandbox arguments), the owner of its process
(`kernel_process.KernelProcess`: each kernel life started and stopped) and the request runner with its watchdog
(`kernel_requests.RequestRunner`); its limits are `kernel_limits.Limits`, host probes, uids and process cleanup live in
`sandbox`, IOPub messages into outputs in `collector`. Here: its results, its public calls, and `KernelSession`, the
blocking twin, which wraps each of them.

Every cell ends in a closed outcome (ok, error, timeout, kernel_died). A cell past its timeout is interrupted, and
the kernel is restarted when the interrupt does not end it; a dead kernel is replaced by a fresh one. The kernel runs
in a temporary copy of the workspace, under bubblewrap where it is available (read-only filesystem, private /tmp and
pids, no network) and, when the host is root, as an unprivileged uid so that the process cap binds. This is a
best-effort guard for replaying notebooks and scoring model-written code, not a security boundary.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from themisto.runtime.agent.recorder import cut_text, text_bytes
from themisto.runtime.collector import OutputCollector
from themisto.runtime.kernel_limits import Limits  # the session's callers take it from here too
from themisto.runtime.kernel_process import KernelProcess
from themisto.runtime.kernel_requests import Outcome, RequestRunner
from themisto.runtime.kernel_setup import KernelLayout, lay_out
from themisto.runtime.outputs import strip_ansi
from themisto.runtime.sandbox import KernelResources, kernel_python, release_resources
from themisto.vocabulary import CellStatus

# The reseed after a stopped cell is two calls; a kernel that cannot take it in this time is left to its watchdog.
RESEED_TIMEOUT_S = 10.0


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
    # evaluated after the cell (IPython: only when it succeeded; the snapshot after a failed cell too)
    user_expressions: dict = field(default_factory=dict)


class AsyncKernelSession:
    """One sandboxed kernel; the coroutine twin of `KernelSession` (use one or the other, from one event loop)."""

    def __init__(self, workspace: str | Path | None = None, limits: Limits = Limits(), *,
                 extra_env: dict | None = None, python: str | None = None, start_dir: str | None = None):
        self.workspace = None if workspace is None else Path(workspace).resolve()
        self.python, self.start_dir = python, start_dir  # None: the default kernel environment; the copy's top
        if self.workspace is not None and not self.workspace.is_dir():
            raise FileNotFoundError(f"workspace folder not found: {self.workspace}")
        self.limits = limits
        self.extra_env = dict(extra_env or {})
        self._resources = KernelResources()
        self._finalizer = weakref.finalize(self, release_resources, self._resources)
        self._layout: KernelLayout | None = None  # made by start(), dropped by close()
        self._process = KernelProcess(self._resources)
        self._runner = RequestRunner(self._process, limits, self._restart_now)
        self._lock = asyncio.Lock()  # one request at a time; bound to a loop only when first awaited

    @property
    def resources(self) -> KernelResources:
        """What must be released even when the session is dropped without close() (the blocking twin's finalizer)."""
        return self._resources

    # ----- lifecycle -------------------------------------------------------------------------------------------

    def _started_layout(self) -> KernelLayout:
        if self._layout is None:
            raise RuntimeError("the kernel session is not started (call start() or use it as a context manager)")
        return self._layout

    @property
    def workdir(self) -> Path:
        """The kernel's own copy of the workspace and its working directory."""
        if self._layout is None:
            raise RuntimeError("the kernel session is not started")
        return self._layout.paths.work

    @property
    def values_dir(self) -> Path:
        """The folder the kernel writes stored values into (outside its working directory; the host empties it)."""
        if self._layout is None:
            raise RuntimeError("the kernel session is not started")
        return self._layout.values_dir

    @property
    def kernel_starts(self) -> int:
        """How many kernels this session has started: a new count means a fresh kernel, which knows nothing the
        last one was told."""
        return self._process.starts

    @property
    def alive(self) -> bool:
        """Whether the kernel process is running."""
        return self._process.alive

    @property
    def sandboxed(self) -> bool:
        """Whether the kernel runs under bubblewrap."""
        return self._layout is not None and self._layout.bwrap is not None

    @property
    def kernel_uid(self) -> int | None:
        """The uid the kernel runs as when it was dropped from root, else None."""
        return self._layout.uid if self._layout is not None else None

    @property
    def kernel_pid(self) -> int | None:
        """The kernel process's pid on this host (its /proc entry), None while none runs."""
        return self._process.pid

    @property
    def kernel_python(self) -> str:
        """The interpreter the kernel runs (see `kernel_environment()` for its versions)."""
        return self._layout.python if self._layout is not None else kernel_python()

    async def start(self) -> None:
        """Copy the workspace, start the kernel and wait until it answers."""
        if self._process.started:
            return
        try:
            self._layout = lay_out(self.workspace, self.limits, self.extra_env, self._resources,
                                   python=self.python, start_dir=self.start_dir)
            await self._start_kernel()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Kill the kernel and everything it started, and remove the session's folders."""
        try:
            await self._process.stop()
        finally:
            release_resources(self._resources)
            self._layout = None

    async def __aenter__(self) -> AsyncKernelSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def restart(self) -> None:
        """Kill the kernel and start a fresh one: empty namespace, same workdir."""
        self._started_layout()
        async with self._lock:
            await self._restart_now()

    async def _start_kernel(self) -> None:
        await self._process.start(self._started_layout())
        await self._runner.drain()

    async def _restart_now(self) -> None:
        await self._process.stop()
        await self._start_kernel()

    async def _ensure_started(self) -> bool:
        """Start a fresh kernel if the last one died between calls; True when that happened (state lost)."""
        self._started_layout()
        if not self._process.started or not self._process.alive:
            await self._restart_now()
            return True
        return False

    def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group, as Jupyter's interrupt button does."""
        self._process.interrupt()

    # ----- execution -------------------------------------------------------------------------------------------

    async def execute(self, code: str, *, timeout: float | None = None, user_expressions: dict[str, str] | None = None,
                      metadata: dict | None = None, clock: Literal["wall", "cpu"] | None = None) -> CellResult:
        """Run one cell as a notebook would (stored in history, counted) and return its outcome.

        `user_expressions` are evaluated in the same request once the cell succeeded (IPython skips them after an
        error, except the snapshot: themisto.runtime.launcher.SNAPSHOT_EXPRESSION); their results land in
        `CellResult.user_expressions`. `metadata` rides on the request as JSON (the agent's arguments for those
        expressions: `execute_silent`). `clock` overrides `Limits.cell_clock` for this cell ("wall" for model-written
        code, whatever the session's limits say).
        """
        async with self._lock:
            replaced = await self._ensure_started()
            collector = OutputCollector(self.limits.output_bytes)
            outcome = await self._runner.request(code, collector, timeout, silent=False,
                                          user_expressions=dict(user_expressions or {}), metadata=metadata,
                                          clock=clock)
            if outcome.status == "timeout" and not outcome.restarted:
                outcome.restarted = await self._reseed_after_stop(code)
        result = self._cell_result(outcome, collector)
        result.kernel_restarted = result.kernel_restarted or replaced
        return result

    async def _reseed_after_stop(self, code: str) -> bool:
        """How far a stopped cell drew from the global generators depends on the host: reseed them from its code
        (themisto.runtime.kernel_main.reseed_code). True when the kernel could not take it and was restarted (the
        state is then lost, as if the cell had lost it)."""
        from themisto.runtime.kernel_main import reseed_code

        outcome = await self._runner.request(reseed_code(code), OutputCollector(self.limits.output_bytes),
                                             RESEED_TIMEOUT_S, silent=True, user_expressions={})
        return outcome.restarted

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
            outcome = await self._runner.request(code, collector, timeout, silent=True,
                                          user_expressions=dict(user_expressions or {}), metadata=metadata)
        if outcome.reply is not None and outcome.kind == "done":
            reply = outcome.reply
        else:
            reply = {"status": outcome.status, "ename": outcome.ename, "evalue": outcome.evalue,
                     "user_expressions": {}}
        if replaced or outcome.restarted:
            reply["kernel_restarted"] = True
        return reply

    def _cell_result(self, outcome: Outcome, collector: OutputCollector) -> CellResult:
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

def _abandon(loop: asyncio.AbstractEventLoop, resources: KernelResources) -> None:
    """A started `KernelSession` was dropped (or the interpreter exits) without close(): kill, remove, stop."""
    release_resources(resources)
    loop.call_soon_threadsafe(loop.stop)


def _blocking(name: str) -> Any:
    """`KernelSession`'s blocking form of the coroutine method `name` of `AsyncKernelSession`: run on the session's
    loop thread, waited for (its signature and docstring are the coroutine's)."""

    @functools.wraps(getattr(AsyncKernelSession, name))
    def call(self: KernelSession, *args: Any, **kwargs: Any) -> Any:
        return self._call(getattr(self._session, name), *args, **kwargs)

    return call


def _forwarded(name: str) -> property:
    """`KernelSession`'s read-only property `name`, the `AsyncKernelSession`'s."""
    return property(lambda self: getattr(self._session, name), doc=getattr(AsyncKernelSession, name).__doc__)


class KernelSession:
    """A sandboxed kernel with a blocking API; use it as a context manager so the kernel always shuts down."""

    def __init__(self, workspace: str | Path | None = None, limits: Limits = Limits(), *,
                 extra_env: dict | None = None, python: str | None = None, start_dir: str | None = None):
        self._session = AsyncKernelSession(workspace, limits, extra_env=extra_env, python=python,
                                           start_dir=start_dir)
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
        self._finalizer = weakref.finalize(self, _abandon, loop, self._session.resources)
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

    workdir = _forwarded("workdir")
    values_dir = _forwarded("values_dir")
    kernel_starts = _forwarded("kernel_starts")
    alive = _forwarded("alive")
    sandboxed = _forwarded("sandboxed")
    kernel_uid = _forwarded("kernel_uid")
    kernel_pid = _forwarded("kernel_pid")
    kernel_python = _forwarded("kernel_python")
    execute = _blocking("execute")
    execute_silent = _blocking("execute_silent")
    restart = _blocking("restart")

    def interrupt(self) -> None:
        """Send SIGINT to the kernel's process group."""
        self._session.interrupt()
