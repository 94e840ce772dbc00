"""A toy value format, whole in this one module as a format of themisto.runtime.agent.formats is: `fractions.Fraction`
as the text "numerator/denominator". tests/test_value_formats.py adds it to the registry and sees a fraction written,
checked and restored."""

from __future__ import annotations

import fractions
import re
from typing import Any

from themisto.runtime.agent.formats.base import Format, Malformed, Resolve, ValueFormatError, Writing

_TEXT = re.compile(rb"-?[0-9]{1,400}/[1-9][0-9]{0,399}\Z")


def holds(value: Any) -> bool:
    return type(value) is fractions.Fraction


def write(value: Any, writing: Writing) -> tuple[bytes, None]:
    return f"{value.numerator}/{value.denominator}".encode("ascii"), None


def read(data: bytes, resolve: Resolve) -> Any:
    if not _TEXT.match(data):
        raise Malformed("not a fraction's text")
    return fractions.Fraction(data.decode("ascii"))


def check(data: bytes, bound: int) -> None:
    if not _TEXT.match(data):
        raise ValueFormatError("not a fraction's text (numerator/denominator)")


FORMAT = Format("fraction", holds, write, read, check)
