"""The house stays as it is drawn: each stage imports only the stages before it, in the order docs/architecture.md's
diagram ("The stages") gives, at module level or inside a function (a function-level import hides a cycle, it does not
remove one). The package's own top-level modules (settings, errors, vocabulary, the bounded reader, ...) lie below
every stage and import none."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "themisto"


def _diagram() -> tuple[list[str], dict[str, list[str]]]:
    """The pipeline's stages in order, and each side stage with the stages it may import, from docs/architecture.md."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = re.search(r"^## The stages\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    lines = re.search(r"```(?:text)?\n(.*?)\n```", section, re.S).group(1).splitlines()
    chain = re.findall(r"(\w+) ─▶", lines[0]) + re.findall(r"─▶ (\w+)(?!.*─▶)", lines[0])
    assert len(chain) >= 5, f"the architecture page's diagram is not a chain of stages: {lines[0]!r}"
    sides = {}
    notes = re.findall(r"(\w+) \(([^)]*)\)", " ".join(lines))
    for name, note in notes:
        named = [stage for stage in chain if re.search(rf"\b{stage}\b", note)]
        # "from release + generation": up to the latest stage named; "over the stages": every stage; "training +
        # scoring": up to scoring, and the side stage training.
        sides[name] = chain[: chain.index(named[-1]) + 1] if named else list(chain)
        sides[name] += [side for side, _ in notes if side != name and re.search(rf"\b{side}\b", note)]
    return chain, sides


CHAIN, SIDES = _diagram()


def _allowed(stage: str) -> set[str] | None:
    """The stages `stage` may import (None: any, the command line's door)."""
    if stage == "cli":
        return None
    if stage in CHAIN:
        return set(CHAIN[: CHAIN.index(stage) + 1])
    if stage in SIDES:
        return set(SIDES[stage]) | {stage}
    raise AssertionError(f"themisto/{stage}/ is not a stage of docs/architecture.md's diagram")


def _imported(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("themisto.")]


def test_the_harness_may_import_generation_and_scoring_and_nothing_imports_it():
    assert {"generation", "scoring"} <= set(SIDES["harness"]) and "leaderboard" not in SIDES["harness"]
    importers = {path.relative_to(PACKAGE).parts[0] for path in PACKAGE.rglob("*.py")
                 if any(name.startswith("themisto.harness") for _, name in _imported(path))}
    assert importers <= {"harness", "cli"}, f"only the command line imports the harness, not {importers}"


def test_the_diagram_names_every_stage():
    stages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert stages - {"cli"} == set(CHAIN) | set(SIDES)
    assert SIDES["training"] == CHAIN[: CHAIN.index("generation") + 1]  # "from release + generation"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_stage_imports_only_the_stages_before_it(path):
    parts = path.relative_to(PACKAGE).parts
    stage = parts[0] if len(parts) > 1 else None
    allowed = set() if stage is None else _allowed(stage)
    back = [f"line {line}: {name}" for line, name in _imported(path)
            if allowed is not None and (target := name.split(".")[1]) in set(CHAIN) | set(SIDES) | {"cli"}
            and target not in allowed]
    where = "a top-level module" if stage is None else f"stage {stage}"
    assert not back, f"{path.relative_to(REPO)} ({where}) imports a later stage: {back}"
