"""A step's state rebuilt from its stored values instead of by replaying its prefix, checked against the state hash
the replay recorded.

Where every variable of the step is stored exactly, the restore loads them (themisto.runtime.agent.restore):
modules imported, values read, the user's functions and classes defined again from their source. Where some are
not, it follows a plan: load the stored ones, re-run the cells that made the others (the last cell of the step's
kernel life that binds each name, else the last that changed it), then load the stored ones again, since those cells
may have changed them. Either way the namespace's state hash is compared with the replay's; a restore that does not
match says which names differ, and the caller replays the prefix instead. A restore works in a fresh kernel or in
one that holds another step's state (the scorer's kernel restores the state before each scored step it does not
replay to: themisto.release.states.pre_step_states); there only the modules the kernel has not imported yet cost an
import.

What a restore cannot give back: files the prefix wrote into the working folder, the state of random generators,
and module-level settings (pandas options, a matplotlib figure being drawn). The state hash covers none of them.
Steps come as `trajectories` rows (themisto.release.tasks.trajectory_row's shape, `stored_values` included), from
a release or from a replay's steps.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from themisto.ingest.cleaning import clean_for_replay
from themisto.replay.cell_limits import CELL_TIMEOUT_S
from themisto.runtime.agent import formats

RESTORE_TIMEOUT_S = 120.0
# Binds no name in the user's namespace.
_CLOSE_FIGURES = ("__import__('sys').modules['matplotlib.pyplot'].close('all') "
                  "if 'matplotlib.pyplot' in __import__('sys').modules else None")


class ValueSource(Protocol):
    """Where a restore's values come from: a replay's values folder (FolderValues) or a release's `values` rows
    (themisto.release.values.ReleaseValues)."""

    def format_of(self, digest: str) -> str | None: ...  # None: not stored exactly
    def data(self, digest: str) -> bytes: ...
    def refs(self, digest: str) -> list[str]: ...


@dataclass
class FolderValues:
    """The values of a replay's values folder (themisto.replay.values.ValueFolder)."""

    folder: Any

    def format_of(self, digest: str) -> str | None:
        entry = self.folder.entry(digest)
        return entry.format if entry is not None and entry.exact else None

    def data(self, digest: str) -> bytes:
        entry = self.folder.entry(digest)
        data = self.folder.file(entry).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise RestoreError(f"{self.folder.file(entry)}: changed since the replay stored it")
        return data

    def refs(self, digest: str) -> list[str]:
        fmt = self.format_of(digest)
        return formats.refs(fmt, lambda: self.data(digest)) if fmt is not None else []


class RestoreError(RuntimeError):
    """A restore could not run (no values, a refused file); the message says why."""


@dataclass
class RestorePlan:
    """How to rebuild the state after `step`: the values to load, the files they need, and the cells to re-run."""

    step: int
    state_hash: str | None  # what the replay recorded
    load: dict[str, str]  # name -> content hash
    files: dict[str, str]  # content hash -> format (values held by others included)
    modules: dict[str, str]
    aliases: list[list[str]]
    rerun: list[int] = field(default_factory=list)  # steps whose cells re-run, in order
    missing: dict[str, str] = field(default_factory=dict)  # name -> why its value is not loaded

    @property
    def complete(self) -> bool:
        """Every variable of the step is loaded from its stored value; no cell re-runs."""
        return not self.missing


@dataclass
class RestoreResult:
    """What a restore did: whether the state hash matched, the names that differ, the time it took."""

    plan: RestorePlan
    matched: bool
    state_hash: str | None  # the restored namespace's
    differing: list[str]
    failures: dict[str, str]
    seconds: float
    reran: list[int] = field(default_factory=list)
    parts_s: dict[str, float] = field(default_factory=dict)  # seconds: stage, imports, load, rerun, check


