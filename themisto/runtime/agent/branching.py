"""Branch execution: each candidate runs in a forked grandchild of the kernel, reports on a pipe, and is reaped.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

from __future__ import annotations

import ctypes
import gc
import json
import mmap
import os
import random
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from themisto.runtime.agent.namespace import (_GRACE_S, _MAX_MESSAGE, _MONITOR_REAP_S, _MSG_HEADER,
                                              _PR_SET_CHILD_SUBREAPER, _REHASH_BYTES, _shell, user_variables)
from themisto.runtime.agent.hashing import content_hash, state_hash
from themisto.runtime.agent.snapshots import _CACHE
from themisto.runtime.agent.workdir import WorkdirGuard, _GUARDS
from themisto.runtime.agent.integrity import (CONTINUATION_PREFIX, Guard, close_inherited, json_encoder, read_alarms,
                                              seal, sealed_method)
from themisto.runtime.agent.delta import Before, hash_after, hash_before, namespace_delta
from themisto.runtime.agent.walls import connection_folder, end_descendants, enter, seal_candidate, set_dumpable
from themisto.runtime.agent.capture import _BranchTimeout, _Recorder, _install_capture, _read_fd_output


def _data_limit(extra_bytes: int) -> tuple[int, int]:
    """(limit, hard): what the process maps now + extra, within the hard RLIMIT_DATA. The heap a forked child
    inherits is counted in its VmData already, so the cap is relative to it."""
    import resource

    used = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                used = int(line.split()[1]) * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = used + int(extra_bytes)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    return limit, hard


@dataclass
class _BranchPlan:
    """What every child of one branch call needs, computed once in the kernel before the forks."""

    timeout_s: float
    memory_bytes: int
    output_bytes: int
    delta: str
    pre_hashes: dict[str, str]
    pre_ids: dict[str, int]
    pre_prints: dict[str, Any]
    random_state: Any
    # After a continuation (cells run after the candidate), hash only these names (None: every user variable).
    state_names: frozenset[str] | None = None
    guard: Any = None  # the child's own Guard (integrity), armed while candidate code runs
    # delta="pages": the fingerprints and buffer spans of large frames and arrays (themisto.runtime.agent.delta)
    page_prints: dict[str, tuple] = field(default_factory=dict)
    hide: tuple[str, ...] = ()  # folders the candidate must not see (the kernel's connection folder and sockets)


def _fingerprint(value: Any) -> Any:
    """Cheap structure of a value (shape, columns, dtypes, buffers): when it differs, the value surely changed."""
    try:
        module = type(value).__module__ or ""
        if module.startswith("pandas") and type(value).__name__ == "DataFrame":
            blocks = tuple(id(getattr(b, "values", None)) for b in value._mgr.blocks)
            return ("df", value.shape, tuple(map(repr, value.columns)), tuple(map(repr, value.dtypes)),
                    id(value.index), blocks)
        if module.startswith("pandas") and type(value).__name__ == "Series":
            return ("s", value.shape, repr(value.dtype), id(value.index), id(value._mgr.array), value.name)
        if module == "numpy" and hasattr(value, "__array_interface__"):
            return ("nd", value.shape, value.dtype.str, value.__array_interface__["data"][0], value.strides)
        if isinstance(value, (list, dict, set, bytearray)):
            return (type(value).__name__, len(value))
    except Exception:  # noqa: BLE001 - a fingerprint is an optimisation; None means "rehash"
        return None
    return None


def _cheap_size(value: Any) -> int:
    module = type(value).__module__ or ""
    try:
        if module == "numpy" and hasattr(value, "nbytes"):
            return int(value.nbytes)
        if module.startswith("pandas") and hasattr(value, "memory_usage"):
            usage = value.memory_usage(deep=False)
            return int(getattr(usage, "sum", lambda: usage)())
        if isinstance(value, (list, tuple, dict, set, frozenset, str, bytes)):
            return len(value) * 8
    except Exception:  # noqa: BLE001
        return 0
    return 0


def _delta(shell: Any, plan: _BranchPlan) -> dict:
    """Added, changed and deleted user variables against the pre-branch hashes, and the post-branch state hash."""
    if plan.delta != "identity":  # exact: "hash" rehashes everything, "pages" what the page flags cannot clear
        post, kept = hash_after(user_variables(shell), Before(plan.pre_hashes, plan.page_prints), _CACHE.kept_hash,
                                full=plan.delta == "hash", end=end_descendants)
        return {**namespace_delta(plan.pre_hashes, post), "state_hash_after": state_hash(post), "unverified": [],
                "kept_by_pages": kept}
    post: dict[str, str] = {}
    unverified: list[str] = []
    for name, value in user_variables(shell).items():
        same_object = plan.pre_ids.get(name) == id(value)
        if (plan.delta == "identity" and same_object and _cheap_size(value) > _REHASH_BYTES
                and plan.pre_prints.get(name) is not None and _fingerprint(value) == plan.pre_prints[name]):
            post[name] = plan.pre_hashes[name]  # trusted: same object, same structure, too large to rehash
            unverified.append(name)
        else:
            post[name] = _CACHE.kept_hash(value) or content_hash(value)
    pre = plan.pre_hashes
    return {
        "added": {n: h for n, h in post.items() if n not in pre},
        "changed": {n: h for n, h in post.items() if n in pre and pre[n] != h},
        "deleted": {n: h for n, h in pre.items() if n not in post},
        "state_hash_after": state_hash(post),
        "unverified": sorted(unverified),
    }


def _send(fd: int, kind: bytes, payload: bytes) -> None:
    data = _MSG_HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _run_cell(shell: Any, code: str, plan: _BranchPlan, fd_out: dict[int, int], timed_out: list[bool]) -> dict:
    """Run one cell in the child under its own timer, outputs captured; its status, outputs, time and truncation."""
    recorder = _Recorder(plan.output_bytes)
    _install_capture(shell, recorder)

    def on_alarm(signum: int, frame: Any) -> None:
        timed_out[0] = True
        raise _BranchTimeout(f"the cell ran past its {plan.timeout_s:g} s timeout")

    signal.signal(signal.SIGALRM, on_alarm)
    # IPython decides whether to show the last expression by tokenizing the newest history entry; without
    # history that is the previous cell, and one with a SyntaxError makes every candidate fail (TokenError).
    # This is the child's own copy of the history, so the kernel's stays as it was.
    history = getattr(shell, "history_manager", None)
    if history is not None:
        history.input_hist_raw.append(code)
        history.input_hist_parsed.append(code)
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, plan.timeout_s)
    try:
        if plan.guard is not None:
            plan.guard.arm()
        run = shell.run_cell(code, store_history=False, silent=False)
    finally:
        if plan.guard is not None:
            plan.guard.disarm()
        signal.setitimer(signal.ITIMER_REAL, 0)
    duration = time.perf_counter() - started
    try:
        ctypes.CDLL(None).fflush(None)  # C-level stdio buffers would die with os._exit
    except (OSError, AttributeError):
        pass
    for fd, name in ((1, "stdout"), (2, "stderr")):
        recorder.stream(name, _read_fd_output(fd_out[fd], plan.output_bytes))
        os.ftruncate(fd_out[fd], 0)  # the next cell of a continuation starts with empty fd output
        os.lseek(fd_out[fd], 0, os.SEEK_SET)
    error = run.error_before_exec or run.error_in_exec
    if timed_out[0] or isinstance(error, _BranchTimeout):
        recorder.outputs = [o for o in recorder.outputs if o.get("ename") != "_BranchTimeout"]
        result = {"status": "timeout", "ename": "CellTimeout",
                  "evalue": f"the cell ran past its {plan.timeout_s:g} s timeout"}
    elif error is not None:
        result = {"status": "error", "ename": type(error).__name__, "evalue": str(error)}
    else:
        result = {"status": "ok", "ename": None, "evalue": None}
    result["duration_s"] = duration
    result["truncated"] = recorder.truncated
    result["outputs"] = recorder.finish()
    return result


def _run_continuation(shell: Any, cells: list[str], plan: _BranchPlan, fd_out: dict[int, int],
                      timed_out: list[bool]) -> tuple[list[dict], dict[str, str]]:
    """Run the cells the developer ran next, one after the other, after the candidate; each one's report, and the
    content hashes of `plan.state_names` (all user variables when None) in the state they leave."""
    reports: list[dict] = []
    if plan.guard is not None:
        plan.guard.alarm.prefix = CONTINUATION_PREFIX  # the developer's cells: alarms told apart from the candidate's
    for code in cells:
        try:
            report = _run_cell(shell, code, plan, fd_out, timed_out)
        except BaseException as error:  # noqa: BLE001 - reported as this cell's failure; the candidate's report stands
            report = {"status": "timeout" if timed_out[0] else "error", "outputs": [], "duration_s": 0.0,
                      "ename": "CellTimeout" if timed_out[0] else "BranchAgentError",
                      "evalue": f"{type(error).__name__}: {error}"[:1000], "truncated": False}
        reports.append(report)
        if report["status"] == "timeout":
            break  # the state is cut mid-cell: the cells after it would only measure the cut
    names = plan.state_names
    state = {name: _CACHE.kept_hash(value) or content_hash(value) for name, value in user_variables(shell).items()
             if names is None or name in names}
    return reports, state


# The report channel: an anonymous shared mapping the monitor makes before forking the candidate (no descriptor,
# no module global); a length prefix written last says the report is complete.
_REPORT_BYTES = 32 * 2**20  # on top of four times the output cap
_ALARM_BYTES = 16384
_AGENT = "themisto.runtime.agent."


@dataclass(frozen=True)
class _SealedCache:
    """The snapshot cache's lookup as the hashing code of a branch child sees it: bound before the candidate ran."""

    kept_hash: Any


