"""One candidate's life, the kernel's side: fork its monitor (which raises the walls and forks the candidate), let it
go, collect its alarms and report, end it, and reap what is left. The next candidate is forked and set up while the
one before it runs (`finish(..., then=...)`), and the kernel goes on as soon as a candidate that reported can do
nothing more (`_ended`), not when its exit has unmapped its copy of the kernel.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from themisto.runtime.agent.integrity import read_alarms
from themisto.runtime.agent.branch_child import (ALARM_BYTES, MONITOR_REAP_S, REPORT_BYTES, BranchPlan, read_report,
                                                 report_written, run_monitor)
from themisto.runtime.agent.handoff import parse_messages

_GRACE_S = 2.0  # after the candidate's own timer: time to hash the delta and report before SIGKILL


def _wait_monitor(pid: int, until: float) -> int | None:
    """The monitor's wait status once it exits before `until`, else None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= until:
            return None
        time.sleep(0.002)


def _candidate_exit(pid: int, until: float) -> None:
    """Wait (until `until`) for a process that is not our child to end: the candidate whose monitor it killed."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return
    try:
        select.select([pidfd], [], [], max(0.0, until - time.monotonic()))
    finally:
        os.close(pidfd)


def _read_alarms(fd: int, alarms: bytearray) -> bool:
    """Read what is ready on the alarm pipe into `alarms` (bounded); False at end of file or when nothing is ready."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return False
    alarms += chunk[:ALARM_BYTES - len(alarms)]
    return bool(chunk)


_LATE_MONITORS: list[int] = []  # monitors whose candidate has reported; reaped after the branch call
_EARLY_END_S = 0.05  # how long a killed candidate may take to stop; past it the kernel waits for its exit


_REAPERS: list[threading.Thread] = []


def reap_later() -> None:
    """Reap the late monitors in a thread: each one waits for its candidate's exit to unmap its copy of the kernel,
    which the kernel's answer need not wait for (their candidates reported and can do nothing more)."""
    monitors = _LATE_MONITORS[:]
    _LATE_MONITORS.clear()
    _REAPERS[:] = [thread for thread in _REAPERS if thread.is_alive()]  # a probe run never joins them all
    if monitors:
        thread = threading.Thread(target=lambda: [_reap_monitor(monitor, None) for monitor in monitors],
                                  name="themisto-reaper", daemon=True)
        thread.start()
        _REAPERS.append(thread)


def join_reapers() -> None:
    while _REAPERS:
        _REAPERS.pop().join()


def _reap_monitor(monitor: int, status: int | None) -> int:
    """The monitor's wait status, after a bounded wait and then SIGKILL."""
    if status is None:
        status = _wait_monitor(monitor, time.monotonic() + MONITOR_REAP_S + 1.0)
    if status is None:
        os.kill(monitor, signal.SIGKILL)
        _, status = os.waitpid(monitor, 0)
    return status


def _collect(started: Started, reported: Callable[[], bool]) -> bool:
    """Read the monitor's messages and the candidate's alarms into `started` until the candidate is done, its monitor
    is gone or the deadline passes (`started.timed_out`, `started.monitor_status`: None while it runs); True when
    instead `reported()` found what was waited for once the candidate said on its go socket that it had written a
    report (it is asked first too: the word may have come with an earlier one)."""
    if reported():
        return True
    messages, monitor = started.messages, started.monitor
    try:
        pidfd = os.pidfd_open(monitor) if hasattr(os, "pidfd_open") and started.monitor_status is None else None
    except OSError:
        pidfd = None
    try:
        poller = select.poll()
        poller.register(started.rfd, select.POLLIN | select.POLLHUP)
        poller.register(started.alarm_r, select.POLLIN | select.POLLHUP)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        poller.register(started.go, select.POLLIN | select.POLLHUP)
        eof = False
        while b"D" not in messages:
            left = started.deadline - time.monotonic()
            if left <= 0:
                started.timed_out = True
                break
            wait_ms = left * 1000 if pidfd is not None else min(left * 1000, 20)
            for fd, _ in poller.poll(max(1, int(wait_ms))):
                if fd == started.go and _heard(started.go, poller) and reported():
                    return True
                if fd == started.alarm_r and not _read_alarms(started.alarm_r, started.alarms):
                    poller.unregister(started.alarm_r)
                if fd == started.rfd:
                    chunk = os.read(started.rfd, 1 << 20)
                    if chunk:
                        started.buffer += chunk
                        parse_messages(started.buffer, messages)
                    else:
                        eof = True
                        poller.unregister(started.rfd)
            if started.monitor_status is None:
                exited, status = os.waitpid(monitor, os.WNOHANG)
                if exited:
                    started.monitor_status = status
                    if pidfd is not None:
                        poller.unregister(pidfd)
            if b"D" in messages or (eof and started.monitor_status is not None):
                break
            if eof and pidfd is None:
                time.sleep(0.002)
        if b"D" not in messages and b"P" in messages and not started.timed_out:
            _candidate_exit(int(messages[b"P"]), started.deadline)  # its monitor died first: it may still report
            started.timed_out = time.monotonic() >= started.deadline
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return False


