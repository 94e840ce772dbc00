"""Chat prompts for the two tasks, with named runtime-context modes, a token budget, and answer extraction.

`none` shows the cells and their outputs (the paper's baseline), `variables` adds the snapshot before the target
(names, types, shapes, bounded reprs, the most relevant variables first), `full` adds memory, execution times,
errors and restarts; `trace` follows each history cell with the variables it changed as JSON (`trace`); `delta`
follows it with what it changed, old -> new (`delta`); `probe` is the `variables` prompt plus the rule that lets the
model probe the live state (`themisto.generation.probe_protocol`).
What each mode shows is a property of its `themisto.modes.ContextModeSpec`, never a test of its name. Every template
lives in `PROMPT_TEMPLATES`, the budget's rule (`themisto.generation.budget`) written into its text; a run records
each template's text and sha256.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable

from themisto.errors import InputError
from themisto.generation.budget import WHOLE_FIELDS, Cut, Fields, Kept, budget_rule, fit
from themisto.generation.delta import (CHANGED_LABEL, DELTA_INTRO, DELTA_RULE, DeltaSettings, change_blocks,
                                       without_traceback)
from themisto.generation.probe_protocol import ProbeSettings, probe_rule, protocol_text
from themisto.generation.trace import TRACE_INTRO, state_lines, trace_names
from themisto.generation.variable_ranking import rank_variables
from themisto.modes import CONTEXT_MODE_TABLE, ContextModeError, ContextModeSpec, context_mode
from themisto.vocabulary import CONTEXT_MODES, TASKS  # noqa: F401 - CONTEXT_MODES: callers import it from here too

SYSTEM = "You are an expert Python data scientist working in a Jupyter notebook."

_HISTORY_INTRO = "The cells a developer executed in a Jupyter notebook, oldest first, with their outputs:"
_NO_HISTORY = "(no earlier cells are shown)"
_INSTRUCTION = {
    "next_cell": ("Write the code of the next cell the developer executes. "
                  "Reply with the code only, in one ```python fenced block."),
    "output_prediction": ("Predict the exact output this cell prints or displays when it runs now. "
                          "Reply with the output text only, in one ``` fenced block (empty if it shows nothing)."),
}
_STATE_LABEL = "State after it:"
_TARGET_CELL = "The cell to run next:\n```python\n{code}\n```"
_USER = "{history_intro}\n\n{history}\n\n{runtime}{target}{instruction}"


def _instruction(task: str, mode: ContextModeSpec, probe: str) -> str:
    """The task's instruction; in the probe mode, the probe rule (`probe`) comes first."""
    return f"{probe}\n\n{_INSTRUCTION[task]}" if mode.is_probe else _INSTRUCTION[task]


def _history_intro(mode: ContextModeSpec) -> str:
    if mode.per_cell_delta:
        return f"{_HISTORY_INTRO}\n{DELTA_INTRO}"
    return f"{_HISTORY_INTRO}\n{TRACE_INTRO}" if mode.per_cell_state else _HISTORY_INTRO


def _cell_layout(mode: ContextModeSpec) -> str:
    """What follows each history cell's code in the template's words (a per-cell mode's state or changes)."""
    if mode.per_cell_delta:
        return f" (each cell: code, {CHANGED_LABEL} {{changes}}, output)"
    return f" (each cell: code, {_STATE_LABEL} {{state}}, output)" if mode.per_cell_state else ""


def _template_text(task: str, mode: ContextModeSpec) -> str:
    """The full template of one (task, context): system message, user layout and the fixed texts it fills in (the
    probe mode: its protocol's texts too), and the budget's rule (not sent: it says how an over-long prompt was
    cut)."""
    runtime = f"{mode.intro}\n{{runtime}}\n\n" if mode.runtime_section else ""
    target = _TARGET_CELL + "\n\n" if task == "output_prediction" else ""
    user = _USER.format(history_intro=_history_intro(mode), history="{history}" + _cell_layout(mode), runtime=runtime,
                        target=target, instruction=_instruction(task, mode, "{probe_rule}"))
    protocol = f"[probe]\n{protocol_text()}\n" if mode.is_probe else ""
    protocol += f"[delta]\n{DELTA_RULE}\n" if mode.per_cell_delta else ""
    return f"[system]\n{SYSTEM}\n[user]\n{user}\n{protocol}[budget]\n{budget_rule(mode.needs_snapshot)}\n"


PROMPT_TEMPLATES: dict[tuple[str, str], str] = {
    (task, mode.name): _template_text(task, mode) for task in TASKS for mode in CONTEXT_MODE_TABLE}


