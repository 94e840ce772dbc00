"""How faithful a replay is: per trajectory, the share of replayed steps that end as the original log recorded.

Three shares, each over the steps where the log can answer the question:
- status: over steps whose logged outcome is ok or error, the replayed outcome is the same;
- ename: over steps logged as errors, the replayed error has the same exception name;
- output types: over steps with a logged `finished_execute`, the replayed output types equal the logged list.
A developer's interrupt (logged `KeyboardInterrupt`) matches a replayed timeout: both are runs stopped from outside.
Steps whose code the log lost (empty code) are not comparable. Every mismatch is listed with the step, both
outcomes, a reason and its cause (`CAUSES`), and the status mismatches are counted by cause. Every step replay stopped
at its limit is listed apart (`Timeout`), with the developer's seconds beside the replay's, whatever the log says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable

from themisto.replay.replay import Step
from themisto.vocabulary import COMPARABLE_LOGGED


# Why a replayed step ended otherwise than the log says, as the card and the README explain each class.
CAUSES: dict[str, str] = {
    "interrupted": "the developer interrupted a long run; replay finished it (the look-alike inputs are smaller)",
    "package_installed": "the package was missing in the developer's environment; the replay kernel has it",
    "replay_succeeded": "replay succeeded where the developer's run raised (other inputs or package versions)",
    "missing_input": "an input file the look-alike workspace lacks (FileNotFoundError)",
    "timeout": "replay stopped the cell at its limit where the developer's run finished (ok or with another error)",
    "name_lost": "NameError: a name an earlier step should have made (it failed, ran past its timeout, or its state "
                 "was lost in replay)",
    "replay_raised": "replay raised another exception where the developer's run succeeded (other inputs or package "
                     "versions)",
    "other_exception": "both raised, another exception",
    "output_types": "the same outcome, other output types (a result shown where the log has none, other streams)",
}


@dataclass
class Mismatch:
    step: int
    kind: str  # "status" | "ename" | "output_types"
    logged: str
    replayed: str
    reason: str
    code: str  # the first line of the cell, for a reader to find it
    cause: str = ""  # `CAUSES`


@dataclass
class Timeout:
    """A step replay stopped at its limit: the seconds it ran and its limit beside what the developer's run took."""

    step: int
    replay_s: float
    limit_s: float | None  # None: a replay made before steps recorded it
    developer_s: float | None  # None: the log did not see the cell finish
    logged: str  # the logged outcome ("ok", "error NameError", "unknown" ...)
    code: str


@dataclass
class FidelityReport:
    kernel_id: str
    notebook: str
    executions_replayed: int
    comparable: int  # steps logged as ok or error
    logged_errors: int
    status_match: float | None
    ename_match: float | None
    output_types_match: float | None
    mismatches: list[Mismatch] = field(default_factory=list)
    status_causes: dict[str, int] = field(default_factory=dict)  # status mismatches per `CAUSES` key
    timeouts: list[Timeout] = field(default_factory=list)  # every step stopped at its limit, comparable or not

    def to_dict(self) -> dict:
        return asdict(self)


def _replayed_outcome(step: Step) -> tuple[str, str | None]:
    """The replayed outcome in the log's terms: a timeout reads as an interrupt, a dead kernel as an error."""
    if step.status == "timeout":
        return "error", "KeyboardInterrupt"
    if step.status == "kernel_died":
        return "error", "DeadKernelError"
    return step.status, step.ename


def _first_line(code: str) -> str:
    for line in code.splitlines():
        if line.strip():
            return line.strip()[:100]
    return ""


