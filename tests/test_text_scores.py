"""Text scores: the code-aware tokenizer, ROUGE-L checked against rouge_score, chrF against sacrebleu, aggregates."""

import random

import pytest
from rouge_score import rouge_scorer
from sacrebleu.metrics import CHRF

from themisto.scoring.text_scores import (
    _lcs_length,
    chrf,
    code_tokens,
    exact_match,
    normalize_whitespace,
    rouge_l,
    text_scores,
)


class _CodeTokenizer:
    """Our tokenizer behind rouge_score's Tokenizer interface, so rouge_score serves as the reference LCS."""

    def tokenize(self, text):
        return code_tokens(text)


def test_operators_count():
    # rouge_score's own tokenizer drops operators; the code tokenizer must not.
    default = rouge_scorer.RougeScorer(["rougeL"]).score("x=a-b", "x=a+b")["rougeL"].fmeasure
    assert default == 1.0
    assert rouge_l("x=a+b", "x=a-b") < 1.0
    assert chrf("x=a+b", "x=a-b") < 1.0
    assert exact_match("x=a+b", "x=a-b") == 0.0


def test_identical_and_empty():
    code = "df = pd.read_csv('data.csv')\ndf.groupby('a')['b'].mean()"
    assert (exact_match(code, code), rouge_l(code, code), chrf(code, code)) == (1.0, 1.0, 1.0)
    for pred, ref in (("", code), (code, ""), ("  \n", code)):
        assert (exact_match(pred, ref), rouge_l(pred, ref), chrf(pred, ref)) == (0.0, 0.0, 0.0)
    # Nothing printed and nothing predicted is a perfect prediction.
    assert (exact_match("", "\n"), rouge_l("", "\n"), chrf("", "\n")) == (1.0, 1.0, 1.0)


def test_whitespace_only_differences():
    ref = "for x in xs:\n    print(x)\n"
    pred = "\r\n\nfor x in xs:   \r\n    print(x)\t\n\n\n"
    assert normalize_whitespace(pred) == normalize_whitespace(ref) == "for x in xs:\n    print(x)"
    assert exact_match(pred, ref) == 1.0
    # Indentation is syntax and internal blank lines are printed text: both count.
    assert exact_match("for x in xs:\n print(x)", ref) == 0.0
    assert exact_match("a\n\nb", "a\nb") == 0.0


def test_tokens():
    assert code_tokens("y = x ** 2 // 3 != 0x1F") == ["y", "=", "x", "**", "2", "//", "3", "!=", "0x1F"]
    assert code_tokens('print(f"{a}: {b}", "it\'s")') == ["print", "(", 'f"{a}: {b}"', ",", '"it\'s"', ")"]
    assert code_tokens("s = '''one\ntwo'''") == ["s", "=", "'''one\ntwo'''"]
    assert code_tokens("1.5e-3 + .5 - 2j") == ["1.5e-3", "+", ".5", "-", "2j"]


@pytest.mark.parametrize("text", ["print('unterminated", 'x = """open', "def f(:\n  ))) @@ $ ?", "é = ∑(ß) ←",
                                  "\x00\x1b[0m"])
def test_tokenizer_never_fails_and_loses_no_visible_character(text):
    tokens = code_tokens(text)
    assert "".join(tokens) == "".join(text.split())


def test_paper_like_example_by_hand():
    ref = 'df = pd.read_csv("data.csv")'
    pred = 'df = pd.read_csv("data.csv", sep=",")'
    # ref: df = pd . read_csv ( "data.csv" )                  -> 8 tokens
    # pred: df = pd . read_csv ( "data.csv" , sep = "," )     -> 12 tokens; LCS = all 8 of ref
    # P = 8/12, R = 8/8, F = 2PR/(P+R) = 16/20 = 0.8
    assert rouge_l(pred, ref) == pytest.approx(0.8)
    scores = text_scores([pred, ref], [ref, ref])
    assert scores["count"] == 2
    assert scores["per_example"]["exact_match"] == [0.0, 1.0]
    assert scores["exact_match"] == 0.5
    assert scores["rouge_l"] == pytest.approx(0.9)
    assert scores["chrf"] == pytest.approx((chrf(pred, ref) + 1.0) / 2)
    assert 0.0 < scores["per_example"]["chrf"][0] < 1.0


def test_rouge_l_agrees_with_rouge_score():
    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_CodeTokenizer())
    rng = random.Random(7)
    words = ["df", "=", "(", ")", "x", "+", "-", "1", "'a'", ".", "mean"]
    for _ in range(200):
        pred = " ".join(rng.choices(words, k=rng.randint(1, 40)))
        ref = " ".join(rng.choices(words, k=rng.randint(1, 40)))
        assert rouge_l(pred, ref) == pytest.approx(scorer.score(ref, pred)["rougeL"].fmeasure)
    long_a = rng.choices(words, k=3000)
    long_b = rng.choices(words, k=2500)
    assert 0 < _lcs_length(long_a, long_b) <= 2500


def test_chrf_agrees_with_sacrebleu():
    metric = CHRF()
    pairs = [("df.head()", "df.head(10)"), ("print(x)", "x"), ("a = [1, 2, 3]", "a = [1, 2]")]
    for pred, ref in pairs:
        assert chrf(pred, ref) == pytest.approx(metric.sentence_score(pred, [ref]).score / 100)


def test_text_scores_rejects_bad_input():
    with pytest.raises(ValueError, match="2 predictions for 1 references"):
        text_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no predictions"):
        text_scores([], [])
    with pytest.raises(TypeError, match=r"predictions\[1\] is NoneType"):
        text_scores(["a", None], ["a", "b"])
