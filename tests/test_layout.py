"""The tree shows the pipeline: every module is listed in docs/architecture.md, stages import nothing heavy, and the in-kernel
agent imports only the standard library (it is imported inside kernels whose environment is not ours)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "themisto"
HEAVY = ("torch", "transformers", "vllm", "datasets", "ray", "openai", "trl", "peft", "pyarrow", "matplotlib",
         "inspect_ai")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts)


def _what_is_here() -> str:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8") + "\n## "
    match = re.search(r"^## Every module\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, "docs/architecture.md has no '## Every module' section"
    return match.group(1)


def test_every_module_is_in_the_architecture_table():
    rows = [line for line in _what_is_here().splitlines() if line.startswith("| `")]
    listed: set[str] = set()
    for row in rows:
        first, *rest = [cell.strip() for cell in row.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", first)
        folders = [n for n in names if n.endswith("/")]
        for name in names:
            listed.add(name)
            for folder in folders:  # `themisto/ingest/` then `june.py`: the module themisto/ingest/june.py
                listed.add(folder + name)
    missing = [str(p.relative_to(REPO)) for p in _modules() if str(p.relative_to(REPO)) not in listed]
    assert not missing, f"modules missing from docs/architecture.md's 'Every module' table: {missing}"


def _imported_at_import_time(statement: str) -> set[str]:
    code = (f"import sys; before = set(sys.modules); {statement}; "
            "import json; print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return set(json.loads(out.stdout))


STAGES = ["themisto", "themisto.cli", "themisto.ingest", "themisto.runtime", "themisto.runtime.agent",
          "themisto.replay", "themisto.release", "themisto.scoring", "themisto.generation", "themisto.leaderboard",
          "themisto.training", "themisto.distributed", "themisto.harness"]


@pytest.mark.parametrize("stage", [s for s in STAGES if (REPO / s.replace(".", "/")).exists()
                                   or (REPO / (s.replace(".", "/") + ".py")).exists()])
def test_importing_a_stage_imports_nothing_heavy(stage):
    loaded = _imported_at_import_time(f"import {stage}")
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert not heavy, f"`import {stage}` loads {heavy}: import them inside the function that needs them"


def test_the_agent_loads_only_the_standard_library():
    loaded = _imported_at_import_time("import themisto.runtime.agent")
    foreign = sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
                     and m.split(".")[0] != "themisto" and not m.startswith("_"))
    assert not foreign, f"the in-kernel agent imports {foreign} at import time"
    agent = PACKAGE / "runtime" / "agent"
    inside = {"themisto.runtime", "themisto.runtime.agent"} | {
        ".".join(("themisto", "runtime", "agent", *p.relative_to(agent).with_suffix("").parts)).removesuffix(".__init__")
        for p in agent.rglob("*.py")}
    assert {m for m in loaded if m.startswith("themisto.")} <= inside, "the agent must not pull other stages into the kernel"


def test_inspect_ai_is_imported_only_by_the_harness():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "harness":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            outside += [f"{path.relative_to(REPO)}:{node.lineno}" for n in names if n.split(".")[0] == "inspect_ai"]
    assert not outside, f"inspect_ai imported outside themisto/harness/: {outside}"


def _module_level_imports(tree: ast.Module) -> list[str]:
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # code that runs at import time, unlike a def body
            todo += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "runtime" / "agent").rglob("*.py")), ids=lambda p: p.name)
def test_agent_modules_import_only_the_standard_library(path):
    names = _module_level_imports(ast.parse(path.read_text(encoding="utf-8")))
    foreign = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names
               and not n.startswith("themisto.runtime.agent") and n != "__future__"]
    assert not foreign, f"{path.name} imports {foreign} at module level"


def _private_names_taken(tree: ast.Module, package: str) -> list[str]:
    """Underscore names this module takes from another module of `package`: imported, or read off an imported module."""
    taken, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package):
            for alias in node.names:
                if alias.name.startswith("_"):
                    taken.append(f"{node.module}.{alias.name}")
                elif node.module == package:
                    modules.add(alias.asname or alias.name)  # `from package import module`
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            taken.append(f"{package}.{node.value.id}.{node.attr}")
    return taken


def test_agent_modules_share_only_public_names():
    agent = PACKAGE / "runtime" / "agent"
    taken = {p.name: _private_names_taken(ast.parse(p.read_text(encoding="utf-8")), "themisto.runtime.agent")
             for p in sorted(agent.rglob("*.py"))}
    assert not {name: found for name, found in taken.items() if found}, (
        "an agent module takes another's underscore names; make the name public where it is shared")


def test_the_private_name_check_sees_both_ways_in():
    tree = ast.parse("from themisto.runtime.agent.snapshots import _CACHE\nfrom themisto.runtime.agent import candidate\n"
                     "candidate._kill(1)\n")
    assert _private_names_taken(tree, "themisto.runtime.agent") == ["themisto.runtime.agent.snapshots._CACHE",
                                                                    "themisto.runtime.agent.candidate._kill"]
