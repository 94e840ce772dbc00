"""Normalize a cell's nbformat outputs: the one `output` text per step that scores compare (its streams as a notebook
shows them), the rich outputs kept typed, and what two runs of one cell print differently masked. (The
`[{output_type, size}]` summary the JuNE logs recorded is `themisto.ingest.output_size.summarize`.)
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import re


_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
# What two runs of the same cell print differently while the cell's content stays the same. An object's address is
# its identity (`<Colorbar at 0x7f18c81afad0>`): two runs (two builds, two forked branches) allocate at different
# addresses. The kernel's execution counter in a traceback (`Cell In[28]`, IPython 8.0-8.4's `Input In [28]`,
# IPython 7's `<ipython-input-28-…>`) counts the cells this kernel ran before: a state rebuilt after a lost kernel, a
# retried worker or a replay under another load runs more or fewer of them (a local and a Ray build of the sample
# differed so). ipykernel's temporary folder (`/tmp/ipykernel_2/…`, where a warning names the cell) holds its pid;
# the folder the sandbox gives each kernel (KERNEL_FOLDER_PREFIX, its home and the themisto code it imports: a
# traceback through them, a library's log of its config folder) a random name.
# No target, history output or prediction keeps any of them.
ADDRESS_RE = re.compile(r"\b(at |id=)0x[0-9a-fA-F]{4,}\b")
ADDRESS_MASK = "0x…"
COUNTER_RE = re.compile(r"(\bCell In ?\[|\bInput In \[|<ipython-input-)\d+(?=\]|-)")
PID_FOLDER_RE = re.compile(r"(\bipykernel_)\d+(?=[\\/])")
KERNEL_FOLDER_PREFIX = "themisto-kernel-"
KERNEL_FOLDER_RE = re.compile(rf"(\b{KERNEL_FOLDER_PREFIX})[a-z0-9_]{{8}}(?=[\\/])")  # tempfile.mkdtemp's 8
COUNTER_MASK = "…"
# A tqdm progress bar's clock: `[00:01<00:03, 47.71it/s]` (elapsed<remaining, rate; `?` before the first rate; the
# unit turns to `s/it` under one per second). Two runs of one loop draw them from two clocks (the same cell's bar in
# two builds of the real release: 47.71it/s alone, 22.09it/s on a loaded host). What stays is the bar, the count and
# the postfix.
_TIME = r"(?:\d+d, )?\d+:\d\d(?::\d\d)?"
PROGRESS_CLOCK_RE = re.compile(rf"\[{_TIME}(<(?:\?|{_TIME}))?, +(?:\?|\d+(?:\.\d+)?) ?[kMGTPEZY]?"
                               r"(?:(s)/([A-Za-z]+)|([A-Za-z]+)/s)\b")


def _progress_clock(match: re.Match) -> str:
    remaining = "<…" if match.group(1) else ""
    return f"[…{remaining}, …{match.group(3) or match.group(4)}/s"


def mask_volatile(text: str) -> str:
    """Replace what differs between two runs of the same cell (object addresses, the kernel's execution counter, its
    pid in a temporary folder, the name of the sandbox's, a progress bar's clock) by one mask each: the single
    normalisation of targets, history and predictions.

    >>> mask_volatile("<matplotlib.colorbar.Colorbar at 0x7f6b6822c490>")
    '<matplotlib.colorbar.Colorbar at 0x…>'
    >>> mask_volatile("Cell In[28], line 1\\nInput In [3], in <cell line: 1>()\\n<ipython-input-7-6b9a0a0e3d0c>")
    'Cell In[…], line 1\\nInput In […], in <cell line: 1>()\\n<ipython-input-…-6b9a0a0e3d0c>'
    >>> mask_volatile("/tmp/ipykernel_2/2560177576.py:3: FutureWarning: in 2 steps [12]")
    '/tmp/ipykernel_…/2560177576.py:3: FutureWarning: in 2 steps [12]'
    >>> mask_volatile("DEBUG:matplotlib:CONFIGDIR=/tmp/themisto-kernel-5rufvscx/home/.config/matplotlib")
    'DEBUG:matplotlib:CONFIGDIR=/tmp/themisto-kernel-…/home/.config/matplotlib'
    >>> mask_volatile("100%|##########| 5/5 [00:01<00:00,  3.84it/s, loss=0.3]\\n200it [01:02,  1.31s/it]")
    '100%|##########| 5/5 […<…, …it/s, loss=0.3]\\n200it […, …it/s]'
    """
    text = ADDRESS_RE.sub(r"\g<1>" + ADDRESS_MASK, text)
    text = COUNTER_RE.sub(r"\g<1>" + COUNTER_MASK, text)
    text = PROGRESS_CLOCK_RE.sub(_progress_clock, text)
    text = KERNEL_FOLDER_RE.sub(r"\g<1>" + COUNTER_MASK, text)
    return PID_FOLDER_RE.sub(r"\g<1>" + COUNTER_MASK, text)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (the colours of IPython tracebacks).

    >>> strip_ansi("\\x1b[0;31mZeroDivisionError\\x1b[0m: division by zero")
    'ZeroDivisionError: division by zero'
    """
    return _ANSI_RE.sub("", text)


