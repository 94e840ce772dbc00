"""Environment variables Themisto reads, read once and typed in one place."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Settings:
    """Host-side settings of the sandboxed kernel (the per-kernel limits live in `themisto.kernel.Limits`)."""

    # Path of the bubblewrap binary; None where it is missing or disabled with THEMISTO_SANDBOX=0.
    bwrap: str | None
    # Unprivileged uid/gid the kernel runs as when the host runs as root; None picks a free one per session.
    kernel_uid: int | None
    # Where the sessions' temporary folders go (the kernel's workdir, its home, its connection file).
    tmp_dir: str | None
    kernel_start_timeout_s: float


def _flag(value: str | None, default: bool) -> bool:
    if value is None or value == "":
        return default
    return value.strip().lower() not in ("0", "false", "no", "off")


def _int_or_none(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The settings from the environment: THEMISTO_SANDBOX, THEMISTO_BWRAP, THEMISTO_KERNEL_UID, THEMISTO_TMPDIR,
    THEMISTO_KERNEL_START_TIMEOUT."""
    bwrap = None
    if _flag(os.environ.get("THEMISTO_SANDBOX"), True):
        bwrap = os.environ.get("THEMISTO_BWRAP") or shutil.which("bwrap")
    timeout = os.environ.get("THEMISTO_KERNEL_START_TIMEOUT", "").strip()
    return Settings(
        bwrap=bwrap,
        kernel_uid=_int_or_none("THEMISTO_KERNEL_UID"),
        tmp_dir=os.environ.get("THEMISTO_TMPDIR") or None,
        kernel_start_timeout_s=float(timeout) if timeout else 60.0,
    )
