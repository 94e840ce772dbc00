"""Normalize a cell's nbformat outputs: the one `output` text per step that scores compare, the rich outputs kept
typed, and what two runs of one cell print differently masked. (The `[{output_type, size}]` summary the JuNE logs
recorded is `themisto.ingest.output_size.summarize`.)
"""

from __future__ import annotations

import base64
import binascii
import json
import re


_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
# What two runs of the same cell print differently while the cell's content stays the same. An object's address is
# its identity (`<Colorbar at 0x7f18c81afad0>`): two runs (two builds, two forked branches) allocate at different
# addresses. The kernel's execution counter in a traceback (`Cell In[28]`, IPython 8.0-8.4's `Input In [28]`,
# IPython 7's `<ipython-input-28-…>`) counts the cells this kernel ran before: a state rebuilt after a lost kernel, a
# retried worker or a replay under another load runs more or fewer of them (a local and a Ray build of the sample
# differed so). A kernel's temporary folder (`/tmp/ipykernel_2/…`, where a warning names the cell) holds its pid.
# No target, history output or prediction keeps any of them.
ADDRESS_RE = re.compile(r"\b(at |id=)0x[0-9a-fA-F]{4,}\b")
ADDRESS_MASK = "0x…"
COUNTER_RE = re.compile(r"(\bCell In ?\[|\bInput In \[|<ipython-input-)\d+(?=\]|-)")
PID_FOLDER_RE = re.compile(r"(\bipykernel_)\d+(?=[\\/])")
COUNTER_MASK = "…"


def mask_volatile(text: str) -> str:
    """Replace what differs between two runs of the same cell (object addresses, the kernel's execution counter, its
    pid in a temporary folder) by one mask each: the single normalisation of targets, history and predictions.

    >>> mask_volatile("<matplotlib.colorbar.Colorbar at 0x7f6b6822c490>")
    '<matplotlib.colorbar.Colorbar at 0x…>'
    >>> mask_volatile("Cell In[28], line 1\\nInput In [3], in <cell line: 1>()\\n<ipython-input-7-6b9a0a0e3d0c>")
    'Cell In[…], line 1\\nInput In […], in <cell line: 1>()\\n<ipython-input-…-6b9a0a0e3d0c>'
    >>> mask_volatile("/tmp/ipykernel_2/2560177576.py:3: FutureWarning: in 2 steps [12]")
    '/tmp/ipykernel_…/2560177576.py:3: FutureWarning: in 2 steps [12]'
    """
    text = ADDRESS_RE.sub(r"\g<1>" + ADDRESS_MASK, text)
    text = COUNTER_RE.sub(r"\g<1>" + COUNTER_MASK, text)
    return PID_FOLDER_RE.sub(r"\g<1>" + COUNTER_MASK, text)


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (the colours of IPython tracebacks).

    >>> strip_ansi("\\x1b[0;31mZeroDivisionError\\x1b[0m: division by zero")
    'ZeroDivisionError: division by zero'
    """
    return _ANSI_RE.sub("", text)


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


def output_text(outputs: list[dict], *, traceback: bool = True) -> str:
    """The cell's output as one text: streams in order, the `text/plain` of results and displays, errors as
    `ename: evalue` (plus the ANSI-free traceback unless `traceback=False`); blocks joined by one newline.

    >>> output_text([{"output_type": "stream", "name": "stdout", "text": "a\\n"},
    ...              {"output_type": "stream", "name": "stdout", "text": "b\\n"},
    ...              {"output_type": "execute_result", "data": {"text/plain": "3"}, "metadata": {}}])
    'a\\nb\\n3'
    """
    blocks: list[str] = []
    stream = ""
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            stream += strip_ansi(_text(output.get("text", "")))
            continue
        if stream:
            blocks.append(stream)
            stream = ""
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
        blocks.append(stream)
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
