"""The `evaluate` metric in metrics/themisto: loads offline by folder, its docstring examples hold, it is a thin door
to themisto.scoring.scorer (same scores, same refusals), and it reaches no network while computing."""

import dataclasses
import doctest
import importlib.util
import inspect
import re
import socket
from pathlib import Path

import evaluate
import pytest

from themisto.scoring import scorer as sc
from themisto.scoring.records import SLOW_REFERENCE_FACTOR
from themisto.gate import ExecutionRefused
from themisto.settings import settings as env_settings

METRIC_DIR = Path(__file__).resolve().parents[1] / "metrics" / "themisto"


@pytest.fixture
def no_code_eval(monkeypatch):
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    env_settings.cache_clear()
    yield
    env_settings.cache_clear()


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("test: the metric tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _metric_module(name: str):
    # Loaded under its own name: as `themisto` it would shadow the package it wraps (pytest cannot collect
    # metrics/ with its default import mode for the same reason).
    spec = importlib.util.spec_from_file_location(name, METRIC_DIR / "themisto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_examples(monkeypatch, no_code_eval):
    module = _metric_module("themisto_metric_doctest")
    monkeypatch.chdir(METRIC_DIR.parents[1])  # the examples load "metrics/themisto" from the repository root
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0


def test_metric_card_examples(monkeypatch):
    monkeypatch.chdir(METRIC_DIR.parents[1])
    result = doctest.testfile(str(METRIC_DIR / "README.md"), module_relative=False)
    assert result.attempted >= 3 and result.failed == 0


def test_metric_text_scores_without_network(no_network):
    metric = evaluate.load(str(METRIC_DIR))
    predictions = ["df.groupby('a').sum()", "x = a + b", "print(df.shape)"]
    references = ["df.groupby('a').mean()", "x = a - b", "print(df.shape)"]
    results = metric.compute(predictions=predictions, references=references, return_records=True)
    assert results["exact_match"] == pytest.approx(1 / 3)
    rouge = [r["rouge_l"] for r in results["records"]]
    # Code-aware tokens: one changed method or operator out of several tokens costs part of the score, not all.
    assert rouge[2] == 1.0 and 0.5 < rouge[0] < 1.0 and 0.5 < rouge[1] < 1.0
    assert results["rouge_l"] == pytest.approx(sum(rouge) / 3)
    assert 0 < results["chrf"] < 1 and [r["chrf"] for r in results["records"]][2] == pytest.approx(1.0)  # chrF in [0, 1]
    assert "functional_match" not in results


def test_several_predictions_per_example():
    metric = evaluate.load(str(METRIC_DIR))
    results = metric.compute(predictions=[["a = 1", "a = 2", "a = 1"], ["b"]], references=["a = 1", "b"],
                             return_records=True)
    assert results["predictions"] == 4 and results["exact_match"] == pytest.approx((2 / 3 + 1) / 2)
    assert [(r["id"], r["index"]) for r in results["records"]] == [("#0", 0), ("#0", 1), ("#0", 2), ("#1", 0)]


def test_output_prediction_config():
    metric = evaluate.load(str(METRIC_DIR), "output_prediction")
    results = metric.compute(predictions=["   a\n0  1.0", "3"], references=["   a\n0  1.0000000001", "4"])
    assert results["output_equivalent"] == 0.5 and results["exact_match"] == 0.0


def test_unknown_config_is_an_error():
    with pytest.raises(KeyError, match="next_cell, output_prediction"):
        evaluate.load(str(METRIC_DIR), "next_output")


def test_bad_input_is_refused():
    metric = evaluate.load(str(METRIC_DIR))
    with pytest.raises(ValueError):
        metric.compute(predictions=["a", "b"], references=["a"])
    with pytest.raises(ValueError):
        metric.compute(predictions=[3], references=["a"])
    with pytest.raises(sc.ScoreError, match="example k/2: the id appears more than once"):
        metric.compute(predictions=["a", "b"], references=["a", "b"], ids=["k/2", "k/2"])


def test_execution_needs_both_switches(monkeypatch, no_code_eval):
    metric = evaluate.load(str(METRIC_DIR))
    with pytest.raises(ExecutionRefused, match="HF_ALLOW_CODE_EVAL"):
        metric.compute(predictions=["a"], references=["a"], ids=["k/5"], release="r", execute=True)
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    # The environment alone executes nothing: without execute=True the result has text scores only.
    results = metric.compute(predictions=["a"], references=["a"])
    assert results["exact_match"] == 1.0 and "functional_match" not in results


@pytest.mark.slow
def test_execution_through_the_metric(tmp_path, monkeypatch):
    from themisto.release.parquet import build_release
    from themisto.replay.replay import ReplaySettings, replay_trajectory
    from themisto.release.tasks import TaskSettings, trajectory_rows
    from themisto.ingest.trajectory import Execution, Trajectory

    cells = ["a = 1", "b = 2", "c = a + b", "print(c)", "items = [a, b, c]", "items.append(4)", "print(sum(items))"]
    trajectory = Trajectory(id="m", notebook="n.ipynb", source="test",
                            executions=[Execution(f"c{i}", code, "ok") for i, code in enumerate(cells)])
    steps = list(replay_trajectory(trajectory, tmp_path, ReplaySettings(cell_timeout_s=20)))
    release = tmp_path / "release"
    build_release(trajectory_rows(steps), release, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": tmp_path.name}})
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        metric = evaluate.load(str(METRIC_DIR))
        results = metric.compute(predictions=[["items.append(4)", "items.append(5)", "items = [1, 2, 3, 4]"],
                                              ["print(sum(items))", "print(10)"]],
                                 references=[cells[5], cells[6]], ids=["m/5", "m/6"], release=str(release),
                                 workspace=str(tmp_path), execute=True, k=[1, 2], return_records=True)
    finally:
        env_settings.cache_clear()
    matches = [r["functional_match"] for r in results["records"]]
    # A list with equal content is the same state by content hash; printing the same number is the same output.
    assert matches == [True, False, True, True, True]
    assert results["pass@1"] == pytest.approx((2 / 3 + 1) / 2) and results["pass@2"] == pytest.approx(1.0)
    assert results["scored_examples"] == 2 and results["outcomes"]["ok"] == 5


def test_the_metrics_keyword_defaults_are_the_scorers():
    # Its defaults are ScoreSettings' own (so are the command line's: tests/test_cli_defaults.py).
    module = _metric_module("themisto_metric_defaults")
    parameters = inspect.signature(module.Themisto._compute).parameters
    fields = {f.name: f.default for f in dataclasses.fields(sc.ScoreSettings)}
    for name in ("k", "timeout_s", "memory_bytes", "continuation_cells"):
        assert parameters[name].default == fields[name], name


def test_the_metric_cards_stated_defaults_are_the_scorers():
    # The card is prose for people, so it spells its defaults out; this keeps them the scorer's.
    module = _metric_module("themisto_metric_card")
    compute = inspect.signature(module.Themisto._compute).parameters
    card = " ".join((METRIC_DIR / "README.md").read_text(encoding="utf-8").split())

    def stated(pattern: str) -> str:
        found = re.search(pattern, card)
        assert found, f"the metric card no longer states {pattern!r}"
        return found.group(1)

    assert stated(r"\*\*execute\*\* \(`bool`, default `(\w+)`\)") == str(compute["execute"].default)
    assert stated(r"\*\*return_records\*\* \(default `(\w+)`\)") == str(compute["return_records"].default)
    assert stated(r"\*\*k\*\* \(`list\[int\]`, default `\[([\d, ]+)\]`\)") == ", ".join(map(str, sc.ScoreSettings.k))
    assert float(stated(r"\*\*timeout_s\*\* \(default ([\d.]+) s")) == sc.ScoreSettings.timeout_s
    assert float(stated(r"raised to ([\d.]+)× the slowest")) == SLOW_REFERENCE_FACTOR
    assert float(stated(r"\*\*memory_bytes\*\* \(default ([\d.]+) GiB")) * 2**30 == sc.ScoreSettings.memory_bytes
    assert int(stated(r"\*\*continuation_cells\*\* \(default (\d+)")) == sc.ScoreSettings.continuation_cells
    assert int(stated(r"A prediction over ([\d,]+) characters").replace(",", "")) == \
        sc.ScoreSettings.max_prediction_chars
