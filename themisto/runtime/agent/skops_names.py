"""skops's table of trusted type names, computed once per kernel environment instead of once per kernel life.

`import skops.io` (0.6) builds that table at import by `sklearn.utils.all_estimators()`, which imports every module
of scikit-learn: 1.3-2.8 s in a kernel that holds a notebook's modules, paid by the first model each kernel life
stores, and 230 modules of scikit-learn in the user's `sys.modules` that the developer never imported. The host runs
`COMPUTE` once in the kernel's interpreter (themisto.runtime.sandbox.skops_names, cached on disk), puts the table
beside the kernel's import folder and names it in `ENV`; `import_skops_io` seeds `skops.io._trusted_types` from it
when the versions it was computed for are the installed ones, so the import costs about 10 ms and 52 modules.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

ENV = "THEMISTO_SKOPS_NAMES"  # the table's file in the kernel (themisto.runtime.kernel_setup sets it)
FILE = "skops_names.json"
_MODULE = "skops.io._trusted_types"
_LISTS = ("PRIMITIVE_TYPE_NAMES", "SKLEARN_ESTIMATOR_TYPE_NAMES", "SCIPY_UFUNC_TYPE_NAMES")
_VERSIONS = ("skops", "scikit-learn", "scipy", "numpy")
_MAX_NAMES = 10_000

# Run by the kernel's interpreter (python -I -c): skops's own table, as skops computes it, with the versions it holds
# for; nothing else is printed.
COMPUTE = f"""
import importlib.metadata as m, json
import skops.io._trusted_types as t
print(json.dumps({{"versions": {{n: m.version(n) for n in {_VERSIONS!r}}},
                  "names": {{n: list(getattr(t, n)) for n in {_LISTS!r}}}}}))
"""


def parse(text: str) -> dict | None:
    """The table `COMPUTE` printed, checked for shape (three lists of names, the versions), else None."""
    try:
        table = json.loads(text)
        versions, names = table["versions"], table["names"]
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(versions, dict) and set(versions) == set(_VERSIONS)
            and all(isinstance(v, str) for v in versions.values())):
        return None
    if not (isinstance(names, dict) and set(names) == set(_LISTS)):
        return None
    for listed in names.values():
        if not (isinstance(listed, list) and len(listed) <= _MAX_NAMES and all(isinstance(n, str) for n in listed)):
            return None
    return {"versions": versions, "names": names}


def _installed() -> dict[str, str | None]:
    import importlib.metadata as metadata

    found: dict[str, str | None] = {}
    for name in _VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _seed() -> None:
    """Put the host's table in place of skops's module that would compute it, when it holds for what is installed."""
    path = os.environ.get(ENV)
    if not path or _MODULE in sys.modules or "skops.io" in sys.modules:
        return
    try:
        with open(path, encoding="utf-8") as f:
            table = parse(f.read(1 << 20))
    except OSError:
        return
    if table is None or table["versions"] != _installed():
        return  # another environment's table: skops computes its own
    module = types.ModuleType(_MODULE)
    module.PRIMITIVES_TYPES = [int, float, str, bool]
    for name, listed in table["names"].items():
        setattr(module, name, list(listed))
    sys.modules[_MODULE] = module


def import_skops_io() -> Any:
    """`skops.io`, imported with the host's table of trusted names where there is one (ImportError without skops)."""
    _seed()
    import skops.io

    return skops.io
