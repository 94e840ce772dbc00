"""The values of the user's variables, written in formats that never run code when read, content-addressed by the
hashes snapshots compute; and read back.

Formats (`FORMATS`): tagged JSON (`valuejson`) for builtins, scalars, matches, object arrays, containers (whose
frames and arrays are stored on their own and named by hash), the defining source of the user's functions and
classes, and references to a library's functions and classes; `.npy` (`allow_pickle=False`) for arrays; `.npz` (a zip
of `.npy` files) for scipy's sparse matrices; Parquet (pyarrow) for frames, series and indexes, with what pandas needs
to give back their dtypes, index and column order; skops for fitted scikit-learn models (loaded with only the types
skops trusts, plus numpy scalars and sparse matrices). A value is written once per content hash, and read back and
hashed again right away: only a value that comes back with the same hash counts as `exact` (restorable). What cannot
be stored is named with the reason. No pickle is written or read.

Runs inside the kernel: standard library only at import; numpy, pandas, pyarrow, scipy and skops are imported only
when a value of theirs is there.
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import time
import types
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable

from themisto.runtime.agent import valuejson
from themisto.runtime.agent.hashing import content_digest, content_hash
from themisto.runtime.agent.namespace import UNHASHABLE, module_bindings, qualname
from themisto.runtime.agent.skops_names import import_skops_io
from themisto.runtime.agent.sources import NoSource, USER_MODULE, class_source, function_source, is_user_defined

# format -> file extension; the release (themisto.release.folder) reads and checks these formats and no others.
FORMATS = {"json": ".json", "npy": ".npy", "npz": ".npz", "parquet": ".parquet", "skops": ".skops"}
VALUES_DIR_ENV = "THEMISTO_VALUES_DIR"  # the kernel's values folder (themisto.runtime.kernel_setup sets it)
DOCUMENT_KEY = "themisto_value"  # the version key of a JSON document; also the Parquet schema's metadata key
DOCUMENT_VERSION = 1
SPARSE_FORMATS = ("csr", "csc", "coo")
# Beyond the types skops trusts (scikit-learn's own), the data types a fitted model holds; never code.
SKOPS_TRUSTED = tuple(f"numpy.{name}" for name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
    "complex64", "complex128", "bool_", "str_", "bytes_")) + tuple(
    f"scipy.sparse._{kind}.{kind}_matrix" for kind in SPARSE_FORMATS)
_SERIES_COLUMN = "__themisto_series__"
_SPARSE_FLAGS = ("_has_sorted_indices", "_has_canonical_format")
_JSON_NODES = 1_000_000


@dataclass(frozen=True)
class Caps:
    """How large one stored value may be (any file, and a JSON document: the bulkiest of the formats), and how long
    one snapshot may spend storing values: the store rides on the cell's own request, within the cell's timeout, so
    what is left when the time runs out is stored at the next snapshot that still holds it."""

    value_bytes: int = 64 << 20
    json_bytes: int = 4 << 20
    seconds: float = 10.0


class Unstorable(Exception):
    """The value cannot be stored exactly in a safe format; the message is the reason."""


def file_name(digest: str, fmt: str) -> str:
    return digest + FORMATS[fmt]


# ---------------------------------------------------------------------------------------------------------------
# Writing one value


def _is_sparse(value: Any) -> bool:
    return (type(value).__module__ or "").startswith("scipy.sparse") and getattr(value, "format", None) in SPARSE_FORMATS


def _is_estimator(value: Any) -> bool:
    base = sys.modules.get("sklearn.base")
    return base is not None and isinstance(value, base.BaseEstimator) and not isinstance(value, type)


def _library_reference(value: Any) -> dict | None:
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
    return {valuejson.TAG: "import", "module": module, "qualname": name} if found is value else None


def _why_not(value: Any, stored: bool = True) -> str:
    """The reason a value of this kind has no safe format (`stored` False: the reason is elsewhere, name the kind)."""
    kind = qualname(value)
    if isinstance(value, io.IOBase):
        return "an open file: never stored (reopening it could change the file)"
    if isinstance(value, types.GeneratorType) or kind.endswith(("generator", "iterator")):
        return "a generator or iterator: its position cannot be stored"
    if kind.startswith("matplotlib."):
        return "a matplotlib figure or axes: no safe format gives it back"
    if kind.startswith(("pandas.core.groupby", "pandas.core.window", "pandas.core.resample")):
        return "a lazy pandas grouping (a rolling window, a resampler): no safe format gives it back"
    if type(value).__module__ == USER_MODULE:
        return f"an object of a class the user defined ({kind}): no safe format stores it"
    return f"a {kind}" + (": no safe format stores it" if stored else "")


@dataclass
class _Writer:
    """One value written into `folder`, with the values it refers to (a dict's frames) written on their own."""

    folder: str
    caps: Caps
    known: Callable[[str], bool]  # whether a hash is stored already (this call or an earlier one)
    known_hashes: dict[int, str]  # id -> content hash of the namespace's values, from the snapshot
    cell_text: str | None
    written: list[dict] = field(default_factory=list)
    live: dict[str, Any] = field(default_factory=dict)  # hash -> the value referred to, for the check below

    def store(self, value: Any, digest: str) -> tuple[str, bool]:
        """Write `value` under `digest` unless it is there; (format, exact). Raises Unstorable."""
        if digest.startswith((UNHASHABLE, "repr:")):
            why = f"its hash failed: {digest.split(':', 1)[1]}" if digest.startswith(UNHASHABLE) else "hashed by its repr"
            raise Unstorable(f"{_why_not(value, stored=False)} (no exact content hash: {why})")
        fmt, data, needs = self._encode(value)
        if len(data) > (self.caps.json_bytes if fmt == "json" else self.caps.value_bytes):
            cap = self.caps.json_bytes if fmt == "json" else self.caps.value_bytes
            raise Unstorable(f"{len(data):,} bytes as {fmt}, over the per-value cap of {cap:,}")
        path = os.path.join(self.folder, file_name(digest, fmt))
        partial = path + ".partial"
        try:
            with open(partial, "wb") as fh:
                fh.write(data)
            os.replace(partial, path)
        except OSError as error:
            if os.path.exists(partial):
                os.unlink(partial)
            raise Unstorable(f"it could not be written ({type(error).__name__}: {error})"[:300]) from None
        exact = self._comes_back(data, fmt, digest, needs)
        self.written.append({"hash": digest, "format": fmt, "type": qualname(value), "exact": exact,
                             "bytes": len(data)})
        return fmt, exact

    def _comes_back(self, data: bytes, fmt: str, digest: str, needs: list[str] | None = None) -> bool:
        try:
            if fmt == "skops" and needs is not None:
                # what read_value does, its audit done by _skops_bytes
                again = import_skops_io().loads(data, trusted=needs)
            else:
                again = read_value(data, fmt, self.live.__getitem__)
            if isinstance(again, Definition):
                return True  # a source compiles to the object's own code; a reference is the object (checked)
            return content_digest(again)[0] == digest
        except Exception:  # noqa: BLE001 - anything a reader raises means the value does not come back
            return False

    def _ref(self, value: Any) -> str:
        digest = self.known_hashes.get(id(value)) or content_hash(value)
        self.live[digest] = value
        if not self.known(digest) and not any(w["hash"] == digest for w in self.written):
            try:
                _, exact = self.store(value, digest)
            except Unstorable as error:
                raise valuejson.Unencodable(f"it holds {qualname(value)}: {error}") from None
            if not exact:
                raise valuejson.Unencodable(f"it holds {qualname(value)}, which does not come back exactly")
        return digest

    def _encode(self, value: Any) -> tuple[str, bytes, list[str] | None]:
        """(format, bytes, for skops the types its loader must trust: the check right after writing needs no
        second audit of the file)."""
        module = type(value).__module__ or ""
        if module.startswith("pandas") and type(value).__name__ in _PANDAS_STORED:
            return "parquet", _parquet_bytes(value), None
        if module == "numpy" and type(value).__name__ == "ndarray" and not value.dtype.hasobject:
            import numpy as np

            if value.nbytes > self.caps.value_bytes:  # its file would be larger still: refused before it is copied
                raise Unstorable(f"{value.nbytes:,} bytes of data, over the per-value cap of {self.caps.value_bytes:,}")
            buffer = io.BytesIO()
            np.save(buffer, value, allow_pickle=False)
            return "npy", buffer.getvalue(), None
        if _is_sparse(value):
            return "npz", _sparse_bytes(value), None
        if _is_estimator(value):
            return ("skops", *_skops_bytes(value, self.caps.value_bytes))
        if is_user_defined(value):
            try:
                source = (function_source(value) if isinstance(value, types.FunctionType)
                          else class_source(value, self.cell_text))
            except NoSource as error:
                raise Unstorable(str(error)) from None
            return "json", _document(value, {valuejson.TAG: "source", **source}), None
        reference = _library_reference(value)
        if reference is not None:
            return "json", _document(value, reference), None
        if _json_kind(value):
            try:
                encoded = valuejson.encode(value, self._ref, [_JSON_NODES])
            except valuejson.Unencodable as error:
                raise Unstorable(str(error)) from None
            except RecursionError:
                raise Unstorable("nested too deep for JSON") from None
            return "json", _document(value, encoded), None
        raise Unstorable(_why_not(value))


_PANDAS_STORED = frozenset({"DataFrame", "Series", "Index", "RangeIndex", "MultiIndex", "DatetimeIndex",
                            "CategoricalIndex"})
_JSON_MODULES = ("builtins", "datetime", "collections", "re", "numpy", "pandas._libs", "pandas.core.groupby")


def _json_kind(value: Any) -> bool:
    module = type(value).__module__ or ""
    return module in _JSON_MODULES or module.startswith(_JSON_MODULES)


def _document(value: Any, encoded: Any) -> bytes:
    text = json.dumps({DOCUMENT_KEY: DOCUMENT_VERSION, "type": qualname(value), "value": encoded},
                      ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.encode("ascii")


def _parquet_bytes(value: Any) -> bytes:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta: dict[str, Any] = {DOCUMENT_KEY: DOCUMENT_VERSION}
    if isinstance(value, pd.Series):
        meta.update(kind="series", name=valuejson.encode(value.name, _no_ref, [1000]))
        frame = value.to_frame(name=_SERIES_COLUMN)
    elif isinstance(value, pd.Index):
        meta["kind"] = "index"
        frame = pd.DataFrame(index=value)
    else:
        meta["kind"] = "frame"
        frame = value
    index = frame.index
    if isinstance(index, pd.DatetimeIndex) and index.freq is not None:
        meta["freq"] = index.freqstr  # Parquet keeps the values, not the frequency the index was made with
    frame, meta["object_columns"] = _object_columns(frame)
    try:
        table = pa.Table.from_pandas(frame, preserve_index=None)
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise Unstorable(f"not storable as Parquet ({type(error).__name__}: {str(error)[:200]})") from None
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           DOCUMENT_KEY.encode(): json.dumps(meta).encode()})
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue().to_pybytes()