def _write_report(channel: mmap.mmap, data: bytes) -> None:
    if len(data) > len(channel) - 8:
        data = b'{"status": "error", "ename": "BranchAgentError", "evalue": "the report was over its size limit"}'
    channel[8:8 + len(data)] = data
    channel[:8] = len(data).to_bytes(8, "big")


def _unsafe_run_candidate(shell: Any, cells: list[str], plan: _BranchPlan, channel: mmap.mmap,
                          alarm_fd: int) -> None:
    """The one place a candidate runs: in the grandchild, under its own memory cap and timer, followed by its
    continuation cells (`cells[1:]`) when given. Its only descriptors: stdin, the output files, the alarm pipe; it
    hashes and reports with code sealed before the candidate ran. Never returns."""
    result: dict[str, Any] = {"status": "error", "ename": "BranchAgentError", "evalue": "the child failed to start"}
    timed_out = [False]
    exit_now, encode = os._exit, None
    try:
        os.setpgid(0, 0)  # its own process group, so the kernel can kill it with everything it forks
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        random.setstate(plan.random_state)  # `random` reseeds itself after fork; the branch must see the parent's
        fd_out = {1: os.memfd_create("themisto-stdout"), 2: os.memfd_create("themisto-stderr")}
        for target, source in fd_out.items():
            os.dup2(source, target)  # fd-level output must not reach the kernel's capture pipe (it would leak)
        fd_out = {1: 1, 2: 2}  # read back through 1 and 2: the candidate gets no other descriptor to them
        close_inherited({0, 1, 2, alarm_fd})  # the kernel's zmq sockets and pipes included
        encode = json_encoder()
        # Every agent module, so the hashing and delta code the child runs after the candidate is the sealed copy.
        spaces = seal([module for name, module in list(sys.modules.items()) if name.startswith(_AGENT)])
        space = spaces["themisto.runtime.agent.branching"]
        space["_CACHE"] = _SealedCache(sealed_method(_CACHE.kept_hash, spaces["themisto.runtime.agent.snapshots"]))
        seal_candidate()  # no capabilities, no new privileges, no page moving; dumpable for its own pagemap
        plan.guard = Guard(alarm_fd)
        import resource

        limit, _ = _data_limit(plan.memory_bytes)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        result = space["_run_cell"](shell, cells[0], plan, fd_out, timed_out)
        plan.guard.check()
        hashing = time.perf_counter()
        result.update(space["_delta"](shell, plan))
        result["delta_s"] = time.perf_counter() - hashing
        if len(cells) > 1 and not timed_out[0]:
            result["continuation"], result["continuation_state"] = space["_run_continuation"](
                shell, cells[1:], plan, fd_out, timed_out)
            plan.guard.check()
    except BaseException as error:  # noqa: BLE001 - the child reports whatever happened, then always exits
        result.setdefault("outputs", [])
        result.update({"status": "timeout" if timed_out[0] else "error",
                       "ename": "CellTimeout" if timed_out[0] else "BranchAgentError",
                       "evalue": f"{type(error).__name__}: {error}"[:1000]})
    finally:
        try:
            try:
                data = encode(result) if encode is not None else json.dumps(result, default=str)
            except BaseException as error:  # noqa: BLE001 - an unencodable report is still a report
                data = encode({"status": "error", "ename": "BranchAgentError", "outputs": [],
                               "evalue": f"the report could not be encoded: {type(error).__name__}"[:1000]})
            _write_report(channel, data.encode("utf-8", "replace"))
        finally:
            exit_now(0)


