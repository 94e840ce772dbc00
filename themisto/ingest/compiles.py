"""Whether a logged cell's code is code a kernel could have run: a cell the log says finished `ok` whose logged text
does not compile was not the text that ran, so the log lost some of it (cmd.exe ate an operator and no other text
of the cell shows it: `if i >= 100:` logged as `if i`).

The text is judged the way IPython runs a cell: its input transforms first (`%magic`, `!shell`, `x?`), then
automagic, which IPython applies at run time rather than in a transform — a line that starts with a line magic's
name (`pip install x`, `cd data`) runs as that magic. Compiling never runs the code; a text that makes the
compiler give up (nesting too deep, a null byte) counts as not compiling.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

_TRIES = 16  # automagic lines rewritten per cell before giving up (each try fixes one line)
# What automagic also runs besides IPython's own line magics: its default shell aliases (POSIX and Windows) and the
# kernel's magics (ipykernel's KernelMagics).
_ALIASES = frozenset({"cat", "cp", "ldir", "lf", "lk", "ll", "ls", "lx", "mkdir", "mv", "rm", "rmdir", "copy", "ddir",
                      "echo", "ren", "clear", "less", "more", "man", "connect_info", "qtconsole", "autosave"})


@lru_cache(maxsize=1)
def _line_magics() -> frozenset[str]:
    """The names automagic runs without `%`: IPython's built-in line magics and the aliases above."""
    import IPython.core.magics as magics

    names: set[str] = set(_ALIASES)
    for cls_name in magics.MAGICS_CLASSES:  # name -> module, loaded on first access
        names.update(getattr(getattr(magics, cls_name), "magics", {}).get("line", {}))
    return frozenset(names)


@lru_cache(maxsize=1)
def _manager():
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


@lru_cache(maxsize=4096)  # the checks, the start folder and replay health each read a cell again
def transformed(code: str) -> str:
    """`code` after IPython's input transforms (`%magic`, `!shell`, `x?` become Python); may raise SyntaxError."""
    return _manager().transform_cell(code)


def parse_cell(code: str):
    """The `ast` tree of `code` after IPython's transforms, or None where it does not parse (never run)."""
    import ast

    try:
        with warnings.catch_warnings():  # an invalid escape in the developer's string is not our warning
            warnings.simplefilter("ignore")
            return ast.parse(transformed(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def compile_error(code: str) -> str | None:
    """None when `code` compiles as an IPython cell, else why not (`SyntaxError: … (line N)`)."""
    lines = code.splitlines()
    for _ in range(_TRIES):
        try:
            with warnings.catch_warnings():  # an invalid escape in the developer's string is not our warning
                warnings.simplefilter("ignore")
                compile(_manager().transform_cell("\n".join(lines)), "<cell>", "exec")
            return None
        except SyntaxError as exc:
            where = (exc.lineno or 0) - 1
            if 0 <= where < len(lines) and _automagic(lines[where]):
                lines[where] = "%" + lines[where].lstrip()
                continue
            return f"{type(exc).__name__}: {exc.msg} (line {exc.lineno})"
        except (ValueError, RecursionError, MemoryError) as exc:  # a null byte; nesting the compiler cannot take
            return f"{type(exc).__name__}: {exc}"[:200]
    return f"more than {_TRIES} lines IPython would read as magics"


def _automagic(line: str) -> bool:
    """Whether IPython's automagic would run `line` as a line magic: its first word names one and what follows is
    not Python (an assignment, a call or an attribute would make the line Python, which compiled or not)."""
    stripped = line.lstrip()
    word, _, rest = stripped.partition(" ")
    return word in _line_magics() and not rest.lstrip().startswith(("=", "(", ".", "[", ","))
