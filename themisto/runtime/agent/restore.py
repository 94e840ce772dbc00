"""A step's namespace rebuilt in the kernel from its stored values (`values`): modules imported, data values read,
the user's functions and classes defined again from their source, names bound to one object bound so again, and
every other user variable and module binding removed (the kernel may hold another step's state). The host
(themisto.replay.restore) checks the result against the step's state hash.

Reading a value runs no code; defining a function or class runs its statement, as the cell that defined it did, in
this (sandboxed) kernel. Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any

from themisto.runtime.agent import formats
from themisto.runtime.agent.executions import moved
from themisto.runtime.agent.formats.definitions import Definition, define, imported
from themisto.runtime.agent.namespace import get_shell, module_bindings, user_variables


def _load(folder: str, files: dict[str, str], digest: str, memo: dict[str, Any], namespace: dict) -> Any:
    """One stored value; a function a container holds is defined right away (top-level ones wait, see restore)."""
    if digest not in memo:
        fmt = formats.named(files.get(digest))
        if fmt is None:
            raise KeyError(f"value {digest} is not among the files given")
        with open(os.path.join(folder, digest + fmt.extension), "rb") as fh:
            data = fh.read()

        def inner(held: str) -> Any:
            found = _load(folder, files, held, memo, namespace)
            return define(found, namespace) if isinstance(found, Definition) else found

        memo[digest] = fmt.read(data, inner)
    return memo[digest]


def restore(folder: str, plan: dict, shell: Any = None) -> str:
    """Rebuild the namespace `plan` describes from the files in `folder`; JSON {"restored", "failures"}.

    plan: {"values": {name: hash}, "files": {hash: format} (every file, refs included), "modules": {name: module},
    "aliases": [[name, ...]], "keep": [names left as they are], "rerun": whether cells re-run next (then the
    namespace holds copies until `finish_restore`)}."""
    shell = get_shell(shell)
    moved()  # no cell runs: the count of cells run would not see the namespace change
    namespace = shell.user_ns
    values, files = dict(plan.get("values", {})), dict(plan.get("files", {}))
    keep = set(plan.get("keep", []))
    failures: dict[str, str] = {}
    began = time.perf_counter()
    modules = dict(plan.get("modules", {}))
    for name in module_bindings(shell):  # the kernel may hold another step's state: its modules go too
        if name not in modules:
            del namespace[name]
    for name, module in modules.items():
        try:
            namespace[name] = imported(str(module))
        except Exception as error:  # noqa: BLE001 - a missing module is that name's failure
            failures[name] = f"{type(error).__name__}: {error}"[:300]
    modules_done = time.perf_counter()
    following = {name for group in plan.get("aliases", []) for name in group[1:] if group[0] in values}
    data: dict[str, Any] = {}
    definitions: dict[str, Definition] = {}
    for name, digest in values.items():
        if name in following:
            continue
        try:
            loaded = _load(folder, files, digest, {}, namespace)
        except Exception as error:  # noqa: BLE001 - one value's failure is reported by name
            failures[name] = f"{type(error).__name__}: {error}"[:300]
            continue
        if isinstance(loaded, Definition):
            definitions[name] = loaded
        else:
            data[name] = loaded
    namespace.update(data)  # a default argument or a base class may name them
    pending = dict(definitions)
    for _ in range(len(definitions) + 1):  # a class may derive from another one defined here: retry in turn
        for name, document in list(pending.items()):
            try:
                data[name] = define(document, namespace)
                namespace[name] = data[name]
                del pending[name]
            except NameError:
                continue
            except Exception as error:  # noqa: BLE001
                failures[name] = f"{type(error).__name__}: {error}"[:300]
                del pending[name]
        if not pending:
            break
    for name in pending:
        failures[name] = "NameError: it needs a name the step does not define"
    for group in plan.get("aliases", []):
        if group and group[0] in data:
            for name in group[1:]:
                data[name] = data[group[0]]
    if plan.get("rerun"):
        # Cells re-run next (themisto.replay.restore): they get copies, so that `finish_restore` binds the values as
        # they were read, whatever the cells did to the copies, without reading them again.
        HELD.clear()
        HELD.update(data)
        memo: dict[int, Any] = {}
        data = {name: _copied(value, memo) for name, value in data.items()}
    _bind(namespace, shell, data, keep)
    return json.dumps({"restored": sorted(data), "failures": failures,
                       "seconds": {"imports": round(modules_done - began, 6),
                                   "values": round(time.perf_counter() - modules_done, 6)}})


HELD: dict[str, Any] = {}  # the values a restore read, while cells re-run on copies of them


def _copied(value: Any, memo: dict[int, Any]) -> Any:
    try:
        return copy.deepcopy(value, memo)
    except Exception:  # noqa: BLE001 - a value that cannot be copied is given as it is
        return value


def _bind(namespace: dict, shell: Any, data: dict[str, Any], keep: set[str]) -> None:
    namespace.update(data)
    for name in user_variables(shell):
        if name not in data and name not in keep:
            del namespace[name]


def finish_restore(keep: list[str], shell: Any = None) -> str:
    """After the re-run cells of a restore's plan: bind the values the restore read (not the copies the cells
    had), leave the names in `keep` (what the cells made) and remove every other user variable."""
    shell = get_shell(shell)
    moved()
    held = dict(HELD)
    HELD.clear()
    _bind(shell.user_ns, shell, held, set(keep))
    return json.dumps({"restored": sorted(held), "failures": {}})
