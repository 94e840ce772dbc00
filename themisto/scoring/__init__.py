"""Scoring: predictions and a release in, per-example records and aggregate scores out.

`text_scores` (exact match, code-aware ROUGE-L, chrF), `equivalence` (are two outputs the same result), `gate` (the
opt-in that execution needs), `scorer` (records, release state, judging, execution in the pre-cell state, totals).
"""
