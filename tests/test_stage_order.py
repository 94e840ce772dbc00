"""The house stays as it is drawn: each stage imports only the stages before it, in the order docs/architecture.md's
diagram ("The stages") gives, at module level or inside a function (a function-level import hides a cycle, it does not
remove one). The package's own top-level modules (settings, errors, vocabulary, the bounded reader, ...) lie below
every stage and import none. No two modules import each other, however far round (an import inside a function or
under TYPE_CHECKING counts), and each module and function reads in one sitting: no module over 450 lines, no function
over 70 (scripts/module_sizes.py)."""

from __future__ import annotations

import ast
import importlib.util
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


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: the line}, every import counted wherever it stands;
    `from a import b` is module a.b where there is one, else a. Importing a module runs its packages' `__init__`
    too, which is not counted: a package's `__init__` that gathers its modules' names is no cycle with them."""
    names = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, dict[str, int]] = {}
    for name, path in names.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph[name] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, `level - 1` packages up
                    base = ".".join(filter(None, [here.rsplit(".", node.level - 1)[0] if node.level > 1 else here,
                                                  node.module]))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names]
            else:
                continue
            for target in targets:
                if target in names and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each set of modules that import each other (a strongly connected component of more than one), as one of its
    cycles: `a (line 3) -> b (line 9) -> a`."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]  # Tarjan's walk without recursion
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    component = set()
                    while not component or member != node:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                    if len(component) > 1:
                        found.append(_one_cycle(graph, component))
            elif target not in order:
                order[target] = low[target] = len(order)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], order[target])
    return found


def _one_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> str:
    """The shortest way round from the component's first module back to it, with the line of each import."""
    first = min(component)
    paths = {first: [first]}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == first:
                path = paths[node] + [first]
                return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {first}"
            if target in component and target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    raise AssertionError(f"no way round {sorted(component)}")


def test_no_modules_import_each_other():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "modules that import each other (move what both need into a module below them):\n" + \
        "\n".join(cycles)


def test_a_cycle_through_an_import_in_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.a import f\n")  # a package's __init__: no cycle with a
    (package / "a.py").write_text("import os\n\n\ndef f():\n    from pkg.sub import c\n    return c\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                          "if TYPE_CHECKING:\n    from ..b import g\n")
    (package / "b.py").write_text("from pkg import a\ng = 1\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.c": 5} and graph["pkg.sub.c"] == {"pkg.b": 3} and graph["pkg"] == {"pkg.a": 1}
    assert import_cycles(graph) == ["pkg.a (line 5) -> pkg.sub.c (line 3) -> pkg.b (line 1) -> pkg.a"]
    (package / "b.py").write_text("g = 1\n")
    assert import_cycles(import_graph(package)) == []


def _module_sizes():
    spec = importlib.util.spec_from_file_location("module_sizes", REPO / "scripts" / "module_sizes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODULE_LINES, FUNCTION_LINES = 450, 70


def test_each_module_and_function_reads_in_one_sitting(tmp_path):
    modules, functions = _module_sizes().oversized([PACKAGE], MODULE_LINES, FUNCTION_LINES)
    assert not modules, f"modules over {MODULE_LINES} lines (split by concern): {modules}"
    assert not functions, f"functions over {FUNCTION_LINES} lines (split into named helpers): {functions}"
    planted = tmp_path / "long.py"
    planted.write_text("def long():\n" + "    x = 1\n" * FUNCTION_LINES)
    assert _module_sizes().oversized([tmp_path], MODULE_LINES, FUNCTION_LINES) == (
        [], [(str(planted), "long", FUNCTION_LINES + 1)])
