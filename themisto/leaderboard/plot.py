"""The board's PNG: per task, each model's lead score per context mode with its 95 % interval (baselines as dashed
lines), and beside it the paired effect of runtime context (context − none on the same examples)."""

from __future__ import annotations

import io

from themisto.leaderboard.tables import Table
from themisto.vocabulary import CONTEXT_MODES

_MARKERS = {"none": "o", "variables": "s", "full": "D", "probe": "^"}
_COLORS = {"none": "#4c72b0", "variables": "#dd8452", "full": "#55a868", "probe": "#c44e52"}


def _models(tables: list[Table]) -> list[str]:
    names: list[str] = []
    for table in tables:
        for row in table.rows:
            if row.kind == "model" and row.model not in names:
                names.append(row.model)
    return names


def _short(name: str, limit: int = 28) -> str:
    name = name if len(name) <= limit else name[: limit - 1] + "…"
    return name.replace("$", r"\$")  # a submitted name is text, never mathtext


def _label(ax, context: str) -> str | None:
    """The legend label for a context's first point on this axis only."""
    return None if context in ax.get_legend_handles_labels()[1] else context


def _intervals(ax, tables: list[Table], models: list[str], pick, centre: str) -> None:
    """One point with its interval per model and table (a context), side by side within each model's slot;
    `pick(table, row)` gives the {centre, low, high} dict to draw, or None."""
    width = 0.8 / max(len(tables), 1)
    for k, table in enumerate(tables):
        rows = {r.model: r for r in table.rows}
        for i, model in enumerate(models):
            value = pick(table, rows[model]) if model in rows else None
            if not value or value.get(centre) is None:
                continue
            x = i - 0.4 + width * (k + 0.5)
            err = [[value[centre] - value["low"]], [value["high"] - value[centre]]]
            ax.errorbar(x, value[centre], yerr=err, fmt=_MARKERS.get(table.context, "o"), capsize=3,
                        color=_COLORS.get(table.context, "gray"), label=_label(ax, table.context))


def _scores_axis(ax, task: str, tables: list[Table], models: list[str]) -> None:
    _intervals(ax, tables, models, lambda table, row: row.values.get(f"{table.lead}/all"), "mean")
    levels: dict[float, list[str]] = {}  # baselines with the same score share one line and one label
    for row in tables[0].rows if tables else []:
        value = row.values.get(f"{tables[0].lead}/all")
        if row.kind == "baseline" and value and value.get("mean") is not None:
            levels.setdefault(round(value["mean"], 6), []).append(_short(row.model, 20))
    for level, names in levels.items():
        ax.axhline(level, linestyle="--", linewidth=0.8, color="gray")
        ax.annotate("baseline " + ", ".join(names), (max(len(models), 1) - 0.45, level), fontsize=7, ha="right",
                    va="bottom", color="dimgray")
    ax.set_xticks(range(len(models)), [_short(m) for m in models], rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
    ax.set_ylabel(tables[0].lead if tables else "score")
    ax.set_title(f"{task}: score per context mode (95 % interval)", fontsize=10)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8, title="context", title_fontsize=8)


def _effect_axis(ax, task: str, tables: list[Table], models: list[str]) -> None:
    _intervals(ax, [t for t in tables if t.paired], models, lambda table, row: row.effect, "diff")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(models)), [_short(m) for m in models], rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
    ax.set_ylabel(f"Δ {tables[0].lead if tables else 'score'} vs none")
    ax.set_title(f"{task}: paired effect of runtime context", fontsize=10)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8, title="context", title_fontsize=8)


def plot_png(tables: list[Table]) -> bytes:
    """The plot as PNG bytes (matplotlib's Agg backend: no display needed)."""
    from matplotlib.figure import Figure

    tasks = sorted({t.task for t in tables})
    figure = Figure(figsize=(11, 3.8 * max(len(tasks), 1)), dpi=100, layout="constrained")
    axes = figure.subplots(max(len(tasks), 1), 2, squeeze=False)
    for line, task in zip(axes, tasks):
        task_tables = sorted((t for t in tables if t.task == task),
                             key=lambda t: CONTEXT_MODES.index(t.context) if t.context in CONTEXT_MODES else 99)
        models = _models(task_tables)
        _scores_axis(line[0], task, task_tables, models)
        _effect_axis(line[1], task, task_tables, models)
        if not models:
            for ax in line:
                ax.text(0.5, 0.5, "no model submitted yet (baselines only)", transform=ax.transAxes, ha="center",
                        color="dimgray")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")  # Figure without pyplot draws with Agg
    return buffer.getvalue()