def _reason(step: Step, replayed: tuple[str, str | None]) -> tuple[str, str]:
    """(cause, reason): the `CAUSES` key and a sentence about this step."""
    logged = step.logged
    status, ename = replayed
    evalue = (step.evalue or "").splitlines()[0][:160] if step.evalue else ""
    if logged.status == "error" and status == "ok":
        if logged.ename == "KeyboardInterrupt":
            return "interrupted", (f"the developer interrupted a long run; replay finished it in "
                                   f"{step.execution_time:.2f} s (the look-alike inputs are smaller than the real "
                                   "ones)")
        if logged.ename == "ModuleNotFoundError":
            return "package_installed", ("the package was missing in the developer's environment; the replay "
                                         "environment has it installed")
        return "replay_succeeded", (f"replay succeeded where the developer's run raised {logged.ename}: "
                                    f"{(logged.evalue or '')[:160]}")
    if logged.status == "ok" and status == "error":
        if ename == "FileNotFoundError":
            return "missing_input", f"an input the look-alike workspace lacks: {evalue}"
        if step.status == "timeout":
            return "timeout", _stopped(step)
        return ("name_lost" if ename == "NameError" else "replay_raised",
                f"replay raised {ename}: {evalue} where the developer's run succeeded")
    if step.status == "timeout" and logged.ename != "KeyboardInterrupt":
        return "timeout", _stopped(step)
    if logged.ename != ename:
        return "other_exception", (f"replay raised {ename}: {evalue}; the log recorded {logged.ename}: "
                                   f"{(logged.evalue or '')[:160]}")
    return "output_types", ("output types differ (e.g. a result shown where the log has none, or a different number "
                            "of streams)")


def _stopped(step: Step) -> str:
    """A timed-out step's reason: the replay's seconds and limit beside the developer's."""
    limit = f" of {step.time_limit_s:g} s" if step.time_limit_s is not None else ""
    developer = (f"the developer's run took {step.logged.seconds:.1f} s" if step.logged.seconds is not None
                 else "the log did not see the developer's run finish")
    return f"replay stopped it at its limit{limit} after {step.execution_time:.1f} s; {developer}"


def _why(step: Step, replayed: tuple[str, str | None], code: str) -> tuple[str, str, str]:
    """(reason, code, cause): a Mismatch's last three fields."""
    cause, reason = _reason(step, replayed)
    return reason, code, cause


def fidelity_report(steps: Iterable[Step]) -> list[FidelityReport]:
    """One report per trajectory, in the order trajectories first appear."""
    by_kernel: dict[str, list[Step]] = {}
    for step in steps:
        by_kernel.setdefault(step.kernel_id, []).append(step)
    reports = []
    for kernel_id, group in by_kernel.items():
        mismatches: list[Mismatch] = []
        comparable = status_ok = errors = ename_ok = types_ok = 0
        timeouts = [Timeout(step.step, round(step.execution_time, 3), step.time_limit_s, step.logged.seconds,
                            f"{step.logged.status} {step.logged.ename or ''}".strip(), _first_line(step.code))
                    for step in group if step.status == "timeout"]
        for step in group:
            logged = step.logged
            if logged.status not in COMPARABLE_LOGGED or not step.code.strip():
                continue  # the log cannot answer: no finished event, or the code itself was not logged
            comparable += 1
            replayed = _replayed_outcome(step)
            code = _first_line(step.code)
            if replayed[0] == logged.status:
                status_ok += 1
            else:
                mismatches.append(Mismatch(step.step, "status", f"{logged.status} {logged.ename or ''}".strip(),
                                           f"{replayed[0]} {replayed[1] or ''}".strip(), *_why(step, replayed, code)))
            if logged.status == "error":
                errors += 1
                if replayed[1] == logged.ename:
                    ename_ok += 1
                elif replayed[0] == "error":
                    mismatches.append(Mismatch(step.step, "ename", logged.ename or "", replayed[1] or "",
                                               *_why(step, replayed, code)))
            if step.output_types == logged.output_types:
                types_ok += 1
            elif replayed[0] == logged.status and (replayed[0] == "ok" or replayed[1] == logged.ename):
                mismatches.append(Mismatch(step.step, "output_types", ",".join(logged.output_types),
                                           ",".join(step.output_types), *_why(step, replayed, code)))
        reports.append(FidelityReport(
            kernel_id=kernel_id,
            notebook=group[0].notebook,
            executions_replayed=len(group),
            comparable=comparable,
            logged_errors=errors,
            status_match=round(status_ok / comparable, 4) if comparable else None,
            ename_match=round(ename_ok / errors, 4) if errors else None,
            output_types_match=round(types_ok / comparable, 4) if comparable else None,
            mismatches=mismatches,
            status_causes={cause: n for cause in CAUSES
                           if (n := sum(m.kind == "status" and m.cause == cause for m in mismatches))},
            timeouts=timeouts,
        ))
    return reports
