"""Explicit, reversible cleaning of a cell before replay; the trajectory itself keeps the code as it ran.

Rules, applied line by line (a line is a logical line: a trailing `\\` continues it onto the next):

| rule | lines | action | why |
| --- | --- | --- | --- |
| `package-install` | `!pip install …`, `!pip3 …`, `!python -m pip …`, `!{sys.executable} -m pip …`, `%pip …`, `!conda/mamba …`, `%conda …` with `install`, `uninstall` or `remove` | replaced by a marker | the replay sandbox has no network and its packages are installed; an install would hang on retries, an uninstall would change the kernel's environment for every later cell |
| `shell-package-install` | the same commands without `!`/`%` inside a `%%bash`, `%%sh` or `%%script bash/sh` cell | replaced by a shell comment | same reasons |
| `windows-path` | a Python string literal holding a Windows path: one into the participant's checkout of the hackathon template (`C:\\\\…\\\\jupyter-notebook-hackathon\\\\data\\\\x`), or a relative one (`r"data\\task1\\x"`, `"data\\\\task1\\\\x"`) | the literal becomes the POSIX path from the checkout (`"data/task1/x"`), its quotes and prefix kept | replay runs on Linux in a copy of the template's layout, where `\\` is part of a file name and the participant's drive does not exist; a single `\\` in a string that is not raw is left alone (Python reads `\\t` as a tab there, as it did for the developer) |
| (none) | other `!` shell commands (`!ls`, `!unzip …`, `!wget …`) | kept | they act on the workspace copy the sandbox provides; a command that needs the network fails there visibly, as it should |
| (none) | other `%` / `%%` magics (`%matplotlib inline`, `%%time`, `%cd`, `%reset`) | kept | they are part of what the developer ran and change the state or output faithfully |
| (none) | imports, `from mining_extension import check_logging`, `check_logging(…)` | kept | the workspace provides a harmless `mining_extension`; a logged ModuleNotFoundError (raised before the developer installed the package) stays in the trajectory, it is not the cleaning's business to hide it |

A removed line becomes a marker on the same line (`pass  # themisto-clean: …` in Python, a `#` comment in a
shell cell), with the same indentation, so line numbers in tracebacks still match the original and an
indented block never becomes empty. `restore(clean_for_replay(code)) == code` always.
Known limit: a line inside a multi-line string that starts with `!pip install` is treated as a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MARKER = "themisto-clean"

# The installer invocations that need the network or change the environment; `install`, `uninstall`, `remove`.
_INSTALLER = (
    r"(?:\{[^}]*\}\s+-m\s+pip|python[0-9.]*\s+-m\s+pip|pip[0-9.]*|conda|mamba|micromamba)"
    r"\s+(?:install|uninstall|remove)\b"
)
_ESCAPED_INSTALL = re.compile(r"^(?P<indent>\s*)(?:!|%)\s*" + _INSTALLER)
_SHELL_INSTALL = re.compile(r"^(?P<indent>\s*)(?:sudo\s+)?" + _INSTALLER)
_SHELL_CELL = re.compile(r"^\s*%%(?:bash|sh|script\s+(?:ba)?sh)\b")

RULES: dict[str, str] = {
    "package-install": "pip/conda install, uninstall or remove via ! or %: skipped (no network, packages installed)",
    "shell-package-install": "pip/conda install, uninstall or remove in a %%bash/%%sh cell: skipped (same reason)",
    "windows-path": "a Windows path into the template's checkout, or a relative one: the POSIX path from the "
                    "checkout (replay runs on Linux in the template's layout)",
}
# The hackathon template's folder: a drive-absolute path into it is read from there on.
TEMPLATE_FOLDER = "jupyter-notebook-hackathon"
# A one-line string literal: its prefix, quote and body (no triple quotes: a path is never one).
_STRING = re.compile(r"""(?P<prefix>(?<!\w)[rRuUbBfF]{1,2}|)(?P<quote>['"])(?P<body>(?:\\.|(?!(?P=quote)).)*)(?P=quote)""")
_NAME = r"[\w.\- ()<>]+"


def _posix_path(body: str, raw: bool) -> str | None:
    """The POSIX path a Windows path literal's body names from the checkout, or None when it is no such path."""
    separator = r"\\" if raw else r"\\\\"
    parts = re.fullmatch(rf"(?:[A-Za-z]:{separator})?{_NAME}(?:{separator}{_NAME})+", body)
    if parts is None:
        return None
    names = re.split(separator, body)
    if re.match(r"[A-Za-z]:$", names[0]):  # drive-absolute: only a path into the template's checkout is known
        if TEMPLATE_FOLDER not in names:
            return None
        names = names[len(names) - names[::-1].index(TEMPLATE_FOLDER):]
    elif names[0] != "data" and not re.search(r"\.\w{1,5}$", names[-1]):
        return None  # a relative path starts in the template's data folder or names a file: "1\\n" is no path
    return "/".join(names) or "."  # the checkout itself is the workspace root


def _windows_paths(line: str) -> str:
    def replace(match: re.Match) -> str:
        prefix = match.group("prefix")
        if "f" in prefix.lower() or "b" in prefix.lower():
            return match.group(0)
        path = _posix_path(match.group("body"), raw="r" in prefix.lower())
        return match.group(0) if path is None else f"{prefix}{match.group('quote')}{path}{match.group('quote')}"

    return _STRING.sub(replace, line) if "\\" in line else line


@dataclass(frozen=True)
class Change:
    """One replaced line: its 1-based number, the rule, the original text and what replay runs instead."""

    line: int
    rule: str
    before: str
    after: str


@dataclass
class CleanedCode:
    """The code replay runs, the code as the developer ran it, and every change between them."""

    code: str
    original: str
    changes: list[Change] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def _marker(indent: str, rule: str, *, shell: bool, continued: bool) -> str:
    note = f"# {MARKER}: {rule}" + (" (continued)" if continued else "")
    return f"{indent}{note}" if shell else f"{indent}pass  {note}"


def clean_for_replay(code: str) -> CleanedCode:
    """Apply the rule table of this module to one cell's code.

    >>> cleaned = clean_for_replay("!pip install pandas\\nimport pandas as pd")
    >>> cleaned.code
    'pass  # themisto-clean: package-install\\nimport pandas as pd'
    >>> restore(cleaned) == cleaned.original
    True
    >>> clean_for_replay(r'pd.read_csv("C:\\\\Users\\\\<user>\\\\jupyter-notebook-hackathon\\\\data\\\\task1\\\\log.txt")').code
    'pd.read_csv("data/task1/log.txt")'
    >>> clean_for_replay(r'ZipFile(r"data\\task1\\jetnet_logs.zip"); open("data\\task1\\x.txt")').code
    'ZipFile(r"data/task1/jetnet_logs.zip"); open("data\\\\task1\\\\x.txt")'
    """
    lines = code.split("\n")  # not splitlines(): keeps "\r" and a final empty line, so restore is exact
    shell = bool(lines) and bool(_SHELL_CELL.match(lines[0]))
    pattern, rule = (_SHELL_INSTALL, "shell-package-install") if shell else (_ESCAPED_INSTALL, "package-install")
    changes: list[Change] = []
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = pattern.match(line) if not (shell and i == 0) else None
        if match is None:
            posix = line if shell else _windows_paths(line)
            if posix != line:
                changes.append(Change(line=i + 1, rule="windows-path", before=line, after=posix))
            out.append(posix)
            i += 1
            continue
        indent = match.group("indent")
        # The command and every line its trailing backslashes continue onto are skipped together.
        first = True
        while True:
            current = lines[i]
            after = _marker(indent, rule, shell=shell, continued=not first)
            changes.append(Change(line=i + 1, rule=rule, before=current, after=after))
            out.append(after)
            i += 1
            first = False
            if not current.rstrip("\r").endswith("\\") or i >= len(lines):
                break
    return CleanedCode(code="\n".join(out), original=code, changes=changes)


def restore(cleaned: CleanedCode) -> str:
    """Undo the changes on `cleaned.code`; raises ValueError if the code no longer carries them."""
    lines = cleaned.code.split("\n")
    for change in cleaned.changes:
        if change.line > len(lines) or lines[change.line - 1] != change.after:
            raise ValueError(f"line {change.line}: expected the marker {change.after!r}, the cleaned code was edited")
        lines[change.line - 1] = change.before
    return "\n".join(lines)
