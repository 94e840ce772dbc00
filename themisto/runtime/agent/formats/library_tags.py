"""Tagged JSON's tags of numpy's and pandas' values that are not stored on their own: numpy scalars, object arrays
(their items one by one), pandas' Timestamp, Timedelta and NaT, and groupbys (what they group stored on its own, their
keys and options); and a list of naive Timestamps read back at once (themisto.runtime.agent.formats.tagged_json holds
the table).

Runs inside the kernel: standard library at import. A value's type is recognised by its module and name (numpy and
pandas are never imported to write one); reading a tag imports its library.
"""

from __future__ import annotations

import datetime
from typing import Any

from themisto.runtime.agent.formats.base import Malformed, Unencodable
from themisto.runtime.agent.formats.definitions import TAG
from themisto.runtime.agent.formats.tags import Decoding, Encoding, Tag, qualified
from themisto.runtime.agent.hashing import GROUPBY_TYPES, groupby_options, grouping_keys, grouping_name, groupings

_UNITS = ("s", "ms", "us", "ns")


def _module(value: Any) -> str:
    return getattr(type(value), "__module__", "") or ""


def _is_numpy_scalar(value: Any) -> bool:
    return (_module(value) == "numpy" and hasattr(value, "dtype") and hasattr(value, "tobytes")
            and type(value).__name__ != "ndarray")


def _scalar(value: Any, encoding: Encoding) -> dict:
    if value.dtype.hasobject:
        raise Unencodable("a numpy object scalar")
    return {TAG: "numpy", "dtype": value.dtype.str, "hex": value.tobytes().hex()}


def _unscalar(data: dict, decoding: Decoding) -> Any:
    import numpy as np

    dtype = np.dtype(str(data["dtype"]))
    if dtype.hasobject:
        raise Malformed("a numpy object scalar")
    return np.frombuffer(bytes.fromhex(data["hex"]), dtype=dtype)[0]


def _is_object_array(value: Any) -> bool:
    return _module(value) == "numpy" and type(value).__name__ == "ndarray" and value.dtype.hasobject


def _array(value: Any, encoding: Encoding) -> dict:
    return {TAG: "ndarray", "shape": list(value.shape),
            "items": [encoding.item(item) for item in value.ravel(order="C").tolist()]}


def _unarray(data: dict, decoding: Decoding) -> Any:
    import numpy as np

    flat = [decoding.item(item) for item in data["items"]]
    made = np.empty(len(flat), dtype=object)
    for i, item in enumerate(flat):
        made[i] = item
    return made.reshape([int(n) for n in data["shape"]])


def _pandas(name: str) -> Any:
    """Whether a value's type is pandas' `name`."""
    return lambda value: _module(value).startswith("pandas") and type(value).__name__ == name


def _time(value: Any, encoding: Encoding) -> dict:
    """A Timestamp or Timedelta as its integer in its own unit: a microsecond Timestamp far from 1970 has no
    nanosecond value."""
    name = type(value).__name__
    tz = getattr(value, "tz", None)
    if tz is not None and type(tz) is not datetime.timezone:
        raise Unencodable(f"a Timestamp with a {qualified(type(tz))} timezone")
    data = {TAG: name, "value": int(value.asm8.view("i8")), "unit": getattr(value, "unit", "ns")}
    if tz is not None:
        data["utcoffset_s"] = tz.utcoffset(None).total_seconds()
    return data


def _untime(data: dict, decoding: Decoding) -> Any:
    import numpy as np
    import pandas as pd

    tag, unit = data[TAG], str(data["unit"])
    if unit not in _UNITS:
        raise Malformed(f"a {tag} in the unit {unit[:8]!r}")
    if tag == "Timedelta":
        return pd.Timedelta(np.timedelta64(int(data["value"]), unit))
    made = pd.Timestamp(np.datetime64(int(data["value"]), unit))
    if "utcoffset_s" in data:
        made = made.tz_localize("UTC").tz_convert(datetime.timezone(datetime.timedelta(
            seconds=float(data["utcoffset_s"]))))
    return made


