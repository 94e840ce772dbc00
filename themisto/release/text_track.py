"""The text track: each task row's fixed prompts as plain text, so that a run needs no Themisto code.

For every context mode whose prompt is fixed before the model runs (`themisto.modes.STATIC_CONTEXT_MODES`: each mode
but probe, whose prompt grows with the model's own probes), the config `<task>_prompts` holds per task row of the
benchmark split (`test`: the only split a Hub run reads; `themisto sft-export` renders training prompts) the user
message of that mode's prompt, beside the row's id and target (`themisto_dataset.PROMPTS`). The release stage renders
nothing itself: generation's one renderer comes in as a `PromptRenderer` (`themisto.generation.prompts.
text_track_renderer`), under a budget in characters so that no model's tokenizer is needed. eval.yaml
(`themisto.release.eval_yaml`) declares one Hub task per (task, mode) over these columns with the renderer's system
message, which Inspect's Hub loader runs with its built-in solvers and scorers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from themisto.modes import STATIC_CONTEXT_MODES
from themisto.vocabulary import BENCHMARK_SPLIT, TASKS


@dataclass(frozen=True)
class PromptRenderer:
    """What the release needs from the prompt renderer: the system message every prompt is sent with, the budget in
    characters, `render(row, task, mode)` giving the user message and whether it fits the budget (a row that does not
    fit even with no history cell keeps its smallest prompt), and each (task, mode) template's sha256."""

    system: str
    budget_chars: int
    render: Callable[[dict, str, str], tuple[str, bool]] = field(repr=False, compare=False)
    templates: dict[str, str] = field(default_factory=dict)  # "<task>/<mode>" -> sha256 of the template text

    def record(self) -> dict:
        """What the build report keeps of it (`settings.text_track`)."""
        return {"budget_chars": self.budget_chars, "modes": list(STATIC_CONTEXT_MODES),
                "template_sha256": dict(sorted(self.templates.items()))}


def prompt_rows(task_rows: dict[str, dict[str, list[dict]]],
                renderer: PromptRenderer) -> tuple[dict[str, dict[str, list[dict]]], list[str]]:
    """The `<task>_prompts` rows of every task config in `task_rows` (config -> split -> rows), of the benchmark
    split, and a note per task where some prompt is over the budget even with no history cell shown."""
    schema = _schema()
    out: dict[str, dict[str, list[dict]]] = {}
    notes = []
    for task in [t for t in TASKS if t in task_rows]:
        over = 0
        config = out.setdefault(schema.prompts_config(task), {})
        for split, rows in task_rows[task].items():
            if split != BENCHMARK_SPLIT:
                continue
            config[split] = []
            for row in rows:
                line = {"id": row["id"], "kernel_id": row["kernel_id"], "step": row["step"], "target": row["target"]}
                for mode in STATIC_CONTEXT_MODES:
                    text, fits = renderer.render(row, task, mode)
                    line[schema.prompt_column(mode)] = text
                    over += not fits
                config[split].append(line)
        if over:
            notes.append(f"{schema.prompts_config(task)}: {over} prompt(s) over the {renderer.budget_chars:,}-"
                         f"character budget even with no history cell shown (the instruction and the cell alone "
                         f"exceed it); each keeps its smallest prompt (no history cell, no variable)")
    return out, notes


def _schema():
    from themisto.release.folder import schema_module

    return schema_module()
