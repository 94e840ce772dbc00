"""The size the JuNE logging extension recorded for one output (`cell_output: [{output_type, size}]`), in one place.

A stream's size is its text serialized as a JSON string (quotes included); an execute_result's or display_data's is
its whole mime bundle serialized as compact JSON; an error's is 0. JSON is built with `ensure_ascii=False`, as
`JSON.stringify` does, and counted in UTF-8 bytes: checked against the participants' final notebooks, every
output with a non-ASCII character whose saved outputs are the ones its last logged run produced (12 of them)
has exactly the byte count logged, and none the character count.
"""

from __future__ import annotations

import json

from themisto.ingest.trajectory import OutputSummary


def _text(value: object) -> object:
    # nbformat stores multi-line strings as lists of lines; the browser (and the extension) saw one string.
    return "".join(str(part) for part in value) if isinstance(value, list) else value


def _json_bytes(value: object) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def output_size(output: dict) -> int:
    """The size the extension logged for one nbformat output.

    >>> output_size({"output_type": "stream", "name": "stdout", "text": ["hé\\n"]}), output_size({"output_type": "error"})
    (7, 0)
    """
    kind = output.get("output_type")
    if kind == "stream":
        return _json_bytes(_text(output.get("text", "")))
    if kind in ("execute_result", "display_data"):
        return _json_bytes({mime: _text(value) for mime, value in (output.get("data") or {}).items()})
    return 0


def summarize(outputs: list[dict]) -> list[OutputSummary]:
    """The outputs as the JuNE log records them: `[OutputSummary(output_type, size)]`."""
    return [OutputSummary(output_type=str(output.get("output_type")), size=output_size(output)) for output in outputs]
