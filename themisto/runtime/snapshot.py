"""Runtime snapshots of a kernel's user namespace, read through a silent channel that leaves In/Out untouched.

The kernel side is `themisto.runtime.agent`; this module sends it silent user expressions and turns the replies into
records. The names the paper's release uses stay recognisable: `size`, `repr`, `memory_bytes`, `state_hash`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from themisto.runtime.agent.namespace import REQUEST_KEY
from themisto.runtime.launcher import SNAPSHOT_EXPRESSION

# A user expression that reaches the agent without binding any name in the user's namespace.
AGENT = "__import__('themisto.runtime.agent').runtime.agent"
SNAPSHOT_TIMEOUT_S = 60.0


class AgentError(RuntimeError):
    """The kernel agent could not answer: the kernel replied with an error, timed out or died."""


def agent_expression(name: str, *, with_arguments: bool = False) -> str:
    """The user expression that calls the agent's function `name` and returns its JSON answer; `with_arguments`:
    with the keyword arguments the request carries as data (`themisto.runtime.agent.requested`)."""
    if not name.isidentifier():
        raise ValueError(f"not an agent function name: {name[:60]!r}")
    arguments = f"**{AGENT}.requested()" if with_arguments else ""
    return f"{AGENT}.reply({AGENT}.{name}({arguments}))"


def agent_answer(answer: dict | None, call: str) -> Any:
    """Decode one user expression's result (from `agent_expression`) into the agent's JSON answer."""
    if answer is None:
        raise AgentError(f"kernel agent call {call!r}: no user expression came back")
    if answer.get("status") != "ok":
        raise AgentError(f"kernel agent call {call!r} failed in the kernel: "
                         f"{answer.get('ename')}: {answer.get('evalue')}")
    try:
        return json.loads(answer["data"]["text/plain"])
    except (KeyError, TypeError, ValueError) as error:  # the kernel's answer is input too (a prediction ran there)
        raise AgentError(f"kernel agent call {call!r}: a malformed answer ({type(error).__name__})") from error


def agent_call(session: Any, name: str, *, timeout: float, **arguments: Any) -> Any:
    """Call the agent's function `name` silently in the session's kernel and return its decoded JSON answer.

    The keyword `arguments` (JSON values: code to run in a branch, paths, limits) travel as data, in the request's
    metadata, and reach the function as the same values; no source text is made of them."""
    expression = agent_expression(name, with_arguments=bool(arguments))
    metadata = {REQUEST_KEY: arguments} if arguments else None
    content = session.execute_silent("", user_expressions={"themisto": expression}, timeout=timeout,
                                     metadata=metadata)
    if content.get("status") != "ok":
        raise AgentError(f"kernel agent call {name!r}: {content.get('status')}: "
                         f"{content.get('ename')}: {content.get('evalue')}")
    return agent_answer(content.get("user_expressions", {}).get("themisto"), name)


@dataclass(frozen=True)
class VariableInfo:
    """One user variable: qualified type, size in bytes, bounded repr, content hash, and shape-like facts."""

    name: str
    type: str
    size: int
    repr: str
    hash: str  # "unhashable:<reason>" when no stable hash could be made
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    len: int | None = None
    columns: tuple[str, ...] | None = None
    repr_error: str | None = None  # the exception of a broken __repr__

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in ("shape", "columns"):
            if data[key] is not None:
                data[key] = list(data[key])
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict) -> VariableInfo:
        try:
            return cls(name=data["name"], type=data["type"], size=int(data["size"]), repr=data["repr"],
                       hash=data["hash"], shape=tuple(data["shape"]) if data.get("shape") is not None else None,
                       dtype=data.get("dtype"), len=data.get("len"),
                       columns=tuple(data["columns"]) if data.get("columns") is not None else None,
                       repr_error=data.get("repr_error"))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"variable record {data.get('name', '?')!r}: {type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class StoredValue:
    """One value file the kernel wrote (themisto.runtime.agent.values): `<hash><extension>` in the values folder."""

    hash: str
    format: str
    type: str
    exact: bool  # read back, it has the same content hash (a restore can use it)
    bytes: int


@dataclass
class SnapshotValues:
    """What a snapshot that stored values wrote, could not store (name -> reason), and what a restore needs besides
    the values: the module bindings (name -> module) and the names bound to one object."""

    written: list[StoredValue]
    unstored: dict[str, str]
    modules: dict[str, str]
    aliases: list[list[str]]
    elapsed_s: float = 0.0

    @classmethod
    def from_dict(cls, data: dict) -> SnapshotValues:
        try:
            return cls(written=[StoredValue(str(w["hash"]), str(w["format"]), str(w["type"]), bool(w["exact"]),
                                            int(w["bytes"])) for w in data["written"]],
                       unstored={str(k): str(v) for k, v in data["unstored"].items()},
                       modules={str(k): str(v) for k, v in data["modules"].items()},
                       aliases=[[str(name) for name in group] for group in data["aliases"]],
                       elapsed_s=float(data.get("elapsed_s", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"values record: malformed ({type(error).__name__}: {error})") from error


@dataclass
class Snapshot:
    """The runtime state after a step: the user's variables, the kernel's memory and a hash of the whole state."""

    variables: dict[str, VariableInfo]
    memory_bytes: int  # resident set of the kernel process
    state_hash: str  # over the sorted (name, content hash) pairs
    failures: dict[str, str] = field(default_factory=dict)  # variable name -> what could not be measured
    uss_bytes: int = 0  # memory unique to the kernel process
    elapsed_s: float = 0.0  # time the kernel spent taking it (storing the values included)
    values: SnapshotValues | None = None  # when the snapshot stored the values too

    def runtime_variables(self) -> dict[str, dict]:
        """The paper's release shape: name -> {size, repr}."""
        return {name: {"size": info.size, "repr": info.repr} for name, info in self.variables.items()}

    def hashes(self) -> dict[str, str]:
        return {name: info.hash for name, info in self.variables.items()}

    def vouched(self, recorded: Sequence[dict]) -> tuple[str, list[str]]:
        """This state's hash over what a release's step vouches for (its `recorded` variables but those it marks
        run-specific, `stable` false: `themisto.release.run_specific`), and the run-specific names whose hash here
        differs from the recorded one (a check counts them apart, never as matched)."""
        from themisto.runtime.agent.hashing import state_hash

        loose = {v["name"]: str(v["hash"]) for v in recorded if v.get("stable") is False}
        differing = sorted(name for name, digest in loose.items() if self.hashes().get(name) != digest)
        return state_hash({n: d for n, d in self.hashes().items() if n not in loose}), differing

    def to_dict(self) -> dict:
        return {"variables": [info.to_dict() for info in self.variables.values()], "memory_bytes": self.memory_bytes,
                "uss_bytes": self.uss_bytes, "state_hash": self.state_hash, "failures": dict(self.failures),
                "elapsed_s": self.elapsed_s}

    @classmethod
    def from_dict(cls, data: dict) -> Snapshot:
        try:
            variables = [VariableInfo.from_dict(v) for v in data["variables"]]
            values = SnapshotValues.from_dict(data["values"]) if data.get("values") is not None else None
            return cls(variables={v.name: v for v in variables}, memory_bytes=int(data["memory_bytes"]),
                       state_hash=data["state_hash"], failures=dict(data.get("failures", {})),
                       uss_bytes=int(data.get("uss_bytes", 0)), elapsed_s=float(data.get("elapsed_s", 0.0)),
                       values=values)
        except (KeyError, TypeError) as error:
            raise ValueError(f"snapshot record: missing or malformed {error}") from error