def _monitor(shell: Any, cells: list[str], plan: _BranchPlan, wfd: int, channel: mmap.mmap, alarm_w: int) -> None:
    """The kernel's child: a new session, the subreaper of the candidate's processes, and their reaper; it tells the
    kernel the candidate's pid ("P") and when it ended ("D"). Never returns. The candidate runs one level further
    down, so `os.kill(os.getppid(), 9)` in it hits this monitor, not the kernel."""
    code_out = 97
    try:
        os.setsid()
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        why = enter(list(plan.hide))  # when it cannot, the candidate runs without them (the kernel says so)
        _send(wfd, b"W", (why or "").encode()[:500])
        child = os.fork()
        if child == 0:
            _unsafe_run_candidate(shell, cells, plan, channel, alarm_w)
        os.close(alarm_w)
        try:
            os.setpgid(child, child)
        except OSError:
            pass  # the child already did it, or already exited
        _send(wfd, b"P", str(child).encode())
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == child:
                exit_code = os.waitstatus_to_exitcode(status)
                code_out = min(exit_code, 99) if exit_code >= 0 else 100 - exit_code  # 100 + signal number
                break
        _send(wfd, b"D", str(code_out).encode())
        os.close(wfd)
        # Whatever the candidate left behind (sleeping children, a fork storm) dies with its group; orphans that
        # left the group were reparented to this subreaper and are killed one by one.
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + _MONITOR_REAP_S
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                for orphan in _children_of(os.getpid()):
                    try:
                        os.kill(orphan, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.005)
    except BaseException:  # noqa: BLE001 - the monitor must exit, never return into the kernel's code
        code_out = 98
    finally:
        os._exit(code_out)


