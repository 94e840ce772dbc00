"""Personal data found in the raw JuNE files by a finder of its own (not themisto.ingest.personal's masking), and
looked for in any text: user names in paths, the events' IP addresses, e-mail addresses. A leak is reported by its
kind and where, never by its value, so a failing test prints no one's name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

NAME = re.compile(r'(?:^|[\s"\'(=,:;\\/])(?:[A-Za-z]:)?(?:\\+|/+)(?:Users|home)(?:\\+|/+)([A-Za-z][\w.-]*)')
IP_FIELD = re.compile(r'ip_address\\*"\s*:\s*\\*"([0-9.]+)')
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]*\d)")
EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}")


@dataclass(frozen=True)
class Found:
    """What the raw files hold: user names in paths, the events' IP addresses and e-mail addresses."""

    names: frozenset[str]
    ips: frozenset[str]
    mails: frozenset[str]


def find_personal(paths: Iterable[Path]) -> Found:
    names, ips, mails = set(), set(), set()
    for path in paths:
        text = path.read_text(encoding="utf-8")
        names |= {m.group(1) for m in NAME.finditer(text)}
        ips |= {m.group(1) for m in IP_FIELD.finditer(text)}
        mails |= set(EMAIL.findall(text))
    return Found(frozenset(names), frozenset(ips), frozenset(mails))


def leaks(text: str, found: Found, where: str) -> list[str]:
    """Each name or address of `found` in `text`, and each IPv4 address outside the template's check_logging(...)
    call (the organisers' public server, kept on purpose), as `kind #i in where` (the value is not given)."""
    folded = text.casefold()
    out = [f"name #{i} in {where}" for i, n in enumerate(sorted(found.names)) if n.casefold() in folded]
    out += [f"address #{i} in {where}" for i, a in enumerate(sorted(found.ips | found.mails)) if a in text]
    for match in IPV4.finditer(text):
        if not match.group().startswith("127.") and text.rfind("check_logging(", 0, match.start()) < match.start() - 40:
            out.append(f"an IPv4 address at offset {match.start()} in {where}")
    return out
