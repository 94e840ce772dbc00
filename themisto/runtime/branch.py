"""Branch execution: run candidate cells in the exact pre-cell state of a kernel and report what each did.

The fast path forks the kernel once per candidate (`themisto.runtime.agent.branch`): the child shares the kernel's
memory copy-on-write, so the state is exact and the kernel's own state stays as it was. Where fork is unavailable,
or when asked, the replay fallback restarts the kernel and replays a prefix of cells before each candidate. Both
return the same BranchResult record. The probe mode's branches (`ProbeBranches`, the kernel's side in
`themisto.runtime.agent.ahead`) are forked ahead of their code and answer before their state check, which a later
call brings. Like the kernel sandbox, this is a best-effort guard, not a security boundary.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from themisto.jsonrecords import from_dict
from themisto.runtime.agent import WorkdirGuard
from themisto.runtime.agent.delta import NAMESPACE_CHANGES, namespace_delta
from themisto.runtime.agent.workdir import UNRESTORED, WORKDIR_CHANGES
from themisto.runtime.outputs import strip_ansi
from themisto.runtime.rebuild import RerunCell, StateLost, rebuild_state
from themisto.runtime.snapshot import AgentError, agent_call, take_snapshot
from themisto.vocabulary import CELL_STATUSES, UNFINISHED_STATUSES, CellStatus

# Per candidate, on top of its own timeout: the child's grace, and the time to fork, report and restore files.
_SLACK_PER_CANDIDATE_S = 5.0
_SLACK_PER_CALL_S = 120.0  # hashing the pre-branch state of a large namespace, backing up the workdir


class BranchError(RuntimeError):
    """Branch execution could not run at all (not a candidate's failure, which is a BranchResult status)."""


@dataclass
class BranchResult:
    """What one candidate did in the pre-cell state: closed status, nbformat outputs, and its namespace delta."""

    index: int
    status: CellStatus
    outputs: list[dict]  # nbformat v4 output dicts, like CellResult.outputs
    ename: str | None = None
    evalue: str | None = None
    traceback: list[str] = field(default_factory=list)  # ANSI-free
    duration_s: float = 0.0
    # The namespace delta, one field per word of `NAMESPACE_CHANGES` (the report's keys are these fields' names).
    added: dict[str, str] = field(default_factory=dict)  # name -> content hash after
    changed: dict[str, str] = field(default_factory=dict)  # name -> content hash after
    deleted: dict[str, str] = field(default_factory=dict)  # name -> content hash before
    state_hash_after: str | None = None  # None when the candidate left no state to hash (it died, or was killed)
    truncated: bool = False
    unverified: list[str] = field(default_factory=list)  # delta="identity": large objects trusted, not rehashed
    workdir_changes: dict[str, list[str]] = field(default_factory=dict)  # added / deleted / modified paths
    workdir_restored: bool = True  # every workdir change was undone
    method: Literal["fork", "replay"] = "fork"
    # The cells run after the candidate in its branch (a candidate given as a list of cells): each one's status,
    # ename, evalue, outputs, duration_s and truncated; and content hashes of the asked names in the state they left.
    continuation: list[dict] = field(default_factory=list)
    continuation_state: dict[str, str] | None = None
    # What the candidate touched in the machinery (gc walks, ctypes, /proc, signals, patched modules, a malformed
    # report), as its branch's monitor saw it; empty when nothing. A leaderboard audits these.
    suspicious: list[str] = field(default_factory=list)
    # Fork only: whether the candidate ran behind its walls (own pid, user and mount namespaces: it could not signal
    # or trace its kernel, and had a /tmp of its own), and the frames and arrays the page check found unwritten.
    walled: bool | None = None
    kept_by_pages: list[str] = field(default_factory=list)

    def delta(self) -> dict[str, dict[str, str]]:
        """The namespace delta in `namespace_delta`'s shape: added, changed, deleted."""
        return {kind: dict(getattr(self, kind)) for kind in NAMESPACE_CHANGES}

    @property
    def changed_state(self) -> bool | None:
        """Whether the code changed its branch's state (a variable added, changed or deleted, or a work-folder file
        touched; the kernel's own state is never changed); None when it left no state to compare (it died, or was
        killed past its time)."""
        if self.added or self.changed or self.deleted or self.workdir_changes:
            return True
        return None if self.state_hash_after is None else False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BranchResult:
        return from_dict(cls, data)


def _traceback(outputs: list[dict]) -> list[str]:
    errors = [o for o in outputs if o.get("output_type") == "error"]
    return [strip_ansi(line) for line in errors[-1].get("traceback", [])] if errors else []


def _from_agent(raw: Any, index: int, output_bytes: int) -> BranchResult:
    """A BranchResult from one branch report; a report that fails `_report_problem` becomes that candidate's
    `error` (it came from the candidate's own process, which may have forged or broken it)."""
    problem = _report_problem(raw, output_bytes)
    if problem is not None:
        suspicious = raw.get("suspicious") if isinstance(raw, dict) else None
        return BranchResult(index=index, status="error", outputs=[], ename="MalformedReport",
                            evalue=f"the branch's report was malformed: {problem}",
                            suspicious=_strings(suspicious) + ["malformed report"], method="fork")
    workdir = raw.get("workdir") or {}
    changes = {key: list(workdir.get(key, [])) for key in WORKDIR_CHANGES if workdir.get(key)}
    outputs = raw.get("outputs", [])
    return BranchResult(
        index=index, status=raw["status"], outputs=outputs, ename=raw.get("ename"),
        evalue=raw.get("evalue"), traceback=_traceback(outputs), duration_s=float(raw.get("duration_s", 0.0)),
        **{kind: raw.get(kind) or {} for kind in NAMESPACE_CHANGES},
        state_hash_after=raw.get("state_hash_after"), truncated=bool(raw.get("truncated", False)),
        unverified=list(raw.get("unverified", [])), workdir_changes=changes,
        workdir_restored=not workdir.get(UNRESTORED), method="fork",
        continuation=_continuation_cells(raw.get("continuation")), continuation_state=_name_hashes(raw),
        suspicious=_strings(raw.get("suspicious")), walled=raw.get("walled") is True,
        kept_by_pages=_strings(raw.get("kept_by_pages")))


def _strings(value: Any) -> list[str]:
    return [str(item)[:200] for item in value[:32]] if isinstance(value, list) else []


_OUTPUT_FIELDS = {"stream": {"name": str, "text": str}, "display_data": {"data": dict, "metadata": dict},
                  "execute_result": {"data": dict, "metadata": dict}, "error": {"ename": str, "evalue": str,
                                                                               "traceback": list}}
# Room in a report beyond the outputs' own cap: the cap marker, error tracebacks, JSON quoting.
_REPORT_SLACK_BYTES = 1 << 20
_HASH_CHARS_MAX = 128


def _output_problem(output: Any) -> str | None:
    if not isinstance(output, dict) or output.get("output_type") not in _OUTPUT_FIELDS:
        return "an output that is not an nbformat output"
    for key, kind in _OUTPUT_FIELDS[output["output_type"]].items():
        if not isinstance(output.get(key), kind):
            return f"a {output['output_type']} output whose {key!r} is not a {kind.__name__}"
    if output["output_type"] == "error" and not all(isinstance(line, str) for line in output["traceback"]):
        return "an error output whose traceback is not a list of str"
    return None


def _hashes_problem(raw: dict, key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(n, str) and isinstance(h, str) and len(h) <= _HASH_CHARS_MAX
                                              for n, h in value.items()):
        return f"{key!r} is not a map of names to hashes"
    return None


def _report_problem(raw: Any, output_bytes: int) -> str | None:
    """What is wrong with a branch report's shape, types or size, or None when it can be used."""
    if not isinstance(raw, dict):
        return f"a {type(raw).__name__}, not an object"
    if raw.get("status") not in CELL_STATUSES:
        return f"status {str(raw.get('status'))[:40]!r}"
    for key in ("ename", "evalue", "state_hash_after"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            return f"{key!r} is not a string"
    if not isinstance(raw.get("duration_s", 0.0), (int, float)) or isinstance(raw.get("duration_s"), bool):
        return "'duration_s' is not a number"
    outputs = raw.get("outputs", [])
    if not isinstance(outputs, list):
        return "'outputs' is not a list"
    for output in outputs:
        problem = _output_problem(output)
        if problem is not None:
            return problem
    size = len(json.dumps(outputs, default=str))
    if size > 2 * output_bytes + _REPORT_SLACK_BYTES:
        return f"its outputs take {size:,} bytes, over the output cap of {output_bytes:,}"
    for key in (*NAMESPACE_CHANGES, "continuation_state"):
        problem = _hashes_problem(raw, key)
        if problem is not None:
            return problem
    if not isinstance(raw.get("unverified", []), list) or not isinstance(raw.get("workdir") or {}, dict):
        return "'unverified' or 'workdir' has the wrong type"
    return None


def _continuation_cells(raw: Any) -> list[dict]:
    """The continuation's cell reports, each reduced to the fields the scorer reads; a malformed one becomes an
    `error` cell (the report came from the candidate's process)."""
    cells = []
    for item in raw if isinstance(raw, list) else []:
        ok = isinstance(item, dict) and item.get("status") in CELL_STATUSES and isinstance(item.get("outputs"), list)
        if not ok:
            cells.append({"status": "error", "ename": "MalformedReport", "evalue": "a continuation cell's report "
                          "was malformed", "outputs": [], "duration_s": 0.0, "truncated": False})
            continue
        cells.append({"status": item["status"], "ename": item.get("ename"), "evalue": item.get("evalue"),
                      "outputs": item["outputs"], "duration_s": float(item.get("duration_s") or 0.0),
                      "truncated": bool(item.get("truncated"))})
    return cells


def _name_hashes(raw: dict) -> dict[str, str] | None:
    state = raw.get("continuation_state")
    if not isinstance(state, dict):
        return None
    return {str(name): str(digest) for name, digest in state.items()}


def _fork_branches(session: Any, candidates: list[list[str]], *, timeout_s: float, memory_bytes: int,
                   output_bytes: int, protect_workdir: bool, delta: str,
                   state_names: list[str] | None) -> list[BranchResult]:
    workdir = str(session.workdir) if protect_workdir else None
    budget = sum(len(cells) * timeout_s + _SLACK_PER_CANDIDATE_S for cells in candidates) + _SLACK_PER_CALL_S
    try:
        # The candidates travel as data (the request's metadata), the same strings in the kernel as here.
        answer = agent_call(session, "branch", timeout=budget, codes=candidates, timeout_s=float(timeout_s),
                            memory_bytes=int(memory_bytes), output_bytes=int(output_bytes), workdir=workdir,
                            delta=delta, state_names=state_names)
    except AgentError as error:
        raise BranchError(f"fork branches of {len(candidates)} candidate(s) failed: {error}") from error
    reports = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(reports, list) or len(reports) != len(candidates):
        raise BranchError(f"fork branches of {len(candidates)} candidate(s): the kernel's answer was malformed")
    return [_from_agent(raw, index, output_bytes) for index, raw in enumerate(reports)]


def _replay_prefix(session: Any, prefix: list[str]) -> None:
    try:
        rebuild_state(session, [RerunCell(number, code) for number, code in enumerate(prefix)], strict=True)
    except StateLost as error:
        raise BranchError(f"replay fallback: prefix {error}; the pre-cell state cannot be rebuilt") from error


def _replay_continuation(session: Any, cells: list[str], timeout_s: float,
                         state_names: list[str] | None) -> tuple[list[dict], dict[str, str] | None]:
    """The replay fallback's continuation: the cells in sequence after the candidate, then the asked names' hashes."""
    reports = []
    for code in cells:  # after a candidate's state: in wall seconds, as model-written code is
        cell = session.execute(code, timeout=timeout_s, clock="wall")
        reports.append({"status": cell.status, "ename": cell.ename, "evalue": cell.evalue, "outputs": cell.outputs,
                        "duration_s": cell.duration_s, "truncated": cell.truncated})
        if cell.status in UNFINISHED_STATUSES or getattr(cell, "kernel_restarted", False):
            return reports, None
    hashes = take_snapshot(session).hashes()
    return reports, {n: h for n, h in hashes.items() if state_names is None or n in state_names}


def _replay_one(session: Any, index: int, cells: list[str], prefix: list[str], *, timeout_s: float,
                memory_bytes: int, guard: WorkdirGuard | None, state_names: list[str] | None) -> BranchResult:
    code = cells[0]
    _replay_prefix(session, prefix)
    before = take_snapshot(session)
    if guard is not None:
        guard.refresh()
    agent_call(session, "set_data_limit", extra_bytes=int(memory_bytes), timeout=30)
    cell = session.execute(code, timeout=timeout_s, clock="wall")
    result = BranchResult(index=index, status=cell.status, outputs=cell.outputs, ename=cell.ename,
                          evalue=cell.evalue, traceback=list(cell.traceback), duration_s=cell.duration_s,
                          truncated=cell.truncated, method="replay")
    if not getattr(cell, "kernel_restarted", False) and session.alive:
        agent_call(session, "set_data_limit", extra_bytes=None, timeout=30)
        after = take_snapshot(session)
        delta = namespace_delta(before.hashes(), after.hashes())
        for kind in NAMESPACE_CHANGES:
            setattr(result, kind, delta[kind])
        result.state_hash_after = after.state_hash
        if len(cells) > 1 and result.status != "timeout":
            result.continuation, result.continuation_state = _replay_continuation(session, cells[1:], timeout_s,
                                                                                  state_names)
    if guard is not None:
        changes = guard.check_and_restore()
        result.workdir_changes = {key: changes[key] for key in WORKDIR_CHANGES if changes[key]}
        result.workdir_restored = not changes[UNRESTORED]
    return result


def _replay_branches(session: Any, candidates: list[list[str]], prefix: list[str], *, timeout_s: float,
                     memory_bytes: int, protect_workdir: bool, state_names: list[str] | None) -> list[BranchResult]:
    guard = WorkdirGuard(str(session.workdir)) if protect_workdir else None
    try:
        results = [_replay_one(session, index, cells, prefix, timeout_s=timeout_s, memory_bytes=memory_bytes,
                               guard=guard, state_names=state_names) for index, cells in enumerate(candidates)]
    finally:
        if guard is not None:
            guard.close()
    _replay_prefix(session, prefix)  # leave the session in the pre-cell state, as the fork path does
    return results


def fork_available() -> bool:
    """True where the kernel can fork (POSIX with os.fork); the kernel runs on this machine."""
    return hasattr(os, "fork") and hasattr(os, "memfd_create")


def run_in_branch(session: Any, code: str, *, timeout_s: float = 30.0, memory_bytes: int = 2**30,
                  output_bytes: int = 2**20) -> BranchResult:
    """Run `code` in one branch of the kernel's current state: its status, its outputs (at most `output_bytes`,
    `truncated` past them) and whether it changed the state (`changed_state`); the kernel's own state and work
    folder stay as they were. One probe of `ProbeBranches`, its state check waited for (it needs fork)."""
    probes = ProbeBranches(session, timeout_s=timeout_s, memory_bytes=memory_bytes, output_bytes=output_bytes)
    index = probes.run(code).index
    return probes.settle()[index]


def _with_state_check(early: BranchResult, full: BranchResult) -> BranchResult:
    """A probe's early result (what its cell did) with its state check from the full one (what it changed, what the
    monitor saw to the end). A full report whose outcome differs from the early one is a check that failed (it ran
    out of time, or its report was broken): its state change is then not known, and the record says why."""
    from dataclasses import replace

    suspicious = list(full.suspicious) or list(early.suspicious)
    if (full.status, full.ename) != (early.status, early.ename):
        suspicious.append(f"the state check failed: {full.status}: {full.ename}: {str(full.evalue)[:160]}")
        full = BranchResult(index=full.index, status=full.status, outputs=[], workdir_changes=full.workdir_changes,
                            workdir_restored=full.workdir_restored, walled=full.walled)
    return replace(early, **{kind: getattr(full, kind) for kind in NAMESPACE_CHANGES},
                   state_hash_after=full.state_hash_after, unverified=full.unverified,
                   workdir_changes=full.workdir_changes, workdir_restored=full.workdir_restored,
                   suspicious=suspicious, walled=full.walled, kept_by_pages=full.kept_by_pages)


class ProbeBranches:
    """The probes of one kernel state, each run in a fresh branch of it (the kernel's side: `agent.ahead`), with the
    work that need not wait for a probe done before and after it: `run` returns as soon as the probe's cell has run,
    its state check (`changed_state`, the monitor's `suspicious`) still to come, and `settle` collects them all
    (`results`, by the order the probes ran in). The kernel's own state and work folder stay as they were. A call the
    kernel cannot answer raises BranchError (the state may be lost: the caller rebuilds it)."""

    def __init__(self, session: Any, *, timeout_s: float = 30.0, memory_bytes: int = 2**30,
                 output_bytes: int = 2**20):
        if not fork_available():
            raise BranchError("a branch of the current state needs fork, which this platform lacks")
        self.session = session
        self.limits = {"timeout_s": float(timeout_s), "memory_bytes": int(memory_bytes),
                       "output_bytes": int(output_bytes), "workdir": str(session.workdir)}
        self.results: dict[int, BranchResult] = {}
        self.pending: set[int] = set()  # probes whose state check has not come back
        self.forked_ahead = 0  # probes whose branch was ready before they came

    def _call(self, name: str, timeout: float, **arguments: Any) -> dict:
        try:
            answer = agent_call(self.session, name, timeout=timeout, **arguments)
        except AgentError as error:
            raise BranchError(f"probe branch call {name!r} failed: {error}") from error
        if not isinstance(answer, dict) or not isinstance(answer.get("settled", []), list):
            raise BranchError(f"probe branch call {name!r}: the kernel's answer was malformed")
        for raw in answer.get("settled", []):
            index = raw.get("probe") if isinstance(raw, dict) else None
            if index in self.pending:  # a full report of a probe whose early one came back
                self.pending.discard(index)
                self.results[index] = _with_state_check(
                    self.results[index], _from_agent(raw, index, self.limits["output_bytes"]))
        return answer

    def ahead(self) -> None:
        """Tell the kernel that probes of this state may come: the first one's branch is forked before it."""
        self._call("probe_ahead", _SLACK_PER_CALL_S, **self.limits)

    def run(self, code: str) -> BranchResult:
        """Run `code` in a fresh branch: its status, outputs and time now; its state check once `settle` ran."""
        budget = self.limits["timeout_s"] + _SLACK_PER_CANDIDATE_S + _SLACK_PER_CALL_S
        answer = self._call("probe", budget, code=str(code), **self.limits)
        index = answer.get("probe")
        if not isinstance(index, int) or index in self.results:
            raise BranchError("probe branch call: the kernel's answer was malformed")
        self.results[index] = _from_agent(answer.get("result"), index, self.limits["output_bytes"])
        if not answer.get("final"):
            self.pending.add(index)
        self.forked_ahead += answer.get("ahead") is True
        return self.results[index]

    def settle(self, *, lost: bool = False) -> dict[int, BranchResult]:
        """End every probe's branch; each probe's whole result, its state check included. `lost`: the kernel was
        lost (replaced), and with it the state checks still to come."""
        if self.pending and not lost:
            self._call("probe_settle", _SLACK_PER_CALL_S)
        for index in sorted(self.pending):  # the kernel ended them without a report: not known
            self.results[index] = _with_state_check(self.results[index], BranchResult(
                index=index, status="kernel_died", outputs=[], ename="KernelDied",
                evalue="the branch ended without its state check"))
        self.pending.clear()
        return dict(self.results)


def run_branches(session: Any, candidates: list, *, timeout_s: float = 30.0, memory_bytes: int = 2**30,
                 output_bytes: int = 2**20, prefix: list[str] | None = None, use_fork: bool | None = None,
                 protect_workdir: bool = True, delta: Literal["pages", "hash", "identity"] = "pages",
                 state_names: list[str] | None = None) -> list[BranchResult]:
    """Run each candidate cell in the session's current state and return one BranchResult per candidate.

    A candidate given as a list of cells runs them in sequence in its branch: the first is the candidate (its
    outputs and delta are the result's), the rest its continuation (`continuation`, and the hashes of
    `state_names` — every user variable when None — in `continuation_state`); each cell gets `timeout_s`.
    `use_fork=None` forks where possible and replays otherwise; the replay fallback needs `prefix`, the cells that
    rebuild the state. `delta="pages"` rehashes only what the candidate may have changed (frames and arrays whose
    large buffers lie on pages its process never wrote keep their hash; exact, like `delta="hash"`, which rehashes
    everything). `delta="identity"` trusts large objects that kept their identity and structure instead of
    rehashing them (inexact; such names are listed in `unverified`).
    """
    candidates = [[c] if isinstance(c, str) else [str(cell) for cell in c] for c in candidates]
    if any(not cells for cells in candidates):
        raise ValueError("a candidate given as a list needs at least one cell")
    state_names = None if state_names is None else sorted(str(n) for n in state_names)
    if not candidates:
        return []
    if delta not in ("pages", "hash", "identity"):
        raise ValueError(f"delta must be 'pages', 'hash' or 'identity', not {delta!r}")
    if use_fork is None:
        use_fork = fork_available()
    if use_fork:
        return _fork_branches(session, candidates, timeout_s=timeout_s, memory_bytes=memory_bytes,
                              output_bytes=output_bytes, protect_workdir=protect_workdir, delta=delta,
                              state_names=state_names)
    if prefix is None:
        raise BranchError("the replay fallback needs `prefix`: the cells that rebuild the pre-cell state")
    return _replay_branches(session, candidates, list(prefix), timeout_s=timeout_s, memory_bytes=memory_bytes,
                            protect_workdir=protect_workdir, state_names=state_names)

