"""List the modules over 400 lines and the functions over 60 lines in the package (an ast walk, no imports).

    python scripts/module_sizes.py [--modules 400] [--functions 60] [ROOT ...]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def oversized(roots: list[Path], module_lines: int, function_lines: int) -> tuple[list, list]:
    """(modules over `module_lines`, functions over `function_lines`) as (path, name, lines) tuples."""
    modules, functions = [], []
    for root in roots:
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root]):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            if len(text.splitlines()) > module_lines:
                modules.append((str(rel), "", len(text.splitlines())))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    size = node.end_lineno - node.lineno + 1
                    if size > function_lines:
                        functions.append((str(rel), node.name, size))
    return modules, functions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[REPO / "themisto", REPO / "eval", REPO / "metrics"])
    parser.add_argument("--modules", type=int, default=400, help="report modules over this many lines")
    parser.add_argument("--functions", type=int, default=60, help="report functions over this many lines")
    args = parser.parse_args()
    modules, functions = oversized([p.resolve() for p in args.roots], args.modules, args.functions)
    print(f"modules over {args.modules} lines: {len(modules)}")
    for path, _, size in modules:
        print(f"  {size:>5}  {path}")
    print(f"functions over {args.functions} lines: {len(functions)}")
    for path, name, size in functions:
        print(f"  {size:>5}  {path}:{name}")


if __name__ == "__main__":
    main()
