"""Output capture in a branch child: streams, display and the displayhook, with the output cap.

Runs inside the kernel: standard library only.
"""

from __future__ import annotations

import builtins
import io
import os
import sys
from typing import Any

from themisto.runtime.agent.recorder import OutputRecorder


# ----- branch execution: the child side -------------------------------------------------------------------------


class BranchTimeout(BaseException):
    """Raised in the child by its own timer; BaseException so that `except Exception` in the candidate passes it."""


class _CaptureStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a branch child: writes go to the recorder, never to the kernel's IOPub."""

    def __init__(self, recorder: OutputRecorder, name: str, fd: int):
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


def install_capture(shell: Any, recorder: OutputRecorder) -> None:
    """Point every output path of the shell at the recorder; nothing the child does may reach zmq."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.error import StdinNotImplementedError

    class CaptureDisplayPublisher(DisplayPublisher):
        def publish(self, data: dict, metadata: dict | None = None, source: Any = None, *, transient: Any = None,
                    update: bool = False, **kwargs: Any) -> None:
            display_id = (transient or {}).get("display_id")
            if update:
                recorder.update(display_id, data, metadata)
            else:
                recorder.display("display_data", data, metadata, display_id=display_id)

        def clear_output(self, wait: bool = False) -> None:
            recorder.clear(wait)

    class CaptureDisplayHook(DisplayHook):
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict: dict, md_dict: dict | None = None) -> None:
            recorder.display("execute_result", format_dict, md_dict, execution_count=self.shell.execution_count)

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


def read_fd_output(fd: int, limit: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, left = [], limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