class PromptError(InputError):
    """An unknown task or context mode, or a row that lacks what the task needs."""


def check_task_context(task: str, context: str | ContextModeSpec) -> ContextModeSpec:
    """The context mode, once the task and the mode are known ones."""
    if task not in TASKS:
        raise PromptError(f"unknown task {task!r} (expected one of {', '.join(TASKS)})")
    try:
        return context_mode(context)
    except ContextModeError as error:
        raise PromptError(str(error)) from None


def template_sha256(task: str, context: str | ContextModeSpec) -> str:
    """The sha256 of one (task, context) template's text."""
    mode = check_task_context(task, context)
    return hashlib.sha256(PROMPT_TEMPLATES[(task, mode.name)].encode("utf-8")).hexdigest()


@dataclass
class Prompt:
    """Chat messages for one example and context mode, what they kept of the row, and why it was skipped (if)."""

    messages: list[dict]
    template_sha256: str
    kept: Kept | None = None  # None: skipped, the model sees nothing
    skipped_reason: str | None = None
    id: str | None = None
    context: str | None = None
    tokens: int | None = None
    task: str | None = None
    row: dict | None = field(default=None, repr=False, compare=False)  # what model-free baselines read
    # A probe conversation's turn (`themisto.generation.probing`): the probes it may still run, the native tool
    # schemas offered (None: none), and which sample and turn it is (so each draws its own seed).
    probes_left: int | None = None
    tools: list[dict] | None = None
    turn: str | None = None

    def seed_key(self) -> str:
        """What a backend seeds this prompt's sampling from: its example and context, and its turn if any."""
        return f"{self.id}/{self.context}" + (f"/{self.turn}" if self.turn else "")


# ---------------------------------------------------------------------------------------------------------------
# Rendering pieces


def _human_bytes(n: int | None) -> str:
    if n is None or n < 0:
        return "unknown"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


# A history cell whose code the log damaged (the release's `code_state`): in every mode, so that no model reads the
# surviving text as what the developer ran.
_DAMAGED = "the log lost part of this cell's code: what is shown is not all that ran"


def _cell_header(cell: dict, number: int, full: bool, short_errors: bool = False) -> str:
    """A history cell's header: with `full` its status, time and restart; with `short_errors` the error it raised."""
    header = f"# Cell {number}"
    facts = []
    if full:
        facts.append(f"status {cell.get('status') or 'unknown'}")
        if cell.get("execution_time") is not None:
            facts.append(f"{cell['execution_time']:.3f} s")
        if cell.get("restarted_before"):
            facts.append("the kernel was restarted before it")
    elif short_errors and cell.get("status") == "error":
        facts.append(f"raised {cell.get('ename') or 'an error'}")
    if cell.get("code_state") == "damaged":
        facts.append(_DAMAGED)
    return f"{header} ({', '.join(facts)})" if facts else header


def _render_cell(cell: dict, number: int, full: bool, between: str | None = None, short_errors: bool = False) -> str:
    """One history cell; `between` (a per-cell mode's state line or change list) goes between its code and its
    output; `short_errors`: the header names the error it raised, and its output stops at the error's message."""
    whole = cell.get("output") or ""
    output = without_traceback(cell) if short_errors else whole
    if cell.get("output_truncated") and output == whole:  # else the cap cut only the traceback left out
        output += "\n... (output truncated)"
    shown = f"Output:\n```\n{output}\n```" if output.strip() else "Output: (none)"
    left = "" if between is None else f"{between}\n"
    return f"{_cell_header(cell, number, full, short_errors)}\n```python\n{cell.get('code') or ''}\n```\n{left}{shown}"


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _render_variable(var: dict, fields: Fields, full: bool) -> str:
    facts = [var.get("type") or "unknown type"]
    if var.get("shape"):
        facts.append(f"shape ({', '.join(str(s) for s in var['shape'])}{',' if len(var['shape']) == 1 else ''})")
    elif var.get("len") is not None:
        facts.append(f"len {var['len']}")
    if var.get("dtype"):
        facts.append(f"dtype {var['dtype']}")
    columns = var.get("columns") or []
    if columns and fields.columns:
        facts.append("columns [" + ", ".join(columns[:fields.columns]) + (", ..." if len(columns) > fields.columns
                                                                           else "") + "]")
    elif columns:
        facts.append(f"{len(columns)} columns")
    if full and var.get("size") is not None:
        facts.append(_human_bytes(var["size"]))
    line = f"- {var.get('name')}: {'; '.join(facts)}"
    if fields.repr_chars > 0 and var.get("repr"):
        line += "\n  " + _bounded(var["repr"], fields.repr_chars).replace("\n", "\n  ")
    return line