def _bound_names(code: str) -> set[str]:
    """The names a cell binds at its top level (assignments, defs, classes, imports, loops, with, del)."""
    try:
        tree = ast.parse(clean_for_replay(code).code)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def _life_start(rows: Sequence[dict], index: int) -> int:
    """The first row of the kernel life `rows[index]` belongs to (after the last logged restart at or before it)."""
    return max([0] + [i for i in range(index + 1) if rows[i].get("restarted_before")])


def plan_restore(rows: Sequence[dict], index: int, source: ValueSource) -> RestorePlan:
    """The plan that rebuilds the state after `rows[index]` (rows of one trajectory, in step order)."""
    row = rows[index]
    stored = row.get("stored_values")
    if stored is None:
        raise RestoreError(f"{row['kernel_id']} step {row['step']}: the replay stored no values")
    unstored = {item["name"]: item["reason"] for item in stored["unstored"]}
    load, files, missing = {}, {}, {}
    for variable in row["variables"]:
        name, digest = variable["name"], str(variable["hash"])
        needed = _files(digest, source) if name not in unstored else None
        if needed is None:
            missing[name] = unstored.get(name, "not stored exactly")
        else:
            load[name] = digest
            files.update(needed)
    start = _life_start(rows, index)
    rerun = set()
    for name in missing:
        made = _making_step(rows, start, index, name)
        if made is not None:
            rerun.add(int(rows[made]["step"]))
    return RestorePlan(step=int(row["step"]), state_hash=row.get("state_hash"), load=load, files=files,
                       modules={m["name"]: m["module"] for m in stored["modules"]},
                       aliases=[list(group) for group in stored["aliases"]], rerun=sorted(rerun), missing=missing)


def _making_step(rows: Sequence[dict], start: int, index: int, name: str) -> int | None:
    """The row (index) whose cell made the variable `name` as it is after `rows[index]`: the last cell that binds it and
    ran ok where its value changed (or appeared), else the last that binds it and ran ok, else the last that binds
    it, else the last that changed it. (An unhashable value's hash says nothing of a change.)"""
    binding = [i for i in range(start, index + 1) if name in _bound_names(rows[i]["code"])]
    changed = {i for i in range(start, index + 1) if _hash_of(rows[i], name) is not None
               and (i == start or _hash_of(rows[i - 1], name) != _hash_of(rows[i], name))}
    ok = {i for i in binding if rows[i].get("status") == "ok"}
    for candidates in ([i for i in binding if i in ok and i in changed], [i for i in binding if i in ok], binding,
                       sorted(changed)):
        if candidates:
            return candidates[-1]
    return None


def _hash_of(row: dict, name: str) -> str | None:
    return next((str(v["hash"]) for v in row["variables"] if v["name"] == name), None)


def _files(digest: str, source: ValueSource, seen: set[str] | None = None) -> dict[str, str] | None:
    """The files a value needs (itself and what it holds), or None when one of them is not stored exactly."""
    seen = set() if seen is None else seen
    fmt = source.format_of(digest)
    if fmt is None:
        return None
    found = {digest: fmt}
    seen.add(digest)
    for held in source.refs(digest):
        if held in seen:
            continue
        inner = _files(held, source, seen)
        if inner is None:
            return None
        found.update(inner)
    return found


def _stage(session: Any, plan: RestorePlan, source: ValueSource) -> Path:
    """The plan's files copied into the kernel's values folder, which it reads them from."""
    folder = Path(session.values_dir)
    for digest, fmt in plan.files.items():
        (folder / formats.file_name(digest, fmt)).write_bytes(source.data(digest))
    return folder


def _agent_restore(session: Any, folder: Path, plan: RestorePlan) -> dict:
    from themisto.runtime.snapshot import agent_call

    return agent_call(session, "restore", timeout=RESTORE_TIMEOUT_S, folder=str(folder),
                      plan={"values": plan.load, "files": plan.files, "modules": plan.modules,
                            "aliases": plan.aliases, "keep": [], "rerun": bool(plan.rerun)})