def _nat(data: dict, decoding: Decoding) -> Any:
    import pandas as pd

    return pd.NaT


def _is_groupby(value: Any) -> bool:
    return _module(value).startswith("pandas.core.groupby") and type(value).__name__ in GROUPBY_TYPES


def _groupby(value: Any, encoding: Encoding) -> dict:
    """A groupby as what it groups (stored on its own), its keys (names and values, or the frame's column names)
    and its options: what `hashing` hashes of it, and what `_regroup` rebuilds it from."""
    parts = groupings(value)
    if value.axis != 0 or value.level is not None or any(g.level is not None for g in parts):
        raise Unencodable("a grouping by index level or along the columns")
    options = groupby_options(value)
    if not all(type(option) is bool for option in options.values()):
        raise Unencodable("a groupby with options that are not plain flags")
    frame = type(value).__name__ == "DataFrameGroupBy"
    columns = frame and all(g.in_axis and grouping_name(g) in value.obj.columns for g in parts)
    keys = []
    for grouping in parts:
        key = {"name": encoding.item(grouping_name(grouping))}
        if not columns:
            key["vector"] = encoding.item(grouping_keys(grouping))
        keys.append(key)
    return {TAG: "groupby", "frame": frame, "obj": encoding.stored(value.obj), "by_columns": columns,
            "keys": keys, "key_list": isinstance(value.keys, list), "options": options,
            "selection": encoding.item(value._selection) if frame else None}


def _regroup(data: dict, decoding: Decoding) -> Any:
    import pandas as pd

    obj = decoding.item(data["obj"])
    names = [decoding.item(key["name"]) for key in data["keys"]]
    if data["by_columns"]:
        by: Any = names
    else:
        vectors = [decoding.item(key["vector"]) for key in data["keys"]]
        by = [pd.Series(vector.array if isinstance(vector, pd.Series) else vector, index=obj.index, name=name)
              for vector, name in zip(vectors, names)]
    if not data["key_list"]:
        by = by[0]
    options = {name: bool(data["options"][name]) for name in ("as_index", "sort", "group_keys", "observed",
                                                              "dropna")}
    made = obj.groupby(by, **options)
    selection = decoding.item(data["selection"]) if data.get("frame") else None
    return made if selection is None else made[selection]


TAGS = [
    Tag("numpy", matches=_is_numpy_scalar, module="numpy", encode=_scalar, decode=_unscalar, needs="numpy"),
    Tag("ndarray", matches=_is_object_array, module="numpy", encode=_array, decode=_unarray, needs="numpy"),
    Tag("Timestamp", matches=_pandas("Timestamp"), module="pandas._libs", encode=_time, decode=_untime,
        needs="pandas"),
    Tag("Timedelta", matches=_pandas("Timedelta"), module="pandas._libs", encode=_time, decode=_untime,
        needs="pandas"),
    Tag("NaT", matches=_pandas("NaTType"), module="pandas._libs", encode=lambda value, encoding: {TAG: "NaT"},
        decode=_nat, needs="pandas"),
    Tag("groupby", matches=_is_groupby, module="pandas.core.groupby", encode=_groupby, decode=_regroup,
        needs="pandas"),
]

# Lists of this many naive Timestamps of one unit are read back as one vector (one by one costs ~20 µs apiece).
_TIMESTAMP_VECTOR = 64


def timestamps(data: list) -> list | None:
    """A list of naive Timestamps of one unit, read back at once; None where the list is not one."""
    if len(data) < _TIMESTAMP_VECTOR or not all(type(item) is dict and item.get(TAG) == "Timestamp"
                                                 and "utcoffset_s" not in item for item in data):
        return None
    units = {item.get("unit") for item in data}
    if len(units) != 1 or next(iter(units)) not in _UNITS:
        return None
    import numpy as np
    import pandas as pd

    try:
        ticks = np.array([int(item["value"]) for item in data], dtype="int64")
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise Malformed(f"a malformed Timestamp ({type(error).__name__}: {error})") from None
    return list(pd.DatetimeIndex(ticks.view(f"M8[{next(iter(units))}]")))