_NAN_BITS = struct.unpack("<Q", struct.pack("<d", float("nan")))[0]


def _object_columns(frame: Any) -> tuple[Any, dict[str, list[int]]]:
    """The frame made ready for Parquet, which gives object columns back with None for every missing value: the
    positions of the object columns of strings (or bytes) whose missing values are all NaN ("nan", given back so),
    and of every other object column (a list, a mix of types: "json", written as one tagged-JSON text a cell)."""
    found: dict[str, list[int]] = {"nan": [], "json": []}
    copied = False
    for i in range(frame.shape[1]):
        column = frame.iloc[:, i]
        if column.dtype != object:
            continue
        items = column.tolist()
        kinds = set(map(type, items))
        present = kinds - {type(None), float}
        if (present <= {str} or present <= {bytes}) and float not in kinds:
            continue
        if (present <= {str} or present <= {bytes}) and type(None) not in kinds and all(
                struct.unpack("<Q", struct.pack("<d", item))[0] == _NAN_BITS
                for item in items if type(item) is float):
            found["nan"].append(i)
            continue
        if not copied:
            frame, copied = frame.copy(deep=False), True
        frame.isetitem(i, [json.dumps(valuejson.encode(item, _no_ref, [_JSON_NODES]), ensure_ascii=True,
                                      allow_nan=False) for item in items])
        found["json"].append(i)
    return frame, found


