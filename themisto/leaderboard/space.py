"""The static Hugging Face Space: `index.html` (sortable tables per task and context mode, the plot, the release hash
and date) and a README with `sdk: static`. Self-contained: no CDN, no fonts, the plot and favicon as data URIs, and a
Content-Security-Policy that lets nothing load from the network and no script run but the page's own sorter.
Every string that comes from a submission is HTML-escaped."""

from __future__ import annotations

import base64
import hashlib
from html import escape

from themisto.leaderboard.board import Board
from themisto.leaderboard.tables import Row, Table, column_label, fmt, unanswered

SPACE_README = """---
title: Themisto Leaderboard
emoji: 📓
colorFrom: indigo
colorTo: gray
sdk: static
app_file: index.html
pinned: false
---

The Themisto leaderboard: models scored on next-cell and cell-output prediction from Jupyter development
trajectories, with and without runtime context. Every score is re-computed by the board from submitted predictions.
Release `{release}`.
"""

_FAVICON = ("data:image/svg+xml;base64," + base64.b64encode(
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><circle cx="8" cy="8" r="7" fill="#3b4cca"/>'
    b'</svg>').decode())

# Sorts a table by the clicked column: numbers by data-v (missing last), text by locale; a second click reverses.
_SCRIPT = """
document.querySelectorAll("table.board").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, index) {
    th.addEventListener("click", function () {
      var numeric = th.dataset.type === "num";
      var ascending = th.getAttribute("aria-sort") === "descending" ||
        (th.getAttribute("aria-sort") !== "ascending" && !numeric);
      table.querySelectorAll("thead th").forEach(function (other) { other.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[index].dataset.v, y = b.cells[index].dataset.v;
        if (numeric) {
          x = x === "" ? NaN : parseFloat(x); y = y === "" ? NaN : parseFloat(y);
          if (isNaN(x) || isNaN(y)) { return isNaN(x) - isNaN(y); }
          return ascending ? x - y : y - x;
        }
        return ascending ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 90rem;
       padding: 0 1rem; color: #1d1d1f; }
table.board { border-collapse: collapse; margin: 0.5rem 0 2rem; font-size: 0.9rem; }
table.board th, table.board td { border-bottom: 1px solid #ddd; padding: 0.3rem 0.6rem; text-align: right; }
table.board th { cursor: pointer; background: #f4f4f8; user-select: none; }
table.board th[aria-sort=ascending]::after { content: " ▲"; }
table.board th[aria-sort=descending]::after { content: " ▼"; }
table.board td { white-space: nowrap; }
table.board td.text, table.board th.text { text-align: left; }
table.board td.name { white-space: normal; min-width: 10rem; max-width: 18rem; overflow-wrap: break-word; }
div.scroll { overflow-x: auto; }
tr.baseline td { color: #555; font-style: italic; }
.ci { color: #777; font-size: 0.8em; }
code { font-size: 0.85em; }
img.plot { max-width: 100%; }
"""


def _cell(text: str, sort_value, css: str = "") -> str:
    value = "" if sort_value is None else str(sort_value)
    klass = f' class="{css}"' if css else ""
    return f'<td{klass} data-v="{escape(value)}">{text}</td>'


def _score_cell(value: dict | None, key: str = "mean") -> str:
    if not value or value.get(key) is None:
        return _cell("–", None)
    text = fmt(value, key)
    main, _, interval = text.partition(" ")
    return _cell(f'{escape(main)} <span class="ci">{escape(interval)}</span>', value[key])


def _row_html(rank: int, row: Row, table: Table) -> str:
    cells = [_cell(str(rank), rank), _cell(escape(row.model), row.model, "text name"), _cell(escape(row.kind), row.kind,
                                                                                        "text")]
    cells += [_score_cell(row.values.get(column)) for column in table.columns]
    if table.paired:
        cells += [_score_cell(row.effect, "diff"), _score_cell(row.effect_generated, "diff")]
    cells.append(_cell(unanswered(row), row.answered["unanswered"] if row.answered else None))
    return f'<tr class="{escape(row.kind)}">' + "".join(cells) + "</tr>"


