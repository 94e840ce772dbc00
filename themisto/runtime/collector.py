"""IOPub messages into a cell's outputs, through the one output recorder a branch child uses too
(`themisto.runtime.agent.recorder`): streams merged, every output counted against the cap, clears as Jupyter does.
"""

from __future__ import annotations

import json

from themisto.runtime.agent.recorder import OutputRecorder


def json_string_prefix(raw: bytes, key: str, limit: int) -> str:
    """The first `limit` bytes of the string under `key` in a serialized JSON object too large to decode whole
    ("" when it is not there). Keys cannot hide inside a string: its quotes are escaped."""
    start = raw.find(f'"{key}":'.encode())
    if start < 0:
        return ""
    start = raw.find(b'"', start + len(key) + 3) + 1
    if start <= 0:
        return ""
    piece = raw[start : start + limit].decode("utf-8", "ignore")
    end = piece.find('"')  # a short string ends inside the piece, at the first quote not escaped
    while end > 0 and (len(piece[:end]) - len(piece[:end].rstrip("\\"))) % 2 == 1:
        end = piece.find('"', end + 1)
    if end >= 0:
        piece = piece[:end]
    # The cut may split an escape sequence; drop characters until the piece decodes as a JSON string.
    for cut in range(0, 8):
        candidate = piece[: len(piece) - cut] if cut else piece
        if candidate.endswith("\\") and not candidate.endswith("\\\\"):
            continue
        try:
            return json.loads(f'"{candidate}"')
        except json.JSONDecodeError:
            continue
    return ""


def stream_prefix(raw: bytes, limit: int) -> tuple[str, str]:
    """Name and the first `limit` bytes of text of a stream message too large to decode whole."""
    name = "stderr" if b'"stderr"' in raw[:200] else "stdout"
    return name, json_string_prefix(raw, "text", limit)


class OutputCollector(OutputRecorder):
    """The outputs of one cell from its IOPub messages, keeping at most `cap` bytes and counting the rest."""

    def add(self, msg_type: str, content: dict, oversized: int = 0) -> None:
        """Record one IOPub message's content (`oversized`: its byte size, when it was too large to decode)."""
        if msg_type == "stream":
            self.stream(content.get("name", "stdout"), content.get("text", ""), oversized)
        elif msg_type in ("display_data", "execute_result"):
            self.display(msg_type, content.get("data", {}), content.get("metadata", {}),
                         display_id=(content.get("transient") or {}).get("display_id"),
                         execution_count=content.get("execution_count"), oversized=oversized)
        elif msg_type == "update_display_data":
            self.update((content.get("transient") or {}).get("display_id"), content.get("data", {}),
                        content.get("metadata", {}), oversized)
        elif msg_type == "error":
            self.error(content.get("ename", ""), content.get("evalue", ""), list(content.get("traceback", [])),
                       oversized)
        elif msg_type == "clear_output":
            self.clear(bool(content.get("wait")))

    def add_oversized(self, msg_type: str, raw: bytes) -> None:
        """Record a message too large to decode: a stream's or an error's leading text is kept, the rest counted."""
        if msg_type == "stream":
            name, text = stream_prefix(raw, self.cap)
            self.add("stream", {"name": name, "text": text}, oversized=len(raw))
        elif msg_type == "error":
            self.add("error", {"ename": json_string_prefix(raw, "ename", 200),
                               "evalue": json_string_prefix(raw, "evalue", max(self.cap - self.kept, 1024)),
                               "traceback": []}, oversized=len(raw))
        else:
            self.add(msg_type, {}, oversized=len(raw))
