"""The board as tables: one per task and context mode, models and model-free baselines as rows, each metric's
overall and hard-subset score with its interval, and the paired effect of runtime context (over every example, skips
scored 0, and over the examples both modes generated); written as Markdown, CSV and JSON (each whole, or not at
all)."""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import asdict, dataclass, field

from themisto.leaderboard.board import Board
from themisto.scoring.results_table import paired_examples
from themisto.vocabulary import BASELINE_CONTEXT, CONTEXT_MODES, SUBSETS

# The metric a table leads with and sorts by, first one present (functional match needs the execution opt-in).
LEAD_METRICS: dict[str, tuple[str, ...]] = {"next_cell": ("continuation_match", "functional_match", "exact_match"),
                                            "output_prediction": ("output_equivalent", "exact_match")}
METRIC_ORDER: tuple[str, ...] = ("continuation_match", "functional_match", "output_equivalent", "exact_match",
                                 "rouge_l", "chrf")


@dataclass
class Row:
    """One model (or baseline) in one task × context table."""

    model: str
    kind: str  # "model" | "baseline"
    backend: str
    source: str  # the submission folder, or "computed by the board" for a baseline the board ran itself
    values: dict[str, dict] = field(default_factory=dict)  # "metric/subset" -> {mean, low, high, n}
    # The lead metric's paired difference vs context "none", {diff, low, high, n}: over every example (a skipped or
    # failed generation scored 0), and over the examples both modes generated (like with like; with `unanswered`).
    effect: dict | None = None
    effect_generated: dict | None = None
    answered: dict | None = None  # {generations, unanswered}: skipped or failed generations score 0


@dataclass
class Table:
    """The rows of one task and context mode, best first by the lead metric."""

    task: str
    context: str
    lead: str
    columns: list[str]  # "metric/subset", in display order
    rows: list[Row]

    @property
    def paired(self) -> bool:
        """Whether the table shows the paired effect against the baseline mode (every table but the baseline's; a
        submission's mode is a name the board may not know, so it is not looked up)."""
        return self.context != BASELINE_CONTEXT


def column_label(column: str) -> str:
    metric, subset = column.split("/")
    return metric + (" (hard)" if subset == "hard" else "")


def _columns(found: set[tuple[str, str]]) -> list[str]:
    metrics = [m for m in METRIC_ORDER if any(f[0] == m for f in found)]
    metrics += sorted({m for m, _ in found} - set(metrics))
    return [f"{m}/{s}" for m in metrics for s in SUBSETS if (m, s) in found]


def _value(score: dict) -> dict:
    return {k: score.get(k) for k in ("mean", "low", "high", "n")}


def _lead(task: str, found: set[tuple[str, str]]) -> str:
    return next((m for m in LEAD_METRICS.get(task, ()) if (m, "all") in found), "exact_match")


def build_tables(board: Board) -> list[Table]:
    """One table per (task, context mode) that some entry covers; baselines repeat in each context's table."""
    tables = []
    keys = sorted({(e.task, c) for e in board.entries for c in e.contexts},
                  key=lambda k: (k[0], CONTEXT_MODES.index(k[1]) if k[1] in CONTEXT_MODES else 99, k[1]))
    for task, context in keys:
        entries = [e for e in board.entries if e.task == task and context in e.contexts]
        rows = [Row(e.model, e.kind, e.backend, e.folder, answered=e.answered.get(context)) for e in entries]
        for row, entry in zip(rows, entries):
            for score in entry.results.get("scores", []):
                if score.get("task", task) == task and score.get("context") == context:
                    row.values[f"{score['metric']}/{score['subset']}"] = _value(score)
        submitted_baselines = {e.model for e in board.entries if e.task == task and e.kind == "baseline"}
        computed: dict[str, Row] = {}
        for score in board.baselines.get(task, []):
            if score.get("baseline") in submitted_baselines:
                continue  # the submitted run of the same baseline is its row
            row = computed.setdefault(score["baseline"], Row(score["baseline"], "baseline", "baseline",
                                                             "computed by the board"))
            row.values[f"{score['metric']}/{score['subset']}"] = _value(score)
        rows += computed.values()
        found = {tuple(column.split("/")) for row in rows for column in row.values}
        lead = _lead(task, found)
        for row, entry in zip(rows, entries):  # the submitted rows come first; computed baselines have no pairs
            row.effect = _effect(entry.results, task, context, lead, "all")
            row.effect_generated = _effect(entry.results, task, context, lead, "both_generated")
        rows.sort(key=lambda r: (-(r.values.get(f"{lead}/all", {}).get("mean") or 0.0), r.kind, r.model))
        tables.append(Table(task, context, lead, _columns(found), rows))
    return tables


