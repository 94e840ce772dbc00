"""A probe conversation's branches, the kernel's side: each probe runs in a fresh branch of the current state, as a
`branching.branch` candidate does, with what need not wait for its code done before it comes and what its answer
need not wait for done after the answer has gone.

Before: a candidate is forked and set up behind its walls ahead of the probe (when the host says the state is
reached, `probe_ahead`, and after each probe), and waits for its code, which comes with its go. After: a probe's
answer leaves as soon as its cell has run (the candidate's early report: its outcome and outputs); its state check
(did it change its branch's state), its end (killed, reaped, the work folder put back) and the next candidate's fork
run once the answer is out, in a callback on the kernel's event loop, while the model reads the answer. What they
found comes back with the next call (`probe` or `probe_settle`).

Exactness: a candidate forked ahead runs only in the state it was forked in: no cell has run since and every name is
bound to the same object (the rule `delta.hash_before_once` keeps a state's hashes by), else it is cancelled and a
fresh one forked. Only one candidate's code runs at a time: the next one is forked once the last one is dead, and waits
not dumpable (`walls.seal_candidate`). Before any cell the kernel runs (a pre_execute hook) every probe is settled and
the waiting candidate cancelled, so nothing of a branch outlives its state.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from themisto.runtime.agent import candidate
from themisto.runtime.agent.branch_child import BranchPlan
from themisto.runtime.agent.delta import hash_before_once
from themisto.runtime.agent.executions import cells_run
from themisto.runtime.agent.handoff import go_message
from themisto.runtime.agent.namespace import get_shell, user_variables
from themisto.runtime.agent.snapshots import CACHE
from themisto.runtime.agent.walls import connection_folder, set_dumpable
from themisto.runtime.agent.workdir import UNRESTORED, WorkdirGuard, guard_workdir, restore_home


@dataclass
class _Served:
    """The state probes are served in, and the branches of it: the one waiting for its code, those whose answer has
    gone and whose end has not been collected, and the results collected and not yet handed to the host."""

    key: tuple | None = None
    plan: BranchPlan | None = None
    guard: WorkdirGuard | None = None
    ready: candidate.Started | None = None
    pending: list[tuple[int, candidate.Started]] = field(default_factory=list)
    settled: list[dict] = field(default_factory=list)
    count: int = 0
    owner: int = 0  # the kernel's pid: the hook does nothing in a candidate (whose own cell fires it too)


_SERVED = _Served()


def _key(shell: Any, variables: dict, settings: tuple) -> tuple | None:
    """What a state is known by: the count of cells run, every name's object, and the probe settings; None when the
    count cannot be told (then nothing is kept between calls)."""
    count = cells_run(shell)
    return None if count is None else (count, tuple((name, id(value)) for name, value in variables.items()), settings)


def _serve(shell: Any, timeout_s: float, memory_bytes: int, output_bytes: int, workdir: str | None) -> _Served:
    """The served state for the kernel's current one: kept while it stands, else made anew (its hashes, its plan and
    its work-folder listing), the waiting candidate of another state cancelled."""
    served = _SERVED
    served.owner = os.getpid()
    _hook(shell)
    variables = user_variables(shell)
    key = _key(shell, variables, (float(timeout_s), int(memory_bytes), int(output_bytes), workdir))
    if key is None or key != served.key:
        _cancel_ready()
        before, _ = hash_before_once(variables, CACHE.kept_hash, True, None if key is None else key[0])
        served.plan = BranchPlan(
            timeout_s=float(timeout_s), memory_bytes=int(memory_bytes), output_bytes=int(output_bytes),
            delta="pages", pre_hashes=before.hashes, pre_ids={name: id(value) for name, value in variables.items()},
            pre_prints={}, random_state=random.getstate(), page_prints=before.prints,
            hide=tuple(p for p in [connection_folder()] if p), early=True)
        served.guard = None if workdir is None else guard_workdir(workdir)
        served.key = key
    return served


def _end(served: _Served, index: int, started: candidate.Started) -> dict:
    """Collect a candidate's report, kill and reap it, and put its work-folder changes back: its whole result."""
    result = candidate.collect(started, served.plan, index)
    if served.guard is not None:
        result["workdir"] = served.guard.check_and_restore()
        restore_home(result["workdir"])
        if result["workdir"].get(UNRESTORED):
            served.key = None  # the folder is not as it was: the next probe takes it as it is now
    result["probe"] = index
    return result


def _settle_pending() -> None:
    served = _SERVED
    while served.pending:
        index, started = served.pending.pop(0)
        served.settled.append(_end(served, index, started))
    candidate.reap_later()


def _cancel_ready() -> None:
    served = _SERVED
    ready, served.ready = served.ready, None
    if ready is not None:
        candidate.cancel(ready)


