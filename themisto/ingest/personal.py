"""Personal data is masked where it enters: user names in paths, IP addresses and e-mail addresses.

Every reader passes each text it keeps (a cell's code, an error's message, a notebook name, a file's name) through
`mask_personal` before the text leaves it, so nothing downstream (replay, releases, prompts, reports) can carry
them. The mask is the same in every field. Kept on purpose: loopback and unspecified addresses (127.x.x.x,
0.0.0.0: nobody's), and the address in the template's `check_logging("http://…")` cell, the organisers' public
collection server that every participant's notebook started with.
"""

from __future__ import annotations

import re

USER_MASK = "<user>"
IP_MASK = "<ip>"
EMAIL_MASK = "<email>"

# A path's user folder: `C:\Users\NAME`, `C:\\Users\\NAME` (in a string literal), `/Users/NAME`, `/home/NAME`,
# `/mnt/c/Users/NAME`. The path must start at a boundary (start, space, quote, bracket, `=`; a comment's `#`, as in
# `#/home/NAME/data`; a closing bracket or `>`, where output runs into a path), so `total/users/n` in code is no
# path. A Windows name may hold spaces when a separator follows it.
_SEP = r"(?:\\+|/+)"
_USER_DIR = re.compile(
    r"(?:(?<=^)|(?<=[\s\"'(\[\])=,:;#>`{|]))"
    rf"((?:[A-Za-z]:)?(?:{_SEP}mnt{_SEP}[A-Za-z])?{_SEP}(?:Users|home|Documents and Settings){_SEP})"
    r"((?:[^\\/\s\"'<>|:*?]+(?: [^\\/\s\"'<>|:*?]+)*(?=[\\/]))|[^\\/\s\"'<>|:*?]+)",
    re.IGNORECASE | re.MULTILINE,
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.]*\d)")
_DOTTED = re.compile(r"\d\.\d+\.\d")
_KEPT_IP = re.compile(r"^(?:127\.|0\.0\.0\.0$)")
# The template's logging check, whose URL names the organisers' server; the URL is kept whole.
_TEMPLATE_CHECK = re.compile(r"check_logging\(\s*(\\*[\"'])https?://[^\"'\\\s]+\1\s*\)")
# An e-mail address; the top-level domain must be a common one or a country's, so `X@w.values` stays code.
_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9-]+\.)+"
    r"(?:com|org|net|edu|gov|mil|int|info|biz|io|ai|dev|app|me|co|[A-Za-z]{2})(?![\w.-]*\w)",
    re.IGNORECASE,
)


def _mask_ips(text: str) -> str:
    return _IPV4.sub(lambda m: m.group() if _KEPT_IP.match(m.group()) else IP_MASK, text)


def mask_personal(text: str) -> str:
    """`text` with user names in paths, IP addresses and e-mail addresses masked.

    >>> mask_personal(r'open("C:\\\\Users\\\\Jane Doe\\\\data.txt") # ip 192.168.0.7, mail jane@example.org')
    'open("C:\\\\\\\\Users\\\\\\\\<user>\\\\\\\\data.txt") # ip <ip>, mail <email>'
    >>> mask_personal("File /home/jdoe/x.py; total/users/n; X@w.values; 127.0.0.1; v1.2.3")
    'File /home/<user>/x.py; total/users/n; X@w.values; 127.0.0.1; v1.2.3'
    >>> mask_personal("path = base  #/home/jdoe/data was the old one")
    'path = base  #/home/<user>/data was the old one'
    """
    if not text:
        return text
    folded = text.casefold()
    # Cheap tests first: most fields (ids, times, code without paths) hold none of the three.
    if "users" in folded or "home" in folded or "documents and settings" in folded:
        text = _USER_DIR.sub(lambda m: m.group(1) + USER_MASK, text)
    if "@" in text:
        text = _EMAIL.sub(EMAIL_MASK, text)
    if not _DOTTED.search(text):
        return text
    kept = [m.span() for m in _TEMPLATE_CHECK.finditer(text)]
    if not kept:
        return _mask_ips(text)
    pieces, pos = [], 0
    for start, end in kept:
        pieces += [_mask_ips(text[pos:start]), text[start:end]]
        pos = end
    return "".join(pieces) + _mask_ips(text[pos:])