def _effect(results: dict, task: str, context: str, metric: str, examples: str) -> dict | None:
    for p in results.get("paired", []):
        if (p.get("task", task) == task and p.get("context") == context and p.get("metric") == metric
                and p.get("subset") == "all" and p.get("versus") == BASELINE_CONTEXT
                and paired_examples(p) == examples):
            # The contract names the difference `diff`; run_scores writes it as `mean`: read either.
            effect = {"diff": p.get("diff", p.get("mean")), "low": p.get("low"), "high": p.get("high"),
                      "n": p.get("n")}
            if "unanswered" in p:
                effect["unanswered"] = p["unanswered"]
            return effect
    return None


def fmt(value: dict | None, key: str = "mean") -> str:
    """`0.123 [0.100, 0.150]`, or an en dash when there is no value."""
    if not value or value.get(key) is None:
        return "–"
    low, high = value.get("low"), value.get("high")
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{value[key]:+.3f}{interval}" if key == "diff" else f"{value[key]:.3f}{interval}"


def unanswered(row: Row) -> str:
    """`3/88`: generations skipped (over the prompt budget) or failed, of all; an en dash for the board's baselines."""
    return f"{row.answered['unanswered']}/{row.answered['generations']}" if row.answered else "–"


def _md_text(text: str) -> str:
    # Markdown on the Hub renders inline HTML: a submitted name must stay text, and a pipe must not split the cell.
    return html.escape(text).replace("|", "&#124;").replace("`", "&#96;").replace("\n", " ")


def to_markdown(board: Board, tables: list[Table]) -> str:
    """leaderboard.md: the release, then one table per task and context mode, refusals and notes."""
    lines = ["# Themisto leaderboard", "",
             f"Release `{board.release_hash}` (built {board.release_built}); board generated {board.generated}; "
             f"execution scores {'on' if board.executed else 'off (text scores only)'}.",
             "Every score below was computed by the board from the submitted predictions; `(hard)` is the subset "
             "of examples no model-free baseline gets right; intervals are 95 %."]
    for table in tables:
        head = (["#", "model", "kind"] + [column_label(c) for c in table.columns]
                + [f"Δ {table.lead} vs none, all (skips as 0)", f"Δ {table.lead} vs none, both generated (n)",
                   "skipped or failed"])
        lines += ["", f"## {table.task} · context `{table.context}` (sorted by {table.lead})", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for rank, row in enumerate(table.rows, start=1):
            cells = [str(rank), _md_text(row.model), row.kind] + [fmt(row.values.get(c)) for c in table.columns]
            both = row.effect_generated
            paired = table.paired
            cells += [fmt(row.effect, "diff") if paired else "–",
                      f"{fmt(both, 'diff')} (n={both['n']})" if paired and both else "–",
                      unanswered(row)]
            lines.append("| " + " | ".join(cells) + " |")
    if board.refused:
        lines += ["", "## Refused", ""] + [f"- `{_md_text(r.folder)}`: {_md_text(r.reason)}" for r in board.refused]
    if board.notes:
        lines += ["", "## Notes", ""] + [f"- {_md_text(n)}" for n in board.notes]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("task", "context", "model", "kind", "backend", "metric", "subset", "mean", "low", "high", "n",
              "diff_vs_none", "diff_low", "diff_high", "diff_both_generated", "diff_both_low", "diff_both_high",
              "n_both_generated", "generations", "skipped_or_failed")


def _csv_text(text: str) -> str:
    # A cell starting with = + - @ is a formula to a spreadsheet; a submitted name must not run as one.
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def to_csv(tables: list[Table]) -> str:
    """leaderboard.csv: one line per task, context, model, metric and subset (long format)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for table in tables:
        for row in table.rows:
            for column in table.columns:
                value = row.values.get(column)
                if not value:
                    continue
                metric, subset = column.split("/")
                lead = metric == table.lead and subset == "all"
                effect = (row.effect if lead else None) or {}
                both = (row.effect_generated if lead else None) or {}
                writer.writerow([table.task, table.context, _csv_text(row.model), row.kind, _csv_text(row.backend),
                                 metric, subset, value["mean"], value["low"], value["high"], value["n"],
                                 effect.get("diff"), effect.get("low"), effect.get("high"),
                                 both.get("diff"), both.get("low"), both.get("high"), both.get("n"),
                                 *((row.answered or {}).get(k) for k in ("generations", "unanswered"))])
    return out.getvalue()


def to_json(board: Board, tables: list[Table]) -> str:
    """leaderboard.json: the tables, the submissions (with what was ignored), refusals and notes."""
    data = {"format": 1, "release": {"content_hash": board.release_hash, "built": board.release_built},
            "generated": board.generated, "executed": board.executed,
            "tables": [asdict(t) for t in tables],
            "submissions": [{"folder": e.folder, "model": e.model, "backend": e.backend, "task": e.task,
                             "contexts": e.contexts, "kind": e.kind, "predictions_sha256": e.predictions_sha256,
                             "scores_from_cache": e.cached, "ignored": e.ignored, "submitter": e.submitter,
                             "link": e.link, "interval": e.results.get("interval")} for e in board.entries],
            "refused": [asdict(r) for r in board.refused], "notes": board.notes}
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
