"""pandas frames, series and indexes as Parquet (pyarrow), with what pandas needs to give back their dtypes, index
and column order: the kind (frame, series, index), a series' name, a DatetimeIndex's frequency and which object
columns hold strings with NaN or other values (written as tagged JSON, a cell a text), in the schema's metadata.

Standard library at import; pandas and pyarrow are imported where a value is written, read or checked.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from themisto.runtime.agent.formats import tagged_json
from themisto.runtime.agent.formats.base import (DOCUMENT_KEY, DOCUMENT_VERSION, Format, Malformed, Resolve,
                                                 Unstorable, ValueFormatError, Writing)

_STORED = frozenset({"DataFrame", "Series", "Index", "RangeIndex", "MultiIndex", "DatetimeIndex", "CategoricalIndex"})
_KINDS = ("frame", "series", "index")
_SERIES_COLUMN = "__themisto_series__"
_NAN_BITS = struct.unpack("<Q", struct.pack("<d", float("nan")))[0]


def holds(value: Any) -> bool:
    return (type(value).__module__ or "").startswith("pandas") and type(value).__name__ in _STORED


def write(value: Any, writing: Writing) -> tuple[bytes, None]:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta: dict[str, Any] = {DOCUMENT_KEY: DOCUMENT_VERSION}
    if isinstance(value, pd.Series):
        meta.update(kind="series", name=tagged_json.encode(value.name, tagged_json.no_ref, [1000]))
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
    return buffer.getvalue().to_pybytes(), None


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
        frame.isetitem(i, [json.dumps(tagged_json.encode(item, tagged_json.no_ref, [tagged_json.NODES]),
                                      ensure_ascii=True, allow_nan=False) for item in items])
        found["json"].append(i)
    return frame, found


def read(data: bytes, resolve: Resolve) -> Any:
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
                made[row] = tagged_json.decode(json.loads(text), tagged_json.no_ref)
            frame.isetitem(int(i), made)
    if meta.get("freq") and isinstance(frame.index, pd.DatetimeIndex):
        frame.index.freq = meta["freq"]
    kind = meta.get("kind")
    if kind == "series":
        series = frame[_SERIES_COLUMN]
        series.name = tagged_json.decode(meta.get("name"), tagged_json.no_ref)
        return series
    if kind == "index":
        return frame.index
    if kind != "frame":
        raise Malformed(f"not a value Parquet file (kind {kind!r})")
    return frame


def check(data: bytes, bound: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not (data.startswith(b"PAR1") and data.endswith(b"PAR1")):
        raise ValueFormatError("not a Parquet file (no PAR1 magic)")
    try:
        metadata = pq.ParquetFile(pa.BufferReader(data)).schema_arrow.metadata or {}
        header = json.loads(metadata.get(DOCUMENT_KEY.encode(), b"null"))
    except (pa.ArrowException, OSError, ValueError) as error:
        raise ValueFormatError(f"not a readable Parquet file ({str(error)[:120]})") from None
    if not isinstance(header, dict) or header.get("kind") not in _KINDS:
        raise ValueFormatError("a Parquet file without a value header")


FORMAT = Format("parquet", holds, write, read, check)
