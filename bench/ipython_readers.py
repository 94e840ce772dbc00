"""The IPython history readers over the whole corpus: what they read, refuse and redact, and how fast the scanner is.

Reads every history database (`repos/*/history/*`) and `%logstart` log (`repos/*/logs/*`) of the IPython corpus
(../shared/data/ipython, or THEMISTO_IPYTHON_DIR) and prints counts only, never a name or a text: files read and
refused (by reason), sessions, inputs, sessions of at least 20 inputs, redactions by kind, seconds; then the secret
scanner's speed alone (`redact_secrets` over every code and output the readers returned, its line cache emptied
first), in texts per second; then what an independent finder (not the masking's own patterns) still sees in the
returned texts: paths under a home folder whose user is not masked, e-mail-like and IPv4-like strings.

    python bench/ipython_readers.py [--limit N]
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, arguments, report  # noqa: E402

CORPUS = Path(os.environ.get("THEMISTO_IPYTHON_DIR", REPO.parent / "shared" / "data" / "ipython"))
# The independent finder: broader than personal.py's patterns on purpose, so what it counts may be code.
# `/home/` and `/Users/` as Linux and macOS spell them (a share's `//host/Home/Desktop`, a JDK's `Contents/Home/jre`
# are folders, not users); Windows's `\Users\` in any case.
_HOME = re.compile(r"(?:/home/|/Users/|\\(?i:users)\\+)(?!<user>)[A-Za-z]")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]*\d)")


def _reason(problem: str) -> str:
    """A refusal's reason without its figures or SQLite's own words."""
    return re.sub(r"\d[\d,.]*", "N", problem.split(" (")[0])


def _files(limit: int | None) -> list[tuple[str, Path]]:
    files = [("database", p) for p in sorted(CORPUS.glob("repos/*/history/*")) if p.is_file()]
    files += [("log", p) for p in sorted(CORPUS.glob("repos/*/logs/*")) if p.is_file()]
    return files[:limit] if limit else files


def _leftovers(texts: list[str]) -> Counter:
    found: Counter = Counter()
    for text in texts:
        found["home_folder"] += len(_HOME.findall(text))
        found["email_like"] += len(_EMAIL.findall(text))
        found["ipv4_like"] += sum(1 for m in _IPV4.findall(text) if not m.startswith(("127.", "0.")))
    return found


def main() -> None:
    from themisto.ingest import secrets
    from themisto.ingest.ipython_history import HistoryRefused, read_history
    from themisto.ingest.ipython_log import read_logstart

    parser = arguments(__doc__)
    parser.add_argument("--limit", type=int, default=None, help="read only the first N files")
    args = parser.parse_args()
    readers = {"database": read_history, "log": read_logstart}
    read, refused, redactions = Counter(), Counter(), Counter()
    sessions = inputs = long_sessions = 0
    texts: list[str] = []
    start = time.perf_counter()
    for kind, path in _files(args.limit):
        try:
            result = readers[kind](path)
        except HistoryRefused as exc:
            refused[f"{kind}: {_reason(exc.problem)}"] += 1
            continue
        read[kind] += 1
        redactions.update(result.redactions)
        sessions += len(result.sessions)
        inputs += sum(len(s.inputs) for s in result.sessions)
        long_sessions += sum(len(s.inputs) >= 20 for s in result.sessions)
        texts += [t for s in result.sessions for i in s.inputs for t in (i.code, i.output) if t is not None]
    seconds = time.perf_counter() - start
    secrets._line_secrets.cache_clear()  # the scanner alone, as cold as the readers found it
    scan_start = time.perf_counter()
    for text in texts:
        secrets.redact_secrets(text)
    scan_seconds = time.perf_counter() - scan_start
    figures = {"files_read": dict(read), "refused": dict(refused), "sessions": sessions, "inputs": inputs,
               "sessions_of_20_inputs_or_more": long_sessions, "redactions": dict(redactions.most_common()),
               "seconds": round(seconds, 1), "scanner_texts": len(texts),
               "scanner_texts_per_s": round(len(texts) / scan_seconds) if scan_seconds else None,
               "finder_leftovers": dict(_leftovers(texts))}
    report("ipython_readers", figures, args=args)


if __name__ == "__main__":
    main()
