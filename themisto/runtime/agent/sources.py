"""The defining source of the user's functions and classes: the statement in the cell IPython compiled (its text is
in linecache) that made the object, checked against the object's own code by compiling it, never by running it.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import ast
import linecache
import textwrap
import types
from typing import Any

from themisto.runtime.agent.hashing import code_digest

USER_MODULE = "__main__"  # the module IPython runs cells in


class NoSource(Exception):
    """The object's defining source cannot be found or does not match its code; the message is the reason."""


def is_user_defined(value: Any) -> bool:
    """A function or class a cell defined (its module is the user's namespace)."""
    return isinstance(value, (types.FunctionType, type)) and getattr(value, "__module__", None) == USER_MODULE


def _cell(filename: str) -> tuple[list[str], ast.Module]:
    lines = linecache.getlines(filename)
    if not lines:
        raise NoSource("the cell that defined it is no longer known")
    try:
        return lines, ast.parse("".join(lines))
    except SyntaxError:
        raise NoSource("the cell that defined it does not parse") from None


def _segment(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return textwrap.dedent("".join(lines[start - 1:node.end_lineno]))


def _compiled(source: str, name: str) -> list[types.CodeType]:
    """The code objects named `name` that compiling `source` makes (nested ones included)."""
    try:
        top = compile(source, "<themisto-source>", "exec", dont_inherit=True)
    except SyntaxError:
        raise NoSource("its statement does not compile on its own") from None
    found, stack = [], [top]
    while stack:
        code = stack.pop()
        if code.co_name == name:
            found.append(code)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return found


def _statements(tree: ast.Module) -> list[ast.stmt]:
    """Statements outside function bodies (a def under an `if` or a `try` still counts)."""
    found, stack = [], list(tree.body)
    while stack:
        node = stack.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))
    return found


def function_source(function: types.FunctionType) -> dict:
    """{"kind": "function", "binds": name, "source": text} for a function a cell defined; NoSource otherwise."""
    if "<locals>" in function.__qualname__:
        raise NoSource("defined inside another function: its source needs the call that made it")
    code = function.__code__
    lines, tree = _cell(code.co_filename)
    node, binds = None, function.__name__
    for statement in _statements(tree):
        if function.__name__ == "<lambda>":
            if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Lambda)
                    and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name)
                    and statement.value.lineno == code.co_firstlineno):
                node, binds = statement, statement.targets[0].id
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == function.__name__:
            start = min([statement.lineno] + [d.lineno for d in statement.decorator_list])
            if start == code.co_firstlineno:
                node = statement
    if node is None:
        raise NoSource("its statement is not in the cell that defined it")
    source = _segment(lines, node)
    if code_digest(code) not in {code_digest(c) for c in _compiled(source, code.co_name)}:
        raise NoSource("its cell's text no longer matches its code")
    return {"kind": "function", "binds": binds, "source": source}


def class_source(cls: type, cell_text: str | None = None) -> dict:
    """{"kind": "class", "binds": name, "source": text} for a class a cell defined, found through its methods' cell
    (or `cell_text`, the cell just run, for a class without methods); NoSource otherwise."""
    if "<locals>" in cls.__qualname__:
        raise NoSource("defined inside a function: its source needs the call that made it")
    methods = {name: member for name, member in vars(cls).items()
               if isinstance(member, types.FunctionType) and member.__code__.co_filename != "<string>"}
    if methods:
        filename = next(iter(methods.values())).__code__.co_filename
        lines, tree = _cell(filename)
    elif cell_text:
        lines = cell_text.splitlines(keepends=True)
        try:
            tree = ast.parse(cell_text)
        except SyntaxError:
            raise NoSource("the cell that defined it does not parse") from None
    else:
        raise NoSource("a class without methods of its own: the cell that defined it is not known")
    first_lines = [m.__code__.co_firstlineno for m in methods.values()]
    node = None
    for statement in _statements(tree):
        if isinstance(statement, ast.ClassDef) and statement.name == cls.__name__:
            if all(statement.lineno <= n <= statement.end_lineno for n in first_lines):
                node = statement
    if node is None:
        raise NoSource("its class statement is not in the cell that defined it")
    source = _segment(lines, node)
    compiled = {code_digest(c) for name in methods for c in _compiled(source, methods[name].__code__.co_name)}
    if not all(code_digest(m.__code__) in compiled for m in methods.values()):
        raise NoSource("its cell's text no longer matches its methods")
    return {"kind": "class", "binds": cls.__name__, "source": source}
