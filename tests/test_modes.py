"""A context mode is an object declared once (themisto/modes.py): no other module tests a mode's name, and the names
every stage and the command line use are the table's. No kernel, no release: well under a second."""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from themisto import modes, vocabulary
from themisto.modes import CONTEXT_MODE_TABLE, ContextModeError, ContextModeSpec, context_mode

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("themisto", "eval", "metrics")
# Comparisons with a word that is also a mode's name but belongs to another vocabulary, each with its reason.
OTHER_VOCABULARIES = {
    ("themisto/ingest/repair.py", "full"): "how much of a log line a candidate explains (full / around)",
    ("themisto/ingest/june.py", "none"): "the texts a JuNE table writes for a missing cell number",
}


def _compared_strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant a comparison tests against: an operand of `==`, `!=`, `in` … and the constant members of
    a tuple, list or set on either side."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            members = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(node.lineno, m.value) for m in members
                      if isinstance(m, ast.Constant) and isinstance(m.value, str)]
    return found


def mode_name_comparisons(source: str, path: str) -> list[str]:
    """`path:line: 'name'` for each comparison in `source` with a context mode's name (bar OTHER_VOCABULARIES)."""
    return [f"{path}:{line}: {value!r}" for line, value in _compared_strings(ast.parse(source, path))
            if value in vocabulary.CONTEXT_MODES and (path, value) not in OTHER_VOCABULARIES]


def test_no_module_but_the_modes_table_compares_a_mode_name():
    quoted = re.compile("|".join(f"[\"']{re.escape(name)}[\"']" for name in vocabulary.CONTEXT_MODES))
    hits = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            relative, source = path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")
            if relative != "themisto/modes.py" and quoted.search(source):  # parse only what may hold one
                hits += mode_name_comparisons(source, relative)
    assert not hits, ("ask the mode's properties (themisto.modes.context_mode(name).needs_snapshot …) instead of "
                      "comparing its name:\n" + "\n".join(hits))


@pytest.mark.parametrize("source", [
    'if context == "full":\n    pass', 'x = "trace" != mode', 'ok = context not in ("none", "trace")',
    'times = "full" in contexts', 'y = [c for c in cs if c in ["probe"]]', 'z = a < b == "variables"'])
def test_the_scan_finds_a_comparison_with_a_mode_name(source):
    assert mode_name_comparisons(source, "themisto/somewhere.py")


def test_the_scan_lets_other_strings_and_the_named_other_vocabularies_be():
    assert not mode_name_comparisons('ok = status == "ok" and kind in ("a", "b")\nx = {"none": 1}', "themisto/x.py")
    assert not mode_name_comparisons('if found == "full":\n    pass', "themisto/ingest/repair.py")
    assert mode_name_comparisons('if found == "full":\n    pass', "themisto/ingest/other.py")


def test_the_names_every_stage_uses_are_derived_from_the_table():
    names = tuple(mode.name for mode in CONTEXT_MODE_TABLE)
    assert vocabulary.CONTEXT_MODES == modes.CONTEXT_MODES == names and len(set(names)) == len(names)
    assert [mode.name for mode in CONTEXT_MODE_TABLE if mode.is_baseline] == [vocabulary.BASELINE_CONTEXT]
    assert [mode.name for mode in CONTEXT_MODE_TABLE if mode.is_probe] == [vocabulary.PROBE_CONTEXT]
    assert vocabulary.PROBE_BASE_CONTEXT == context_mode(vocabulary.PROBE_CONTEXT).base
    assert vocabulary.STATIC_CONTEXT_MODES == tuple(m.name for m in CONTEXT_MODE_TABLE if not m.is_probe)
    assert vocabulary.DEFAULT_CONTEXT_MODES == tuple(m.name for m in CONTEXT_MODE_TABLE if m.is_default)
    from typing import get_args
    assert get_args(vocabulary.ContextMode) == names


def test_every_mode_is_coherent():
    for mode in CONTEXT_MODE_TABLE:
        assert context_mode(mode.name) is mode and context_mode(mode) is mode
        assert bool(mode.intro) == mode.runtime_section, mode.name  # a runtime section opens with its intro
        assert mode.is_baseline or mode.needs_snapshot, mode.name  # only the baseline shows no runtime state
        assert mode.base is None or context_mode(mode.base).is_static, mode.name
    probe = context_mode(vocabulary.PROBE_CONTEXT)
    assert probe.intro == context_mode(probe.base).intro  # the probe prompt is its base's prompt plus the rule


def test_an_unknown_mode_is_refused_with_the_modes_there_are():
    with pytest.raises(ContextModeError) as refused:
        context_mode("verbose")
    assert isinstance(refused.value, ValueError)
    assert all(name in str(refused.value) for name in vocabulary.CONTEXT_MODES)
    with pytest.raises(ValueError):
        context_mode(None)


def _options(command: str, flag: str) -> argparse.Action:
    from themisto.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in subparsers.choices[command]._actions if flag in a.option_strings)


@pytest.mark.parametrize("command, flag, expected", [
    ("generate", "--context", "CONTEXT_MODES"), ("sft-export", "--context", "STATIC_CONTEXT_MODES"),
    ("study", "--contexts", "STATIC_CONTEXT_MODES")])
def test_the_command_line_offers_the_tables_modes(command, flag, expected):
    assert tuple(_options(command, flag).choices) == getattr(vocabulary, expected)


def test_the_branch_delta_words_are_the_branch_results_fields():
    from themisto.runtime.agent.delta import NAMESPACE_CHANGES, namespace_delta
    from themisto.runtime.branch import BranchResult

    assert set(NAMESPACE_CHANGES) <= {f.name for f in fields(BranchResult)}
    assert tuple(namespace_delta({"a": "1", "b": "2"}, {"a": "3", "c": "4"})) == NAMESPACE_CHANGES
    assert BranchResult(0, "ok", [], added={"c": "4"}).delta() == {"added": {"c": "4"}, "changed": {}, "deleted": {}}


def test_a_spec_is_frozen():
    with pytest.raises(AttributeError):
        context_mode("none").name = "other"  # type: ignore[misc]
    assert isinstance(CONTEXT_MODE_TABLE[0], ContextModeSpec)
