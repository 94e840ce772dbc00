"""The example spec: which examples a front end takes and how their prompts are rendered (tasks, context modes, split,
limit, prompt budget, the probe and delta modes' settings), checked once, with the probe mode's budget rule.

`themisto generate` (`RunSettings`), the Inspect tasks (`HarnessSettings`), `themisto sft-export` and the study hold
or check one; each front end keeps only its own settings beside it. A refusal names the option as the front end that
was given it spells it (`Spelling`): `--limit 0` on the command line, `-T limit=0` in Inspect.

>>> ExampleSpec(tasks=("next_cell",), contexts=("none",)).task
'next_cell'
>>> try:
...     ExampleSpec(limit=0)
... except ExampleSpecError as refused:
...     print(refused)
--limit 0: must be at least 1
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from themisto.errors import InputError
from themisto.generation.delta import DeltaSettings
from themisto.generation.probe_protocol import ProbeSettings
from themisto.generation.probing import reserve_tokens
from themisto.vocabulary import BENCHMARK_SPLIT, CONTEXT_MODES, DEFAULT_CONTEXT_MODES, RUN_SPLITS, TASKS


class ExampleSpecError(InputError):
    """A task, context mode, split, limit or prompt budget that no front end can take; the message names the option
    as the front end spells it."""


@dataclass(frozen=True)
class Spelling:
    """How one front end spells the spec's fields in a refusal: `form` joins an option's name and its value, `names`
    gives each field's option name (the field's own name where it has none), `error` is the front end's exception."""

    form: str
    names: Mapping[str, str]
    error: type[InputError] = ExampleSpecError

    def option(self, name: str, value) -> str:
        """`name` (a field of the spec) given `value`, as the front end writes it."""
        shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
        return self.form.format(name=self.names.get(name, name), value=shown).strip()


# The command line's options: `themisto generate --limit 4 --context none variables`.
COMMAND_LINE = Spelling("--{name} {value}", {"tasks": "task", "contexts": "context",
                                             "max_prompt_tokens": "max-prompt-tokens"})


@dataclass(frozen=True)
class ExampleSpec:
    """Which examples (tasks, split, `limit` of them evenly spread) in which context modes, the prompt budget (None:
    the model's context less its new tokens, where there is a model), and the probe and delta modes' settings."""

    tasks: tuple[str, ...] = TASKS
    contexts: tuple[str, ...] = DEFAULT_CONTEXT_MODES
    split: str = BENCHMARK_SPLIT  # `themisto.vocabulary.RUN_SPLITS`; only a `test` run is a submission
    limit: int | None = None
    max_prompt_tokens: int | None = None
    probe: ProbeSettings = field(default_factory=ProbeSettings)  # the `probe` mode's settings (recorded with it)
    delta: DeltaSettings = field(default_factory=DeltaSettings)  # the `delta` mode's settings (recorded with it)
    # How the refusals name the options: not part of what the spec selects.
    spelling: Spelling = field(default=COMMAND_LINE, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.tasks or any(task not in TASKS for task in self.tasks) or len(set(self.tasks)) != len(self.tasks):
            raise self.refused("tasks", self.tasks, f"tasks must be distinct names from {', '.join(TASKS)}")
        contexts = self.contexts
        if not contexts or any(c not in CONTEXT_MODES for c in contexts) or len(set(contexts)) != len(contexts):
            raise self.refused("contexts", contexts, f"context modes must be distinct names from "
                                                     f"{', '.join(CONTEXT_MODES)}")
        if self.split not in RUN_SPLITS:
            raise self.refused("split", self.split, f"expected one of {', '.join(RUN_SPLITS)}")
        for name in ("limit", "max_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise self.refused(name, value, "must be at least 1")

    def refused(self, name: str, value, why: str) -> InputError:
        """The front end's error for the field `name` given `value`, named as the front end spells it."""
        return self.spelling.error(f"{self.spelling.option(name, value)}: {why}")

    @property
    def task(self) -> str:
        """The one task of a spec that has one (a run folder and an Inspect task are each of one task)."""
        if len(self.tasks) != 1:
            raise self.refused("tasks", self.tasks, "give one task")
        return self.tasks[0]

    @property
    def context(self) -> str:
        """The one context mode of a spec that has one (an Inspect task runs in one)."""
        if len(self.contexts) != 1:
            raise self.refused("contexts", self.contexts, "give one context mode")
        return self.contexts[0]

    def first_probe_budget(self, max_new_tokens: int, count_tokens: Callable[[str], int],
                           budget: int | None = None) -> int | None:
        """The budget of a probe conversation's first prompt: the prompt budget (the spec's, else `budget`) less the
        room its probes' requests and replies may take (`reserve_tokens`), which is at most half of it; None where
        there is no budget."""
        budget = self.max_prompt_tokens if self.max_prompt_tokens is not None else budget
        if not budget:
            return None
        # Half at most: with many long probes the reserve alone would leave no room for the example itself.
        return budget - min(budget // 2, reserve_tokens(self.probe, max_new_tokens, count_tokens))


DEFAULT_SPEC = ExampleSpec()  # the defaults every front end's options take (the Inspect tasks' keywords among them)

__all__ = ["COMMAND_LINE", "DEFAULT_SPEC", "ExampleSpec", "ExampleSpecError", "Spelling"]
