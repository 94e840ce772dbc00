"""The closed vocabularies are declared once (themisto/vocabulary.py) and the command line offers exactly them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from themisto import vocabulary

REPO = Path(__file__).resolve().parents[1]
SETS = {name: getattr(vocabulary, name) for name in dir(vocabulary)
        if name.isupper() and isinstance(getattr(vocabulary, name), tuple) and len(getattr(vocabulary, name)) > 1}


def test_narrower_sets_lie_inside_the_sets_they_narrow():
    assert set(vocabulary.UNFINISHED_STATUSES) < set(vocabulary.CELL_STATUSES)
    assert set(vocabulary.OUTCOMES) == set(vocabulary.CELL_STATUSES) | {"refused"}
    assert set(vocabulary.COMPARABLE_LOGGED) < set(vocabulary.LOGGED_STATUSES)
    assert vocabulary.BASELINE_CONTEXT == vocabulary.CONTEXT_MODES[0]
    assert set(vocabulary.DEFAULT_CONTEXT_MODES) <= set(vocabulary.CONTEXT_MODES)
    assert vocabulary.BENCHMARK_SPLIT in vocabulary.SPLITS


@pytest.mark.parametrize("name", sorted(SETS))
def test_no_other_module_spells_a_vocabulary_out_again(name):
    # The first two names of a set, quoted and in order, as a tuple or Literal spells them: a copy of the set.
    first, second = SETS[name][:2]
    pattern = re.compile(rf'"{re.escape(first)}",\s*"{re.escape(second)}"')
    copies = [str(p.relative_to(REPO)) for p in sorted((REPO / "themisto").rglob("*.py"))
              if p.name != "vocabulary.py" and "agent" not in p.parts
              and pattern.search(p.read_text(encoding="utf-8"))]
    assert not copies, f"{name} is spelled out again in {copies}: import it from themisto.vocabulary"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "themisto.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_generate_offers_exactly_the_context_modes():
    done = _cli("generate", "--release", "x", "--task", "next_cell", "--backend", "baseline", "--model", "m",
                "--context", "none", "no_such_mode", "-o", "out")
    assert done.returncode == 2
    assert "invalid choice: 'no_such_mode'" in done.stderr
    assert all(repr(mode) in done.stderr for mode in vocabulary.CONTEXT_MODES)
    done = _cli("generate", "--help")
    assert f"default: {' '.join(vocabulary.DEFAULT_CONTEXT_MODES)}" in " ".join(done.stdout.split())
