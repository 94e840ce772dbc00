"""Write the architecture page's module table (docs/architecture.md, "Every module") from the modules' docstrings: one
row per module of the package, its docstring's first paragraph, the stages in the order of the page's own stages table
(the package's top-level modules last). An ast walk: nothing is imported.

    python scripts/module_table.py           # rewrite the table in the page
    python scripts/module_table.py --check   # exit 1 when the page's table is not what the docstrings give
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
BEGIN = "<!-- the module table: written by scripts/module_table.py from each module's docstring; edit those -->"
END = "<!-- end of the module table -->"


def summary(docstring: str) -> str:
    """A docstring's first paragraph (its summary), on one line."""
    return " ".join(docstring.strip().split("\n\n")[0].split())


def stage_order(page: str) -> list[str]:
    """The stages as the page's stages table lists them (`themisto/<stage>/` rows), in order."""
    return re.findall(r"^\| `themisto/(\w+)/` \|", page, re.M)


def module_rows(package: Path, stages: list[str]) -> list[tuple[str, str]]:
    """(path, summary) of every module under `package`: by stage in `stages`' order, then the package's own
    top-level modules; a folder's `__init__.py` before its modules. ValueError naming the modules with no docstring
    or in a folder no stage names."""
    rows, missing, unplaced = [], [], []
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        name = f"{package.name}/{'/'.join(parts)}"
        if not doc:
            missing.append(name)
        if len(parts) > 1 and parts[0] not in stages:
            unplaced.append(name)
        rank = stages.index(parts[0]) if len(parts) > 1 and parts[0] in stages else len(stages)
        rows.append(((rank, tuple("" if part == "__init__.py" else part for part in parts)), name, doc or ""))
    if missing or unplaced:
        raise ValueError(f"modules without a docstring: {sorted(missing)}; in no stage of the page: {sorted(unplaced)}")
    return [(name, summary(doc)) for _, name, doc in sorted(rows)]


def table(rows: list[tuple[str, str]]) -> str:
    """The Markdown table of `rows`, between its two markers."""
    lines = [BEGIN, "", "| module | what it does (its docstring's first paragraph) |", "| --- | --- |"]
    lines += [f"| `{path}` | {text.replace('|', chr(92) + '|')} |" for path, text in rows]
    return "\n".join(lines + ["", END])


def with_table(page: str, package: Path) -> str:
    """The page with its module table written anew from `package`'s docstrings (ValueError without its markers)."""
    begin, end = page.find(BEGIN), page.find(END)
    if begin < 0 or end < begin:
        raise ValueError(f"the page has no module table between {BEGIN!r} and {END!r}")
    return page[:begin] + table(module_rows(package, stage_order(page))) + page[end + len(END):]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page's table is current")
    args = parser.parse_args()
    page = PAGE.read_text(encoding="utf-8")
    written = with_table(page, REPO / "themisto")
    if args.check:
        if written != page:
            sys.exit(f"{PAGE.relative_to(REPO)}: the module table is not what the docstrings give; run "
                     f"python scripts/module_table.py")
        print("the module table is current")
    elif written != page:
        PAGE.write_text(written, encoding="utf-8")
        print(f"wrote the module table of {PAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
