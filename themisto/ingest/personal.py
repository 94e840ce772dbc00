"""Personal data is masked where it enters: user names in paths, IP addresses, e-mail addresses, and host names
and user names in URLs, network paths and shell prompts.

Every reader passes each text it keeps (a cell's code, an error's message, a notebook name, a file's name) through
`mask_personal` before the text leaves it, so nothing downstream (replay, releases, prompts, reports) can carry
them. The mask is the same in every field. Kept on purpose: loopback and unspecified addresses (127.x.x.x,
0.0.0.0: nobody's), and the address in the template's `check_logging("http://…")` cell, the organisers' public
collection server that every participant's notebook started with.

Host names are a machine's, not a public site's: a URL's host with no dot (`http://labserver:8888/`) or under a
suffix only a private network resolves (`.local`, `.lan`, `.internal`, `.intranet`, `.corp`, `.localdomain`,
`.home.arpa`), the server of a Windows network path (`\\\\fileserver\\share`), a cloud machine's name that holds its
address (`ip-10-1-2-3`), a Windows machine's default name (`DESKTOP-1A2B3C4`), and such a name printed alone where
its first label holds a digit or a hyphen (`build-07.cluster.local`; `threading.local` is code). Public domains
(`github.com`) are kept: they are nobody's. A user name goes with its host in `user@host:` (scp, ssh, a shell prompt)
and before a URL's host (`https://user@host/`).
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


HOST_MASK = "<host>"
_PRIVATE_SUFFIX = r"(?:local|lan|internal|intranet|corp|localdomain|home\.arpa)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# A URL's user and host: `scheme://[user@]host[:port]`; the host judged by `_private_host`.
_URL_HOST = re.compile(rf"(\b[A-Za-z][A-Za-z0-9+.-]*://)(?:([^\s/@'\"<>]+)@)?({_LABEL}(?:\.{_LABEL})*)"
                       r"(?=[:/?#\s'\"<>)\]]|$)")
_UNC = re.compile(rf"(?:(?<=^)|(?<=[\s\"'(\[=,;]))(\\{{2,}})({_LABEL}(?:\.{_LABEL})*)(?=\\)", re.MULTILINE)
_SCP = re.compile(rf"(?<![\w.@-])([a-z_][a-z0-9_.-]{{0,31}})@({_LABEL}(?:\.{_LABEL})*):(?=[~/\w$]|\s|$)")
_MACHINE = re.compile(rf"\b(?:ip-\d{{1,3}}(?:-\d{{1,3}}){{3}}(?:\.{_LABEL})*|(?:DESKTOP|LAPTOP)-[A-Z0-9]{{7,8}}\b"
                      rf"|(?=[A-Za-z0-9-]*[0-9-])[A-Za-z0-9-]+(?:\.{_LABEL})*\.{_PRIVATE_SUFFIX}\b(?!\())")
_KEPT_HOSTS = frozenset({"localhost", "127.0.0.1", "0.0.0.0"})
_MACHINE_WORDS = ("ip-", "DESKTOP-", "LAPTOP-", ".local", ".lan", ".internal", ".intranet", ".corp", ".home.arpa")


def _private_host(host: str) -> bool:
    """Whether a URL's host names a machine rather than a public site (see the module's docstring)."""
    lower = host.lower()
    if lower in _KEPT_HOSTS or lower.replace(".", "").isdigit():  # addresses are `_mask_ips`' to judge
        return False
    return "." not in lower or bool(re.search(rf"\.{_PRIVATE_SUFFIX}$", lower)) or bool(_MACHINE.fullmatch(host))


def _mask_url(match: re.Match) -> str:
    scheme, user, host = match.groups()
    if scheme.lower() in ("s3://", "gs://", "file://") or not _private_host(host):
        return match.group() if user is None else f"{scheme}{USER_MASK}@{host}"
    return f"{scheme}{'' if user is None else USER_MASK + '@'}{HOST_MASK}"


def _mask_hosts(text: str) -> str:
    if "://" in text:
        text = _URL_HOST.sub(_mask_url, text)
    if "\\\\" in text:
        text = _UNC.sub(lambda m: m.group(1) + HOST_MASK, text)
    if "@" in text:
        text = _SCP.sub(lambda m: f"{USER_MASK}@{HOST_MASK}:", text)
    return _MACHINE.sub(HOST_MASK, text) if any(word in text for word in _MACHINE_WORDS) else text


def _mask_network(text: str) -> str:
    """Host names, then IP addresses."""
    text = _mask_hosts(text)
    return _mask_ips(text) if _DOTTED.search(text) else text


def _mask_ips(text: str) -> str:
    return _IPV4.sub(lambda m: m.group() if _KEPT_IP.match(m.group()) else IP_MASK, text)


def mask_personal(text: str) -> str:
    """`text` with user names in paths, IP addresses, e-mail addresses, host names and the user names beside them
    masked.

    >>> mask_personal(r'open("C:\\\\Users\\\\Jane Doe\\\\data.txt") # ip 192.168.0.7, mail jane@example.org')
    'open("C:\\\\\\\\Users\\\\\\\\<user>\\\\\\\\data.txt") # ip <ip>, mail <email>'
    >>> mask_personal("File /home/jdoe/x.py; total/users/n; X@w.values; 127.0.0.1; v1.2.3")
    'File /home/<user>/x.py; total/users/n; X@w.values; 127.0.0.1; v1.2.3'
    >>> mask_personal("path = base  #/home/jdoe/data was the old one")
    'path = base  #/home/<user>/data was the old one'
    >>> mask_personal("scp jdoe@gpu-box:~/x .; http://labserver:8888/tree; https://github.com/x; ip-10-0-0-7 up")
    'scp <user>@<host>:~/x .; http://<host>:8888/tree; https://github.com/x; <host> up'
    """
    if not text:
        return text
    folded = text.casefold()
    # Cheap tests first: most fields (ids, times, code without paths) hold none of the three.
    if "users" in folded or "home" in folded or "documents and settings" in folded:
        text = _USER_DIR.sub(lambda m: m.group(1) + USER_MASK, text)
    if "@" in text:
        text = _EMAIL.sub(EMAIL_MASK, text)
    kept = [m.span() for m in _TEMPLATE_CHECK.finditer(text)] if "check_logging" in text else []
    if not kept:
        return _mask_network(text)
    pieces, pos = [], 0
    for start, end in kept:
        pieces += [_mask_network(text[pos:start]), text[start:end]]
        pos = end
    return "".join(pieces) + _mask_network(text[pos:])