def _fork_ahead(shell: Any, key: tuple | None) -> None:
    """The next probe's candidate, forked now that no other candidate runs, if the state is still `key`'s."""
    served = _SERVED
    if served.ready is None and not served.pending and key is not None and key == served.key:
        variables = user_variables(shell)
        if _key(shell, variables, key[2]) == key:
            served.ready = candidate.try_start(shell, None, served.plan)


def _after_answer(shell: Any, key: tuple | None) -> None:
    """Once a probe's answer is out: collect its end, then fork the next candidate. Never raises (it runs on the
    kernel's event loop, where an exception, an interrupt included, would stop the kernel)."""
    try:
        _settle_pending()
        _fork_ahead(shell, key)
    except BaseException as error:  # noqa: BLE001 - recorded; the next call forks afresh
        _SERVED.settled.append({"probe": None, "error": f"{type(error).__name__}: {error}"[:500]})
        _SERVED.key = None


def _later(shell: Any, key: tuple | None) -> None:
    """Run `_after_answer` once the current request's reply has been sent: on the kernel's event loop when there is
    one (ipykernel's), else now."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        _after_answer(shell, key)
    else:
        loop.call_soon(_after_answer, shell, key)


def end_probes() -> None:
    """End every probe's branch (their results kept for the next call) and cancel the waiting one: before any cell
    of the kernel's (a pre_execute hook) and any other branch call, nothing of a probe's branch goes on."""
    served = _SERVED
    if os.getpid() != served.owner or not (served.pending or served.ready):
        return  # nothing to end; or a candidate, whose own cell fires the hook too
    try:
        _settle_pending()
        _cancel_ready()
    finally:
        served.key = None
        set_dumpable(True)


def _hook(shell: Any) -> None:
    """Register `end_probes` on pre_execute, again if a cell removed it. Where it cannot be, exactness still holds
    (each probe's call checks the state); the hook ends what would otherwise live on beside the next cell."""
    events = getattr(shell, "events", None)
    callbacks = getattr(events, "callbacks", None)
    if isinstance(callbacks, dict) and any(callback is end_probes or getattr(callback, "__wrapped__", None)
                                           is end_probes for callback in callbacks.get("pre_execute", [])):
        return
    try:
        events.register("pre_execute", end_probes)
    except (ValueError, TypeError, AttributeError):
        pass


def _handed() -> list[dict]:
    settled, _SERVED.settled = _SERVED.settled, []
    return settled


def probe_ahead(timeout_s: float = 30.0, memory_bytes: int = 2**30, output_bytes: int = 2**20,
                workdir: str | None = None, shell: Any = None) -> str:
    """Get the current state ready for probes with these limits: its hashes and work-folder listing taken, and the
    first probe's candidate forked (after the reply); JSON with the results of earlier probes settled meanwhile."""
    shell = get_shell(shell)
    _settle_pending()
    set_dumpable(False)  # while a candidate lives, no process of this uid may read or write the kernel's memory
    served = _serve(shell, timeout_s, memory_bytes, output_bytes, workdir)
    _later(shell, served.key)
    return json.dumps({"settled": _handed()}, default=str)


def probe(code: str, timeout_s: float = 30.0, memory_bytes: int = 2**30, output_bytes: int = 2**20,
          workdir: str | None = None, shell: Any = None) -> str:
    """Run `code` in a fresh branch of the current state; JSON: `result`, the branch's result as `branching.branch`
    gives it, complete (`final`) or its early report, whose state check comes with a later call (`settled`, each
    result with its `probe` number); `ahead`, whether its candidate was forked before the call."""
    shell = get_shell(shell)
    began = time.perf_counter()
    _settle_pending()  # its end collected already, unless this call came before the last answer's callback ran
    set_dumpable(False)  # while a candidate lives, no process of this uid may read or write the kernel's memory
    served = _serve(shell, timeout_s, memory_bytes, output_bytes, workdir)
    current, served.ready = served.ready, None
    ahead = current is not None and candidate.still_waiting(current)
    if current is not None and not ahead:
        candidate.cancel(current)
    if not ahead:
        current = candidate.start(shell, None, served.plan)
    index, served.count = served.count, served.count + 1
    prepared = time.perf_counter() - began
    candidate.let_go(current, go_message(served.plan, [str(code)]), served.plan, 1)
    result = candidate.early_result(current, served.plan, index)
    final = result is None
    if final:  # it ended, or ran out of time, without its early report: it is collected now
        result = _end(served, index, current)
    else:
        served.pending.append((index, current))
    _later(shell, served.key)
    return json.dumps({"probe": index, "result": result, "final": final, "ahead": ahead, "prepare_s": prepared,
                       "settled": _handed()}, default=str)


def probe_settle(shell: Any = None) -> str:
    """End every probe's branch and cancel the waiting one; JSON with the results not yet handed over (`settled`)."""
    _settle_pending()
    _cancel_ready()
    _SERVED.key = None
    set_dumpable(True)
    return json.dumps({"settled": _handed()}, default=str)