def _no_ref(value: Any) -> str:
    raise valuejson.Unencodable(f"a name of type {qualname(value)}")


def _sparse_bytes(value: Any) -> bytes:
    import numpy as np

    arrays = {"format": np.array(value.format), "shape": np.array(value.shape, dtype=np.int64), "data": value.data}
    if value.format == "coo":
        arrays.update(row=value.row, col=value.col)
    else:
        arrays.update(indices=value.indices, indptr=value.indptr)
    # scipy caches whether the indices are sorted and canonical; a pickle (and so the hash) holds the cached flags,
    # in the order they were cached
    flags = [name for name in vars(value) if name in _SPARSE_FLAGS]
    arrays["flag_names"] = np.array(flags, dtype="<U32")
    arrays["flag_values"] = np.array([bool(vars(value)[name]) for name in flags], dtype=bool)
    members = {}
    for name, array in arrays.items():  # what np.savez writes, without its archive's clock time
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
        members[name + ".npy"] = buffer.getvalue()
    return _fixed_zip(members)


# Every member of an archive this module writes gets this time (zip's earliest), so two builds write the same bytes:
# np.savez and skops stamp the clock time.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _fixed_zip(members: dict[str, bytes], compression: dict[str, int] | None = None) -> bytes:
    """A zip archive of `members` (name -> bytes, in order) whose bytes depend on nothing else."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = (compression or {}).get(name, zipfile.ZIP_STORED)
            info.external_attr = 0o600 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def _canonical_skops(data: bytes) -> bytes:
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
                member = _fixed_zip({i.filename: inner.read(i) for i in inner.infolist()},
                                    {i.filename: i.compress_type for i in inner.infolist()})
        rewritten[renamed.get(name, name)] = member
    compression = {renamed.get(name, name): kind for name, kind in compression.items()}
    # compact: with an indent, json encodes in Python, not C (2 s of a 1,200-tree forest's 4 s, here)
    rewritten["schema.json"] = json.dumps(schema, separators=(",", ":")).encode("utf-8")
    return _fixed_zip(rewritten, compression)


# A skops archive holding more members than this is refused while it is written (about five members a tree), a
# bound on what one value's encoding may cost whatever its bytes: step 132 of a real task-2 log, a bagging of 50
# forests of 300 trees, was still being written when its snapshot's two minutes ran out (skops then cost n^2 in the
# members, before `_CappedZip.namelist`: 5,010 stumps, 25,052 members, took 22 s to write whole).
SKOPS_MEMBERS = 10_000


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


def _skops_dump(value: Any, cap: int) -> bytes:
    """skops.io.dumps (skops 0.6, requirements-kernel.txt: its own steps, in this order) into a capped archive."""
    import skops

    import_skops_io()  # registers the types' get_state functions
    from skops.io._utils import SaveContext, get_state

    buffer = _CappedFile(cap)
    archive = _CappedZip(buffer, SKOPS_MEMBERS)
    try:
        context = SaveContext(zip_file=archive)
        state = get_state(value, context)
        context.clear_memo()
        state["protocol"] = context.protocol
        state["_skops_version"] = skops.__version__
        archive.writestr("schema.json", json.dumps(state))  # _canonical_skops writes it again
        archive.close()
    except BaseException:
        archive.fp = None  # nothing more is written into a refused archive (close() would write its directory)
        raise
    return buffer.getvalue()


def _skops_bytes(value: Any, cap: int) -> tuple[bytes, list[str]]:
    """The model as a canonical skops file, and the types beyond skops's own that loading it trusts (all of them
    in SKOPS_TRUSTED: a model needing others raises Unstorable); renumbering does not change which types it holds.
    Writing stops as soon as the file passes `cap` bytes or SKOPS_MEMBERS members."""
    try:
        sio = import_skops_io()
    except ImportError:
        raise Unstorable("a fitted scikit-learn model, and skops is not installed in the kernel") from None
    try:
        data = _skops_dump(value, cap)
        needs = sio.get_untrusted_types(data=data)
        untrusted = [t for t in needs if t not in SKOPS_TRUSTED]
    except _OverCap as over:
        raise Unstorable(str(over)) from None
    except Exception as error:  # noqa: BLE001 - skops refuses what it cannot represent
        raise Unstorable(f"skops cannot store it ({type(error).__name__}: {str(error)[:200]})") from None
    if untrusted:
        raise Unstorable(f"skops would need types it cannot load safely: {', '.join(untrusted[:5])}")
    return _canonical_skops(data), needs


# ---------------------------------------------------------------------------------------------------------------
# Reading one value (restore, and the check right after writing)


@dataclass(frozen=True)
class Definition:
    """A stored function or class: its source (run by a restore, never by reading) or its library's name."""

    document: dict


