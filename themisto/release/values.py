"""The release's `values` config: the values a replay stored (themisto.replay.values), each checked to be one of the
safe formats, capped per value and per release, as rows the `trajectories` rows' variables point into by `hash`;
and the one check of a value's bytes (`check_value`), which the build, `themisto check` and every reader use.

A values row is `hash` (the variables' content hash), `type`, `format` (json, npy, npz, parquet, skops: the formats of
themisto.runtime.agent.formats, whose modules each check their own), `exact` (read back in the kernels' environment,
it hashed the same: a restore can use it), `bytes`, `sha256` and `data` (the file's bytes). No format runs code when
read; a pickle, or a file that claims a format it does not have, is refused, never loaded.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from themisto.runtime.agent import formats
from themisto.runtime.agent.formats.base import Malformed, ValueFormatError

VALUES = "values"  # the config's name
HASH = re.compile(r"[0-9a-f]{32}\Z")


@dataclass(frozen=True)
class ValueCaps:
    """How much of the stored values a release takes: one value's file, and all values of the release."""

    value_bytes: int = 64 << 20
    release_bytes: int = 2 << 30


# ---------------------------------------------------------------------------------------------------------------
# The check of one value's bytes


def check_value(fmt: str, data: bytes, caps: ValueCaps = ValueCaps()) -> None:
    """Refuse (ValueFormatError) bytes that are not `fmt`, one of the safe formats, within `caps.value_bytes`."""
    formats.check_value(fmt, data, caps.value_bytes)


def check_row(row: dict, caps: ValueCaps = ValueCaps()) -> None:
    """One `values` row: its hash, its sha256 over its data, and its data's format (ValueFormatError otherwise)."""
    data = row.get("data")
    if not HASH.match(str(row.get("hash"))):
        raise ValueFormatError(f"the hash {str(row.get('hash'))[:40]!r} is not a content hash")
    if not isinstance(data, bytes) or hashlib.sha256(data).hexdigest() != row.get("sha256"):
        raise ValueFormatError("its data does not have its sha256")
    check_value(row.get("format"), data, caps)


# ---------------------------------------------------------------------------------------------------------------
# The config, from a replay's values folder


@dataclass
class ValuesBuild:
    """The `values` rows of each split, and what the build counted: stored variables and those it could not."""

    rows: dict[str, list[dict]]
    variables: int = 0
    stored: int = 0
    bytes: int = 0
    unstored: dict[str, int] = field(default_factory=dict)  # reason (its first clause) -> variables
    kinds: dict[str, list[int]] = field(default_factory=dict)  # variable_kind -> [variables, stored]


# The kinds of value the issue calls data (frames, series, indexes, arrays, sparse matrices, numbers, strings,
# dates and containers of them), by their type's module and name; functions and classes are definitions.
_DATA_TYPES = frozenset(f"builtins.{name}" for name in (
    "int", "float", "complex", "bool", "str", "bytes", "bytearray", "NoneType", "list", "tuple", "dict", "set",
    "frozenset", "range")) | frozenset({"pandas.core.frame.DataFrame", "pandas.core.series.Series",
                                         "collections.Counter", "collections.OrderedDict", "collections.defaultdict",
                                         "collections.deque"})
_DATA_MODULES = ("numpy.", "scipy.sparse.", "pandas.core.indexes.", "pandas._libs.tslibs.", "pandas.core.arrays.",
                 "datetime.")
_NOT_DATA = ("numpy.random.", "numpy.ufunc")  # a generator's state, a numpy function
_DEFINITION_TYPES = frozenset({"builtins.function", "builtins.type", "abc.ABCMeta"})


def variable_kind(type_name: str) -> str:
    """`data`, `definition` (a function or class) or `other` (models, files, figures, objects of the user's
    classes, ...): what a build counts stored values by."""
    if type_name in _DEFINITION_TYPES:
        return "definition"
    if type_name in _DATA_TYPES or (type_name.startswith(_DATA_MODULES) and not type_name.startswith(_NOT_DATA)):
        return "data"
    return "other"


def _reason_kind(reason: str) -> str:
    return reason.split(":", 1)[0].split(" (", 1)[0]


