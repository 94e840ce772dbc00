"""Output equivalence: whether a predicted or replayed output text says the same as the reference output text.

Rules, tried in this order; the first that finds the texts equal decides, and a rule that applies but finds a
difference gives the reason: `exact` (after whitespace normalisation), `numbers` (every number within tolerance),
`table` (pandas DataFrame/Series reprs cell by cell), `error` (same exception and normalised message) and `image`
(images of the same kind, whatever their size). Nothing here raises on odd input.

>>> outputs_equivalent("0.30000000000000004", "0.3")
Verdict(equal=True, rule='numbers', reason='1 number(s) agree within tolerance')
>>> outputs_equivalent("3", "4").equal
False
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from themisto.scoring.frame_text import aligned, parse_table
from themisto.scoring.text_scores import clip, normalize_whitespace

__all__ = ["Verdict", "outputs_equivalent", "image_placeholder"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison: whether the outputs are equivalent, the rule that decided, and why."""

    equal: bool
    rule: str  # exact | numbers | table | error | image | none | invalid
    reason: str


@dataclass(frozen=True)
class _Tolerance:
    rel: float
    abs: float


def image_placeholder(mime: str, size: int) -> str:
    """The text that stands for an image output, from a `themisto.runtime.outputs.rich_outputs` entry's mime and bytes.

    >>> image_placeholder("image/png", 12345)
    '<image/png 12345 bytes>'
    """
    return f"<{mime} {size} bytes>"


# --- numbers ------------------------------------------------------------------------------------------------------

