"""The kernel session is built by composition, and each of its files reads alone: no class of one session file
inherits from another's (no mixins sharing `self`), and every attribute a class reads off `self` is set or defined in
that class, in that file. (A test over the source: it starts no kernel.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "themisto" / "runtime"
SESSION_FILES = ("kernel.py", "kernel_setup.py", "kernel_process.py", "kernel_requests.py")


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.ClassDef)}


def _self_attributes(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(defined, read): what the class's body defines (methods, properties, fields) or its methods set on `self`,
    and what its methods read off `self`."""
    defined = {node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, ast.Assign):
            defined.update(target.id for target in node.targets if isinstance(target, ast.Name))
    read: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (defined if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.attr)
    return defined, read


def test_no_session_class_inherits_from_another_session_file():
    owners = {name: file for file in SESSION_FILES for name in _classes(RUNTIME / file)}
    crossing = [f"{file}: {cls.name}({ast.unparse(base)})" for file in SESSION_FILES
                for cls in _classes(RUNTIME / file).values() for base in cls.bases
                if owners.get(ast.unparse(base).split(".")[-1], file) != file]
    assert not crossing, f"a session class is a mixin of another file's: {crossing}"


@pytest.mark.parametrize("file", SESSION_FILES)
def test_each_session_file_reads_alone(file):
    unset = {}
    for name, cls in _classes(RUNTIME / file).items():
        defined, read = _self_attributes(cls)
        if read - defined:
            unset[name] = sorted(read - defined)
    assert not unset, f"{file}: attributes read off self that the class neither sets nor defines: {unset}"


def test_the_check_sees_a_mixin_and_an_attribute_set_elsewhere():
    cls = ast.parse("class Requests:\n    def go(self):\n        return self._kc.send()\n").body[0]
    defined, read = _self_attributes(cls)
    assert read - defined == {"_kc"}