def release_values(trajectories: dict[str, list[dict]], folder: Path | None,
                   caps: ValueCaps = ValueCaps()) -> ValuesBuild:
    """The `values` rows of each split from the replay's values folder, for the variables of `trajectories` rows
    (split -> rows, in order); each row's `stored_values.unstored` gains the variables this build cannot store
    (no file, refused by the format check, over a cap). Values enter in the order the steps first hold them."""
    from themisto.replay.values import ValueFolder

    taker = _Taker(ValueFolder(folder) if folder is not None else None, caps)
    built = ValuesBuild(rows={})
    for split, rows in trajectories.items():
        taker.pending, taker.checked = [], {}  # each split holds every value its rows point to
        for row in rows:
            if row.get("stored_values") is not None:
                _count_row(built, row, taker.take)
        if taker.pending:
            taker.pending.sort(key=lambda r: r["hash"])
            built.rows[split] = taker.pending
            built.bytes += sum(r["bytes"] for r in taker.pending)
    return built


class _Taker:
    """The values of one build taken from the replay's values folder: each checked once per split, within the caps
    (the release's across every split), with every value it holds."""

    def __init__(self, store: Any, caps: ValueCaps) -> None:
        from themisto.release.scrub import Scrubber

        self.store, self.caps, self.total = store, caps, 0
        self.scrubber = Scrubber()  # a value holding personal data or a credential stays out
        self.checked: dict[str, str | None] = {}  # hash -> None (taken) or the reason it is not
        self.pending: list[dict] = []  # the split's values rows

    def take(self, digest: str) -> str | None:
        """None where the value `digest` names is in the split's rows (taken now or before); else why it is not."""
        if digest in self.checked:
            return self.checked[digest]
        store, caps = self.store, self.caps
        entry = store.entry(digest) if store is not None and HASH.match(digest) else None
        if entry is None:
            self.checked[digest] = "no stored file: the replay did not store it"
            return self.checked[digest]
        data = store.file(entry).read_bytes()
        try:
            check_value(entry.format, data, caps)
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise ValueFormatError("its file changed since the replay stored it")
            refs = formats.refs(entry.format, lambda: data)
        except ValueFormatError as error:
            self.checked[digest] = f"refused by the format check: {error}"
            return self.checked[digest]
        if self.scrubber.holds(entry.format, data):
            self.checked[digest] = "holds personal data or a credential (themisto.release.scrub)"
            return self.checked[digest]
        if self.total + len(data) > caps.release_bytes:
            self.checked[digest] = f"over the release's cap on values ({caps.release_bytes:,} bytes)"
            return self.checked[digest]
        self.checked[digest] = None
        missing = next((why for ref in refs if (why := self.take(ref)) is not None), None)
        if missing is not None:
            self.checked[digest] = f"a value it holds is not stored ({missing})"
            return self.checked[digest]
        self.total += len(data)
        self.pending.append({"hash": digest, "type": entry.type, "format": entry.format, "exact": entry.exact,
                             "bytes": len(data), "sha256": entry.sha256, "data": data})
        return None


def _count_row(built: ValuesBuild, row: dict, take: Callable[[str], str | None]) -> None:
    """One row's variables taken (`take`) and counted into `built`; its `unstored` gains those not taken."""
    stored = row["stored_values"]
    unstored = {item["name"]: item["reason"] for item in stored["unstored"]}
    for variable in row["variables"]:
        built.variables += 1
        name = variable["name"]
        if name not in unstored:
            why = take(str(variable["hash"]))
            if why is not None:
                unstored[name] = why
        counted = built.kinds.setdefault(variable_kind(str(variable.get("type"))), [0, 0])
        counted[0] += 1
        if name in unstored:
            kind = _reason_kind(unstored[name])
            built.unstored[kind] = built.unstored.get(kind, 0) + 1
        else:
            built.stored += 1
            counted[1] += 1
    stored["unstored"] = [{"name": k, "reason": v} for k, v in sorted(unstored.items())]


def values_note(built: ValuesBuild) -> str:
    """The build note on values: how many variables have their value stored, and why the others do not."""
    share = built.stored / built.variables if built.variables else 0.0
    reasons = "; ".join(f"{kind}: {n:,}" for kind, n in sorted(built.unstored.items(), key=lambda kv: -kv[1])[:8])
    kinds = ", ".join(f"{kind} {stored:,} of {n:,} ({stored / n:.1%})"
                      for kind, (n, stored) in sorted(built.kinds.items()) if n)
    return (f"values: {built.stored:,} of {built.variables:,} variable records ({share:.1%}) have their value in "
            f"`values` ({sum(len(r) for r in built.rows.values()):,} rows, {built.bytes:,} bytes)"
            + (f"; by kind: {kinds}" if kinds else "") + (f"; not stored: {reasons}" if reasons else ""))


