"""What the whole agent shares: its hash and repr limits and markers, the IPython shell, the user's namespace,
bounded reprs.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import builtins
import reprlib
import types
from typing import Any


REPR_CHARS = 500
HASH_CHARS = 32  # hex digits of sha256 kept: 128 bits
UNHASHABLE = "unhashable"
# Names IPython puts in the namespace even when user_ns_hidden no longer lists them.
IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})
# The key of the request metadata under which the host sends an agent call's keyword arguments.
REQUEST_KEY = "themisto_arguments"
# One marker for a cut cell, whether it ran in the kernel (themisto.runtime.kernel) or in a branch child.
OUTPUT_CAP_MARKER = "\n[themisto: output truncated: the cell wrote {total:,} bytes, over its {cap:,}-byte limit]\n"


def get_shell(shell: Any = None) -> Any:
    """`shell`, or the running IPython shell when None (an error outside a kernel)."""
    if shell is not None:
        return shell
    from IPython import get_ipython

    found = get_ipython()
    if found is None:
        raise RuntimeError("themisto.runtime.agent runs inside an IPython kernel; no shell is active")
    return found


def requested(shell: Any = None) -> dict[str, Any]:
    """The keyword arguments the host sent with the request being answered (as data, in its message's metadata:
    `themisto.runtime.snapshot.agent_call`); {} when it sent none."""
    kernel = getattr(get_shell(shell), "kernel", None)
    parent = kernel.get_parent("shell") if kernel is not None else {}
    arguments = (parent.get("metadata") or {}).get(REQUEST_KEY)
    return dict(arguments) if isinstance(arguments, dict) else {}


def qualname(value: Any) -> str:
    """The value's type as `module.QualifiedName`."""
    kind = type(value)
    module = getattr(kind, "__module__", None) or "builtins"
    return f"{module}.{kind.__qualname__}"


def user_variables(shell: Any = None) -> dict[str, Any]:
    """The user's variables: not modules, not IPython's own names, not names that start with `_`."""
    shell = get_shell(shell)
    hidden = getattr(shell, "user_ns_hidden", {})
    found = {}
    for name, value in list(shell.user_ns.items()):
        if name.startswith("_") or name in IPYTHON_NAMES or isinstance(value, types.ModuleType):
            continue
        if name in hidden and hidden[name] is value:
            continue
        found[name] = value
    return found


def module_bindings(shell: Any = None) -> dict[str, types.ModuleType]:
    """The user's names bound to modules (`pd`, `plt`): not IPython's own, not names that start with `_`."""
    shell = get_shell(shell)
    hidden = getattr(shell, "user_ns_hidden", {})
    return {name: value for name, value in list(shell.user_ns.items())
            if isinstance(value, types.ModuleType) and not name.startswith("_")
            and not (name in hidden and hidden[name] is value)}


_REPR = reprlib.Repr()
_REPR.maxstring = REPR_CHARS
_REPR.maxother = REPR_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 50
_REPR.maxdict = 30
_REPR.maxlevel = 4


def safe_repr(value: Any) -> tuple[str, str | None]:
    """A repr of at most REPR_CHARS characters, and the error if __repr__ failed."""
    try:
        module = type(value).__module__ or ""
        if type(value) in (list, tuple, dict, set, frozenset, str, bytes):
            text = _REPR.repr(value)  # bounded effort on huge builtin containers
        elif module.startswith("pandas"):
            import pandas as pd

            # Fewer rows and narrower cells than the notebook shows: the repr is cut at REPR_CHARS anyway.
            with pd.option_context("display.max_rows", 6, "display.min_rows", 6, "display.max_columns", 8,
                                   "display.max_colwidth", 30):
                text = builtins.repr(value)
        else:
            text = builtins.repr(value)
    except Exception as error:  # noqa: BLE001 - a broken __repr__ is data, not a failure of the snapshot
        reason = f"{type(error).__name__}: {error}"[:200]
        return f"<repr failed: {reason}>", reason
    if len(text) > REPR_CHARS:
        text = text[: REPR_CHARS - 3] + "..."
    return text, None
