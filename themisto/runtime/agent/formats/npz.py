"""scipy's sparse matrices (csr, csc, coo) as `.npz`: a zip of `.npy` files (the format, the shape, the arrays, and
the flags scipy caches), written with one fixed time so that two builds write the same bytes.

Standard library at import; numpy and scipy are imported where a matrix is written or read, numpy where checked.
"""

from __future__ import annotations

import io
from typing import Any

from themisto.runtime.agent.formats import npy
from themisto.runtime.agent.formats.base import (Format, Malformed, Resolve, ValueFormatError, Writing, checked_zip,
                                                 fixed_zip)

SPARSE_FORMATS = ("csr", "csc", "coo")
_SPARSE_FLAGS = ("_has_sorted_indices", "_has_canonical_format")
_ARRAYS = frozenset({"format", "shape", "data", "indices", "indptr", "row", "col", "flag_names", "flag_values"})


def holds(value: Any) -> bool:
    return (type(value).__module__ or "").startswith("scipy.sparse") and getattr(value, "format", None) in SPARSE_FORMATS


def write(value: Any, writing: Writing) -> tuple[bytes, None]:
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
    return fixed_zip(members), None


def read(data: bytes, resolve: Resolve) -> Any:
    import numpy as np
    import scipy.sparse as sp

    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        fmt = str(arrays["format"])
        if fmt not in SPARSE_FORMATS:
            raise Malformed(f"unknown sparse format {fmt!r}")
        shape = tuple(int(n) for n in arrays["shape"])
        if fmt == "coo":
            made = sp.coo_matrix((arrays["data"], (arrays["row"], arrays["col"])), shape=shape)
        else:
            kind = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
            made = kind((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)
        for flag, value in zip(arrays["flag_names"].tolist(), arrays["flag_values"].tolist()):
            if flag not in _SPARSE_FLAGS:
                raise Malformed(f"unknown sparse flag {flag!r}")
            vars(made)[flag] = bool(value)
    return made


def check(data: bytes, bound: int = 0) -> None:
    archive = checked_zip(data, "a .npz archive")
    for name in archive.namelist():
        if not name.endswith(".npy") or name[:-4] not in _ARRAYS:
            raise ValueFormatError(f"a .npz member {name[:60]!r} that a sparse matrix does not have")
        npy.check(archive.read(name))


FORMAT = Format("npz", holds, write, read, check)
