"""Environment variables Themisto reads, read once and typed in one place."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

# The replay kernel's own environment, made by scripts/install.sh from requirements-kernel.txt beside the package.
KERNEL_VENV = Path(__file__).resolve().parents[1] / ".venv-kernel"
# The kernel environments a trajectory may ask for by name (`Trajectory.provenance["environment"]`), each a venv
# beside the package made by scripts/install.sh: "june", the 2023 stack of requirements-kernel.txt (the default, or
# THEMISTO_KERNEL_PYTHON); "wild", that stack and the packages sessions from public repositories import most
# (requirements-kernel-wild.txt); "wide", the wild one and CPU wheels of the larger packages those sessions import
# (requirements-kernel-wide.txt: tensorflow, torch, ...), made only by `scripts/install.sh --wide`.
KERNEL_ENVIRONMENTS: dict[str, str] = {"june": ".venv-kernel", "wild": ".venv-kernel-wild", "wide": ".venv-kernel-wide"}
DEFAULT_ENVIRONMENT = "june"


def environment_interpreter(name: str) -> Path:
    """Where the kernel environment `name`'s interpreter lies (it may not be installed); KeyError for an unknown one."""
    return KERNEL_VENV.parent / KERNEL_ENVIRONMENTS[name] / "bin" / "python"


@dataclass(frozen=True)
class Settings:
    """Host-side settings of the sandboxed kernel (the per-kernel limits live in `themisto.runtime.kernel.Limits`)."""

    # Path of the bubblewrap binary; None where it is missing or disabled with THEMISTO_SANDBOX=0.
    bwrap: str | None
    # Unprivileged uid/gid the kernel runs as when the host runs as root; None picks a free one per session.
    kernel_uid: int | None
    # Where the sessions' temporary folders go (the kernel's workdir, its home, its connection file).
    tmp_dir: str | None
    kernel_start_timeout_s: float
    # The interpreter the kernel runs (not resolved: a venv's bin/python must stay a path into the venv), and where
    # the choice came from: THEMISTO_KERNEL_PYTHON ("env"), the repo's .venv-kernel ("kernel_venv"), or this
    # process's own interpreter ("host", which lacks the 2023 stack that replay fidelity needs).
    kernel_python: str
    kernel_python_source: Literal["env", "kernel_venv", "host"]
    # HF_ALLOW_CODE_EVAL=1: the user's half of the opt-in to executing model-written code (see themisto.gate).
    allow_code_eval: bool = False
    # The OpenAI-compatible endpoint and key of `themisto generate --backend openai` (OPENAI_BASE_URL,
    # OPENAI_API_KEY), as the openai client itself names them; None: give them as options.
    openai_base_url: str | None = None
    openai_api_key: str | None = None


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


def _kernel_python() -> tuple[str, Literal["env", "kernel_venv", "host"]]:
    configured = os.environ.get("THEMISTO_KERNEL_PYTHON", "").strip()
    if configured:
        path = Path(configured).expanduser()
        if not path.is_absolute():
            found = shutil.which(configured)
            path = Path(found) if found else path
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValueError(f"environment variable THEMISTO_KERNEL_PYTHON={configured!r} is not an executable file")
        return str(path.absolute()), "env"
    venv_python = KERNEL_VENV / "bin" / "python"
    if venv_python.is_file() and os.access(venv_python, os.X_OK):
        return str(venv_python), "kernel_venv"
    return sys.executable, "host"


def usable_cores() -> int:
    """How many cores this process may use (its CPU affinity): how many kernels to run at once, one per core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@lru_cache(maxsize=1)
def settings() -> Settings:
    """The settings from the environment: THEMISTO_SANDBOX, THEMISTO_BWRAP, THEMISTO_KERNEL_UID, THEMISTO_TMPDIR,
    THEMISTO_KERNEL_START_TIMEOUT, THEMISTO_KERNEL_PYTHON (default: the repo's .venv-kernel, else this interpreter),
    HF_ALLOW_CODE_EVAL, OPENAI_BASE_URL, OPENAI_API_KEY."""
    bwrap = None
    if _flag(os.environ.get("THEMISTO_SANDBOX"), True):
        bwrap = os.environ.get("THEMISTO_BWRAP") or shutil.which("bwrap")
    timeout = os.environ.get("THEMISTO_KERNEL_START_TIMEOUT", "").strip()
    kernel_python, kernel_python_source = _kernel_python()
    return Settings(
        bwrap=bwrap,
        kernel_uid=_int_or_none("THEMISTO_KERNEL_UID"),
        tmp_dir=os.environ.get("THEMISTO_TMPDIR") or None,
        kernel_start_timeout_s=float(timeout) if timeout else 60.0,
        kernel_python=kernel_python,
        kernel_python_source=kernel_python_source,
        # Exactly "1", as evaluate's code_eval reads it: an opt-in is never inferred from "yes" or "true".
        allow_code_eval=os.environ.get("HF_ALLOW_CODE_EVAL", "").strip() == "1",
        openai_base_url=os.environ.get("OPENAI_BASE_URL") or None,
        openai_api_key=os.environ.get("OPENAI_API_KEY") or None,
    )