def _render_runtime(row: dict, mode: ContextModeSpec, variables: list[dict], cut: Cut) -> str:
    full = mode.needs_times
    lines = []
    if full:
        lines.append(f"memory in use: {_human_bytes(row.get('memory_bytes_before'))}")
        if row.get("restarted_before"):
            lines.append("the kernel was restarted just before the next cell")
    lines += [_render_variable(v, cut.fields, full) for v in variables[:cut.variables]]
    hidden = len(variables) - cut.variables
    if not variables:
        lines.append("(no user variables)")
    elif hidden:
        lines.append(f"(and {hidden} more variable{'s' if hidden > 1 else ''}, ranked lower, not shown)")
    return "\n".join(lines)


def _between(row: dict, mode: ContextModeSpec, shown: list[dict], names: list, cut: Cut) -> list[str | None]:
    """What follows each shown history cell's code: the trace mode's state line, the delta mode's change list, or
    nothing."""
    if mode.per_cell_delta:
        return change_blocks(row, shown, names, cut)
    if mode.per_cell_state:
        return [f"{_STATE_LABEL} {state or '(not recorded)'}" for state in state_lines(row, shown, names, cut)]
    return [None] * len(shown)


# The delta mode's last word when the kernel restarted between the last history cell and the next.
_RESTARTED_BEFORE_NEXT = "(the kernel was restarted before the next cell: none of the variables above is left)"


def _render_user(row: dict, task: str, mode: ContextModeSpec, variables: list, cut: Cut, probe: ProbeSettings) -> str:
    """The user message; `variables`: the ranked variables (a per-cell mode: the ranked names, `trace_names`)."""
    full = mode.needs_times
    history = list(row.get("history") or [])
    first = len(history) - cut.history
    shown = history[first:]
    cells = "\n\n".join(_render_cell(c, first + 1 + i, full, between, short_errors=mode.per_cell_delta)
                         for i, (c, between) in enumerate(zip(shown, _between(row, mode, shown, variables, cut))))
    cells = cells or _NO_HISTORY
    if mode.per_cell_state and shown and cut.variables < len(variables):
        hidden = len(variables) - cut.variables
        cells += f"\n\n(the state lines leave out {hidden} variable{'s' if hidden > 1 else ''}, ranked lower)"
    if mode.per_cell_delta and shown and row.get("restarted_before"):
        cells += f"\n\n{_RESTARTED_BEFORE_NEXT}"
    runtime = ""
    if mode.runtime_section:
        runtime = f"{mode.intro}\n{_render_runtime(row, mode, variables, cut)}\n\n"
    target = _TARGET_CELL.format(code=row.get("code") or "") + "\n\n" if task == "output_prediction" else ""
    return _USER.format(history_intro=_history_intro(mode), history=cells, runtime=runtime, target=target,
                        instruction=_instruction(task, mode, probe_rule(probe)))


