"""The `probe` context mode's protocol: its settings, the rule the prompt states, the fenced-block text protocol any
model can follow, the native tool's schema, the replies a model gets back, and the transcript on a generation line.

A probe is a short piece of model-written code run in a fresh branch of the exact pre-cell state (see
`themisto.generation.probing`); its printed output, result or error comes back bounded. The texts below are part of
the probe template (`themisto.generation.prompts.PROMPT_TEMPLATES`), so its sha256 changes with any of them, and
run.json records the settings, the tool schema and the rule as it was sent.

>>> find_probe("Let me look first.\\n```probe\\ndf.dtypes\\n```\\n")
'df.dtypes'
>>> find_probe("```python\\nprint(1)\\n```") is None
True
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from themisto.errors import InputError
from themisto.vocabulary import OUTCOMES, PROBE_PROTOCOLS, PROBE_STOPS

TOOL_NAME = "run_probe"
PROBE_TAG = "probe"  # the info string of a text-protocol probe block: ```probe
# A probe longer than this is not run (its reply says so): a probe is a question, not a program.
MAX_PROBE_CODE_CHARS = 4_000


class ProbeSettingsError(InputError):
    """Probe settings out of range, or a protocol the backend cannot speak: `field` (its dotted path in an example
    spec, e.g. `probe.max_probes`) given `value` cannot be taken, `why`; the message names the option as `themisto
    generate` spells it, and another front end may name it its own way."""

    def __init__(self, field: str, value, why: str, option: str):
        super().__init__(f"--{option} {value}: {why}")
        self.field, self.value, self.why = field, value, why


@dataclass(frozen=True)
class ProbeSettings:
    """How a `probe` run lets a model probe: how many probes, how much of each one's output comes back and how long
    each may run, the branch's own memory cap, and the protocol (`text`: a fenced block; `native`: tool calls)."""

    max_probes: int = 4
    output_chars: int = 2_000
    timeout_s: float = 5.0
    memory_bytes: int = 2**30
    protocol: str = "text"

    def __post_init__(self) -> None:
        if not 0 <= self.max_probes <= 64:
            raise ProbeSettingsError("probe.max_probes", self.max_probes, "must be between 0 and 64", "probes")
        if not 100 <= self.output_chars <= 100_000:
            raise ProbeSettingsError("probe.output_chars", self.output_chars,
                                     "a probe's output must be 100-100,000 characters", "probe-chars")
        if not 0.1 <= self.timeout_s <= 600:
            raise ProbeSettingsError("probe.timeout_s", self.timeout_s, "a probe's time must be 0.1-600 s",
                                     "probe-timeout")
        if self.protocol not in PROBE_PROTOCOLS:
            raise ProbeSettingsError("probe.protocol", self.protocol,
                                     f"expected one of {', '.join(PROBE_PROTOCOLS)}", "probe-protocol")

    def to_dict(self) -> dict:
        return asdict(self)

    def record(self) -> dict:
        """What run.json records: the settings, the tool schema, and the rule as the prompt states it."""
        return {**self.to_dict(), "tool": TOOL_SCHEMA, "rule": probe_rule(self)}


TOOL_SCHEMA: dict = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": ("Run a short piece of Python (an expression or a few lines) in a copy of the notebook "
                        "kernel's current state, the state right before the next cell; returns what it printed, the "
                        "value of its last expression, or its error. The kernel itself never changes."),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python code to run, e.g. df.dtypes"}},
            "required": ["code"],
        },
    },
}

_RULE_HEAD = ("Before you answer you may query the live kernel, which holds the state right before the next cell. "
              "Each probe is an expression or a few lines of Python; it runs in a copy of that state (nothing it "
              "does changes the kernel or what the next probe sees), and you get back what it printed, the value of "
              "its last expression, or its error, cut to {output_chars} characters and {timeout_s:g} seconds. You "
              "may run up to {max_probes} probes, one at a time.")
_RULE_HOW = {
    "text": ("To run a probe, reply with one fenced block tagged probe and nothing else, for example:\n"
             "```probe\ndf.dtypes\n```"),
    "native": f"To run a probe, call the `{TOOL_NAME}` tool with the code.",
}
_RULE_TAIL = "When you have seen enough, give your answer as asked below, not in a probe."
REPLY = "Probe {number} {facts}:\n```\n{output}\n```\n{left}"
NO_PROBES_LEFT = "No probes left: now give your answer as asked."
NO_ROOM = "No room is left in the prompt for another probe's output: now give your answer as asked."
# What a probe's output says of how it ended, where it did not end by itself.
STOPPED = "\n(stopped: it ran past {timeout_s:g} s)"
DIED = "\n(its branch died: nothing more came back)"
CUT = "\n... ({more:,} more characters cut)"
NOT_RUN = "(not run: a probe may have {limit:,} characters, this one has {length:,})"
KERNEL_LOST = "(the probe took its kernel down: {error}; the state was rebuilt)"


def probe_rule(settings: ProbeSettings) -> str:
    """The rule the probe prompt states, for these settings."""
    head = _RULE_HEAD.format(output_chars=settings.output_chars, timeout_s=settings.timeout_s,
                             max_probes=settings.max_probes)
    return f"{head} {_RULE_HOW[settings.protocol]}\n{_RULE_TAIL}"


