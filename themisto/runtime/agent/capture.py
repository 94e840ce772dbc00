"""Output capture in a branch child: streams, display and the displayhook, with the output cap.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

from __future__ import annotations

import builtins
import io
import json
import os
import sys
from typing import Any

from themisto.runtime.agent.namespace import OUTPUT_CAP_MARKER


# ----- branch execution: the child side -------------------------------------------------------------------------


class _BranchTimeout(BaseException):
    """Raised in the child by its own timer; BaseException so that `except Exception` in the candidate passes it."""


class _Recorder:
    """Collects a branch's nbformat outputs in order, keeping at most `cap` bytes and counting the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.outputs: list[dict] = []
        self.kept = 0
        self.total = 0
        self.truncated = False
        self.displays: dict[str, list[dict]] = {}

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        room = self.cap - self.kept
        # utf-8 takes at least a byte per character: a text far over the room is cut before it is encoded
        size = len(text) if len(text) > 4 * max(room, 0) + 4096 else len(text.encode("utf-8", "replace"))
        self.total += size
        if size > room:
            self.truncated = True
            if room <= 0:
                return
            text = text[:room].encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
            size = len(text.encode("utf-8"))
        self.kept += size
        last = self.outputs[-1] if self.outputs else None
        if last is not None and last["output_type"] == "stream" and last["name"] == name:
            last["_parts"].append(text)
        else:
            self.outputs.append({"output_type": "stream", "name": name, "_parts": [text]})

    def display(self, output: dict, display_id: str | None = None) -> None:
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v, default=str)) for v in output["data"].values())
        self.total += size
        if size > self.cap - self.kept:
            self.truncated = True
            return
        self.kept += size
        self.outputs.append(output)
        if display_id:
            self.displays.setdefault(display_id, []).append(output)

    def error(self, ename: str, evalue: str, traceback: list[str]) -> None:
        if sum(len(line) for line in traceback) > self.cap:  # a recursion traceback can be long; keep head and tail
            traceback = traceback[:20] + ["[themisto: traceback truncated]"] + traceback[-20:]
        self.outputs.append({"output_type": "error", "ename": ename, "evalue": evalue, "traceback": traceback})

    def clear(self) -> None:
        self.outputs.clear()
        self.displays.clear()
        self.kept = 0

    def finish(self) -> list[dict]:
        for output in self.outputs:
            if "_parts" in output:
                output["text"] = "".join(output.pop("_parts"))
        if self.truncated:
            marker = OUTPUT_CAP_MARKER.format(total=self.total, cap=self.cap)
            self.outputs.append({"output_type": "stream", "name": "stderr", "text": marker})
        return self.outputs


class _CaptureStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a branch child: writes go to the recorder, never to the kernel's IOPub."""

    def __init__(self, recorder: _Recorder, name: str, fd: int):
        self._recorder, self._name, self._fd = recorder, name, fd

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._recorder.stream(self._name, text)
        return len(text)


def _install_capture(shell: Any, recorder: _Recorder) -> None:
    """Point every output path of the shell at the recorder; nothing the child does may reach zmq."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import StdinNotImplementedError

    class CaptureDisplayPublisher(DisplayPublisher):
        def publish(self, data: dict, metadata: dict | None = None, source: Any = None, *, transient: Any = None,
                    update: bool = False, **kwargs: Any) -> None:
            display_id = (transient or {}).get("display_id")
            if update:
                for output in recorder.displays.get(display_id, []):
                    output["data"], output["metadata"] = data, metadata or {}
                return
            recorder.display({"output_type": "display_data", "data": data, "metadata": metadata or {}}, display_id)

        def clear_output(self, wait: bool = False) -> None:
            recorder.clear()

    class CaptureDisplayHook(DisplayHook):
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: dict, md_dict: dict | None = None) -> None:
            recorder.display({"output_type": "execute_result", "execution_count": self.shell.execution_count,
                              "data": format_dict, "metadata": md_dict or {}})

        def log_output(self, format_dict: dict) -> None:
            pass

        def finish_displayhook(self) -> None:
            self._is_active = False

    def show_traceback(etype: type, evalue: BaseException, stb: list[str]) -> None:
        recorder.error(etype.__name__, str(evalue), list(stb))

    def no_input(*args: Any, **kwargs: Any) -> str:
        raise StdinNotImplementedError("raw_input was called, but this frontend does not support input requests.")

    sys.stdout = _CaptureStream(recorder, "stdout", 1)
    sys.stderr = _CaptureStream(recorder, "stderr", 2)
    shell.display_pub = CaptureDisplayPublisher(shell=shell)
    hook = CaptureDisplayHook(shell=shell, cache_size=shell.cache_size)
    shell.displayhook = hook
    shell.display_trap.hook = hook
    sys.displayhook = hook
    shell._showtraceback = show_traceback
    builtins.input = no_input
    import getpass

    getpass.getpass = no_input
    # The history database connection belongs to the parent: the child must never write to it.
    if getattr(shell, "history_manager", None) is not None:
        shell.history_manager.enabled = False
        shell.history_manager.db_log_output = False


def _read_fd_output(fd: int, limit: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