def _messages(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def messages_text(messages: list[dict]) -> str:
    """The messages' contents joined, as token counters without a chat template see them."""
    return "\n".join(m["content"] for m in messages)


def approx_tokens(text: str) -> int:
    """A deliberately high token estimate (UTF-8 bytes / 3) for backends with no local tokenizer."""
    return len(text.encode("utf-8")) // 3 + 1


# ---------------------------------------------------------------------------------------------------------------
# The budget


def _kept(row: dict, mode: ContextModeSpec, variables: list, cut: Cut) -> Kept:
    runtime = mode.needs_snapshot
    shown = variables[:cut.variables]
    if mode.per_cell:  # the names shown (none without a cell to follow); reprs: the target's snapshot's
        reprs = {v["name"]: v.get("repr") or "" for v in row.get("variables_before") or []}
        shown = [{"repr": reprs.get(name, "")} for name in shown] if cut.history else []
        cut = Cut(cut.history, len(shown), cut.fields)
    limit = cut.fields.repr_chars if runtime and cut.fields != WHOLE_FIELDS else None
    reprs_cut = 0 if limit is None else sum(len(v.get("repr") or "") > limit for v in shown)
    return Kept(history_shown=cut.history, history_total=len(row.get("history") or []),
                variables_shown=cut.variables if runtime else None,
                variables_total=len(variables) if runtime else None, repr_chars=limit, reprs_cut=reprs_cut)


def render_prompt(row: dict, task: str, context: str | ContextModeSpec, *,
                  count_tokens: Callable[[str], int] | None = None, max_prompt_tokens: int | None = None,
                  probe: ProbeSettings | None = None, delta: DeltaSettings | None = None) -> Prompt:
    """Render one row as chat messages in a context mode (its name or its `ContextModeSpec`); over
    `max_prompt_tokens`, cut the history and the runtime section by the budget's rule (`themisto.generation.budget`),
    counting with `count_tokens` (default: `approx_tokens`). The probe mode states the probe rule of `probe`
    (default: `ProbeSettings()`); the delta mode shows at most the last cells `delta` allows (default: all)."""
    probe = probe or ProbeSettings()
    mode = check_task_context(task, context)
    if task == "output_prediction" and "code" not in row:
        raise PromptError(f"row {row.get('id')}: an output_prediction row needs the cell's `code`")
    variables: list = rank_variables(row, task) if mode.needs_snapshot else []
    if mode.per_cell:
        variables = trace_names(row, variables)
    history = len(row.get("history") or [])
    if mode.per_cell_delta:
        history = (delta or DeltaSettings()).history(history)

    def messages(cut: Cut) -> list[dict]:
        return _messages(_render_user(row, task, mode, variables, cut, probe))

    def prompt(cut: Cut | None, tokens: int | None, reason: str | None = None) -> Prompt:
        shown = cut or Cut(0, 0)
        return Prompt(messages(shown), template_sha256(task, mode),
                      _kept(row, mode, variables, cut) if cut else None, reason, row.get("id"), mode.name, tokens,
                      task, row)

    whole = Cut(history, len(variables))
    if max_prompt_tokens is None:
        return prompt(whole, count_tokens(messages_text(messages(whole))) if count_tokens else None)
    count = count_tokens or approx_tokens
    chosen = fit(lambda cut: count(messages_text(messages(cut))), max_prompt_tokens, history,
                 len(variables) if mode.needs_snapshot else None)
    if chosen.cut is None:
        section = " and no variable" if mode.needs_snapshot else ""
        return prompt(None, chosen.tokens, f"prompt over budget: {chosen.tokens} tokens with no history cell{section} "
                                           f"shown (budget {max_prompt_tokens})")
    return prompt(chosen.cut, chosen.tokens)


# ---------------------------------------------------------------------------------------------------------------
# The text track: the fixed prompts a release carries as plain text

# The budget of the text track's prompts, in characters of the whole prompt (system and user message), so that no
# model's tokenizer is needed: about 6,000 tokens of code or English at the usual 3-4 characters per token, so the
# prompt and a reply fit an 8k-token context.
TEXT_TRACK_CHARS = 24_000


def text_track_prompt(row: dict, task: str, context: str | ContextModeSpec,
                      budget_chars: int = TEXT_TRACK_CHARS) -> tuple[str, bool]:
    """One row's user message in a mode with a fixed prompt, cut by the budget's rule to `budget_chars` characters
    (`len` is the counter), and whether it fits; a prompt that does not fit even with no history cell is its
    smallest rendering (no history cell, no variable)."""
    prompt = render_prompt(row, task, context, count_tokens=len, max_prompt_tokens=budget_chars)
    [user] = [m["content"] for m in prompt.messages if m["role"] == "user"]  # the system message is eval.yaml's
    return user, prompt.skipped_reason is None


def text_track_renderer(budget_chars: int = TEXT_TRACK_CHARS):
    """The renderer a release build writes its `<task>_prompts` configs with (`themisto.release.text_track`)."""
    from themisto.modes import STATIC_CONTEXT_MODES
    from themisto.release.text_track import PromptRenderer

    return PromptRenderer(
        system=SYSTEM, budget_chars=budget_chars,
        render=lambda row, task, mode: text_track_prompt(row, task, mode, budget_chars),
        templates={f"{task}/{mode}": template_sha256(task, mode) for task in TASKS for mode in STATIC_CONTEXT_MODES})


# ---------------------------------------------------------------------------------------------------------------
# Answers

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.S)
_FENCE = re.compile(r"(?m)^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n]*\n")


def extract_answer(raw: str, task: str) -> str:
    """The answer inside the first fenced block (an unclosed one runs to the end), else the bare text."""
    text = _THINK.sub("", raw or "")
    match = _FENCE.search(text)
    if match:
        fence = match.group(1)
        rest = text[match.end():]
        close = re.search(rf"(?m)^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", rest)
        body = rest[:close.start()] if close else rest
    else:
        body = text
    if task == "output_prediction":
        # An output's leading spaces matter (a DataFrame's header row starts with them); blank edges do not.
        return "\n".join(line.rstrip() for line in body.strip("\n").split("\n")).strip("\n")
    return body.strip()
