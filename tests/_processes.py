"""Process accounting shared by the kernel tests."""

import psutil


def live_children() -> set[int]:
    """Descendants of this test process that are running (zombies are the host init's to reap)."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found
