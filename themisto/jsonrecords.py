"""Dataclass records read back from JSON: one tolerant constructor for every record a run writes and resumes from.

A record written by a newer Themisto may carry fields this one does not know (ignored), and one written by an older
Themisto may lack fields added since (they take their defaults); a missing field without a default is an error that
names the record type and the field.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def from_dict(cls: type[T], data: Mapping[str, Any], **converted: Any) -> T:
    """An instance of the dataclass `cls` from `data`; `converted` gives fields already turned into their types.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Point:
    ...     x: int
    ...     y: int = 0
    >>> from_dict(Point, {"x": 1, "z": 9}), from_dict(Point, {"x": 1, "y": 2})
    (Point(x=1, y=0), Point(x=1, y=2))
    >>> from_dict(Point, {"y": 2})
    Traceback (most recent call last):
    ...
    ValueError: Point record: missing field(s) x
    """
    known = {f.name: f for f in fields(cls) if f.init}
    values = {key: value for key, value in data.items() if key in known}
    values.update(converted)
    missing = [name for name, f in known.items()
               if name not in values and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} record: missing field(s) {', '.join(missing)}")
    return cls(**values)
