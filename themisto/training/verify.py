"""Execution-verified targets: keep a task row only where the release's replay reproduced what the developer saw.

The release's `trajectories` config holds, per step, the replayed outcome (`status`, `ename`, `output_types`) beside
the logged one (`logged_status`, `logged_ename`, `logged_output_types`). A target is verified when its own step ended
as logged and so did every cell its prompt shows in the history (older divergences are not checked: on the real
task-1 log one early difference would otherwise drop 9 in 10 rows); an output target must also show the logged
output types and must not have been cut by the kernel's output cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from themisto.errors import InputError
from themisto.runtime.agent import OUTPUT_CAP_MARKER
from themisto.vocabulary import COMPARABLE_LOGGED, UNFINISHED_STATUSES

# Why a row is left out, in the order the rules are checked; the manifest counts each.
DROP_REASONS: dict[str, str] = {
    "outcome_not_logged": "the log recorded no finished outcome for the target step (interrupted, or no event), "
                          "so nothing vouches for the replayed target",
    "replay_unfinished": "replay did not finish the target step (timeout or kernel died)",
    "status_differs": "replay ended the target step ok where the developer's run raised, or the reverse",
    "ename_differs": "replay raised another exception than the developer's run",
    "output_types_differ": "the replayed output types differ from the logged ones (the output text is not the "
                           "developer's)",
    "output_capped": "the target output was cut by the kernel's output cap",
    "history_diverged": "a cell the prompt shows in the history ended otherwise in replay than logged, so the "
                        "prompt (and the state before the target) is not what the developer had",
    "no_snapshot": "the context mode shows the runtime state, and the row has no snapshot of it",
}
# The cap marker's fixed head: every capped output contains it, whatever the sizes formatted into it.
_CAP_HEAD = OUTPUT_CAP_MARKER.split("{", 1)[0]


class VerificationError(InputError):
    """A task row whose step the release's trajectories config lacks."""


@dataclass(frozen=True)
class StepKey:
    kernel_id: str
    step: int


def step_problem(row: Mapping) -> str | None:
    """Why one `trajectories` row's replay does not reproduce the log (a DROP_REASONS key), or None."""
    logged = row.get("logged_status")
    if logged not in COMPARABLE_LOGGED:
        return "outcome_not_logged"
    if row.get("status") == "timeout" and logged == "error" and row.get("logged_ename") == "KeyboardInterrupt":
        return None  # the developer stopped the run, replay's watchdog did: both stopped from outside (as in fidelity)
    if row.get("status") in UNFINISHED_STATUSES:
        return "replay_unfinished"
    if row.get("status") != logged:
        return "status_differs"
    if logged == "error" and row.get("ename") != row.get("logged_ename"):
        return "ename_differs"
    return None


def output_problem(row: Mapping) -> str | None:
    """Why a step's replayed output is not the developer's output, beyond its status (a DROP_REASONS key), or None."""
    if list(row.get("output_types") or []) != list(row.get("logged_output_types") or []):
        return "output_types_differ"
    if _CAP_HEAD in (row.get("output") or ""):
        return "output_capped"
    return None


class Verifier:
    """Answers, for a task row, why its target is not execution-verified, from the release's `trajectories` rows."""

    def __init__(self, trajectory_rows: Iterable[Mapping]):
        self._rows: dict[StepKey, Mapping] = {StepKey(r["kernel_id"], int(r["step"])): r for r in trajectory_rows}

    def _step(self, task_row: Mapping, step: int) -> Mapping:
        row = self._rows.get(StepKey(task_row["kernel_id"], int(step)))
        if row is None:
            raise VerificationError(f"example {task_row['id']}: step {step} is not in the release's trajectories "
                                    "config, so the example cannot be checked against the log")
        return row

    def problem(self, task_row: Mapping, task: str) -> str | None:
        """The DROP_REASONS key that leaves this task row out, or None when its target is verified."""
        step = self._step(task_row, task_row["step"])
        problem = step_problem(step)
        if problem is None and task == "output_prediction":
            problem = output_problem(step)
        if problem is not None:
            return problem
        for cell in task_row.get("history") or []:
            # An unlogged outcome (e.g. an interrupt) in the history is not a known divergence.
            if step_problem(self._step(task_row, cell["step"])) not in (None, "outcome_not_logged"):
                return "history_diverged"
        return None


def has_snapshot(task_row: Mapping) -> bool:
    """Whether the row records the runtime state before its target (a fresh kernel's empty state counts)."""
    fresh = task_row["step"] == 0 or task_row.get("restarted_before")
    return bool(fresh or task_row.get("state_hash_before") is not None)

