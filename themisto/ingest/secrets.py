"""Credentials in a text found by a maintained scanner (Yelp's detect-secrets, pinned) and replaced by
`<redacted:KIND>`, counted by kind.

Every plugin detect-secrets ships runs in-process on each line of the text (its plugin API, built once under a
settings context; no file, no subprocess), but for the public-IP one (`personal.mask_personal` masks addresses as
`<ip>`). Its heuristic filters drop what is plainly no credential (templates such as `<password>`, sequences, UUIDs,
ids). Two are not used: the allowlist, so a developer's `# pragma: allowlist secret` comment does not keep a
credential; and the indirect-reference one, which drops every report on a line with a call on it
(`conn = connect(password="…")`, `get(url, params={"appid": "…"})`) though in Python these plugins report only
quoted literals. The entropy plugins' reports that are paths (`/data/...`) are no credentials. Where a plugin reports
less than the credential (the GitHub and GitLab plugins report only a token's prefix, the JWT one stops before the
signature) the whole token its pattern matched is replaced; a private key from its BEGIN line through its END line
(or the end of its base64 body); a URL's credentials, user and password both. Each credential found is then
replaced wherever it stands as a whole token in the text (a key assigned on one line and printed on another).
Markers already in a text (`<redacted:password_literal>`, from the corpus's own scrub) are kept as they are. A text
is first searched once for what each plugin needs (`_WORDS`, `_PATTERNS`), so most texts cost a few searches.

>>> redact_secrets("aws = 'AKIAIOSFODNN7EXAMPLE'; print(aws)")
("aws = '<redacted:aws_access_key>'; print(aws)", {'aws_access_key': 1})
>>> redact_secrets("db = 'postgres://admin:hunter2hunter2@db.local/x'")
("db = 'postgres://<redacted:credential_url>@db.local/x'", {'credential_url': 1})
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

REDACTED = "<redacted:{kind}>"
_MARKER = re.compile(r"<redacted:[A-Za-z0-9_-]*>")

# detect-secrets' secret types, as the kinds the markers name (the corpus's own scrub used the same words for the
# kinds both know); a type not listed here is named by its words joined with underscores.
KINDS = {
    "AWS Access Key": "aws_access_key",
    "Artifactory Credentials": "artifactory_token",
    "Azure Storage Account access key": "azure_storage_key",
    "Base64 High Entropy String": "high_entropy_base64",
    "Basic Auth Credentials": "credential_url",
    "Cloudant Credentials": "cloudant_credential",
    "Discord Bot Token": "discord_token",
    "GitHub Token": "github_token",
    "GitLab Token": "gitlab_token",
    "Hex High Entropy String": "high_entropy_hex",
    "IBM COS HMAC Credentials": "ibm_cos_hmac",
    "IBM Cloud IAM Key": "ibm_cloud_iam_key",
    "JSON Web Token": "jwt",
    "Mailchimp Access Key": "mailchimp_key",
    "NPM tokens": "npm_token",
    "OpenAI Token": "openai_key",
    "Private Key": "private_key",
    "PyPI Token": "pypi_token",
    "Secret Keyword": "secret_literal",
    "SendGrid API Key": "sendgrid_key",
    "Slack Token": "slack_token",
    "SoftLayer Credentials": "softlayer_credential",
    "Square OAuth Secret": "square_oauth_secret",
    "Stripe Access Key": "stripe_key",
    "Telegram Bot Token": "telegram_token",
    "Twilio API Key": "twilio_key",
}
_SLACK_WEBHOOK = "slack_webhook"  # the Slack plugin's webhook URLs, told apart from its tokens
_LEFT_OUT = frozenset({"IPPublicDetector"})  # addresses are personal data, masked by personal.py
_ENTROPY = frozenset({"Base64HighEntropyString", "HexHighEntropyString"})
# Plugins that judge a string by its look or by the word before it, not by a vendor's format: an id on the line
# may clear what they report.
_GENERIC = _ENTROPY | {"KeywordDetector"}
# What a text must hold for a plugin to report anything in one of its lines, checked once over the whole text (a
# match inside a line is a match inside the text). Words first (plain substring tests on the case-folded text): the
# stems of the keyword plugin's words, and the words the assignment patterns of the vendor plugins require (their
# patterns start with a look-behind no search can skip ahead on, ~30-70 µs a text). Then patterns: a pattern
# plugin's own; for the entropy plugins a run of their alphabet long enough to pass their limit (entropy is at most
# log2 of the length: 4.5 needs 23 characters, 3.0 needs 9); the keyword plugin needs no more than its words.
_WORDS = {
    "KeywordDetector": ("key", "pass", "pwd", "secret", "contrase"),
    "CloudantDetector": ("key", "pw", "pass", "token", "cloudant"),
    "IbmCloudIamDetector": ("key", "pwd", "pass", "token"),
    "IbmCosHmacDetector": ("key",),
    "SoftlayerDetector": ("key", "pwd", "pass", "token", "softlayer"),
    "ArtifactoryDetector": ("akc", "ap"),
    "MailchimpDetector": ("-us",),
}
_PATTERNS = {
    "KeywordDetector": (),
    "Base64HighEntropyString": (re.compile(r"[A-Za-z0-9+/=]{23}"),),
    "HexHighEntropyString": (re.compile(r"[0-9a-fA-F]{9}"),),
}
_SHORT = 8  # a pattern's group shorter than this is a token's prefix or a fragment, not the credential
_MIN_LINE = 8  # no plugin's pattern fits in fewer characters
# A token a pattern matched only part of runs on: to the right over a token's characters (the JWT plugin's match
# stops before the signature), to the left over word characters (a key id glued to a name).
_TOKEN_TAIL = re.compile(r"[\w\-.+/=]*")
# A private key's block: from the BEGIN line's dashes through the END line; where the END line is missing, through
# the rest of the BEGIN line and the base64 or header lines (`Proc-Type: 4,ENCRYPTED`) that follow it.
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*(?:PRIVATE KEY|KEY BLOCK)[A-Z ]*-----")
_KEY_BODY = re.compile(r"(?:\n[ \t]*(?:[A-Za-z0-9+/=]{16,}|[A-Za-z-]+: [^\n]*|)[ \t]*(?=\n|$))*")


@dataclass(frozen=True)
class _Scanner:
    """detect-secrets' plugins, built once: the private-key one apart (its hits are block starts), the others with
    what a text must hold for each to find anything, the specific ones before the generic ones (a string both
    report is named by the specific one)."""

    private_key: Any
    plugins: tuple[Any, ...]
    words: tuple[tuple[str, ...], ...]  # per plugin: one of these must be in the case-folded text (none: no test)
    patterns: tuple[tuple[re.Pattern, ...], ...]  # then one of these must match (none: no test)


@lru_cache(maxsize=1)
def _scanner() -> _Scanner:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.settings import get_plugins, transient_settings

    names = sorted(cls.__name__ for cls in get_mapping_from_secret_type_to_class().values())
    used = [{"name": name} for name in names if name not in _LEFT_OUT]
    # The settings hold no verification policy, so no plugin ever calls its vendor's API to check a secret.
    with transient_settings({"plugins_used": used}):
        plugins = get_plugins()
    private = next(p for p in plugins if type(p).__name__ == "PrivateKeyDetector")
    rest = sorted((p for p in plugins if p is not private), key=lambda p: type(p).__name__ in _GENERIC)
    words = tuple(_WORDS.get(type(p).__name__, ()) for p in rest)
    patterns = tuple(_PATTERNS.get(type(p).__name__, tuple(getattr(p, "denylist", ()))) for p in rest)
    return _Scanner(private, tuple(rest), words, patterns)


def _candidates(text: str) -> tuple[int, ...]:
    """The plugins that may find something in `text`, by index."""
    scanner, folded = _scanner(), text.casefold()
    return tuple(i for i, (words, patterns) in enumerate(zip(scanner.words, scanner.patterns))
                 if (not words or any(w in folded for w in words))
                 and (not patterns or any(p.search(text) for p in patterns)))


def _kind(plugin: Any, value: str) -> str:
    if type(plugin).__name__ == "SlackDetector" and value.startswith("https://hooks.slack"):
        return _SLACK_WEBHOOK
    return KINDS.get(plugin.secret_type) or re.sub(r"\W+", "_", plugin.secret_type.lower()).strip("_")


def _cleared(plugin: Any, value: str, line: str) -> bool:
    """Whether detect-secrets' heuristic filters say `value` is no credential."""
    from detect_secrets.filters import heuristic

    if (not value or _MARKER.search(value) or heuristic.is_templated_secret(value)
            or heuristic.is_prefixed_with_dollar_sign(value) or heuristic.is_not_alphanumeric_string(value)
            or heuristic.is_sequential_string(value) or heuristic.is_potential_uuid(value)):
        return True
    name = type(plugin).__name__
    if name in _ENTROPY and value[0] in "/~." and "/" in value:
        return True  # a path (or base64 data starting with one, such as a JPEG's `/9j/`), not a credential
    return name in _GENERIC and heuristic.is_likely_id_string(value, line, plugin)


