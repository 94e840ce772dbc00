"""Branch execution, the kernel side: each candidate runs in a forked grandchild of the kernel (`branch_child`),
reports through shared memory and a pipe, and is reaped (`candidate`); the kernel only hashes its namespace (once per
state: `delta.hash_before_once`), guards its work folder, and waits, reads, kills and reaps. The next candidate is
forked and set up behind its walls while the one before it runs, and waits for the kernel's go: its fork then costs no
time of its own where a core is free.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

from themisto.runtime.agent import ahead, candidate
from themisto.runtime.agent.namespace import get_shell, user_variables
from themisto.runtime.agent.hashing import state_hash
from themisto.runtime.agent.snapshots import CACHE
from themisto.runtime.agent.workdir import guard_workdir, restore_home
from themisto.runtime.agent.delta import hash_before_once
from themisto.runtime.agent.executions import cells_run
from themisto.runtime.agent.walls import connection_folder, set_dumpable
from themisto.runtime.agent.branch_child import BranchPlan, data_limit, value_fingerprint
from themisto.runtime.agent.handoff import go_message


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
    shell = get_shell(shell)
    began = time.perf_counter()
    # The last call's candidates may still be unmapping their copies of the kernel: going on before they are gone
    # measured no cheaper (bench/probes.py at load 3.5-3.6: 141-163 ms overhead median, against 155-175 waiting).
    ahead.end_probes()  # a probe's branches go first: one candidate's code at a time, the work folder put back
    candidate.join_reapers()
    plan = BranchPlan(
        timeout_s=float(timeout_s), memory_bytes=int(memory_bytes), output_bytes=int(output_bytes), delta=delta,
        pre_hashes={}, pre_ids={}, pre_prints={}, random_state=random.getstate(),
        state_names=None if state_names is None else frozenset(state_names),
        hide=tuple(p for p in [connection_folder()] if p))
    candidates = [[code] if isinstance(code, str) else list(code) for code in codes]
    results = []
    set_dumpable(False)  # while candidates run, no process of this uid may read or write the kernel's memory
    # The first candidate is forked and set up while the kernel hashes the namespace; what it needs of the hashes
    # (only after its cell) comes with its go.
    ready = candidate.try_start(shell, candidates[0], plan) if candidates else None
    try:
        variables = user_variables(shell)
        before, kept = hash_before_once(variables, CACHE.kept_hash, delta == "pages", cells_run(shell))
        plan.pre_hashes, plan.page_prints = before.hashes, before.prints
        plan.pre_ids = {name: id(value) for name, value in variables.items()}
        if delta == "identity":
            plan.pre_prints = {name: value_fingerprint(value) for name, value in variables.items()}
        go = go_message(plan)
        del variables, before
        guard = None if workdir is None else guard_workdir(workdir)
        prepared = time.perf_counter() - began
        for index, cells in enumerate(candidates):
            current = ready or candidate.start(shell, cells, plan)
            ready = None
            # The next candidate is forked, walled and set up while this one runs (the kernel's state is the same,
            # and it cannot run code of its own before this one is gone and the work folder restored). Where that
            # fork fails (this candidate may hold every process the uid may have), it is forked in its turn.
            following = candidates[index + 1] if index + 1 < len(candidates) else None
            result, ready = candidate.finish(current, go, plan, index, then=None if following is None else
                                             (lambda: candidate.try_start(shell, following, plan)))
            if guard is not None:
                result["workdir"] = guard.check_and_restore()
                restore_home(result["workdir"])
            results.append(result)
    finally:
        if ready is not None:
            candidate.cancel(ready)
        candidate.reap_later()
        set_dumpable(True)
    return json.dumps({"state_hash_before": state_hash(plan.pre_hashes), "prepare_s": prepared,
                       "before_kept": kept, "results": results},
                      default=str)


def set_data_limit(extra_bytes: int | None) -> str:
    """Lower the kernel's soft RLIMIT_DATA to its current use + extra (None: back to the hard limit); JSON of both.

    The replay fallback uses it to give a candidate the same memory cap as a branch child.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = hard if extra_bytes is None else data_limit(extra_bytes)[0]
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return json.dumps({"previous_soft": soft, "hard": hard})


def process_count() -> str:
    """JSON count of the processes visible in this kernel's /proc (its pid namespace under bubblewrap) and of
    this process's threads: what a branch must leave as it found them."""
    candidate.join_reapers()  # the monitors of the last branch call are part of what it left
    return json.dumps({"processes": sum(1 for entry in os.listdir("/proc") if entry.isdigit()),
                       "threads": threading.active_count()})
