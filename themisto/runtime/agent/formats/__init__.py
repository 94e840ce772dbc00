"""The safe formats of stored values, one module each, with its writer, reader and check side by side: tagged JSON
(`tagged_json`, one table of tags: `tags`, `builtin_tags`, `library_tags`; with `definitions`: the user's functions
and classes as their source, a library's by name), `.npy` (`npy`), scipy's sparse matrices as `.npz` (`npz`),
pandas' frames, series and indexes as Parquet (`parquet`), fitted scikit-learn models as skops (`skops`, with its
trust list). No format runs code when read; no pickle is written or
read. The kernel's store (themisto.runtime.agent.values), the restore (themisto.runtime.agent.restore,
themisto.replay.restore) and the release's check (themisto.release.values) go through this registry; nothing else
knows a format.

Adding a format is one module that declares `FORMAT` (themisto.runtime.agent.formats.base.Format) and one entry in
`REGISTRY`, in the order a value is offered to the formats.

Standard library at import, in the kernel and on the host: a format imports its library (numpy, pandas, pyarrow,
scipy, skops) only where a value of its kind is written, read or checked.
"""

from __future__ import annotations

from typing import Any, Callable

from themisto.runtime.agent.formats import npy, npz, parquet, skops, tagged_json
from themisto.runtime.agent.formats.base import (Caps, Format, Malformed, Resolve, Unstorable, ValueFormatError,
                                                 Writing)

# The formats, in the order a value is offered to them (the first that holds it writes it).
REGISTRY: list[Format] = [parquet.FORMAT, npy.FORMAT, npz.FORMAT, skops.FORMAT, tagged_json.FORMAT]


def names() -> list[str]:
    """The formats' names, in the registry's order: a values row's `format` is one of them."""
    return [fmt.name for fmt in REGISTRY]


def named(name: Any) -> Format | None:
    """The format called `name`, or None."""
    return next((fmt for fmt in REGISTRY if fmt.name == name), None)


def file_name(digest: str, name: str) -> str:
    """The stored file of a value: its content hash and its format's extension (KeyError for an unknown format)."""
    found = named(name)
    if found is None:
        raise KeyError(name)
    return digest + found.extension


def holding(value: Any) -> Format | None:
    """The format that writes `value`, or None when none has a safe form of its kind."""
    return next((fmt for fmt in REGISTRY if fmt.holds(value)), None)


def read_value(data: bytes, name: str, resolve: Resolve) -> Any:
    """The value stored as `data` (a file's bytes) in the format `name`; `resolve(hash)` gives a value a JSON
    document refers to. Never runs code from the data: no pickle is read, and a model loads only trusted types. A
    function or class comes back as a `definitions.Definition`."""
    found = named(name)
    if found is None:
        raise Malformed(f"unknown value format {name!r}")
    return found.read(data, resolve)


def refs(name: str, data: Callable[[], bytes]) -> list[str]:
    """The content hashes of the values a stored value holds that are stored on their own; `data()` gives its bytes,
    read only where its format can hold such values."""
    found = named(name)
    return found.refs(data()) if found is not None and found.refs is not None else []


def plain_value(name: str, data: bytes) -> tuple[bool, Any]:
    """(True, value) where the stored value reads back with the standard library alone (any host can hash it
    again); else (False, None)."""
    found = named(name)
    return found.plain(data) if found is not None and found.plain is not None else (False, None)


def check_value(name: Any, data: bytes, value_bytes: int) -> None:
    """Refuse (ValueFormatError) bytes that are not the format `name`, one of the safe formats, within
    `value_bytes`; a pickle is refused whatever format it claims, never loaded."""
    found = named(name)
    if found is None:
        raise ValueFormatError(f"an unknown value format {str(name)[:40]!r} (known: {', '.join(sorted(names()))})")
    if len(data) > value_bytes:
        raise ValueFormatError(f"{len(data):,} bytes, over the per-value cap of {value_bytes:,}")
    if data.startswith(b"\x80"):
        raise ValueFormatError("a pickle (never read)")
    found.check(data, value_bytes)


__all__ = ["REGISTRY", "Caps", "Format", "Malformed", "Unstorable", "ValueFormatError", "Writing", "check_value",
           "file_name", "holding", "named", "names", "plain_value", "read_value", "refs"]
