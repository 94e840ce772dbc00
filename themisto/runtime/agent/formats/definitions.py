"""The user's functions and classes, and a library's, as JSON value documents: a function or class a cell defined
as its defining source (`{"$": "source", "kind", "binds", "source"}`, found and checked by
themisto.runtime.agent.sources), a library's function, class or ufunc as its name (`{"$": "import", "module",
"qualname"}`). Reading gives a `Definition` and runs nothing; `define` (a restore, in the kernel) runs the source, as
the cell that defined it did, or imports the name.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from dataclasses import dataclass
from typing import Any

from themisto.runtime.agent.formats.base import Unstorable
from themisto.runtime.agent.sources import NoSource, USER_MODULE, class_source, function_source, is_user_defined

TAG = "$"  # tagged JSON's tag key (themisto.runtime.agent.formats.tagged_json)
TAGS = frozenset({"source", "import"})  # the tags of a definition document's value
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


@dataclass(frozen=True)
class Definition:
    """A stored function or class: its source (run by a restore, never by reading) or its library's name."""

    document: dict


def library_reference(value: Any) -> dict | None:
    """{"$": "import", module, qualname} for a library's function, class or ufunc found at that name; else None."""
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str) or module == USER_MODULE or "<" in name:
        return None
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)) and \
            type(value).__name__ != "ufunc":
        return None
    found: Any = sys.modules.get(module)
    for part in name.split("."):
        found = getattr(found, part, None)
    return {TAG: "import", "module": module, "qualname": name} if found is value else None


def holds(value: Any) -> bool:
    return is_user_defined(value) or library_reference(value) is not None


def encode(value: Any, cell_text: str | None) -> dict:
    """The definition document of a function or class `holds` takes (Unstorable when its source is not found)."""
    if is_user_defined(value):
        try:
            source = (function_source(value) if isinstance(value, types.FunctionType)
                      else class_source(value, cell_text))
        except NoSource as error:
            raise Unstorable(str(error)) from None
        return {TAG: "source", **source}
    reference = library_reference(value)
    if reference is None:
        raise Unstorable("neither a function or class a cell defined nor a library's")
    return reference


def is_definition(encoded: Any) -> bool:
    """Whether a JSON document's value is a definition (read as a `Definition`, not decoded)."""
    return isinstance(encoded, dict) and encoded.get(TAG) in TAGS


def imported(module: str) -> Any:
    """The module `module` names, imported (ValueError for a text that is not a module name)."""
    if not _MODULE_NAME.match(module):
        raise ValueError(f"not a module name: {module[:80]!r}")
    return importlib.import_module(module)


def define(definition: Definition, namespace: dict) -> Any:
    """The object a source or import document defines; a source runs in the user's namespace and its binding is
    undone (the caller binds the object under the variable's own name)."""
    document = definition.document
    if document[TAG] == "import":
        found = imported(str(document["module"]))
        for part in str(document["qualname"]).split("."):
            found = getattr(found, part)
        return found
    binds = str(document["binds"])
    had, before = binds in namespace, namespace.get(binds)
    exec(compile(str(document["source"]), f"<themisto-restore:{binds}>", "exec", dont_inherit=True), namespace)
    made = namespace[binds]
    if had:
        namespace[binds] = before
    else:
        del namespace[binds]
    return made