def protocol_text() -> str:
    """Every fixed text of the protocol (the rule for each protocol, the reply a probe gets), for the template."""
    rules = "\n".join(f"{name}: {_RULE_HEAD} {how} {_RULE_TAIL}" for name, how in _RULE_HOW.items())
    notes = " | ".join((STOPPED, DIED, CUT, NOT_RUN, KERNEL_LOST)).replace("\n", " ")
    return (f"{rules}\nreply: {REPLY}\nlast: {NO_PROBES_LEFT}\nno room: {NO_ROOM}\nnotes: {notes}\n"
            f"tool: {json.dumps(TOOL_SCHEMA, sort_keys=True)}")


# ---------------------------------------------------------------------------------------------------------------
# The text protocol: a fenced block tagged `probe`

_THINK = re.compile(r"<think>.*?(</think>|\Z)", re.S)
_PROBE_FENCE = re.compile(rf"(?m)^[ \t]*(`{{3,}}|~{{3,}})[ \t]*{PROBE_TAG}[ \t]*\n")


def find_probe(raw: str) -> str | None:
    """The code of the first fenced block tagged `probe` in a reply (an unclosed one, cut by the token limit, runs
    to the end); None when the reply asks for no probe. Blocks inside `<think>` do not count."""
    text = _THINK.sub("", raw or "")
    match = _PROBE_FENCE.search(text)
    if match is None:
        return None
    fence = match.group(1)
    rest = text[match.end():]
    close = re.search(rf"(?m)^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", rest)
    return (rest[:close.start()] if close else rest).strip("\n")


def without_probes(raw: str) -> str:
    """A reply with its probe blocks taken out, so that the answer is read from what is left."""
    text = raw or ""
    while True:
        match = _PROBE_FENCE.search(text)
        if match is None:
            return text
        fence = match.group(1)
        close = re.search(rf"(?m)^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*(\n|\Z)", text[match.end():])
        text = text[:match.start()] + (text[match.end() + close.end():] if close else "")


def tool_call_code(arguments: Any) -> str | None:
    """The code of a native `run_probe` call from its arguments (a JSON string or an object); None if it has none."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return code if isinstance(code, str) else None


# ---------------------------------------------------------------------------------------------------------------
# What a probe did, as the model sees it and as its generation line records it


@dataclass
class ProbeRun:
    """One probe: the code, how it ended (a cell status, or `refused`: not run), what came back to the model (bounded;
    `truncated` when cut), whether it changed the state of its own branch (never the kernel's), its own run time and
    the whole probe's until its answer came back, what its branch's monitor flagged, and the raw reply that asked
    for it. Whether it changed its state and what the monitor flagged come after the answer (`StateProbes.settle`
    in themisto.generation.probing fills them in)."""

    code: str
    status: str
    output: str
    truncated: bool = False
    changed_state: bool | None = None
    duration_s: float = 0.0
    wall_s: float = 0.0
    suspicious: list[str] = field(default_factory=list)
    raw: str = ""

    def reply(self, number: int, left: int) -> str:
        """The text the model gets back for this probe (a user message, or a tool message's content)."""
        # Whether it changed its copy of the state is not among them: the rule says that nothing a probe does is
        # kept, and the check comes after the answer (themisto.runtime.agent.ahead), for the record only.
        facts = [self.status if self.status != "ok" else "ran", f"{self.duration_s:.2f} s"]
        if self.truncated:
            facts.append("output cut")
        remaining = f"{left} probe{'s' if left != 1 else ''} left." if left else NO_PROBES_LEFT
        return REPLY.format(number=number, facts=f"({', '.join(facts)})", output=self.output, left=remaining)


@dataclass(frozen=True)
class Transcript:
    """A probe-mode generation's probing, on its generation line (`probes`): the protocol, probes allowed and used,
    why the conversation stopped, the model calls it took, each probe, and the seconds the probes took in all."""

    protocol: str
    allowed: int
    used: int
    stop: str
    turns: int
    probes: list[ProbeRun] = field(default_factory=list)
    probe_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def problem(value: object) -> str | None:
        """What is wrong with a generation line's `probes` (read back from a file someone wrote), or None when it is
        null or this record's shape: known fields with the right types, counts that agree."""
        if value is None:
            return None
        names = {f.name for f in fields(Transcript)}
        if not isinstance(value, dict) or not set(value) <= names:
            return "`probes` is not a probe transcript"
        counts = [value.get(k) for k in ("allowed", "used", "turns")]
        if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 10_000 for c in counts):
            return "`probes` has counts that are not small non-negative integers"
        if value.get("protocol") not in PROBE_PROTOCOLS or value.get("stop") not in PROBE_STOPS:
            return f"`probes` has protocol {str(value.get('protocol'))[:20]!r} or stop {str(value.get('stop'))[:20]!r}"
        probes = value.get("probes", [])
        if not isinstance(probes, list) or len(probes) != value["used"] or value["used"] > value["allowed"]:
            return "`probes` lists another number of probes than it says it used (or more than allowed)"
        for probe in probes:
            if not (isinstance(probe, dict) and set(probe) <= {f.name for f in fields(ProbeRun)}
                    and isinstance(probe.get("code"), str) and isinstance(probe.get("output"), str)
                    and probe.get("status") in OUTCOMES):
                return "`probes` holds a probe that is not a probe record"
        return None