def _table_html(table: Table) -> str:
    heads = ['<th data-type="num">#</th>', '<th class="text" data-type="text">model</th>',
             '<th class="text" data-type="text">kind</th>']
    heads += [f'<th data-type="num">{escape(column_label(c))}</th>' for c in table.columns]
    if table.paired:
        heads += [f'<th data-type="num" title="over every example; a skipped or failed generation scores 0">'
                  f'Δ {escape(table.lead)} vs none, all</th>',
                  f'<th data-type="num" title="over the examples where both modes generated: like with like">'
                  f'Δ {escape(table.lead)} vs none, both generated</th>']
    heads.append('<th data-type="num" title="generations skipped (over the prompt budget) or failed; they score 0">'
                 'skipped or failed</th>')
    rows = "\n".join(_row_html(rank, row, table) for rank, row in enumerate(table.rows, start=1))
    anchor = escape(f"{table.task}-{table.context}")
    return (f'<section id="{anchor}"><h2>{escape(table.task)} · context <code>{escape(table.context)}</code></h2>\n'
            f'<p>Sorted by {escape(table.lead)}; click a column header to sort by it.</p>\n'
            f'<div class="scroll"><table class="board" data-task="{escape(table.task)}" '
            f'data-context="{escape(table.context)}"><thead><tr>{"".join(heads)}</tr></thead>\n<tbody>\n{rows}\n'
            '</tbody></table></div></section>')


def index_html(board: Board, tables: list[Table], plot_png: bytes | None) -> str:
    """The page, whole; its only script is `_SCRIPT`, allowed by hash in the page's Content-Security-Policy."""
    script_hash = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    csp = (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'; "
           "base-uri 'none'; form-action 'none'")
    nav = " · ".join(f'<a href="#{escape(t.task)}-{escape(t.context)}">{escape(t.task)} / {escape(t.context)}</a>'
                     for t in tables)
    parts = ['<!doctype html>', '<html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{escape(csp)}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<title>Themisto leaderboard</title>', f'<link rel="icon" href="{_FAVICON}">',
             f'<style>{_STYLE}</style></head><body>', '<header><h1>Themisto leaderboard</h1>',
             f'<p>Release <code id="release-hash">{escape(board.release_hash)}</code> (built '
             f'<span id="release-date">{escape(board.release_built)}</span>) · board generated '
             f'{escape(board.generated)} · execution scores {"on" if board.executed else "off (text scores only)"}'
             '</p><p>A submission is predictions, never scores: every number here was computed by the board. '
             '<em>(hard)</em> is the subset of examples no model-free baseline gets right; baselines are rows of '
             'their own (in italics); intervals are 95 %; Δ is the paired difference with context <code>none</code> '
             'on the same examples: over all of them (a skipped or failed generation scores 0), and over those '
             'where both modes generated.</p>', f'<nav>{nav}</nav></header><main>']
    parts += [_table_html(table) for table in tables]
    if plot_png:
        data = base64.b64encode(plot_png).decode()
        parts.append('<figure><img class="plot" alt="Each model\'s score per context mode with its 95 % interval, '
                     f'and the paired effect of runtime context" src="data:image/png;base64,{data}"></figure>')
    if board.refused:
        parts.append("<section><h2>Refused submissions</h2><ul>" + "".join(
            f"<li><code>{escape(r.folder)}</code>: {escape(r.reason)}</li>" for r in board.refused) + "</ul></section>")
    if board.notes:
        parts.append("<section><h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in board.notes)
                     + "</ul></section>")
    parts.append(f"</main><script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"


def space_readme(board: Board) -> str:
    """The Space's README.md (`sdk: static`)."""
    return SPACE_README.format(release=board.release_hash)
