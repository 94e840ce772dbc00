"""IOPub messages into a cell's outputs, under the output cap: streams merged, displays sized, clears honoured.
"""

from __future__ import annotations

from __future__ import annotations

import json


from themisto.runtime.agent import OUTPUT_CAP_MARKER


def _data_size(data: dict) -> int:
    """Bytes of a mime bundle as it would be serialized (str as UTF-8, anything else as JSON)."""
    size = 0
    for value in data.values():
        if isinstance(value, str):
            size += len(value.encode("utf-8", "replace"))
        else:
            size += len(json.dumps(value))
    return size


def stream_prefix(raw: bytes, limit: int) -> tuple[str, str]:
    """Name and the first `limit` bytes of text of a stream message too large to decode whole."""
    name = "stderr" if b'"stderr"' in raw[:200] else "stdout"
    start = raw.find(b'"text":')
    if start < 0:
        return name, ""
    start = raw.find(b'"', start + 7) + 1
    piece = raw[start : start + limit].decode("utf-8", "ignore")
    # The cut may split an escape sequence; drop characters until the piece decodes as a JSON string.
    for cut in range(0, 8):
        candidate = piece[: len(piece) - cut] if cut else piece
        if candidate.endswith("\\") and not candidate.endswith("\\\\"):
            continue
        try:
            return name, json.loads(f'"{candidate}"')
        except json.JSONDecodeError:
            continue
    return name, ""


class OutputCollector:
    """Builds the nbformat outputs of one cell, keeping at most `cap` bytes and counting the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.outputs: list[dict] = []
        self.kept = 0
        self.total = 0
        self.truncated = False
        self._clear_on_next = False
        self._displays: dict[str, list[dict]] = {}

    def _room(self) -> int:
        return self.cap - self.kept

    def add(self, msg_type: str, content: dict, oversized: int = 0) -> None:
        if self._clear_on_next and msg_type in ("stream", "display_data", "execute_result", "error"):
            self._clear()
        if msg_type == "stream":
            self._add_stream(content.get("name", "stdout"), content.get("text", ""), oversized)
        elif msg_type in ("display_data", "execute_result"):
            self._add_display(msg_type, content, oversized)
        elif msg_type == "update_display_data":
            display_id = (content.get("transient") or {}).get("display_id")
            for output in self._displays.get(display_id, []):
                output["data"] = content.get("data", {})
                output["metadata"] = content.get("metadata", {})
        elif msg_type == "error":
            traceback = list(content.get("traceback", []))
            size = sum(len(line) for line in traceback)
            if size > self.cap:  # a recursion traceback can be long; keep its head and tail
                traceback = traceback[:20] + ["[themisto: traceback truncated]"] + traceback[-20:]
            self.outputs.append({"output_type": "error", "ename": content.get("ename", ""),
                                 "evalue": content.get("evalue", ""), "traceback": traceback})
        elif msg_type == "clear_output":
            if content.get("wait"):
                self._clear_on_next = True
            else:
                self._clear()

    def _clear(self) -> None:
        self.outputs.clear()
        self._displays.clear()
        self.kept = 0
        self._clear_on_next = False

    def _add_stream(self, name: str, text: str, oversized: int) -> None:
        encoded_len = oversized or len(text.encode("utf-8", "replace"))
        self.total += encoded_len
        room = self._room()
        if oversized or encoded_len > room:
            self.truncated = True
            if room <= 0:
                return
            text = text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
            encoded_len = len(text.encode("utf-8"))
        self.kept += encoded_len
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def _add_display(self, msg_type: str, content: dict, oversized: int) -> None:
        data = content.get("data", {})
        size = oversized or _data_size(data)
        self.total += size
        if oversized or size > self._room():
            self.truncated = True
            return
        self.kept += size
        output = {"output_type": msg_type, "data": data, "metadata": content.get("metadata", {})}
        if msg_type == "execute_result":
            output["execution_count"] = content.get("execution_count")
        self.outputs.append(output)
        display_id = (content.get("transient") or {}).get("display_id")
        if display_id:
            self._displays.setdefault(display_id, []).append(output)

    def finish(self) -> list[dict]:
        if self.truncated:
            marker = OUTPUT_CAP_MARKER.format(total=self.total, cap=self.cap)
            self.outputs.append({"output_type": "stream", "name": "stderr", "text": marker})
        return self.outputs