def read_value(data: bytes, fmt: str, resolve: Callable[[str], Any]) -> Any:
    """The value stored as `data` (a file's bytes) in `fmt`; `resolve(hash)` gives a value a JSON document refers
    to. Never runs code from the data: no pickle is read, and a model loads only trusted types."""
    if fmt == "json":
        document = json.loads(data)
        if not isinstance(document, dict) or document.get(DOCUMENT_KEY) != DOCUMENT_VERSION:
            raise valuejson.Malformed("not a value document")
        encoded = document["value"]
        if isinstance(encoded, dict) and encoded.get(valuejson.TAG) in ("source", "import"):
            return Definition(encoded)  # themisto.runtime.agent.restore runs it; reading does not
        return valuejson.decode(encoded, resolve)
    if fmt == "npy":
        import numpy as np

        return np.load(io.BytesIO(data), allow_pickle=False)
    if fmt == "npz":
        return _read_sparse(data)
    if fmt == "parquet":
        return _read_parquet(data)
    if fmt == "skops":
        sio = import_skops_io()
        untrusted = sio.get_untrusted_types(data=data)
        refused = [t for t in untrusted if t not in SKOPS_TRUSTED]
        if refused:
            raise valuejson.Malformed(f"a model with types that are not trusted: {', '.join(refused[:5])}")
        return sio.loads(data, trusted=untrusted)
    raise valuejson.Malformed(f"unknown value format {fmt!r}")