def decode(row: dict, rows: dict[str, dict] | None = None) -> Any:
    """The value of one `values` row, checked first (`check_row`); `rows` (hash -> row) gives the rows a JSON value
    refers to. A function or class comes back as its document (`{"$": "source", "kind", "binds", "source"}` or an
    import name), never run. Needs numpy, pandas, pyarrow, scipy or skops for values of theirs."""
    from themisto.runtime.agent.formats.definitions import Definition

    check_row(row)

    def resolve(digest: str) -> Any:
        if rows is None or digest not in rows:
            raise ValueFormatError(f"value {row['hash']} refers to {digest}, which is not among the rows given")
        return decode(rows[digest], rows)

    value = formats.read_value(row["data"], row["format"], resolve)
    return value.document if isinstance(value, Definition) else value


# ---------------------------------------------------------------------------------------------------------------
# `themisto check`


def _content_problem(row: dict) -> str | None:
    """For a value that reads back with the standard library alone (builtins only: no numpy or pandas type, no value
    stored on its own), its content hash recomputed here; the others were hashed in the kernels' environment, which
    this process need not have."""
    from themisto.runtime.agent.hashing import content_hash

    plain, value = formats.plain_value(row["format"], row["data"])
    if not plain:
        return None
    found = content_hash(value)
    return None if found == row["hash"] else f"its value hashes to {found}, not to its hash"


def value_problems(paths: list[Path], split: str, caps: ValueCaps = ValueCaps()) -> list[str]:
    """Every `values` row of a split checked: hash, sha256, safe format (a pickle or a file that is not what it
    claims is refused, never loaded), and for builtin values the content hash itself."""
    import pyarrow.parquet as pq

    problems: list[str] = []
    for path in paths:
        try:
            batches = pq.ParquetFile(path).iter_batches(batch_size=64)
            number = 0
            for batch in batches:
                for row in batch.to_pylist():
                    number += 1
                    try:
                        check_row(row, caps)
                        problem = _content_problem(row)
                    except (ValueFormatError, Malformed) as error:
                        problem = str(error)
                    if problem is not None:
                        problems.append(f"{VALUES}/{split}: row {number} (hash {str(row.get('hash'))[:32]}): "
                                        f"refused: {problem}")
        except (OSError, ValueError, KeyError) as error:
            problems.append(f"{VALUES}/{split}: not readable ({error})")
    return problems


def pointer_problems(folder: Path, values_config: dict, trajectories_config: dict) -> list[str]:
    """A trajectories variable that the release says is stored (not in its step's `unstored`) has a `values` row
    in the same split."""
    import pyarrow.parquet as pq

    have: dict[str, set[str]] = {}
    for item in values_config.get("data_files") or []:
        for path in sorted(folder.glob(item.get("path") or "")):
            have.setdefault(item.get("split"), set()).update(
                pq.read_table(path, columns=["hash"]).column("hash").to_pylist())
    problems: list[str] = []
    for item in trajectories_config.get("data_files") or []:
        split = item.get("split")
        for path in sorted(folder.glob(item.get("path") or "")):
            rows = pq.read_table(path, columns=["kernel_id", "step", "variables", "stored_values"]).to_pylist()
            for row in rows:
                if row["stored_values"] is None:
                    continue
                unstored = {u["name"] for u in row["stored_values"]["unstored"]}
                missing = [v["name"] for v in row["variables"]
                           if v["name"] not in unstored and v["hash"] not in have.get(split, set())]
                if missing:
                    problems.append(f"trajectories/{split}: {row['kernel_id']} step {row['step']}: variables "
                                    f"{missing[:3]} point to no `values` row")
    return problems[:50]


@dataclass
class ReleaseValues:
    """A release split's `values` rows as a restore's source (themisto.replay.restore.ValueSource), each row checked
    (`check_row`) before its data is used."""

    rows: dict[str, dict]  # hash -> row

    @classmethod
    def of(cls, info: Any, split: str) -> ReleaseValues:
        """The values of `split` of an opened release (themisto.release.folder.ReleaseInfo); none if it has none."""
        return cls({row["hash"]: row for row in info.rows(VALUES, split)} if info.has(VALUES, split) else {})

    def format_of(self, digest: str) -> str | None:
        row = self.rows.get(digest)
        return row["format"] if row is not None and row["exact"] else None

    def data(self, digest: str) -> bytes:
        row = self.rows[digest]
        check_row(row)
        return row["data"]

    def refs(self, digest: str) -> list[str]:
        fmt = self.format_of(digest)
        return formats.refs(fmt, lambda: self.data(digest)) if fmt is not None else []
