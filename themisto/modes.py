"""The runtime-context modes of a prompt, each declared once with what it needs and what it shows.

A mode is looked up by name at the edge (`context_mode`), and past it the code asks the object what to do
(`mode.needs_snapshot`, `mode.per_cell_state`, `mode.is_probe` …), never its name. Adding a mode is one entry of
`CONTEXT_MODE_TABLE` plus its template in `themisto.generation.prompts`; the names every stage and the command line
use (`CONTEXT_MODES`, `BASELINE_CONTEXT` …, re-exported by `themisto.vocabulary`) are derived from the table.
Standard library only: importing it loads nothing and does no work beyond building the table.

>>> context_mode("full").needs_times, context_mode("none").needs_snapshot
(True, False)
>>> try:
...     context_mode("verbose")
... except ContextModeError as refused:
...     print(type(refused).__name__, refused)
ContextModeError unknown context mode 'verbose' (expected one of none, variables, full, trace, delta, probe)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from themisto.errors import InputError


@dataclass(frozen=True)
class ContextModeSpec:
    """One runtime-context mode: what its prompt needs from the release and what it shows."""

    name: str
    needs_snapshot: bool = False  # the row's variables (the snapshot before the target); `none` alone does without
    # Memory, each cell's status, execution time and restart, each variable's size (the release joins the times).
    needs_times: bool = False
    runtime_section: bool = False  # a section of its own after the history, opened by `intro`
    per_cell_state: bool = False  # each history cell followed by the state it left (the release joins those states)
    per_cell_delta: bool = False  # each history cell followed by what it changed (joined as per_cell_state's states)
    is_probe: bool = False  # the model may run probes in branches of the live pre-cell state (the execution opt-in)
    is_baseline: bool = False  # the control of every paired effect: exactly one mode
    is_default: bool = False  # run when no --context is given
    base: str | None = None  # the mode whose prompt this one extends
    compared_with: tuple[str, ...] = ()  # the controls of its paired effects besides the baseline's
    intro: str = ""  # the first line of the runtime section

    @property
    def is_static(self) -> bool:
        """Whether the prompt is a picture of the state fixed before the model runs (no code runs to make it), so
        that `themisto sft-export` can write it: a probe conversation exists only once a model has had it."""
        return not self.is_probe

    @property
    def per_cell(self) -> bool:
        """Whether each history cell is followed by a state of its own, which the release joins from the snapshot
        after each step (`trace`'s JSON lines, `delta`'s change lists)."""
        return self.per_cell_state or self.per_cell_delta


class ContextModeError(InputError):
    """A context mode name that is not in the table."""


_VARIABLES_INTRO = ("Runtime state before the next cell: the user's variables, most relevant first (name, type, shape, "
                    "repr).")
_FULL_INTRO = ("Runtime state before the next cell: memory in use, and the user's variables, most relevant first "
               "(name, type, shape, size, repr). Cell headers show status, execution time and kernel restarts.")

# In the order tables show them. `none`: the cells and their outputs (the paper's baseline). `variables`: plus the
# snapshot before the target. `full`: plus memory, execution times, errors and restarts. `trace`: each history cell
# followed by the variables it changed, as JSON (themisto.generation.trace); asked for by name. `delta`: each history
# cell followed by what it changed (names added, removed, changed; old -> new), compared with `none` and with
# `variables` (themisto.generation.delta); asked for by name. `probe`: the `variables` prompt plus the right to run
# probes (themisto.generation.probe_protocol); it needs the execution opt-in.
CONTEXT_MODE_TABLE: tuple[ContextModeSpec, ...] = (
    ContextModeSpec("none", is_baseline=True, is_default=True),
    ContextModeSpec("variables", needs_snapshot=True, runtime_section=True, is_default=True, intro=_VARIABLES_INTRO),
    ContextModeSpec("full", needs_snapshot=True, needs_times=True, runtime_section=True, is_default=True,
                    intro=_FULL_INTRO),
    ContextModeSpec("trace", needs_snapshot=True, per_cell_state=True),
    ContextModeSpec("delta", needs_snapshot=True, per_cell_delta=True, compared_with=("variables",)),
    ContextModeSpec("probe", needs_snapshot=True, runtime_section=True, is_probe=True, base="variables",
                    compared_with=("variables",), intro=_VARIABLES_INTRO),
)
_BY_NAME: dict[str, ContextModeSpec] = {mode.name: mode for mode in CONTEXT_MODE_TABLE}

CONTEXT_MODES: tuple[str, ...] = tuple(_BY_NAME)
BASELINE_CONTEXT: str = next(mode.name for mode in CONTEXT_MODE_TABLE if mode.is_baseline)
PROBE_CONTEXT: str = next(mode.name for mode in CONTEXT_MODE_TABLE if mode.is_probe)
PROBE_BASE_CONTEXT: str = _BY_NAME[PROBE_CONTEXT].base  # the prompt a probe conversation starts from
STATIC_CONTEXT_MODES: tuple[str, ...] = tuple(mode.name for mode in CONTEXT_MODE_TABLE if mode.is_static)
DEFAULT_CONTEXT_MODES: tuple[str, ...] = tuple(mode.name for mode in CONTEXT_MODE_TABLE if mode.is_default)


def context_mode(name: str | ContextModeSpec) -> ContextModeSpec:
    """The mode named `name` (a mode is returned as it is); an unknown name raises `ContextModeError` (a
    `ValueError`) that lists the modes there are."""
    if isinstance(name, ContextModeSpec):
        return name
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ContextModeError(f"unknown context mode {name!r} (expected one of {', '.join(CONTEXT_MODES)})") from None


def context_modes(names: Iterable[str | ContextModeSpec]) -> tuple[ContextModeSpec, ...]:
    """The modes named in `names`, in their order (`context_mode` for each)."""
    return tuple(context_mode(name) for name in names)
