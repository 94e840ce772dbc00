"""pandas DataFrame and Series reprs read back into labels and cells (wrapped blocks, elided rows and footers
included), so two printed frames can be compared cell by cell.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_FRAME_FOOTER_RE = re.compile(r"^\[(\d+) rows x (\d+) columns\]$")
_SERIES_FOOTER_RE = re.compile(r"^(?:(Name: .*?), )?(?:(Freq: \S+), )?(?:Length: (\d+), )?(dtype: \S+)$")
_WRAP_MARK_RE = re.compile(r"\s+\\$")  # pandas marks a frame wrapped into blocks with a trailing backslash
_ELLIPSIS = {"..", "..."}
_NOT_SPACE_RE = re.compile(r"[^ ]")
_ASCII_BITS = bytes(ord("0") if byte == ord(" ") else ord("1") for byte in range(256))


@dataclass
class _Table:
    kind: str  # "DataFrame" or "Series"
    rows: tuple[list[str], list[str]]  # labels before and after the `...` row; both all labels if not truncated
    columns: tuple[list[str], list[str]]  # the same for column labels
    cells: dict[tuple, str]  # (row label, its occurrence, column label, its occurrence) -> cell text
    shape: tuple[int, int] | None
    footer: str  # a Series' name, freq and dtype
    truncated: bool


def _occupied(lines: list[str]) -> str:
    """"1" at each position where some line has a character, "0" where every line is blank (or ends before)."""
    mask = 0
    for line in lines:  # one big-integer OR per line instead of a loop over characters
        if line.isascii():
            bits = line[::-1].encode().translate(_ASCII_BITS).decode()
        else:
            bits = _NOT_SPACE_RE.sub("1", line[::-1]).replace(" ", "0")
        mask |= int(bits or "0", 2)
    return f"{mask:b}"[::-1]


def _parse_block(lines: list[str], with_header: bool) -> tuple[list[str], list[list[str]], int, int] | None:
    """One fixed-width block: column labels, rows of [index label, cells...], and where `...` cut the rows and the
    columns (-1: nowhere); None where the block is not a pandas table.

    pandas right-aligns labels and cells on each column's right edge; columns may be 1 blank apart, cells may hold
    single blanks (dates), the index is left-aligned and 2+ blanks before the first column."""
    header, body = (lines[0], lines[1:]) if with_header else ("", lines)
    if not body:
        return None
    used = _occupied(body) + "00"
    edges: list[int] = []
    labels: list[str] = []
    words: list[str] = []  # the words of a label up to its last
    found = list(re.finditer(r"\S+", header)) if with_header else []
    header_words = [(m.end() - 1, m[0]) for m in found] if with_header else [(len(used) - 3, "")]
    longest = max(len(word) for _, word in header_words)
    limits = [m.start() - 2 for m in found[1:]] + [len(used)]  # a column ends 2+ before the next label
    for (end, word), limit in zip(header_words, limits):
        words.append(word)
        # A column ends where the next position is blank on every row; pandas pads labels to the longest one
        # before right-aligning them, so a short label may end up to that many positions left of its cells.
        last = min(end + longest - len(word), limit)
        edge = next((p for p in range(end, last + 1) if used[p + 1:p + 2] == "0"), None)
        if edge is not None and (not edges or edge > edges[-1]):
            edges.append(edge)
            labels.append(" ".join(words))
            words = []
    if words or not edges:
        return None  # header words with no cells under them
    gap = used.rfind("00", 0, edges[0])
    start = gap + 1 if gap >= 1 else used.find("0", 1, edges[0])  # a date first column is 1 blank after the index
    if start < 1:
        return None
    rows: list[list[str]] = []
    row_cut = col_cut = -1
    for line in body:
        row = [line[:start].strip()] + [line[a + 1:b + 1].strip() for a, b in zip([start - 1, *edges], edges)]
        if all(cell in _ELLIPSIS or not cell for cell in row):
            row_cut = len(rows)
        elif not any(row[1:]):
            continue  # the index name
        elif not row[0] or len(line.rstrip()) > edges[-1] + 1:
            return None  # a row without a label, or text past the last column: not a pandas table
        else:
            rows.append(row)
    for j in range(len(labels) - 1, -1, -1):
        cells = [row[j + 1] for row in rows]
        if labels[j] in _ELLIPSIS and all(cell in _ELLIPSIS for cell in cells):
            col_cut = j
        elif j + 1 < len(labels) and not any(cells):
            labels[j + 1] = f"{labels[j]} {labels[j + 1]}"  # a word of a longer label over short cells
        else:
            continue
        del labels[j]
        for row in rows:
            del row[j + 1]
    return labels, rows, row_cut, col_cut


def _split(labels: list[str], cut: int) -> tuple[list[str], list[str]]:
    return (labels, labels) if cut < 0 else (labels[:cut], labels[cut:])


def parse_table(text: str) -> _Table | None:
    """A pandas DataFrame or Series repr as its visible cells, or None where the text is not one."""
    lines = text.split("\n")
    frame_footer = _FRAME_FOOTER_RE.match(lines[-1])
    series_footer = _SERIES_FOOTER_RE.match(lines[-1])
    shape, footer = None, ""
    if frame_footer and len(lines) >= 4 and not lines[-2].strip():
        kind, body, shape = "DataFrame", lines[:-2], (int(frame_footer[1]), int(frame_footer[2]))
    elif series_footer:
        kind, body, footer = "Series", lines[:-1], ", ".join(filter(None, series_footer.group(1, 2, 4)))
        shape = (int(series_footer[3]), 1) if series_footer[3] else None
    else:
        kind, body = "DataFrame", lines
    blocks: list[list[str]] = [[]]  # a wide frame may be wrapped into blocks of columns
    for line in body:
        if line.strip():
            blocks[-1].append(_WRAP_MARK_RE.sub("", line) if kind == "DataFrame" else line)
        elif blocks[-1]:
            blocks.append([])
    if kind == "Series" and len(blocks) > 1:
        return None
    columns: list[str] = []
    cells: dict[tuple, str] = {}
    row_labels: list[str] = []
    row_cut = col_cut = -1
    for block in filter(None, blocks):
        parsed = _parse_block(block, with_header=kind == "DataFrame")
        if parsed is None or (row_labels and [row[0] for row in parsed[1]] != row_labels):
            return None
        labels, rows, row_cut, block_col_cut = parsed
        col_cut = len(columns) + block_col_cut if block_col_cut >= 0 else col_cut
        row_labels = [row[0] for row in rows]
        for key, cell in _keyed(rows, labels):
            cells[key] = cell
        columns += labels
    if not cells:
        return None
    truncated = row_cut >= 0 or col_cut >= 0
    if shape is None and not truncated:
        shape = (len(row_labels), len(columns) if kind == "DataFrame" else 1)
    return _Table(kind, _split(row_labels, row_cut), _split(columns, col_cut), cells, shape, footer, truncated)


def _keyed(rows: list[list[str]], labels: list[str]):
    """Each cell keyed by its row and column labels and their occurrence, so repeated labels stay apart."""
    row_seen: Counter = Counter()
    for row in rows:
        row_seen[row[0]] += 1
        col_seen: Counter = Counter()
        for label, cell in zip(labels, row[1:]):
            col_seen[label] += 1
            yield (row[0], row_seen[row[0]], label, col_seen[label]), cell


def aligned(a: tuple[list[str], list[str]], b: tuple[list[str], list[str]]) -> bool:
    """Labels before the cut agree as far as both show them, and so do those after it, counted from the end."""
    head, tail = min(len(a[0]), len(b[0])), min(len(a[1]), len(b[1]))
    return a[0][:head] == b[0][:head] and a[1][len(a[1]) - tail:] == b[1][len(b[1]) - tail:]
