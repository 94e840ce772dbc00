"""Arrays as `.npy` (numpy's own file, written and read with `allow_pickle=False`): a numpy array of any dtype but
object (an object array is tagged JSON, its items one by one).

Standard library at import; numpy is imported where an array is written, read or checked.
"""

from __future__ import annotations

import io
from typing import Any

from themisto.runtime.agent.formats.base import Format, Resolve, Unstorable, ValueFormatError, Writing


def holds(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray" and not value.dtype.hasobject


def write(value: Any, writing: Writing) -> tuple[bytes, None]:
    import numpy as np

    cap = writing.caps.value_bytes
    if value.nbytes > cap:  # its file would be larger still: refused before it is copied
        raise Unstorable(f"{value.nbytes:,} bytes of data, over the per-value cap of {cap:,}")
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue(), None


def read(data: bytes, resolve: Resolve) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def check(data: bytes, bound: int = 0) -> None:
    import numpy as np

    if not data.startswith(b"\x93NUMPY"):
        raise ValueFormatError("not a .npy file (no NUMPY magic)")
    try:
        np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise ValueFormatError(f"not a .npy array numpy reads without pickle ({str(error)[:120]})") from None


FORMAT = Format("npy", holds, write, read, check)