def _children_of(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found


# ----- branch execution: the kernel side ------------------------------------------------------------------------


def _parse_messages(buffer: bytearray, messages: dict[bytes, bytes]) -> None:
    while len(buffer) >= _MSG_HEADER.size:
        kind, length = _MSG_HEADER.unpack_from(buffer)
        if length > _MAX_MESSAGE:
            raise ValueError(f"branch child sent a {length}-byte message")
        if len(buffer) < _MSG_HEADER.size + length:
            return
        messages[kind] = bytes(buffer[_MSG_HEADER.size:_MSG_HEADER.size + length])
        del buffer[:_MSG_HEADER.size + length]


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
    alarms += chunk[:_ALARM_BYTES - len(alarms)]
    return bool(chunk)


_LATE_MONITORS: list[int] = []  # monitors whose candidate has reported; reaped at the end of the branch call


def _reap_monitor(monitor: int, status: int | None) -> int:
    """The monitor's wait status, after a bounded wait and then SIGKILL."""
    if status is None:
        status = _wait_monitor(monitor, time.monotonic() + _MONITOR_REAP_S + 1.0)
    if status is None:
        os.kill(monitor, signal.SIGKILL)
        _, status = os.waitpid(monitor, 0)
    return status


def _collect(rfd: int, alarm_r: int, monitor: int, deadline: float, messages: dict[bytes, bytes],
             alarms: bytearray) -> tuple[int | None, bool]:
    """Read the monitor's messages and the candidate's alarms until the candidate is done, its monitor is gone or
    the deadline passes; the monitor's wait status (None while it runs) and whether the deadline passed."""
    buffer = bytearray()
    monitor_status: int | None = None
    timed_out = False
    try:
        pidfd = os.pidfd_open(monitor) if hasattr(os, "pidfd_open") else None
    except OSError:
        pidfd = None
    try:
        poller = select.poll()
        poller.register(rfd, select.POLLIN | select.POLLHUP)
        poller.register(alarm_r, select.POLLIN | select.POLLHUP)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        eof = False
        while b"D" not in messages:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            wait_ms = left * 1000 if pidfd is not None else min(left * 1000, 20)
            for fd, _ in poller.poll(max(1, int(wait_ms))):
                if fd == alarm_r and not _read_alarms(alarm_r, alarms):
                    poller.unregister(alarm_r)
                if fd == rfd:
                    chunk = os.read(rfd, 1 << 20)
                    if chunk:
                        buffer += chunk
                        _parse_messages(buffer, messages)
                    else:
                        eof = True
                        poller.unregister(rfd)
            if monitor_status is None:
                done, status = os.waitpid(monitor, os.WNOHANG)
                if done:
                    monitor_status = status
                    if pidfd is not None:
                        poller.unregister(pidfd)
            if b"D" in messages or (eof and monitor_status is not None):
                break
            if eof and pidfd is None:
                time.sleep(0.002)
        if b"D" not in messages and b"P" in messages and not timed_out:
            _candidate_exit(int(messages[b"P"]), deadline)  # its monitor died first: the candidate may still report
            timed_out = time.monotonic() >= deadline
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return monitor_status, timed_out


def _run_one(shell: Any, cells: list[str], plan: _BranchPlan, index: int) -> dict:
    """Fork the monitor, collect the candidate's alarms and report until its deadline, then kill and reap everything.

    The kernel holds the candidate's channels itself (the report's shared mapping, the alarm pipe), so a candidate
    that kills its monitor still reports, and is still seen."""
    rfd, wfd = os.pipe()
    alarm_r, alarm_w = os.pipe()
    channel = mmap.mmap(-1, 4 * plan.output_bytes + _REPORT_BYTES)  # shared, anonymous: pages cost once written
    started = time.monotonic()
    deadline = started + plan.timeout_s * len(cells) + _GRACE_S
    gc.freeze()  # the children's collector then never walks (and copies) the kernel's objects
    try:
        monitor = os.fork()
        if monitor == 0:
            os.close(rfd)
            os.close(alarm_r)
            _monitor(shell, cells, plan, wfd, channel, alarm_w)
    finally:
        gc.unfreeze()
    os.close(wfd)
    os.close(alarm_w)
    messages: dict[bytes, bytes] = {}
    alarms = bytearray()
    monitor_status: int | None = None
    timed_out = False
    try:
        monitor_status, timed_out = _collect(rfd, alarm_r, monitor, deadline, messages, alarms)
    finally:
        child = int(messages[b"P"]) if b"P" in messages else None
        if child is not None and (timed_out or b"D" not in messages or monitor_status is not None):
            for kill in (os.killpg, os.kill):
                try:
                    kill(child, signal.SIGKILL)
                except OSError:
                    pass
        if (monitor_status is None and not timed_out and b"D" in messages and messages.get(b"W") == b""
                and int.from_bytes(channel[:8], "big") > 0):
            # The candidate reported and is gone, and with it its whole pid namespace: the monitor has nothing
            # left to do that matters, and its exit (unmapping a copy of the kernel) need not be waited for here.
            _LATE_MONITORS.append(monitor)
        else:
            monitor_status = _reap_monitor(monitor, monitor_status)
        os.set_blocking(alarm_r, False)
        while len(alarms) < _ALARM_BYTES and _read_alarms(alarm_r, alarms):
            pass
        os.close(rfd)
        os.close(alarm_r)
    elapsed = time.monotonic() - started
    length = int.from_bytes(channel[:8], "big")
    result = _decode_report(channel[8:8 + length]) if 0 < length <= len(channel) - 8 else None
    channel.close()
    return _result(result, plan, index, elapsed, timed_out, monitor_status, messages, alarms)


def _result(result: dict | None, plan: _BranchPlan, index: int, elapsed: float, timed_out: bool,
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


def branch(codes: list, timeout_s: float = 30.0, memory_bytes: int = 2**30, output_bytes: int = 2**20,
           workdir: str | None = None, delta: str = "pages", shell: Any = None,
           state_names: list[str] | None = None) -> str:
    """Run each candidate in a forked child of this kernel, in the exact current state; JSON list of results.

    A candidate is a cell, or a list of cells run in sequence in one child (the candidate, then its continuation;
    `state_names` picks the names hashed after the continuation). The kernel's own state is not changed: each
    candidate gets a fresh copy-on-write fork. Files under `workdir` that a candidate added, changed or deleted are
    restored after it, and reported.
    """
    if not hasattr(os, "fork"):
        raise OSError("os.fork is not available on this platform; use the replay fallback")
    if delta not in ("pages", "hash", "identity"):
        raise ValueError(f"delta must be 'pages', 'hash' or 'identity', not {delta!r}")
    shell = _shell(shell)
    started = time.perf_counter()
    variables = user_variables(shell)
    before = hash_before(variables, _CACHE.kept_hash, prints=delta == "pages")
    pre_hashes = before.hashes
    plan = _BranchPlan(
        timeout_s=float(timeout_s), memory_bytes=int(memory_bytes), output_bytes=int(output_bytes), delta=delta,
        pre_hashes=pre_hashes, pre_ids={name: id(value) for name, value in variables.items()},
        pre_prints={name: _fingerprint(value) for name, value in variables.items()} if delta == "identity" else {},
        random_state=random.getstate(), state_names=None if state_names is None else frozenset(state_names),
        page_prints=before.prints, hide=tuple(p for p in [connection_folder()] if p))
    del variables, before
    guard = None
    if workdir is not None:
        guard = _GUARDS.get(workdir) or WorkdirGuard(workdir)
        _GUARDS[workdir] = guard
        guard.refresh()
        _guard_home()
    prepared = time.perf_counter() - started
    results = []
    set_dumpable(False)  # while candidates run, no process of this uid may read or write the kernel's memory
    try:
        for index, code in enumerate(codes):
            result = _run_one(shell, [code] if isinstance(code, str) else list(code), plan, index)
            if guard is not None:
                result["workdir"] = guard.check_and_restore()
                _restore_home(result["workdir"])
            results.append(result)
    finally:
        while _LATE_MONITORS:
            _reap_monitor(_LATE_MONITORS.pop(), None)
        set_dumpable(True)
    return json.dumps({"state_hash_before": state_hash(pre_hashes), "prepare_s": prepared, "results": results},
                      default=str)


def _restore_home(changes: dict) -> None:
    """Undo what the candidate wrote in the kernel's home (a startup file planted for the next prediction, say) and
    add it to the workdir `changes` as `~/…` paths."""
    home = os.path.realpath(os.path.expanduser("~"))
    if not os.path.isdir(home) or home in ("/", os.path.realpath("/root")):
        return  # no home of its own (the kernel runs unsandboxed as a real user): not ours to restore
    guard = _GUARDS.get(home)
    if guard is None:
        return
    found = guard.check_and_restore()
    for key in ("added", "deleted", "modified", "unrestored"):
        if found.get(key):
            changes[key] = list(changes.get(key) or []) + [os.path.join("~", path) for path in found[key]]


def _guard_home() -> None:
    """Guard the kernel's home for the branches about to run: its files as they are now are kept."""
    home = os.path.realpath(os.path.expanduser("~"))
    if os.path.isdir(home) and home not in ("/", os.path.realpath("/root")):
        _GUARDS.setdefault(home, WorkdirGuard(home)).refresh()


def set_data_limit(extra_bytes: int | None) -> str:
    """Lower the kernel's soft RLIMIT_DATA to its current use + extra (None: back to the hard limit); JSON of both.

    The replay fallback uses it to give a candidate the same memory cap as a branch child.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = hard if extra_bytes is None else _data_limit(extra_bytes)[0]
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return json.dumps({"previous_soft": soft, "hard": hard})


def process_count() -> str:
    """JSON count of the processes visible in this kernel's /proc (its pid namespace under bubblewrap) and of
    this process's threads: what a branch must leave as it found them."""

    return json.dumps({"processes": sum(1 for entry in os.listdir("/proc") if entry.isdigit()),
                       "threads": threading.active_count()})
