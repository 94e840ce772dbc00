"""Fitted scikit-learn models as skops files, with the one trust list: the types beyond scikit-learn's own that a
stored model may hold (numpy scalars, scipy's sparse matrices; never code). Written canonical (objects renumbered,
one fixed time) and capped while written; read with only those types trusted; checked without loading (every node a
data node, every type a trusted one, every member an `.npy` or an `.npz` of them).

Standard library at import; skops (and scikit-learn) are imported where a model is written or read.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from typing import Any, Callable

from themisto.runtime.agent.addresses import stored_int
from themisto.runtime.agent.formats import npy
from themisto.runtime.agent.formats.base import (Format, Malformed, Resolve, Unstorable, ValueFormatError, Writing,
                                                 checked_zip, fixed_zip)
from themisto.runtime.agent.formats.npz import SPARSE_FORMATS
from themisto.runtime.agent.skops_names import import_skops_io

# Beyond the types skops trusts (scikit-learn's own), the data types a fitted model holds; never code.
TRUSTED = tuple(f"numpy.{name}" for name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
    "complex64", "complex128", "bool_", "str_", "bytes_")) + tuple(
    f"scipy.sparse._{kind}.{kind}_matrix" for kind in SPARSE_FORMATS)
# What a checked file's schema may name besides scikit-learn's types and TRUSTED: the builtins and numpy's own.
_BUILTINS = frozenset({"builtins.dict", "builtins.list", "builtins.tuple", "builtins.str", "builtins.int",
                       "builtins.float", "builtins.bool", "builtins.NoneType", "builtins.slice", "builtins.set",
                       "builtins.bytes", "numpy.ndarray", "numpy.dtype"})
# skops' loaders that build data (a Tree and an SGD model are rebuilt from their arrays); never one that loads a
# function, a method or an arbitrary reduce
_LOADERS = frozenset({"ObjectNode", "DictNode", "ListNode", "TupleNode", "SetNode", "JsonNode", "NdArrayNode",
                      "SparseMatrixNode", "DTypeNode", "SliceNode", "BytesNode", "BytearrayNode", "TypeNode",
                      "TreeNode", "SGDNode", "CachedNode", "_DictWithDeprecatedKeysNode"})
# A skops archive holding more members than this is refused while it is written (about five members a tree), a
# bound on what one value's encoding may cost whatever its bytes: step 132 of a real task-2 log, a bagging of 50
# forests of 300 trees, was still being written when its snapshot's two minutes ran out (skops then cost n^2 in the
# members, before `_CappedZip.namelist`: 5,010 stumps, 25,052 members, took 22 s to write whole).
MEMBERS = 10_000


def holds(value: Any) -> bool:
    base = sys.modules.get("sklearn.base")
    return base is not None and isinstance(value, base.BaseEstimator) and not isinstance(value, type)


# ---------------------------------------------------------------------------------------------------------------
# Writing


def canonical(data: bytes) -> bytes:
    """A skops file rewritten so that two processes write the same bytes for one model: skops names every object by
    its address (`__id__`, and an array's member file `<id>.npy`), which is renumbered in the order the schema first
    names it (the same address gets the same number: that is how skops shares one object between its users), and
    every member is stamped with one fixed time (a nested `.npz` too)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        members = {info.filename: archive.read(info) for info in infos}
        compression = {info.filename: info.compress_type for info in infos}
    numbers: dict[int, int] = {}
    renamed: dict[str, str] = {}

    def number(old: int) -> int:
        return numbers.setdefault(old, len(numbers) + 1)

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, item in node.items():
            if key == "__id__" and type(item) is int:
                item = number(item)
            elif key == "content" and node.get("__loader__") == "JsonNode" and isinstance(item, str):
                item = _json_without_addresses(item)
            elif key == "file" and isinstance(item, str) and item in members:
                stem, dot, ext = item.partition(".")
                if stem.isdigit() and item not in renamed:
                    renamed[item] = f"{number(int(stem))}{dot}{ext}"
                item = renamed.get(item, item)
            out[key] = walk(item)
        return out

    schema = walk(json.loads(members.pop("schema.json")))
    rewritten = {}
    for name, member in members.items():
        if name.endswith(".npz"):
            with zipfile.ZipFile(io.BytesIO(member)) as inner:
                member = fixed_zip({i.filename: inner.read(i) for i in inner.infolist()},
                                   {i.filename: i.compress_type for i in inner.infolist()})
        rewritten[renamed.get(name, name)] = member
    compression = {renamed.get(name, name): kind for name, kind in compression.items()}
    # compact: with an indent, json encodes in Python, not C (2 s of a 1,200-tree forest's 4 s, here)
    rewritten["schema.json"] = json.dumps(schema, separators=(",", ":")).encode("utf-8")
    return fixed_zip(rewritten, compression)


def _json_without_addresses(content: str) -> str:
    """A JSON leaf of a model's state with an address of the process that wrote it (scikit-learn's vectorizers keep
    `_stop_words_id = id(...)`) as the one placeholder (`addresses`)."""
    try:
        value = json.loads(content)
    except ValueError:
        return content
    if type(value) is int and stored_int(value) != value:
        return json.dumps(stored_int(value))
    return content


class _OverCap(Exception):
    """The value's file passed a cap while it was being written."""


class _CappedFile(io.BytesIO):
    """An in-memory file that refuses to grow past `cap` bytes, so that a model too large to store costs about the
    cap to refuse, not its whole encoding (689 MB for the bagging of step 129 of that log, refused only once it was
    all written)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def write(self, data: Any) -> int:
        if self.tell() + memoryview(data).nbytes > self.cap:
            raise _OverCap(f"more than {self.cap:,} bytes as skops, over the per-value cap (refused while written)")
        return super().write(data)


class _CappedZip(zipfile.ZipFile):
    """A zip archive that refuses its `members`+1-th member, and answers skops's question before each array it adds
    (is it in `namelist()` already?) without listing every member: that made writing n arrays cost n^2 (a forest of
    1,200 trees, 6,001 members: 0.65 s of listing)."""

    def __init__(self, file: Any, members: int) -> None:
        super().__init__(file, "w")
        self.members = members

    def namelist(self) -> Any:  # a view: skops only asks whether a name is in it
        return self.NameToInfo.keys()

    def writestr(self, name: Any, data: Any, *args: Any, **kwargs: Any) -> None:
        if len(self.filelist) >= self.members:
            raise _OverCap(f"more than {self.members:,} arrays and parts as skops (refused while written)")
        super().writestr(name, data, *args, **kwargs)


def _dump(value: Any, cap: int) -> bytes:
    """skops.io.dumps (skops 0.6, requirements-kernel.txt: its own steps, in this order) into a capped archive."""
    import skops

    import_skops_io()  # registers the types' get_state functions
    from skops.io._utils import SaveContext, get_state

    buffer = _CappedFile(cap)
    archive = _CappedZip(buffer, MEMBERS)
    try:
        context = SaveContext(zip_file=archive)
        state = get_state(value, context)
        context.clear_memo()
        state["protocol"] = context.protocol
        state["_skops_version"] = skops.__version__
        archive.writestr("schema.json", json.dumps(state))  # canonical() writes it again
        archive.close()
    except BaseException:
        archive.fp = None  # nothing more is written into a refused archive (close() would write its directory)
        raise
    return buffer.getvalue()


def write(value: Any, writing: Writing) -> tuple[bytes, Callable[[], Any]]:
    """The model as a canonical skops file (all the types beyond skops's own it holds in TRUSTED: a model needing
    others raises Unstorable; renumbering does not change which types it holds), and its read back trusting the
    types found here, which needs no second audit of the file. Writing stops as soon as the file passes the cap or
    MEMBERS members."""
    try:
        sio = import_skops_io()
    except ImportError:
        raise Unstorable("a fitted scikit-learn model, and skops is not installed in the kernel") from None
    try:
        data = _dump(value, writing.caps.value_bytes)
        needs = sio.get_untrusted_types(data=data)
        untrusted = [t for t in needs if t not in TRUSTED]
    except _OverCap as over:
        raise Unstorable(str(over)) from None
    except Exception as error:  # noqa: BLE001 - skops refuses what it cannot represent
        raise Unstorable(f"skops cannot store it ({type(error).__name__}: {str(error)[:200]})") from None
    if untrusted:
        raise Unstorable(f"skops would need types it cannot load safely: {', '.join(untrusted[:5])}")
    written = canonical(data)
    return written, lambda: sio.loads(written, trusted=needs)


# ---------------------------------------------------------------------------------------------------------------
# Reading and checking


def read(data: bytes, resolve: Resolve) -> Any:
    sio = import_skops_io()
    untrusted = sio.get_untrusted_types(data=data)
    refused = [t for t in untrusted if t not in TRUSTED]
    if refused:
        raise Malformed(f"a model with types that are not trusted: {', '.join(refused[:5])}")
    return sio.loads(data, trusted=untrusted)


def check(data: bytes, bound: int) -> None:
    from themisto.bounded import BoundError, Bounds, loads_json

    archive = checked_zip(data, "a skops file")
    names = archive.namelist()
    if "schema.json" not in names:
        raise ValueFormatError("a skops file without schema.json")
    try:
        schema = loads_json(archive.read("schema.json").decode("utf-8"), Bounds(file_bytes=bound, depth=200),
                            path="schema.json")
    except (BoundError, UnicodeDecodeError) as error:
        raise ValueFormatError(f"a skops file whose schema is not JSON ({error})") from None
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "__loader__" in node:
            kind = f"{node.get('__module__')}.{node.get('__class__')}"
            loader = node.get("__loader__")
            if loader not in _LOADERS:
                raise ValueFormatError(f"a skops file with a {str(loader)[:40]!r} node (only data nodes are loaded)")
            if not (kind.startswith("sklearn.") or kind in _BUILTINS or kind in TRUSTED):
                raise ValueFormatError(f"a skops file naming the untrusted type {kind[:80]!r}")
        stack.extend(node.values())
    for name in names:
        if name == "schema.json":
            continue
        if name.endswith(".npy"):
            npy.check(archive.read(name))
        elif name.endswith(".npz"):
            inner = checked_zip(archive.read(name), "a .npz archive")
            for member in inner.namelist():
                if not member.endswith(".npy"):
                    raise ValueFormatError(f"a skops .npz member {member[:60]!r} that is not .npy")
                npy.check(inner.read(member))
        else:
            raise ValueFormatError(f"a skops member {name[:60]!r} that is neither .npy nor .npz")


FORMAT = Format("skops", holds, write, read, check)