def restore_step(session: Any, rows: Sequence[dict], plan: RestorePlan, source: ValueSource, *,
                 cell_timeout_s: float = CELL_TIMEOUT_S) -> RestoreResult:
    """Carry out `plan` in the started `session` (its namespace is replaced) and check the state hash."""
    from themisto.runtime.agent.delta import namespace_delta
    from themisto.runtime.snapshot import agent_call, take_snapshot

    began = time.perf_counter()
    parts: dict[str, float] = {}

    def lap(part: str) -> None:
        parts[part] = round(time.perf_counter() - began - sum(parts.values()), 6)

    folder = _stage(session, plan, source)
    lap("stage")
    try:
        answer = _agent_restore(session, folder, plan)
        failures = dict(answer.get("failures", {}))
        lap("load")
        # the modules the step had imported (pandas, matplotlib ...): a prefix replay imports them too
        parts["imports"] = min(parts["load"], float((answer.get("seconds") or {}).get("imports", 0.0)))
        parts["load"] = round(parts["load"] - parts["imports"], 6)
        for step in plan.rerun:  # silently: nothing is displayed, In/Out and the execution count stay as they are
            session.execute_silent(clean_for_replay(rows[_index_of(rows, step)]["code"]).code, timeout=cell_timeout_s)
        if plan.rerun:
            # the figures a re-run cell drew are closed, as the notebook backend closes them once a cell has shown them
            session.execute_silent(_CLOSE_FIGURES, timeout=RESTORE_TIMEOUT_S)
            agent_call(session, "finish_restore", timeout=RESTORE_TIMEOUT_S, keep=sorted(plan.missing))
        lap("rerun")
    finally:
        for leftover in folder.iterdir():
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
    snapshot = take_snapshot(session)
    lap("check")
    variables = rows[_index_of(rows, plan.step)]["variables"]
    recorded = {v["name"]: str(v["hash"]) for v in variables}
    differing = sorted(set().union(*namespace_delta(recorded, snapshot.hashes()).values()))
    vouched, _ = snapshot.vouched(variables)  # run-specific values (clock, entropy) do not come back: not checked
    return RestoreResult(plan=plan, matched=vouched == plan.state_hash, state_hash=snapshot.state_hash,
                         differing=differing, failures=failures, seconds=round(time.perf_counter() - began, 6),
                         reran=list(plan.rerun), parts_s=parts)


def _index_of(rows: Sequence[dict], step: int) -> int:
    return next(i for i, row in enumerate(rows) if int(row["step"]) == step)


@dataclass(frozen=True)
class Restored:
    """What `restore_before` did: the step whose state the session now holds (None: none was restored, the
    session is a fresh kernel), how long it took, and why there was no restore ("" when there was)."""

    step: int | None
    seconds: float
    note: str


def restore_before(session: Any, rows: Sequence[dict], step: int, source: ValueSource, *,
                   cell_timeout_s: float = CELL_TIMEOUT_S) -> Restored:
    """In `session`, the state before `rows`' step `step` restored from `source` where its state hash matches the
    replay's; otherwise the kernel is restarted (fresh), so the caller replays the prefix. The session may be fresh
    or hold another step's state (its namespace is replaced; the modules it imported stay imported, so a second
    restore in one kernel imports only what is new). For the scorer and the probes: a branch can start from it
    instead of a prefix replay."""
    from themisto.runtime.snapshot import AgentError

    index = _index_of(rows, step)
    start = _life_start(rows, index)
    if index <= start:
        return Restored(None, 0.0, "the step opens its kernel life: no prefix to skip")
    began = time.perf_counter()
    try:
        result = restore_step(session, rows, plan_restore(rows, index - 1, source), source,
                              cell_timeout_s=cell_timeout_s)
    except (RestoreError, AgentError, ValueError, KeyError) as error:
        session.restart()
        return Restored(None, round(time.perf_counter() - began, 6), f"no restore: {str(error)[:300]}")
    if not result.matched:
        session.restart()
        return Restored(None, round(time.perf_counter() - began, 6),
                        f"the restored state differs in {result.differing[:5]}; the prefix is replayed")
    return Restored(step, round(time.perf_counter() - began, 6), "")