# numpy 2 prints scalars as `np.float64(1.5)`; the value is what the cell printed, the wrapper is repr noise.
_NP_SCALAR_RE = re.compile(r"\bnp\.(?:float|int|uint|complex|str_|bytes_|longdouble|double|half|single)\w*\(([^()]*)\)")
_NP_BOOL_RE = re.compile(r"\bnp\.(True|False)_")
# A number is not part of a word (`x1`, `1.5.2`); its sign counts only where it cannot be an operator (`a-1`).
_NUMBER_RE = re.compile(r"(?<![\w.)\]])(?:[-+](?=[\d.]))?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_SPACES_RE = re.compile(r"[ \t]{2,}|\t")


def _unwrap_numpy(text: str) -> str:
    if "np." not in text:
        return text
    return _NP_BOOL_RE.sub(r"\1", _NP_SCALAR_RE.sub(r"\1", text))


_FLOAT_MARKS = set(".eE")


def _int_text(number: str) -> str:
    digits = number.lstrip("+-").lstrip("0") or "0"
    return f"-{digits}" if number.startswith("-") and digits != "0" else digits


def _shown(text: str) -> str:
    return clip(text, 60)  # a value quoted in a reason


def _numbers_close(a: str, b: str, tol: _Tolerance) -> bool:
    """Integers must be equal; a float on either side is compared with tolerance (`1e3` == `1000.0`)."""
    if not _FLOAT_MARKS & set(a + b):  # compared as text: int() refuses over 4,300 digits
        return _int_text(a) == _int_text(b)
    return math.isclose(float(a), float(b), rel_tol=tol.rel, abs_tol=tol.abs)


def _numbers_rule(pred: str, ref: str, tol: _Tolerance) -> Verdict | None:
    """Equal text around the numbers (spacing runs collapsed, as column padding follows number widths)."""
    pred, ref = (_SPACES_RE.sub(" ", _unwrap_numpy(text)) for text in (pred, ref))
    pred_numbers, ref_numbers = _NUMBER_RE.findall(pred), _NUMBER_RE.findall(ref)
    if not ref_numbers or len(pred_numbers) != len(ref_numbers):
        return None
    if _NUMBER_RE.split(pred) != _NUMBER_RE.split(ref):
        return None
    for index, (a, b) in enumerate(zip(pred_numbers, ref_numbers)):
        if not _numbers_close(a, b, tol):
            return Verdict(False, "numbers", f"number {index + 1} differs: {_shown(a)} vs {_shown(b)}")
    return Verdict(True, "numbers", f"{len(ref_numbers)} number(s) agree within tolerance")


def _cells_equal(a: str, b: str, tol: _Tolerance) -> bool:
    if a == b or (a.lower() == b.lower() == "nan"):
        return True
    verdict = _numbers_rule(a, b, tol)
    return verdict is not None and verdict.equal


def _table_rule(pred: str, ref: str, tol: _Tolerance) -> Verdict | None:
    """Visible cells of two reprs agree (numbers with tolerance, NaN equals NaN), with the same labels in the same
    places and the same shape."""
    a, b = parse_table(pred), parse_table(ref)
    if a is None or b is None or a.kind != b.kind:
        return None
    if a.shape != b.shape or a.shape is None:
        return Verdict(False, "table", f"{a.kind} shapes differ: {a.shape} vs {b.shape}")
    if a.footer != b.footer:
        return Verdict(False, "table", f"Series footers differ: {a.footer!r} vs {b.footer!r}")
    if a.truncated or b.truncated:
        labels_agree = aligned(a.rows, b.rows) and aligned(a.columns, b.columns)
    else:
        labels_agree = a.rows == b.rows and a.columns == b.columns
    if not labels_agree:
        return Verdict(False, "table", "row or column labels differ")
    common = a.cells.keys() & b.cells.keys()
    for key in sorted(common, key=str):
        if not _cells_equal(a.cells[key], b.cells[key], tol):
            return Verdict(False, "table", f"cell [{key[0]!r}, {key[2]!r}] differs: "
                                           f"{_shown(a.cells[key])} vs {_shown(b.cells[key])}")
    return Verdict(True, "table", f"{len(common)} visible cell(s) agree; shape {a.shape[0]} x {a.shape[1]}")


# --- errors -------------------------------------------------------------------------------------------------------

_ERROR_LINE_RE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Iteration|Warning))(?::[ \t]*(.*))?$", re.MULTILINE)
_PY_TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\):$", re.MULTILINE)
# What follows an error's first line in themisto.runtime.outputs' layout: IPython's dashes, a cell or file location.
_TRACEBACK_START_RE = re.compile(r"-{20,}|\s*(?:Cell In\s?\[|Input In \[|File \"|Traceback \()")
_MESSAGE_NOISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-+~]+)+[\\/]"), "<dir>/"),  # sandbox and user folders differ
    (re.compile(r"<ipython-input-\d+-[0-9a-f]+>"), "<ipython-input>"),
    (re.compile(r"\b\d{6,}\.py\b"), "<cell>.py"),  # ipykernel's file name for a cell
    (re.compile(r"Cell In\[\d+\]"), "Cell In[?]"),
    (re.compile(r"\bline \d+"), "line ?"),
    (re.compile(r"\s+"), " "),
]


def _parse_error(text: str) -> tuple[str, str, str] | None:
    """(text printed before the error, exception name without module, normalised message), or None.

    Two layouts: Python's (`Traceback (most recent call last):` ... `KeyError: 'a'` last) and themisto.runtime.outputs'
    (`KeyError: 'a'` first, then the traceback)."""
    python = _PY_TRACEBACK_RE.search(text)
    if python:
        found = list(_ERROR_LINE_RE.finditer(text, python.end()))
        if not found or text[found[-1].end():].strip():
            return None  # the error line must end the text
        match, before = found[-1], text[: python.start()]
    else:
        # A line that merely looks like an error (printed by an `except`) is one only if the text ends or a
        # traceback starts after it; otherwise what follows it would be ignored.
        match = next((m for m in _ERROR_LINE_RE.finditer(text) if not text[m.end():].strip()
                      or _TRACEBACK_START_RE.match(text[m.end():].lstrip("\n"))), None)
        if match is None:
            return None
        before = text[: match.start()]
    message = match[2] or ""
    for pattern, replacement in _MESSAGE_NOISE:
        message = pattern.sub(replacement, message)
    return normalize_whitespace(before), match[1].rsplit(".", 1)[-1], message.strip()