def _token_start(line: str, start: int) -> int:
    while start > 0 and (line[start - 1].isalnum() or line[start - 1] == "_"):
        start -= 1
    return start


def _pattern_spans(plugin: Any, line: str, values: set[str]) -> list[tuple[int, int]]:
    """Where a pattern plugin's reported values lie in `line`: the reported group, or the whole match (and the rest
    of its token) where the group is only the match's start (a token's prefix); a URL's user and password together."""
    spans = []
    basic = type(plugin).__name__ == "BasicAuthDetector"
    for regex in plugin.denylist:
        for match in regex.finditer(line):
            groups = [i for i in range(1, (regex.groups or 0) + 1) if match.group(i) in values]
            if basic and groups:
                spans.append((match.start() + 3, match.end() - 1))  # between `://` and `@`
            elif (match.group(0) in values or (groups and match.start(groups[0]) == match.start())
                  or (groups and len(match.group(groups[0])) < _SHORT)):
                spans.append((_token_start(line, match.start()), _TOKEN_TAIL.match(line, match.end()).end()))
            elif groups:
                spans.append(match.span(groups[0]))
    return spans


@lru_cache(maxsize=1 << 16)
def _line_secrets(line: str, candidates: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    """(credential, kind) of each credential the `candidates` plugins find in one line (cached: re-run cells
    repeat their lines)."""
    from detect_secrets.plugins.base import RegexBasedDetector

    found: dict[str, str] = {}
    for index in candidates:
        plugin = _scanner().plugins[index]
        reported = plugin.analyze_line(filename="cell.py", line=line, line_number=0)
        values = {s.secret_value for s in reported if not _cleared(plugin, s.secret_value or "", line)}
        if not values:
            continue
        if isinstance(plugin, RegexBasedDetector):
            strings = {line[start:end] for start, end in _pattern_spans(plugin, line, values)}
        else:
            strings = values
        for value in strings:
            if value and not _MARKER.search(value):
                found.setdefault(value, _kind(plugin, value))
    return tuple(found.items())


def _private_keys(text: str, counts: Counter) -> str:
    """`text` with each private key block the private-key plugin finds replaced, counted."""
    hits = sorted({m.start() for regex in _scanner().private_key.denylist for m in regex.finditer(text)})
    pieces, pos = [], 0
    for hit in hits:
        if hit < pos:
            continue  # inside the block just replaced
        start = hit
        while start > max(pos, hit - 5) and text[start - 1] == "-":
            start -= 1
        end_match = _KEY_END.search(text, hit)
        if end_match:
            end = end_match.end()
        else:
            line_end = text.find("\n", hit)
            end = len(text) if line_end < 0 else _KEY_BODY.match(text, line_end).end()
        pieces += [text[pos:start], REDACTED.format(kind=KINDS["Private Key"])]
        counts[KINDS["Private Key"]] += 1
        pos = end
    return "".join(pieces) + text[pos:]


def redact_secrets(text: str) -> tuple[str, dict[str, int]]:
    """`text` with every credential the scanner finds replaced by `<redacted:KIND>`, and the replacements counted
    by kind."""
    counts: Counter = Counter()
    text = _private_keys(text, counts) if "PRIVATE KEY" in text or "PuTTY" in text else text
    candidates = _candidates(text)
    found: dict[str, str] = {}
    for line in text.split("\n") if candidates else ():
        if len(line) >= _MIN_LINE:
            for value, kind in _line_secrets(line, candidates):
                found.setdefault(value, kind)
    if found:
        text = _replace_everywhere(text, found, counts)
    return text, dict(counts)


def _replace_everywhere(text: str, found: dict[str, str], counts: Counter) -> str:
    """Each credential replaced wherever it stands as a whole token (the longest first where one holds another),
    then, where one is still in the text (found inside a longer word), wherever it is; markers already in the text
    are left whole."""

    def replace(match: re.Match) -> str:
        value = match.group()
        if value not in found:
            return value  # a marker
        counts[found[value]] += 1
        return REDACTED.format(kind=found[value])

    values = sorted(found, key=len, reverse=True)
    text = re.sub("|".join([_MARKER.pattern] + [rf"(?<!\w){re.escape(v)}(?!\w)" for v in values]), replace, text)
    left = [v for v in values if v in text]
    return re.sub("|".join([_MARKER.pattern] + [re.escape(v) for v in left]), replace, text) if left else text


def scrub(text: str, counts: Counter) -> str:
    """`text` fit to keep: credentials redacted (counted into `counts` by kind), then personal data masked
    (`personal.mask_personal`), in that order so a URL's user name goes with its password."""
    from themisto.ingest.personal import mask_personal

    text, found = redact_secrets(text)
    counts.update(found)
    return mask_personal(text)