# The agent's two snapshot calls: with "snapshot_and_store" the kernel also writes the values into its session's
# values folder (THEMISTO_VALUES_DIR, set by themisto.runtime.kernel_setup; the host reads it as `values_dir`).
def _snapshot_call(store: bool) -> str:
    return "snapshot_and_store" if store else "snapshot"


def snapshot_expressions(store: bool = False) -> dict[str, str]:
    """The user expression that takes a snapshot on a step's own execute request (no extra round trip, see
    themisto.replay.replay); with `store`, the kernel also writes the values into the session's `values_dir`, taking
    the arguments the request carries (`held_arguments`)."""
    return {SNAPSHOT_EXPRESSION: agent_expression(_snapshot_call(store), with_arguments=store)}


def held_arguments(held: list[str]) -> dict | None:
    """The metadata of a request whose snapshot stores values (`snapshot_expressions(store=True)`): the hashes of
    values the host holds exactly already, which the kernel then does not write again; None when there are none."""
    return {REQUEST_KEY: {"held": list(held)}} if held else None


SNAPSHOT_EXPRESSIONS = snapshot_expressions()


def snapshot_from_expressions(user_expressions: dict) -> Snapshot | None:
    """The snapshot a cell's reply carried (`snapshot_expressions`; the kernel evaluates it after a failed cell too:
    themisto.runtime.launcher), or None when there is none (the request did not end with a reply)."""
    if SNAPSHOT_EXPRESSION not in user_expressions:
        return None
    return Snapshot.from_dict(agent_answer(user_expressions[SNAPSHOT_EXPRESSION], "snapshot"))


def take_snapshot(session: Any, *, timeout: float = SNAPSHOT_TIMEOUT_S, store: bool = False,
                  store_seconds: float | None = None, held: list[str] | None = None) -> Snapshot:
    """Read the session kernel's runtime snapshot silently (In/Out and the execution count stay as they were); with
    `store`, the values are written into the session's `values_dir` too, in at most `store_seconds` (default: the
    agent's Caps.seconds; what is left is named `deferred`), except those `held` (hashes the host holds exactly)."""
    arguments = {"seconds": store_seconds} if store and store_seconds is not None else {}
    if store and held:
        arguments["held"] = list(held)
    answer = agent_call(session, _snapshot_call(store), timeout=timeout, **arguments)
    try:
        return Snapshot.from_dict(answer)
    except (ValueError, AttributeError) as error:
        raise AgentError(f"the kernel's snapshot was malformed: {error}") from error
