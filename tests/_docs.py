"""What the documentation checks share: the pages (README.md, dataset_card.md, docs/*.md), the relative links and
repository paths they name, and the fenced blocks they show (tests/test_docs.py runs them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A path a page names is checked when its first part is one of these (the repository's own folders and files);
# anything else in code spans is an output path (out/june/…), a placeholder (RUN/…) or another project's file.
REPO_ROOTS = ("themisto", "tests", "bench", "scripts", "eval", "data", "metrics", "docs")
REPO_FILES = ("README.md", "dataset_card.md", "themisto_dataset.py", "requirements.txt", "requirements-gpu.txt",
              "requirements-kernel.txt", "pyproject.toml")
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A block closes at a fence as long as the one that opened it (a ```` block may show ``` blocks inside it).
_FENCE = re.compile(r"^(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_INSPECT_TASK = re.compile(r"^themisto/(?:next_cell|output_prediction)(?:_[a-z]+)?$")
_PATH = re.compile(r"^(?:\./)?(?P<path>(?:[\w.*-]+/)*[\w.*-]+/?)(?:::[\w\[\]-]+)?[),.:;]*$")


def pages(repo: Path = REPO) -> list[Path]:
    """Every page the checks cover: the README, the card template and docs/."""
    return [repo / "README.md", repo / "dataset_card.md", *sorted((repo / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor GitHub (and mkdocs' toc with its GitHub slugs) gives a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


@dataclass(frozen=True)
class Problem:
    page: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.what}"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def link_problems(page: Path, repo: Path = REPO) -> list[Problem]:
    """Each relative link of `page` whose file, or heading anchor, is not there."""
    text = page.read_text(encoding="utf-8")
    unfenced = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    problems = []
    for m in _LINK.finditer(unfenced):
        target = m.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check offline
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        line = _line_of(unfenced, m.start())
        if not linked.exists():
            problems.append(Problem(page, line, f"link to {target}: no such file"))
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(Problem(page, line, f"link to {target}: no heading #{anchor} in {linked.name}"))
    return problems


def named_paths(text: str) -> list[tuple[int, str]]:
    """(offset, path) for each repository path in `text`'s code spans and fenced blocks: a word whose first part is
    one of REPO_ROOTS or REPO_FILES (a `tests/x.py::test` names its file; `*` globs)."""
    found = []
    spans = [(m.start(1), m.group(1)) for m in _SPAN.finditer(_FENCE.sub(lambda m: " " * len(m.group(0)), text))]
    spans += [(m.start("body"), m.group("body")) for m in _FENCE.finditer(text)]
    for offset, span in spans:
        for word in re.finditer(r"[^\s\"'=()\[\]{}|<>,;`]+", span):
            m = _PATH.match(word.group(0))
            if not m:
                continue
            path = m.group("path")
            first = path.split("/")[0]
            if _INSPECT_TASK.match(path):  # `inspect eval themisto/next_cell`: a registered task's name, no path
                continue
            if (first in REPO_ROOTS and "/" in path) or path in REPO_FILES:
                found.append((offset + word.start(), path))
    return found


def path_problems(page: Path, repo: Path = REPO) -> list[Problem]:
    """Each repository path `page` names that is not in the repository."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for offset, path in named_paths(text):
        exists = any(repo.glob(path.rstrip("/"))) if "*" in path else (repo / path).exists()
        if not exists:
            problems.append(Problem(page, _line_of(text, offset), f"names {path}: not in the repository"))
    return problems


def fenced_blocks(page: Path, lang: str) -> list[tuple[int, str]]:
    """(line, body) of each fenced block of `page` in language `lang`."""
    text = page.read_text(encoding="utf-8")
    return [(_line_of(text, m.start()), m.group("body")) for m in _FENCE.finditer(text) if m.group("lang") == lang]


def commands(block: str, program: str = "themisto") -> list[list[str]]:
    """The `program` command lines of a shell block, each as argv after the program (continuations joined,
    comments dropped, `VAR=value` prefixes and a `.venv/bin/` folder taken off)."""
    import shlex

    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        for part in re.split(r"&&|\|\||;|\|", line.split(" #")[0]):
            if not re.search(rf"(^|[\s/]){re.escape(program)}(\s|$)", part) or part.lstrip().startswith("#"):
                continue
            words = shlex.split(part, comments=True)
            while words and re.match(r"^\w+=", words[0]):
                words.pop(0)
            if words and words[0].rsplit("/", 1)[-1] == program:
                found.append(words[1:])
    return found
