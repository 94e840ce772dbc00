"""One request to the kernel and the watchdog over it: send the execute request (its metadata too), read its messages
until the reply and the idle status come, the deadline passes or the kernel dies; past the deadline, interrupt, and
restart the kernel when the interrupt does not end the cell. Every request ends in a closed outcome. The session
(themisto.runtime.kernel) holds one `RequestRunner` over its process owner (themisto.runtime.kernel_process).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from themisto.runtime import launcher as kernel_launcher
from themisto.runtime.collector import OutputCollector
from themisto.runtime.kernel_limits import Limits
from themisto.runtime.kernel_process import KernelProcess
from themisto.runtime.line_budget import LINE_BUDGET_KEY, LineBudgetSpent
from themisto.vocabulary import CellStatus

# After an interrupt, how long the cell gets to end before the kernel is restarted. A restart loses the state, and
# replay then reruns the kernel life's earlier cells, so the grace is generous: on a loaded machine a cell that
# honours its interrupt (its KeyboardInterrupt and traceback written) can take several seconds (measured: the real
# task-1 log's step 56 at load 22 needed more than 1.5 s, and its restart and the rebuild of 54 cells took 2 min).
INTERRUPT_GRACE_S = 6.0
# Once a cell has ended within its timeout, how long the user expressions on its request (a snapshot) may take.
EXPRESSIONS_TIMEOUT_S = 120.0
# How often the kernel process is checked for life while a cell runs.
_LIVENESS_PERIOD_S = 0.2
# A cell timed in CPU seconds (`Limits.cell_clock` "cpu"): how often its CPU is read (a walk of /proc), and how many
# times its timeout it may take all the same in seconds of the clock that the kernel did not spend waiting for a
# core (a cell that waits without computing: a sleep, a lock). The kernel's wait for a core is its run-queue time
# (/proc/PID/schedstat), so however busy the host, a computing cell never reaches this bound; where the kernel has
# no schedstat, plain seconds of the clock are counted, and a host that gives the kernel less than
# 1/CPU_CLOCK_WALL_FACTOR of its core decides again.
_CPU_PERIOD_S = 1.0
CPU_CLOCK_WALL_FACTOR = 4.0


@dataclass
class Outcome:
    """How one request ended: done (with the kernel's reply), timeout or died, and the cell's closed status."""

    kind: str  # done | timeout | died
    reply: dict | None
    duration_s: float
    status: CellStatus = "ok"
    ename: str | None = None
    evalue: str | None = None
    restarted: bool = False


class RequestRunner:
    """One request at a time to the kernel `process` runs, under `limits`, with the watchdog over it; `restart` is the
    session's own restart (a fresh kernel life), called when the watchdog gives the kernel up."""

    def __init__(self, process: KernelProcess, limits: Limits, restart: Callable[[], Awaitable[None]]) -> None:
        self._process = process
        self._limits = limits
        self._restart = restart

    async def request(self, code: str, collector: OutputCollector, timeout: float | None, *, silent: bool,
                       user_expressions: dict | None, metadata: dict | None = None,
                       clock: str | None = None) -> Outcome:
        await self.drain()
        timeout = self._limits.cell_timeout_s if timeout is None else timeout
        by_cpu = (clock or self._limits.cell_clock) == "cpu" and not silent
        started = time.monotonic()
        deadline = _Deadline(started + timeout)
        if by_cpu and (cpu := self._process.cpu_seconds()) is not None:
            deadline.cpu = cpu + timeout
            queued = self._process.queued_seconds()
            if queued is None:
                deadline.wall = started + timeout * CPU_CLOCK_WALL_FACTOR
            else:
                deadline.wall = math.inf
                deadline.paced = (started, queued, timeout * CPU_CLOCK_WALL_FACTOR)
        # jupyter_client's `execute`, with the message's metadata (which it cannot set)
        content = {"code": code, "silent": silent, "store_history": not silent,
                   "user_expressions": dict(user_expressions or {}), "allow_stdin": False, "stop_on_error": False}
        kc = self._process.client
        request = kc.session.msg("execute_request", content, metadata=dict(metadata or {}))
        kc.shell_channel.send(request)
        msg_id = request["header"]["msg_id"]
        # A silent request's expressions are its work (an agent call): its timeout times them. A cell's times the cell.
        wait = _Wait(msg_id, expressions_s=EXPRESSIONS_TIMEOUT_S if user_expressions and not silent else 0.0)
        kind = await self._wait(wait, deadline, collector, extend=not silent)
        # (a CPU deadline is only declared while the cell runs: a cell that announced its end did so in time)
        in_time = not silent and wait.cell_done is not None and wait.cell_done <= deadline.wall
        outcome = Outcome(kind=kind, reply=wait.reply, duration_s=(wait.cell_done or time.monotonic()) - started)
        if kind == "done":
            outcome.status = "ok" if (wait.reply or {}).get("status") == "ok" else "error"
            lines = (metadata or {}).get(LINE_BUDGET_KEY)
            if lines and (wait.reply or {}).get("ename") == LineBudgetSpent.__name__:
                outcome.kind, outcome.status, outcome.ename = "timeout", "timeout", "CellTimeout"
                outcome.evalue = f"the cell ran past its budget of {lines:,} lines; interrupted, state kept"
            return outcome
        interrupted = kind == "deadline"
        if interrupted:
            self._process.interrupt()
            kind = await self._wait(wait, _Deadline(time.monotonic() + INTERRUPT_GRACE_S), collector, extend=False)
            outcome.reply = wait.reply
        if kind == "done" and in_time:  # the snapshot ran long, not the cell: the cell's own outcome stands
            outcome.status = "ok" if (wait.reply or {}).get("status") == "ok" else "error"
        elif kind == "done":
            outcome.kind, outcome.status, outcome.ename = "timeout", "timeout", "CellTimeout"
            outcome.evalue = f"the cell ran past its {deadline.words(timeout)} timeout; interrupted, state kept"
        elif kind == "deadline" and not in_time:
            await self._restart()
            outcome.kind, outcome.status, outcome.ename, outcome.restarted = "timeout", "timeout", "CellTimeout", True
            outcome.evalue = (f"the cell ran past its {deadline.words(timeout)} timeout and ignored the interrupt; "
                              "kernel restarted after timeout, state lost")
        else:  # it died (perhaps of the interrupt), or what hung was the snapshot after a cell that ended in time
            outcome.kind, outcome.status, outcome.ename = "died", "kernel_died", "KernelDied"
            outcome.evalue = await self._replace_dead_kernel(timeout if interrupted else None, in_time)
            outcome.restarted = True
        return outcome

    async def _replace_dead_kernel(self, interrupted_after: float | None, in_time: bool) -> str:
        """Restart a kernel that died (or hung past the interrupt after its cell ended), once; why, for `evalue`."""
        process = self._process.popen()
        code_ = process.poll() if process is not None else None
        await self._restart()
        if code_ is None and in_time:
            return ("the user expressions after the cell (a snapshot) ignored the interrupt; a fresh kernel was "
                    "started, state lost")
        when = "" if interrupted_after is None else f" when interrupted after its {interrupted_after:g} s timeout"
        return f"the kernel died{when} (exit status {code_}); a fresh kernel was started, state lost"

    async def _wait(self, wait: _Wait, deadline: _Deadline, collector: OutputCollector, *, extend: bool) -> str:
        """Read messages of `wait.msg_id` until its reply and idle status arrive ("done"), the deadline passes
        ("deadline": its wall time, or its CPU seconds while the cell runs) or the kernel dies ("died"). With
        `extend`, a cell that ended before the deadline gives its user expressions `wait.expressions_s` more."""
        import zmq
        import zmq.asyncio

        kc = self._process.client
        iopub = kc.iopub_channel.socket
        shell = kc.shell_channel.socket
        poller = zmq.asyncio.Poller()
        poller.register(iopub, zmq.POLLIN)
        poller.register(shell, zmq.POLLIN)
        last_check = last_cpu = time.monotonic()
        while not (wait.idle and wait.reply is not None):
            now = time.monotonic()
            limit = deadline.wall
            if extend and wait.cell_done is not None and wait.cell_done <= deadline.wall:
                # a CPU-timed cell (whose wall deadline may be none) gets its expressions' seconds, or a grace for its
                # reply, from its end
                limit = max(deadline.wall, wait.cell_done + wait.expressions_s) if deadline.cpu is None else (
                    wait.cell_done + max(wait.expressions_s, INTERRUPT_GRACE_S))
            if now >= limit:
                return "deadline"
            events = dict(await poller.poll(int(min(limit - now, _LIVENESS_PERIOD_S) * 1000) + 1))
            if iopub in events:
                await self._read_iopub(wait, collector)
            if shell in events:
                msg = await kc.shell_channel.get_msg(timeout=0)
                if msg.get("parent_header", {}).get("msg_id") == wait.msg_id:
                    wait.reply = msg["content"]
            if time.monotonic() - last_check >= _LIVENESS_PERIOD_S or not events:
                last_check = time.monotonic()
                if not self._process.alive:
                    await self._read_iopub(wait, collector)
                    return "died"
            if deadline.cpu is not None and wait.cell_done is None and time.monotonic() - last_cpu >= _CPU_PERIOD_S:
                last_cpu = time.monotonic()
                if deadline.passed(self._process):
                    return "deadline"
        return "done"

    async def _read_iopub(self, wait: _Wait | None, collector: OutputCollector | None, limit: int = 1000) -> None:
        """Read the iopub messages ready now (at most `limit`), without decoding any content over the output cap."""
        kc = self._process.client
        socket = kc.iopub_channel.socket
        session = kc.session
        cap = self._limits.output_bytes + 65536
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

    async def drain(self) -> None:
        """Drop the IOPub messages waiting (a kernel life's start, an abandoned request's last words)."""
        if self._process.client is not None:
            await self._read_iopub(None, None, limit=100_000)


@dataclass
class _Deadline:
    wall: float  # time.monotonic() past which the request is given up (math.inf: `paced` bounds it)
    cpu: float | None = None  # the kernel's CPU seconds (KernelProcess.cpu_seconds) past which its cell is given up
    # (started, the kernel's run-queue seconds then, seconds): a CPU-timed cell is also given up once that many
    # seconds of the clock have passed that the kernel did not spend waiting for a core
    paced: tuple[float, float, float] | None = None

    def passed(self, process: KernelProcess) -> bool:
        """Whether a CPU-timed cell is past its CPU seconds, or past its paced seconds of the clock."""
        used = process.cpu_seconds()
        if used is not None and self.cpu is not None and used >= self.cpu:
            return True
        if self.paced is not None and (queued := process.queued_seconds()) is not None:
            started, queued_then, seconds = self.paced
            return time.monotonic() - started - (queued - queued_then) >= seconds
        return False

    def words(self, timeout: float) -> str:
        return f"{timeout:g} CPU s" if self.cpu is not None else f"{timeout:g} s"


@dataclass
class _Wait:
    msg_id: str
    reply: dict | None = None
    idle: bool = False
    cell_done: float | None = None  # when the kernel said the cell itself ended (before its user expressions)
    expressions_s: float = 0.0  # how long the user expressions may take once the cell ended in time
