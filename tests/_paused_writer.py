"""Run one `themisto` command in this process, paused while it holds its output: `python _paused_writer.py READY GO
hold|line -- ARGS...` touches READY once the command has taken its lock (`hold`) or written its first line (`line`,
`themisto.resume.LineWriter`), then waits until GO exists (or is killed there). The command is the real one; only
the pause is added, so a test can start a second writer, or kill this one mid-write, at a known point."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _pause(ready: Path, go: Path) -> None:
    ready.touch()
    while not go.exists():
        time.sleep(0.02)


def main() -> int:
    ready, go, where = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    args = sys.argv[sys.argv.index("--") + 1:]
    import themisto.resume as resume

    paused = []
    if where == "hold":
        acquire = resume._acquire

        def acquire_then_pause(*a, **k):
            fd = acquire(*a, **k)
            if not paused:
                paused.append(True)
                _pause(ready, go)
            return fd

        resume._acquire = acquire_then_pause
    else:
        write = resume.LineWriter.write

        def write_then_pause(self, value):
            write(self, value)
            if not paused:
                paused.append(True)
                _pause(ready, go)

        resume.LineWriter.write = write_then_pause
    from themisto.cli import main as cli

    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