def _read_parquet(data: bytes) -> Any:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(pa.BufferReader(data))
    meta = json.loads((table.schema.metadata or {}).get(DOCUMENT_KEY.encode(), b"{}"))
    frame = table.to_pandas()
    columns = meta.get("object_columns") or {}
    if columns.get("nan") or columns.get("json"):
        import numpy as np

        for i in columns.get("nan", []):
            made = frame.iloc[:, int(i)].to_numpy(dtype=object, copy=True)
            made[pd.isna(made)] = float("nan")
            frame.isetitem(int(i), made)
        for i in columns.get("json", []):
            cells = frame.iloc[:, int(i)].tolist()
            made = np.empty(len(cells), dtype=object)
            for row, text in enumerate(cells):
                made[row] = valuejson.decode(json.loads(text), _no_ref)
            frame.isetitem(int(i), made)
    if meta.get("freq") and isinstance(frame.index, pd.DatetimeIndex):
        frame.index.freq = meta["freq"]
    kind = meta.get("kind")
    if kind == "series":
        series = frame[_SERIES_COLUMN]
        series.name = valuejson.decode(meta.get("name"), _no_ref)
        return series
    if kind == "index":
        return frame.index
    if kind != "frame":
        raise valuejson.Malformed(f"not a value Parquet file (kind {kind!r})")
    return frame


