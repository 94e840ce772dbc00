"""The kernel process's entry point (`python -m themisto.runtime.kernel_main`, exec'd by the launcher): ipykernel's
own launcher, but started without the debugger.

ipykernel imports debugpy, and with it all of pydevd (165 modules, about a third of a kernel's start-up CPU), at
start-up, whether or not a client will ever debug; replay and the scorer never do, and they start a kernel per
trajectory and again at every restart. IPython's completer imports jedi (and parso) likewise, for completion
requests, which no one sends here. The kernel starts as if neither were installed (no debugger is offered, the
completer completes without jedi), and the block is lifted before any cell runs, so a cell that imports them gets
them.

Randomness a cell does not seed (`df.sample(100)`, a model fit without `random_state`) draws the same in every kernel
life: `random` is seeded before ipykernel starts and numpy's global generator as numpy.random is first imported, so
two builds of a log, and the scorer's replay of a prefix, hold the same values. A cell stopped by its limit drew as far
as it got, which the host decides; the session reseeds both generators after it from the cell's code
(`reseed_code`), so the cells after it draw the same on any host. (The developer's own draws are lost to any replay;
`numpy.random.default_rng()` without a seed still draws from the system.)
"""

from __future__ import annotations

import sys

_NOT_AT_START = ("debugpy", "jedi")
SEED = 0  # of `random` and numpy's global generator in every kernel life


def reseed_code(stopped_cell: str) -> str:
    """Code for a silent request that reseeds `random` and numpy's global generator (where numpy.random is loaded)
    from a stopped cell's code; it binds no name and displays nothing."""
    import hashlib

    digest = hashlib.sha256(f"{SEED}\0{stopped_cell}".encode("utf-8", "surrogatepass")).digest()
    seed = int.from_bytes(digest[:4], "big")
    return (f"if True:\n    __import__('random').seed({seed})\n"
            f"    if 'numpy.random' in __import__('sys').modules:\n"
            f"        __import__('sys').modules['numpy.random'].seed({seed})\n")


class _SeedNumpyOnImport:
    """A meta-path finder that seeds numpy's global generator once numpy.random has been executed (importing numpy
    at start-up would cost every kernel that never uses it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "numpy.random":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def run_and_seed(module):
            run(module)
            module.seed(SEED)

        spec.loader.exec_module = run_and_seed
        return spec


def main() -> None:
    import random

    random.seed(SEED)
    sys.meta_path.insert(0, _SeedNumpyOnImport())
    for name in _NOT_AT_START:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  (None: `import debugpy` raises ImportError)
    try:
        from ipykernel import kernelapp
    finally:
        for name in _NOT_AT_START:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    # What a cell sees is ipykernel_launcher's: sys.argv[0] names it (argparse's usage line in a cell's output does)
    import importlib.util

    spec = importlib.util.find_spec("ipykernel_launcher")
    if spec is not None and spec.origin:
        sys.argv[0] = spec.origin
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    # As ipykernel_launcher does: the current folder leaves sys.path while ipykernel loads (IPython puts it back).
    if sys.path[0] == "":
        del sys.path[0]
    main()
