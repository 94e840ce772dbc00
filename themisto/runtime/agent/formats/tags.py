"""Tagged JSON's table entry (`Tag`): one tag's name, the kinds of value it writes, its writer and reader side by side,
and what reading it back needs; with what a tag's writer and reader are given (`Encoding`, `Decoding`) and the one
tag every document may hold whatever its value (`REF`: a value stored on its own, named by its content hash).

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from themisto.runtime.agent.formats.definitions import TAG


class Encoding(NamedTuple):
    """What a tag's writer is given beside its value: `item(x)` encodes a value it holds (one level deeper, within
    the document's budget); `ref(x)` stores a value on its own and gives its content hash (or raises Unencodable)."""

    item: Callable[[Any], Any]
    ref: Callable[[Any], str]

    def stored(self, value: Any) -> dict:
        """`value` stored on its own, as the `ref` tag names it."""
        return {TAG: REF.name, "hash": self.ref(value)}


class Decoding(NamedTuple):
    """What a tag's reader is given beside its object: `item(x)` decodes a value it holds (one level deeper);
    `resolve(hash)` gives a value stored on its own."""

    item: Callable[[Any], Any]
    resolve: Callable[[str], Any]


@dataclass(frozen=True, eq=False)
class Tag:
    """One tag of tagged JSON. A value is offered to it by its exact type (`kinds`) or, for a library's type the
    kernel may not have imported, by `matches(value)`, whose types come from `module` (a module or its prefix: the
    format claims that module's values). `encode(value, encoding)` gives the tagged object (`{"$": name, ...}`) or
    raises Unencodable with the reason; `decode(data, decoding)` gives the value back and runs no code (a KeyError,
    TypeError or ValueError there is the document's fault). `needs`: what reading it back needs beyond the standard
    library ("": nothing, a built-in tag, whose value any host hashes again)."""

    name: str
    encode: Callable[[Any, Encoding], Any]
    decode: Callable[[dict, Decoding], Any]
    kinds: tuple[type, ...] = ()
    matches: Callable[[Any], bool] | None = None
    module: str = ""
    needs: str = ""

    @property
    def modules(self) -> set[str]:
        """The modules (or their prefixes) whose values this tag writes."""
        return {kind.__module__ for kind in self.kinds} | ({self.module} if self.module else set())


def qualified(kind: type) -> str:
    """A type's module and name, for a refusal's reason."""
    return f"{getattr(kind, '__module__', None) or 'builtins'}.{kind.__qualname__}"


# Any value no other tag writes (a frame, an array, a function ...): the format's fallback, stored on its own.
REF = Tag("ref", encode=lambda value, encoding: encoding.stored(value),
          decode=lambda data, decoding: decoding.resolve(str(data["hash"])), needs="another stored value")