def _error_rule(pred: str, ref: str, tol: _Tolerance) -> Verdict | None:
    a, b = _parse_error(pred), _parse_error(ref)
    if a is None and b is None:
        return None
    if a is None or b is None:
        return Verdict(False, "error", f"only the {'reference' if a is None else 'prediction'} is an error")
    if a[1] != b[1]:
        return Verdict(False, "error", f"different errors: {a[1]} vs {b[1]}")
    if a[2] != b[2]:
        return Verdict(False, "error", f"{a[1]} with different messages: {_shown(a[2])!r} vs {_shown(b[2])!r}")
    if a[0] != b[0] and not _cells_equal(a[0], b[0], tol):
        return Verdict(False, "error", f"same {a[1]}, but the output printed before it differs")
    return Verdict(True, "error", f"same {a[1]} and message")


# --- images -------------------------------------------------------------------------------------------------------

# A matplotlib figure's text/plain: its size is styling like an image's bytes, its number of axes is content.
_IMAGE_RE = re.compile(r"<(image/[\w.+-]+) \d+ bytes>|<Figure size [\d.]+x[\d.]+ (with \d+ Axes)>")


def _image_rule(pred: str, ref: str, tol: _Tolerance) -> Verdict | None:
    """Same kinds of images in the same order (sizes ignored), and the same text around them."""
    kinds = [[m[1] or f"Figure {m[2]}" for m in _IMAGE_RE.finditer(text)] for text in (pred, ref)]
    if not kinds[0] and not kinds[1]:
        return None
    if not kinds[0] or not kinds[1]:
        return Verdict(False, "image", f"image vs text: {kinds[0] or 'text'} vs {kinds[1] or 'text'}")
    if kinds[0] != kinds[1]:
        return Verdict(False, "image", f"different images: {kinds[0]} vs {kinds[1]}")
    rest = [_IMAGE_RE.sub("<image>", text) for text in (pred, ref)]
    if rest[0] != rest[1] and not _cells_equal(rest[0], rest[1], tol):
        return Verdict(False, "image", "same images, but the text around them differs")
    return Verdict(True, "image", f"same image kinds: {', '.join(kinds[1])}")


# --- the door -----------------------------------------------------------------------------------------------------


def _first_difference(pred: str, ref: str) -> str:
    pred_lines, ref_lines = pred.split("\n"), ref.split("\n")
    for number, (a, b) in enumerate(zip(pred_lines, ref_lines), start=1):
        if a != b:
            return f"line {number} differs: {_shown(a)!r} vs {_shown(b)!r}"
    return f"{len(pred_lines)} line(s) vs {len(ref_lines)} line(s)"


def outputs_equivalent(predicted: str, reference: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> Verdict:
    """Compare two output texts under the module's rules; numbers agree within `rel_tol` or `abs_tol`.

    >>> outputs_equivalent("KeyError: 'a'", "Traceback (most recent call last):\\n  File \\"/x/y.py\\", line 3\\n"
    ...                    "KeyError: 'a'")
    Verdict(equal=True, rule='error', reason='same KeyError and message')
    >>> outputs_equivalent("   a\\n0  1.0\\n1  NaN", "     a\\n0  1.0000001\\n1    NaN").rule
    'numbers'
    >>> outputs_equivalent("<image/png 100 bytes>", "<image/png 23456 bytes>").equal
    True
    """
    if not isinstance(predicted, str) or not isinstance(reference, str):
        return Verdict(False, "invalid", f"expected two texts, got {type(predicted).__name__} "
                                         f"and {type(reference).__name__}")
    pred, ref = normalize_whitespace(predicted), normalize_whitespace(reference)
    if pred == ref:
        return Verdict(True, "exact", "identical after whitespace normalisation")
    tol = _Tolerance(rel_tol, abs_tol)
    misses = []
    for rule in (_numbers_rule, _table_rule, _error_rule, _image_rule):
        verdict = rule(pred, ref, tol)
        if verdict is not None and verdict.equal:
            return verdict
        if verdict is not None:
            misses.append(verdict)
    # The most specific difference is the most useful reason: a table, error or image one before a number one.
    specific = [miss for miss in misses if miss.rule != "numbers"]
    if misses:
        return (specific or misses)[0]
    return Verdict(False, "none", _first_difference(pred, ref))
