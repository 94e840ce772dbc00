"""What every value format shares: the `Format` record a format module declares, the caps and context of one write,
the JSON value document (its header key, also the Parquet schema's metadata key), the errors, and the fixed-time zip
archives and their check (npz and skops are zips of `.npy` files).

Runs inside the kernel and on the host: standard library only.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any, Callable

DOCUMENT_KEY = "themisto_value"  # the version key of a JSON document; also the Parquet schema's metadata key
DOCUMENT_VERSION = 1

Resolve = Callable[[str], Any]  # a content hash -> the value stored under it (a value a JSON document refers to)


@dataclass(frozen=True)
class Caps:
    """How large one stored value may be (any file, and a JSON document: the bulkiest of the formats), and how long
    one snapshot may spend storing values: the store rides on the cell's own request, within the cell's timeout, so
    what is left when the time runs out is stored at the next snapshot that still holds it."""

    value_bytes: int = 64 << 20
    json_bytes: int = 4 << 20
    seconds: float = 10.0


@dataclass(frozen=True)
class Writing:
    """One value's write: the caps, `ref(value)` (stores a value a container holds on its own and gives its content
    hash, or raises Unencodable) and the text of the cell just run (a class without methods is found in it)."""

    caps: Caps
    ref: Callable[[Any], str]
    cell_text: str | None = None


@dataclass(frozen=True)
class Format:
    """One safe format, declared once in its module: the values it holds, and its writer, reader and check side by
    side. `name` is a values row's `format` and, after a dot, the stored file's extension."""

    name: str
    holds: Callable[[Any], bool]  # whether this format writes `value` (the registry asks in its order)
    # (bytes, read_back): read_back() gives the value again from those bytes when the format has a cheaper way than
    # `read` (skops: the types its audit found); None: `read` is used
    write: Callable[[Any, Writing], tuple[bytes, Callable[[], Any] | None]]
    read: Callable[[bytes, Resolve], Any]  # never runs code from the data
    check: Callable[[bytes, int], None]  # refuse (ValueFormatError) bytes that are not this format; the int: a bound
    # the content hashes of the values it holds that are stored on their own; None: a value of it holds none
    refs: Callable[[bytes], list[str]] | None = None
    cap: Callable[[Caps], int] = lambda caps: caps.value_bytes
    # (True, value) where this value reads back with the standard library alone (so any host can hash it again);
    # None or (False, None): it needs its library, or values stored on their own
    plain: Callable[[bytes], tuple[bool, Any]] | None = None

    @property
    def extension(self) -> str:
        return "." + self.name


class Unstorable(Exception):
    """The value cannot be stored exactly in a safe format; the message is the reason."""


class Unencodable(Exception):
    """The value has no exact tagged-JSON form; the message is the reason."""


class Malformed(ValueError):
    """Bytes (a tagged-JSON document, a Parquet file ...) that no writer of their format wrote."""


class ValueFormatError(ValueError):
    """Bytes that are not the safe format they claim to be; the message says what is wrong."""


def document(type_name: str, encoded: Any) -> bytes:
    """A JSON value document: the header, the value's type and its encoded value, compact and ASCII."""
    text = json.dumps({DOCUMENT_KEY: DOCUMENT_VERSION, "type": type_name, "value": encoded},
                      ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.encode("ascii")


def read_document(data: bytes) -> Any:
    """The encoded value of a JSON value document (Malformed when it is not one)."""
    found = json.loads(data)
    if not isinstance(found, dict) or found.get(DOCUMENT_KEY) != DOCUMENT_VERSION:
        raise Malformed("not a value document")
    return found["value"]


# Every member of an archive these formats write gets this time (zip's earliest), so two builds write the same bytes:
# np.savez and skops stamp the clock time.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def fixed_zip(members: dict[str, bytes], compression: dict[str, int] | None = None) -> bytes:
    """A zip archive of `members` (name -> bytes, in order) whose bytes depend on nothing else."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = (compression or {}).get(name, zipfile.ZIP_STORED)
            info.external_attr = 0o600 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def checked_zip(data: bytes, what: str) -> zipfile.ZipFile:
    """`data` opened as a zip archive whose every member passes its CRC (ValueFormatError otherwise)."""
    if not data.startswith(b"PK\x03\x04"):
        raise ValueFormatError(f"not {what} (no zip header)")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        if archive.testzip() is not None:
            raise zipfile.BadZipFile("a member fails its CRC")
        return archive
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueFormatError(f"not {what} ({error})") from None
