"""`transformers serve` as a real OpenAI-compatible server process on a free loopback port, offline, serving the
model folder each request names (the suite's one server: `served` in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

SERVE_START_TIMEOUT_S = 300  # a bound on a busy machine, where importing the server alone can take a minute


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(log: Path) -> Iterator[str]:
    """Start `transformers serve` on 127.0.0.1 (its output in `log`) and yield its /v1 base URL; stop it after. No
    model is forced on it: it loads the folder a request names as its model (and keeps it loaded a while)."""
    port = _free_port()
    serve_bin = Path(sys.executable).parent / "transformers"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen([str(serve_bin), "serve", "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
