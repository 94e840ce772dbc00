"""The text scores of the Themisto paper: exact match, ROUGE-L and chrF, all on a 0-1 scale.

Both tasks (next-cell code, cell output) are scored with the same three functions. Two empty texts score 1.0 on
every score: a cell that prints nothing is predicted perfectly by an empty prediction (rouge_score and sacrebleu
would say 0.0).

>>> scores = text_scores(["x = a + b", "print(df.shape)"], ["x = a - b", "print(df.shape)"])
>>> scores["exact_match"], round(scores["rouge_l"], 3), scores["per_example"]["rouge_l"][1]
(0.5, 0.9, 1.0)
"""

from __future__ import annotations

import functools
import re
from statistics import fmean

__all__ = ["normalize_whitespace", "code_tokens", "exact_match", "rouge_l", "chrf", "text_scores", "SCORE_NAMES"]

SCORE_NAMES = ("exact_match", "rouge_l", "chrf")

# Longest alternatives first: string literals (one token each, prefixes such as f/rb included, never across a line
# unless triple-quoted), numbers (hex, floats, exponents, complex), identifiers, multi-character operators, then
# any other single non-space character, so the pattern matches everything and never fails on broken code.
_TOKEN_RE = re.compile(
    r"""
    (?:[rRbBuUfF]{1,2})?(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")
    | 0[xXoObB][0-9a-fA-F_]+
    | (?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d+)?[jJ]?
    | \w+
    | \*\*=?|//=?|>>=?|<<=?|->|:=|[-+*/%@&|^=!<>]=
    | \S
    """,
    re.VERBOSE,
)
_TRAILING_SPACE_RE = re.compile(r"[ \t\f\v]+$", re.MULTILINE)


def normalize_whitespace(text: str) -> str:
    """The text as exact match compares it: `\\r\\n` and `\\r` become `\\n`, trailing whitespace of every line and
    leading/trailing blank lines are dropped.

    Indentation and internal blank lines are kept: indentation is Python syntax, and a blank line inside an output
    is something the cell printed, while trailing spaces and edge blank lines are invisible in a notebook.

    >>> normalize_whitespace("\\n\\nx = 1   \\r\\n\\n    y = 2\\t\\n\\n")
    'x = 1\\n\\n    y = 2'
    """
    text = _TRAILING_SPACE_RE.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return text.strip("\n")


def clip(text: str, width: int) -> str:
    """`text` cut to at most `width` characters, marked with "..." where it was cut.

    >>> clip("abcdefgh", 6), clip("abc", 6)
    ('abc...', 'abc')
    """
    return text if len(text) <= width else f"{text[:max(width - 3, 0)]}..."


def code_tokens(text: str) -> list[str]:
    """Tokens for ROUGE-L: identifiers, numbers, whole string literals, and each operator or punctuation mark.

    >>> code_tokens("x=a+b  # sum")
    ['x', '=', 'a', '+', 'b', '#', 'sum']
    >>> code_tokens("df[df['n'] >= 1e-3].head(")
    ['df', '[', 'df', '[', "'n'", ']', '>=', '1e-3', ']', '.', 'head', '(']
    """
    return _TOKEN_RE.findall(text)


def _lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence, bit-parallel (Hyyrö 2004): one big-integer step per token of `b`.

    rouge_score's LCS fills a Python table cell by cell (3.4 s for two 2,000-token texts here); this gives the same
    length in a few milliseconds.
    """
    masks: dict[str, int] = {}
    for i, token in enumerate(a):
        masks[token] = masks.get(token, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full  # a 0 bit marks a position of `a` that ends a longer common subsequence
    for token in b:
        matched = row & masks.get(token, 0)
        row = ((row + matched) | (row - matched)) & full
    return len(a) - row.bit_count()


def exact_match(prediction: str, reference: str) -> float:
    """1.0 if the texts are equal after `normalize_whitespace`, else 0.0.

    >>> exact_match("df.head()\\n\\n", "df.head()   ")
    1.0
    """
    return float(normalize_whitespace(prediction) == normalize_whitespace(reference))


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (as rouge_score computes it: F1 of LCS precision and recall) over `code_tokens`.

    >>> rouge_l("x=a+b", "x=a-b")
    0.8
    """
    pred, ref = code_tokens(prediction), code_tokens(reference)
    if not pred and not ref:
        return 1.0
    if not pred or not ref:
        return 0.0
    # F1 of precision lcs/len(pred) and recall lcs/len(ref), written in the form that rounds least.
    return 2 * _lcs_length(ref, pred) / (len(pred) + len(ref))


@functools.cache
def _chrf_metric():
    from sacrebleu.metrics import CHRF  # imported on first use: no work at import time

    return CHRF()  # chrF2: character 6-grams, beta 2, whitespace ignored (sacrebleu's defaults)


def chrf(prediction: str, reference: str) -> float:
    """Sentence-level chrF (sacrebleu's chrF2 defaults), divided by 100.

    >>> chrf("df.head()", "df.head()"), chrf("abc", "xyz")
    (1.0, 0.0)
    """
    if not prediction.strip() and not reference.strip():
        return 1.0
    return _chrf_metric().sentence_score(prediction, [reference]).score / 100.0


def text_scores(predictions: list[str], references: list[str]) -> dict:
    """Mean exact match, ROUGE-L and chrF over aligned lists, plus each example's scores under `per_example`.

    Returns `{"exact_match": float, "rouge_l": float, "chrf": float, "count": int,
    "per_example": {"exact_match": [...], "rouge_l": [...], "chrf": [...]}}`.
    """
    if len(predictions) != len(references):
        raise ValueError(f"got {len(predictions)} predictions for {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    for name, texts in (("predictions", predictions), ("references", references)):
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name}[{index}] is {type(text).__name__}, expected str")
    functions = {"exact_match": exact_match, "rouge_l": rouge_l, "chrf": chrf}
    per_example = {name: [fn(p, r) for p, r in zip(predictions, references)] for name, fn in functions.items()}
    result: dict = {name: fmean(values) for name, values in per_example.items()}
    result["count"] = len(predictions)
    result["per_example"] = per_example
    return result