def as_displayed(text: str) -> str:
    """A stream's text as a notebook shows it: a backspace deletes the character before it, a carriage return
    takes the cursor back to the line's start, where later text overwrites (a progress bar redrawn 40 times shows
    its last state once). The spaces a redraw pads a shorter state with are dropped: how many depends on the
    redraw before it, which depends on the clock.

    >>> as_displayed("\\r0it [00:00, ?it/s]\\r5it [00:00, 47.71it/s]  \\r9it\\n")
    '9it [00:00, 47.71it/s]\\n'
    >>> as_displayed("12/30 [==>...]" + "\\b" * 14 + "\\r30/30 [======]\\r\\n")
    '30/30 [======]\\n'
    """
    if "\r" not in text and "\b" not in text:
        return text
    if "\b" in text:
        kept: list[str] = []
        for char in text:
            if char != "\b":
                kept.append(char)
            elif kept and kept[-1] != "\n":
                kept.pop()
        text = "".join(kept)
    lines = re.sub(r"\r+\n", "\n", text).split("\n")
    for index, line in enumerate(lines):
        if "\r" in line:
            # One slot per column, and each redraw writes only its own characters: a line redrawn n times costs its
            # length, not n times it (a predicted cell's `print("a" * 500_000 + "\\rx" * 250_000)` copied 10^11 bytes).
            shown: list[str] = []
            for part in line.split("\r"):
                shown[:len(part)] = part
            lines[index] = "".join(shown).rstrip(" ")
    return "\n".join(lines)


def _text(value: object) -> str:
    """nbformat stores multiline strings either whole or as a list of lines."""
    if isinstance(value, list):
        return "".join(str(part) for part in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def error_text(output: dict) -> str:
    """An error output as `ename: evalue`, then its ANSI-free traceback without the repeated last line."""
    head = f"{output.get('ename', '')}: {output.get('evalue', '')}"
    lines = strip_ansi("\n".join(output.get("traceback") or [])).split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and lines[-1].strip() == head.strip():
        lines.pop()
    body = "\n".join(lines).strip("\n")
    return f"{head}\n{body}" if body else head


def _shown_streams(parts: list[tuple[object, str]]) -> str:
    """Consecutive stream outputs as one text: each run of one stream merged, as a notebook merges them, and shown
    as the notebook shows it (`as_displayed`: stdout never overwrites stderr)."""
    return "".join(as_displayed(strip_ansi("".join(text for _, text in run)))
                   for _, run in itertools.groupby(parts, key=lambda part: part[0]))


def output_text(outputs: list[dict], *, traceback: bool = True) -> str:
    """The cell's output as one text: streams in order (each run of one stream as a notebook shows it:
    `as_displayed`), the `text/plain` of results and displays, errors as `ename: evalue` (plus the ANSI-free
    traceback unless `traceback=False`); blocks joined by one newline.

    >>> output_text([{"output_type": "stream", "name": "stdout", "text": "a\\n"},
    ...              {"output_type": "stream", "name": "stdout", "text": "b\\n"},
    ...              {"output_type": "execute_result", "data": {"text/plain": "3"}, "metadata": {}}])
    'a\\nb\\n3'
    """
    blocks: list[str] = []
    stream: list[tuple[object, str]] = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            stream.append((output.get("name"), _text(output.get("text", ""))))
            continue
        if stream:
            blocks.append(_shown_streams(stream))
            stream = []
        if kind in ("execute_result", "display_data"):
            plain = (output.get("data") or {}).get("text/plain")
            if plain is not None:
                blocks.append(strip_ansi(_text(plain)))
        elif kind == "error":
            if traceback:
                blocks.append(error_text(output))
            else:
                blocks.append(f"{output.get('ename', '')}: {output.get('evalue', '')}")
    if stream:
        blocks.append(_shown_streams(stream))
    return "\n".join(block.rstrip("\n") for block in blocks if block.strip("\n"))


def output_types(outputs: list[dict]) -> list[str]:
    """The `output_type` of each output, in order (as the JuNE log lists them)."""
    return [str(output.get("output_type")) for output in outputs]


def _payload_bytes(mime: str, value: object) -> int:
    text = _text(value)
    if mime.startswith("image/") and mime != "image/svg+xml":
        try:
            return len(base64.b64decode(text, validate=False))
        except (binascii.Error, ValueError):
            return len(text.encode("utf-8"))
    return len(text.encode("utf-8"))


def rich_outputs(outputs: list[dict]) -> list[dict]:
    """Every non-plain-text representation, typed: images as `{"mime", "bytes"}` placeholders (decoded size), text
    formats (html, markdown, latex, svg, json) as `{"mime", "text"}`; each with the index of its output.

    >>> rich_outputs([{"output_type": "display_data", "metadata": {},
    ...                "data": {"text/plain": "<Figure>", "image/png": "iVBORw0KGgo="}}])
    [{'output_index': 0, 'mime': 'image/png', 'bytes': 8}]
    """
    found: list[dict] = []
    for index, output in enumerate(outputs):
        if output.get("output_type") not in ("execute_result", "display_data"):
            continue
        for mime, value in (output.get("data") or {}).items():
            if mime == "text/plain":
                continue
            if mime.startswith("image/") and mime != "image/svg+xml":
                found.append({"output_index": index, "mime": mime, "bytes": _payload_bytes(mime, value)})
            else:
                found.append({"output_index": index, "mime": mime, "text": _text(value)})
    return found