def _read_sparse(data: bytes) -> Any:
    import numpy as np
    import scipy.sparse as sp

    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        fmt = str(arrays["format"])
        if fmt not in SPARSE_FORMATS:
            raise valuejson.Malformed(f"unknown sparse format {fmt!r}")
        shape = tuple(int(n) for n in arrays["shape"])
        if fmt == "coo":
            made = sp.coo_matrix((arrays["data"], (arrays["row"], arrays["col"])), shape=shape)
        else:
            kind = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
            made = kind((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)
        for flag, value in zip(arrays["flag_names"].tolist(), arrays["flag_values"].tolist()):
            if flag not in _SPARSE_FLAGS:
                raise valuejson.Malformed(f"unknown sparse flag {flag!r}")
            vars(made)[flag] = bool(value)
    return made


# ---------------------------------------------------------------------------------------------------------------
# The store of one kernel life

HELD = "held"  # the format recorded for a value the host's folder holds (ValueStore.held): this life wrote no file


@dataclass
class ValueStore:
    """What this kernel life stored already (by content hash) and could not store (the reason), so that a value
    unchanged across steps is written once and a hopeless one is not tried again."""

    stored: dict[str, tuple[str, bool]] = field(default_factory=dict)  # hash -> (format, exact)
    refused: dict[str, str] = field(default_factory=dict)  # hash -> reason

    def held(self, hashes: Any) -> None:
        """Take `hashes` as stored, exactly: the host's values folder holds them (an earlier kernel life or another
        trajectory wrote them), so this life does not encode, write and read them back again only for the host to
        drop the copy."""
        if isinstance(hashes, list):
            for digest in hashes:
                if isinstance(digest, str):
                    self.stored.setdefault(digest, (HELD, True))

    def store_all(self, named: dict[str, tuple[Any, str]], folder: str, caps: Caps,
                  cell_text: str | None = None) -> dict:
        """Store each variable's value (name -> (value, content hash)) into `folder`; returns {"written": [one
        record per file written], "unstored": {name: reason}}."""
        os.makedirs(folder, exist_ok=True)
        known_hashes = {id(value): digest for value, digest in named.values()}
        writer = _Writer(folder, caps, lambda digest: digest in self.stored, known_hashes, cell_text)
        unstored: dict[str, str] = {}
        deadline = time.perf_counter() + caps.seconds
        for name, (value, digest) in named.items():
            if digest not in self.stored and digest not in self.refused and time.perf_counter() > deadline:
                unstored[name] = (f"deferred: this snapshot's {caps.seconds:g} s for storing values ran out "
                                  "(stored at the next snapshot that holds it)")
                continue
            if digest in self.stored:
                if not self.stored[digest][1]:
                    unstored[name] = "stored, but it does not come back exactly"
                continue
            if digest in self.refused:
                unstored[name] = self.refused[digest]
                continue
            before = len(writer.written)
            try:
                writer.store(value, digest)
            except Unstorable as error:
                if not digest.startswith(UNHASHABLE):
                    self.refused[digest] = str(error)
                unstored[name] = str(error)
            except Exception as error:  # noqa: BLE001 - one value's failure never loses the others
                unstored[name] = f"{type(error).__name__}: {error}"[:300]
            for record in writer.written[before:]:
                self.stored[record["hash"]] = (record["format"], record["exact"])
            if digest in self.stored and not self.stored[digest][1]:
                unstored[name] = "stored, but it does not come back exactly"
        return {"written": writer.written, "unstored": unstored}


STORE = ValueStore()


def modules_and_aliases(shell: Any, names: list[str]) -> tuple[dict[str, str], list[list[str]]]:
    """The user's module bindings (name -> module name: `pd` -> "pandas") and the groups of the variables `names`
    bound to one object (`df1 = df`), which a restore binds to one object again."""
    namespace = shell.user_ns
    modules = {name: value.__name__ for name, value in module_bindings(shell).items()}
    groups: dict[int, list[str]] = {}
    for name in names:
        value = namespace[name]
        if not isinstance(value, (int, float, str, bool, type(None))):
            groups.setdefault(id(value), []).append(name)
    return modules, sorted(group for group in groups.values() if len(group) > 1)
