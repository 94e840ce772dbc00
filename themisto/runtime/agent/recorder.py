"""One cell's outputs under the output cap, the one shape for the host's IOPub collector and a branch child's capture.

Sizes are UTF-8 bytes of text (JSON for other data); every kind of output counts against the cap (streams, displays,
display updates, errors); `clear_output(wait=True)` waits for the next output, as Jupyter does; a cut cell ends with
OUTPUT_CAP_MARKER. Runs inside the kernel too: standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from themisto.runtime.agent.namespace import OUTPUT_CAP_MARKER

# An error always keeps its name and at least this much of its message, even past the cap: it is the cell's outcome.
ERROR_MIN_BYTES = 1024
# A traceback over the cap keeps this many lines from each end.
_TRACEBACK_ENDS = 20
_TRACEBACK_LINE_BYTES = 1000


def text_bytes(text: str) -> int:
    """UTF-8 size of a text (lone surrogates counted as replaced)."""
    return len(text.encode("utf-8", "replace"))


def cut_text(text: str, limit: int) -> str:
    """The longest prefix of `text` of at most `limit` UTF-8 bytes (never a split character)."""
    if limit <= 0:
        return ""
    if len(text) <= limit // 4:
        return text
    return text[:limit].encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def data_size(data: dict) -> int:
    """Bytes of a mime bundle as it would be serialized (str as UTF-8, anything else as JSON)."""
    size = 0
    for value in data.values():
        size += text_bytes(value) if isinstance(value, str) else len(json.dumps(value, default=str))
    return size


class OutputRecorder:
    """Builds the nbformat outputs of one cell, keeping at most `cap` bytes and counting the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.outputs: list[dict] = []
        self.kept = 0
        self.total = 0
        self.truncated = False
        self._clear_pending = False
        self._displays: dict[str, list[dict]] = {}

    def _room(self) -> int:
        return self.cap - self.kept

    def _before_output(self) -> None:
        if self._clear_pending:
            self._clear_now()

    def stream(self, name: str, text: str, oversized: int = 0) -> None:
        """Append stream text (merged with the previous output when it is the same stream)."""
        if not text and not oversized:
            return
        self._before_output()
        room = self._room()
        # UTF-8 takes at least a byte per character: a text far over the room is cut before it is encoded.
        size = oversized or (len(text) if len(text) > 4 * max(room, 0) + 4096 else text_bytes(text))
        self.total += size
        if oversized or size > room:
            self.truncated = True
            text = cut_text(text, room)
            if not text:
                return
            size = text_bytes(text)
        self.kept += size
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["_parts"].append(text)
        else:
            self.outputs.append({"output_type": "stream", "name": name, "_parts": [text]})

    def display(self, output_type: str, data: dict, metadata: dict | None = None, *, display_id: str | None = None,
                execution_count: int | None = None, oversized: int = 0) -> None:
        """Append a display_data or execute_result output (dropped whole, and counted, when it does not fit)."""
        self._before_output()
        size = oversized or data_size(data)
        self.total += size
        if oversized or size > self._room():
            self.truncated = True
            return
        self.kept += size
        output: dict[str, Any] = {"output_type": output_type, "data": data, "metadata": metadata or {}}
        if output_type == "execute_result":
            output["execution_count"] = execution_count
        self.outputs.append(output)
        if display_id:
            self._displays.setdefault(display_id, []).append(output)

    def update(self, display_id: str | None, data: dict, metadata: dict | None = None, oversized: int = 0) -> None:
        """update_display_data: replace the data of the outputs shown under `display_id`, within the cap."""
        targets = self._displays.get(display_id or "", [])
        size = oversized or data_size(data)
        self.total += size
        growth = sum(size - data_size(output["data"]) for output in targets)
        if oversized or growth > self._room():
            self.truncated = True
            return
        self.kept += growth
        for output in targets:
            output["data"], output["metadata"] = data, metadata or {}

    def error(self, ename: str, evalue: str, traceback: list[str], oversized: int = 0) -> None:
        """Append an error: counted like any output; past the cap its message and traceback are cut, never emptied."""
        self._before_output()
        size = oversized or (text_bytes(ename) + text_bytes(evalue) + sum(text_bytes(line) for line in traceback))
        self.total += size
        room = max(self._room(), ERROR_MIN_BYTES)
        if oversized or size > self._room():
            self.truncated = True
            evalue = cut_text(evalue, room)
            if len(traceback) > 2 * _TRACEBACK_ENDS:  # a recursion traceback: keep its head and tail
                traceback = (traceback[:_TRACEBACK_ENDS] + ["[themisto: traceback truncated]"]
                             + traceback[-_TRACEBACK_ENDS:])
            traceback = [cut_text(line, _TRACEBACK_LINE_BYTES) for line in traceback]
            size = text_bytes(ename) + text_bytes(evalue) + sum(text_bytes(line) for line in traceback)
        self.kept += size
        self.outputs.append({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback})

    def clear(self, wait: bool = False) -> None:
        """clear_output: now, or (wait=True) when the next output arrives."""
        if wait:
            self._clear_pending = True
        else:
            self._clear_now()

    def _clear_now(self) -> None:
        self.outputs.clear()
        self._displays.clear()
        self.kept = 0
        self._clear_pending = False

    def finish(self) -> list[dict]:
        """The outputs, with the cap's marker at the end when anything was cut."""
        for output in self.outputs:
            if "_parts" in output:
                output["text"] = "".join(output.pop("_parts"))
        if self.truncated:
            marker = OUTPUT_CAP_MARKER.format(total=self.total, cap=self.cap)
            self.outputs.append({"output_type": "stream", "name": "stderr", "text": marker})
        return self.outputs
