"""The one opt-in door for executing model-written code: a permit only the user's two switches can open.

Nothing in Themisto runs a prediction or a probe unless the environment says `HF_ALLOW_CODE_EVAL=1` (as evaluate's
`code_eval` asks) and the caller passes the explicit option (`execute=True` in Python; `--execute` to `themisto
score`, `--execute-probes` to `themisto generate`). Functions that run model-written code take an `ExecutionPermit`,
which only `permit()` hands out, so no code path can reach them without passing here. It lies below every stage:
scoring executes predictions, generation runs the probes of the `probe` context mode.

>>> permit(execute=False)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
themisto.gate.ExecutionRefused: Executing model-written code is off: ...the explicit option was not passed...
"""

from __future__ import annotations

from dataclasses import dataclass

from themisto.settings import settings

ENV_SWITCH = "HF_ALLOW_CODE_EVAL"

_WARNING = """\
It runs untrusted code written by a model in a Jupyter kernel with Themisto's sandbox around it (bubblewrap where it
works, memory/process/output limits, a watchdog, a private copy of the workspace). That sandbox is a best-effort
guard, not a security boundary: model-written code may still act destructively, and a determined attacker may escape
it. Run it on a machine (or container) you can afford to lose, without credentials.

To opt in, both switches are needed:
  1. set the environment variable {env}=1 before the process starts (the environment is read once), e.g.
       {env}=1 themisto score ... --execute
  2. pass the explicit option: execute=True to the metric's compute() or to themisto.scoring.scorer, --execute to
     `themisto score`, or --execute-probes to `themisto generate` (the `probe` context mode runs the model's probes).
Text scores (exact match, ROUGE-L, chrF, output equivalence) and the other context modes need neither switch."""


class ExecutionRefused(PermissionError):
    """Model-written code was asked to run without both opt-in switches; the message says how to opt in."""


@dataclass(frozen=True)
class ExecutionPermit:
    """Proof that both switches were on; the scorer's executing functions require one."""

    # Only `permit()` knows this token; an ExecutionPermit built anywhere else is rejected by `check`.
    _token: object

    def check(self) -> None:
        """Raise ExecutionRefused unless this permit came from `permit()`."""
        if self._token is not _TOKEN:
            raise ExecutionRefused("this ExecutionPermit was not issued by themisto.gate.permit()")


_TOKEN = object()


def refusal_message(*, execute: bool, env_allowed: bool) -> str:
    """The refusal text: which switch is off, what running predictions risks, and how to turn both on."""
    missing = []
    if not env_allowed:
        missing.append(f"the environment variable {ENV_SWITCH} is not set to 1")
    if not execute:
        missing.append("the explicit option was not passed (execute=True / --execute / --execute-probes)")
    return ("Executing model-written code is off: " + ("; ".join(missing) or "no switch is missing") + ".\n"
            + _WARNING.format(env=ENV_SWITCH))


def permit(*, execute: bool) -> ExecutionPermit:
    """An ExecutionPermit when `execute` is true and HF_ALLOW_CODE_EVAL=1; otherwise ExecutionRefused."""
    env_allowed = settings().allow_code_eval
    if execute is not True or not env_allowed:
        raise ExecutionRefused(refusal_message(execute=execute is True, env_allowed=env_allowed))
    return ExecutionPermit(_TOKEN)
