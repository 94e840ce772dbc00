"""A package its developer's environment lacked stays unimportable in replay until the cell that installed it.

The replay's kernel environment has every package the sessions need, so a cell whose import raised
`ModuleNotFoundError` for its developer (who then ran `!pip install …`) would succeed in replay, and the steps between
the failed import and the install would see a state their developer never had (JuNE's 9667b100 had ten such steps).
Where the log records a `ModuleNotFoundError: No module named 'x'` (a package: not a submodule, not the standard
library), the module `x` is hidden from the kernel's imports (a finder first on `sys.meta_path` raises the same
error) from the trajectory's start (or after the last import of it the log shows working before) until, after the last
error the log shows for it, the first cell that installs it, that the log shows importing it without error, or that
a logged kernel restart came before (a developer who installed it in a terminal restarts the kernel to see it). The finder is set by a silent request
before a step whose hidden set differs from the kernel's, and again in every new kernel life; it binds no name in
the user's namespace, so snapshots and state hashes do not see it.
"""

from __future__ import annotations

import ast
import re
from typing import Iterable, Sequence

# pip's distribution names whose import name differs, for the packages these logs install most.
_IMPORT_NAMES = {"scikit_learn": "sklearn", "sklearn": "sklearn", "opencv_python": "cv2", "opencv_python_headless": "cv2",
                 "pillow": "PIL", "beautifulsoup4": "bs4", "python_dotenv": "dotenv", "pyyaml": "yaml",
                 "python_dateutil": "dateutil", "scikit_image": "skimage"}
_MISSING = re.compile(r"No module named '([\w.]+)'")
_INSTALL = re.compile(r"(?:pip[0-9.]*|conda|mamba|micromamba)\s+install\s+(?P<args>[^\n;&|#]*)")

_FINDER = '''
import sys
class ThemistoMissingPackages:
    """Modules the developer's environment lacked at this point of the log (themisto.replay.missing_packages)."""
    def __init__(self, names):
        self.names = frozenset(names)
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "ThemistoMissingPackages"]
if NAMES:
    sys.meta_path.insert(0, ThemistoMissingPackages(NAMES))
    for loaded in [m for m in sys.modules if m.partition(".")[0] in NAMES]:
        del sys.modules[loaded]  # loaded by the kernel's own start-up: the developer's `import` found none
'''


def installed_modules(code: str) -> set[str]:
    """The import names a cell's `pip install` / `conda install` lines install."""
    names = set()
    for match in _INSTALL.finditer(code):
        for arg in match.group("args").split():
            if arg.startswith("-") or "/" in arg or arg.startswith("{"):
                continue
            package = re.split(r"[<>=!~\[]", arg, maxsplit=1)[0].strip("'\"").lower().replace("-", "_")
            if package:
                names.add(_IMPORT_NAMES.get(package, package))
    return names


def _imports(code: str) -> set[str]:
    from themisto.ingest.compiles import parse_cell

    tree = parse_cell(code)
    if tree is None:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names


def hidden_modules(executions: Sequence, restarts: Iterable[int] = ()) -> list[frozenset[str]]:
    """Per execution, the modules hidden from the kernel before it runs (the module docstring's rule); `restarts`:
    the executions a logged kernel restart came right before."""
    import sys

    first_error: dict[str, int] = {}
    last_error: dict[str, int] = {}
    for index, execution in enumerate(executions):
        match = _MISSING.fullmatch(execution.evalue or "") if execution.ename == "ModuleNotFoundError" else None
        # A package, not a submodule (`import datetime.datetime`) and not the standard library: a name the
        # developer's environment lacked.
        if execution.status == "error" and match is not None and "." not in match.group(1) \
                and match.group(1) not in sys.stdlib_module_names:
            first_error.setdefault(match.group(1), index)
            last_error[match.group(1)] = index
    restarts = set(restarts)
    hidden: list[set[str]] = [set() for _ in executions]
    for module, index in last_error.items():
        # From after the last import of it the log shows working before its first error (if any), ...
        start = next((k + 1 for k in range(first_error[module] - 1, -1, -1) if executions[k].status == "ok"
                      and module in _imports(executions[k].code)), 0)
        end = len(executions)
        for later in range(index + 1, len(executions)):
            other = executions[later]
            if later in restarts or module in installed_modules(other.code) or (
                    other.status == "ok" and module in _imports(other.code)):
                end = later
                break
        for step in range(start, end):
            hidden[step].add(module)
    return [frozenset(names) for names in hidden]


def hide(session, names: frozenset[str]) -> None:
    """Make `names` unimportable in the session's kernel (and importable again whatever is not in it)."""
    code = f"exec(compile({_FINDER!r}, '<themisto>', 'exec'), {{'NAMES': {sorted(names)!r}}})"
    reply = session.execute_silent(code)
    if reply.get("status") != "ok":
        raise RuntimeError(f"could not hide the packages {sorted(names)} the log shows missing: "
                           f"{reply.get('ename')}: {reply.get('evalue')}")