def _heard(done: int, poller: Any) -> bool:
    """Whether the candidate said something on its go socket (it reported); at its end, stop listening."""
    try:
        said = os.read(done, 65536)  # a candidate may flood it: its word is only a reason to look
    except OSError:
        said = b""
    if not said:
        poller.unregister(done)
    return bool(said)


_PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit and runs no more user code


def _ended(pid: int, until: float) -> bool:
    """Whether a killed candidate can do nothing more: every thread of it is exiting (a syscall one was in has
    returned) and it has no child. It is the init of its pid namespace, where every other process descends from
    it, so none is left there. Polled until `until`."""
    while True:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            return True  # reaped already
        except OSError:
            return False
        if all(map(_task_ended, [f"/proc/{pid}/task/{task}" for task in tasks])):
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.0002)


def _task_ended(folder: str) -> bool:
    """Whether a task is exiting with no child, or gone."""
    try:
        with open(f"{folder}/stat", "rb") as f:
            flags = int(f.read().rsplit(b")", 1)[1].split()[6])
        with open(f"{folder}/children", "rb") as f:
            children = f.read().split()
    except FileNotFoundError:
        return True  # it has exited since the listing
    except (OSError, ValueError, IndexError):
        return False
    return bool(flags & _PF_EXITING) and not children


@dataclass
class Started:
    """A candidate forked and ready behind its walls, blocked until the kernel writes to `go` (or closes it); once let
    go, when its time ends and what came back of it so far."""

    cells: list[str] | None  # None: they come with the go (forked ahead of them)
    monitor: int
    rfd: int
    alarm_r: int
    go: int
    channel: mmap.mmap
    begun: float = 0.0
    deadline: float = 0.0
    messages: dict[bytes, bytes] = field(default_factory=dict)
    alarms: bytearray = field(default_factory=bytearray)
    buffer: bytearray = field(default_factory=bytearray)
    monitor_status: int | None = None
    timed_out: bool = False


def start(shell: Any, cells: list[str] | None, plan: BranchPlan) -> Started:
    """Fork the monitor, which raises the walls and forks the candidate; the candidate sets itself up and waits.

    The kernel holds the candidate's channels itself (the report's shared mapping, the alarm pipe), so a candidate
    that kills its monitor still reports, and is still seen."""
    rfd, wfd = os.pipe()
    alarm_r, alarm_w = os.pipe()
    # Both ways: the kernel's go (with the hashes), then the candidate's word that its report is written.
    go_ours, go_theirs = (end.detach() for end in socket.socketpair())
    channel = mmap.mmap(-1, 4 * plan.output_bytes + REPORT_BYTES)  # shared, anonymous: pages cost once written
    gc.freeze()  # the children's collector then never walks (and copies) the kernel's objects
    try:
        monitor = os.fork()
        if monitor == 0:
            for fd in (rfd, alarm_r, go_ours):
                os.close(fd)
            run_monitor(shell, cells, plan, wfd, channel, alarm_w, go_theirs)
    except BaseException:
        for fd in (rfd, wfd, alarm_r, alarm_w, go_theirs, go_ours):
            os.close(fd)
        channel.close()
        raise
    finally:
        gc.unfreeze()
    for fd in (wfd, alarm_w, go_theirs):
        os.close(fd)
    return Started(cells, monitor, rfd, alarm_r, go_ours, channel)


def still_waiting(started: Started) -> bool:
    """Whether a candidate forked ahead still waits for its go: its monitor runs and has not said that it ended (a
    fork storm of the candidate before may have left it no process to fork)."""
    readable, _, _ = select.select([started.rfd], [], [], 0)
    if readable:
        chunk = os.read(started.rfd, 1 << 20)
        started.buffer += chunk
        parse_messages(started.buffer, started.messages)
        if not chunk:
            return False
    if started.monitor_status is None:
        exited, status = os.waitpid(started.monitor, os.WNOHANG)
        if exited:
            started.monitor_status = status
    return started.monitor_status is None and b"D" not in started.messages


