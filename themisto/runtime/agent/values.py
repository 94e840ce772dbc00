"""The store of one kernel life: the values of the user's variables written in the safe formats
(themisto.runtime.agent.formats), content-addressed by the hashes snapshots compute. A value is written once per
content hash, and read back and hashed again right away: only a value that comes back with the same hash counts as
`exact` (restorable). What cannot be stored is named with the reason.

Runs inside the kernel: standard library only at import (a format imports its library where a value of its kind is
there).
"""

from __future__ import annotations

import io
import os
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from themisto.runtime.agent import formats
from themisto.runtime.agent.formats.base import Caps, Unencodable, Unstorable, Writing
from themisto.runtime.agent.formats.definitions import Definition
from themisto.runtime.agent.hashing import content_digest, content_hash
from themisto.runtime.agent.namespace import UNHASHABLE, module_bindings, qualname
from themisto.runtime.agent.sources import USER_MODULE

VALUES_DIR_ENV = "THEMISTO_VALUES_DIR"  # the kernel's values folder (themisto.runtime.kernel_setup sets it)


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
        fmt = formats.holding(value)
        if fmt is None:
            raise Unstorable(_why_not(value))
        data, read_back = fmt.write(value, Writing(self.caps, self._ref, self.cell_text))
        cap = fmt.cap(self.caps)
        if len(data) > cap:
            raise Unstorable(f"{len(data):,} bytes as {fmt.name}, over the per-value cap of {cap:,}")
        path = os.path.join(self.folder, digest + fmt.extension)
        partial = path + ".partial"
        try:
            with open(partial, "wb") as fh:
                fh.write(data)
            os.replace(partial, path)
        except OSError as error:
            if os.path.exists(partial):
                os.unlink(partial)
            raise Unstorable(f"it could not be written ({type(error).__name__}: {error})"[:300]) from None
        exact = self._comes_back(data, fmt, digest, read_back)
        self.written.append({"hash": digest, "format": fmt.name, "type": qualname(value), "exact": exact,
                             "bytes": len(data)})
        return fmt.name, exact

    def _comes_back(self, data: bytes, fmt: formats.Format, digest: str,
                    read_back: Callable[[], Any] | None) -> bool:
        try:
            again = read_back() if read_back is not None else fmt.read(data, self.live.__getitem__)
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
                raise Unencodable(f"it holds {qualname(value)}: {error}") from None
            if not exact:
                raise Unencodable(f"it holds {qualname(value)}, which does not come back exactly")
        return digest


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