def cancel(started: Started) -> None:
    """End a candidate that was never let go: it reads the end of its go socket and exits; its monitor is killed."""
    os.close(started.go)
    if started.monitor_status is None:
        try:
            os.kill(started.monitor, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(started.monitor, 0)
    for fd in (started.rfd, started.alarm_r):
        os.close(fd)
    started.channel.close()


def let_go(started: Started, go: bytes, plan: BranchPlan, cells: int) -> None:
    """Let the candidate go (`go`: handoff.go_message): its `cells` each have the plan's time, then the grace."""
    started.begun = time.monotonic()
    started.deadline = started.begun + plan.timeout_s * cells + _GRACE_S
    try:
        view = memoryview(go)
        while view:
            view = view[os.write(started.go, view):]
    except OSError:
        pass  # the candidate is gone already: its monitor says how


def early_result(started: Started, plan: BranchPlan, index: int) -> dict | None:
    """Wait for a candidate let go with `plan.early` to write its early report (its cell's outcome and outputs): that
    report with what the kernel saw so far, as `finish` gives a result; None when it ended or ran out of time without
    one (`collect` then says how). It runs on: `collect` ends it."""
    if not _collect(started, lambda: report_written(started.channel, early=True)):
        return None
    data = read_report(started.channel, early=True)
    if data is None:
        return None
    return _result(_decode_report(data), plan, index, time.monotonic() - started.begun, False, None,
                   started.messages, started.alarms)


def finish(started: Started, go: bytes, plan: BranchPlan, index: int,
           then: Callable[[], Started | None] | None = None) -> tuple[dict, Started | None]:
    """Let the candidate go (`go`: handoff.go_message), then (`then()` first: the next candidate's fork overlaps
    this one's run) collect its alarms and report until its deadline, and kill and reap everything. Its result, and
    what `then` gave."""
    let_go(started, go, plan, len(started.cells or [None]))
    following = then() if then is not None else None
    try:
        return collect(started, plan, index), following
    except BaseException:
        if following is not None:
            cancel(following)
        raise


def collect(started: Started, plan: BranchPlan, index: int) -> dict:
    """Collect a candidate's alarms and report until its deadline, and kill and reap everything: its result."""
    messages, channel, monitor = started.messages, started.channel, started.monitor
    early = False

    def reported() -> bool:
        # Its report is complete and it ran behind its walls: kill it, and go on once it can do nothing more,
        # without waiting for its exit to unmap its copy of the kernel (the monitor reaps it).
        if b"P" not in messages or messages.get(b"W") != b"" or not report_written(channel):
            return False
        _kill(int(messages[b"P"]))
        return _ended(int(messages[b"P"]), time.monotonic() + _EARLY_END_S)

    try:
        early = _collect(started, reported)
    finally:
        os.close(started.go)
        child = int(messages[b"P"]) if b"P" in messages else None
        monitor_status, timed_out = started.monitor_status, started.timed_out
        if child is not None and not early and (timed_out or b"D" not in messages or monitor_status is not None):
            _kill(child)
        if (monitor_status is None and not timed_out and (early or b"D" in messages)
                and messages.get(b"W") == b"" and report_written(channel)):
            # The candidate reported and is gone (or can do nothing more), and with it its whole pid namespace: the
            # monitor has nothing left to do that matters, and its exit need not be waited for here.
            _LATE_MONITORS.append(monitor)
        else:
            monitor_status = _reap_monitor(monitor, monitor_status)
        os.set_blocking(started.alarm_r, False)
        while len(started.alarms) < ALARM_BYTES and _read_alarms(started.alarm_r, started.alarms):
            pass
        os.close(started.rfd)
        os.close(started.alarm_r)
    elapsed = time.monotonic() - started.begun
    data = read_report(channel)
    result = _decode_report(data) if data is not None else None
    channel.close()
    return _result(result, plan, index, elapsed, timed_out, monitor_status, messages, started.alarms)


def _kill(pid: int) -> None:
    """SIGKILL a candidate and its process group (its walls' pid namespace goes with it)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def try_start(shell: Any, cells: list[str] | None, plan: BranchPlan) -> Started | None:
    """`start`, or None where the fork fails (the candidate before may hold every process the uid may have)."""
    try:
        return start(shell, cells, plan)
    except OSError:
        return None


def _result(result: dict | None, plan: BranchPlan, index: int, elapsed: float, timed_out: bool,
            monitor_status: int | None, messages: dict[bytes, bytes], alarms: bytearray) -> dict:
    """The candidate's report (or the timeout or death that replaced it) with what the kernel itself saw."""
    if result is not None:
        pass
    elif timed_out:
        result = {"status": "timeout", "ename": "CellTimeout",
                  "evalue": f"the cell ran past its {plan.timeout_s:g} s timeout; the branch was killed",
                  "outputs": [], "duration_s": elapsed}
    else:
        result = {"status": "kernel_died", "ename": "KernelDied", "evalue": _death_reason(monitor_status),
                  "outputs": [], "duration_s": elapsed}
    result["index"] = index
    result["wall_s"] = elapsed
    # The kernel's word, not the candidate's: what the candidate touched while it ran, and whether walls stood.
    result["suspicious"] = read_alarms(bytes(alarms))
    result["walled"] = messages.get(b"W") == b""
    return result


def _decode_report(data: bytes) -> dict:
    """The candidate's report as a dict; a report that is not a JSON object is that candidate's `error`."""
    try:
        report = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        report = f"{type(error).__name__}"
    if not isinstance(report, dict):
        return {"status": "error", "ename": "MalformedReport", "outputs": [],
                "evalue": f"the branch's report is not a JSON object ({str(report)[:80]})"}
    return report


def _death_reason(monitor_status: int | None) -> str:
    if monitor_status is None:
        return "the branch ended without a result"
    if os.WIFSIGNALED(monitor_status):
        return f"the branch's monitor was killed by signal {os.WTERMSIG(monitor_status)} and no result came"
    code = os.WEXITSTATUS(monitor_status)
    if code >= 100:
        return f"the branch process died by signal {code - 100}"
    return f"the branch process exited with status {code} without a result"
