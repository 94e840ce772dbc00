"""Connect to Ray — a local Ray on this machine's cores, or a running cluster by address — and check its workers.

Ray is imported here only, and only when a command asks for it. An address that cannot be reached is refused before
anything starts (Ray itself would retry it for minutes). Every worker must run the kernels the driver would run:
the same kernel environment and, where the driver sandboxes its kernels, bubblewrap.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from themisto.errors import InputError

RAY_REQUIREMENT = "ray==2.60.0"
DEFAULT_GCS_PORT = 6379
DEFAULT_CLIENT_PORT = 10001
CONNECT_TIMEOUT_S = 5.0
# Settings the workers must read as the driver does (themisto.settings reads them from the environment).
_FORWARDED_PREFIXES = ("THEMISTO_",)
_FORWARDED = ("HF_ALLOW_CODE_EVAL", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


class ClusterError(InputError):
    """Ray cannot be used as asked: not installed, an address that does not answer, or workers unlike the driver."""


@dataclass(frozen=True)
class RayTarget:
    """Where Ray work runs: `address` None starts a local Ray; else `host:port`, `ray://host:port` or `auto`."""

    address: str | None = None
    num_cpus: int | None = None  # local Ray only: CPUs (= kernels at once); default: this machine's cores
    temp_dir: str | None = None  # local Ray only: its session files (Ray's default is /tmp/ray)
    max_retries: int = 1  # a task whose worker died runs once more, then counts as failed


def import_ray():
    """The `ray` module, or ClusterError with the install command."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--ray needs Ray: pip install '{RAY_REQUIREMENT}'") from None
    return ray


def _auto_address(temp_dir: str | None) -> str:
    """What `ray.init(address="auto")` would use: RAY_ADDRESS, else the cluster `ray start` recorded on this node."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    # where `ray start` records it: Ray's temp folder (RAY_TMPDIR, else TMPDIR, else /tmp, then ray/)
    default = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"
    current = Path(temp_dir or default) / "ray_current_cluster"
    if current.is_file() and current.read_text(encoding="utf-8").strip():
        return current.read_text(encoding="utf-8").strip()
    raise ClusterError("Ray address auto: no running Ray cluster on this node (start one with `ray start --head`, "
                       "or give the head's address)")


def endpoint(address: str) -> tuple[str, int]:
    """The host and port an address names (a bare host gets Ray's default port)."""
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    host, sep, port = rest.rpartition(":")
    if not sep:
        host, port = rest, ""
    host = host.strip("[]")
    if not host or (port and not port.isdigit()):
        raise ClusterError(f"Ray address {address!r}: expected host:port, ray://host:port or auto")
    return host, int(port) if port else (DEFAULT_CLIENT_PORT if client else DEFAULT_GCS_PORT)


def check_reachable(address: str, temp_dir: str | None = None) -> str:
    """Refuse an address whose port does not answer (nothing is started); returns the address to connect to."""
    resolved = _auto_address(temp_dir) if address == "auto" else address
    host, port = endpoint(resolved)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ClusterError(f"Ray address {address!r} ({host}:{port}) cannot be reached: {exc}; nothing was started "
                           f"(is the cluster up? `ray status` on its head shows it)") from None
    return resolved


def forwarded_environment() -> dict[str, str]:
    """The driver's Themisto settings that workers must share (the sandbox switch, the code-eval opt-in, ...)."""
    return {k: v for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIXES) or k in _FORWARDED}


def remote(ray, function, **options):
    """`function` as a Ray task whose workers read the driver's Themisto settings (set per task, so that a Ray
    started before those settings, or by someone else, still gets them)."""
    return ray.remote(runtime_env={"env_vars": forwarded_environment()}, **options)(function)


def _node_root() -> Path:
    """Ray's own folder for this session on this node (it goes with Ray's temp folder); outside Ray, a temp folder."""
    import sys
    import tempfile

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        return Path(context.get_temp_dir()) / context.get_session_name() / "themisto"
    from themisto.settings import settings

    return Path(settings().tmp_dir or tempfile.gettempdir()) / "themisto-ray"


def node_folder(key: str, fill: Callable[[Path], None]) -> Path:
    """A folder on this node named for `key` (a digest of its content), filled once by `fill` and then shared by
    every worker process here; workers die by signal, so per-process copies would never be removed."""
    import shutil
    import tempfile

    root = _node_root()
    final = root / key
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        fill(partial)
        partial.chmod(0o755)
        try:
            partial.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # another worker on this node filled it first: theirs is used, ours removed below
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


@contextmanager
def ray_session(target: RayTarget) -> Iterator[Any]:
    """Ray, connected as `target` says and shut down afterwards; a Ray this process already runs is used as is."""
    ray = import_ray()
    if ray.is_initialized():  # the caller (a test, a notebook) started or joined Ray: use it, leave it running
        yield ray
        return
    if target.address is None:
        ray.init(num_cpus=target.num_cpus, include_dashboard=False, _temp_dir=target.temp_dir, log_to_driver=False)
    else:
        ray.init(address=check_reachable(target.address, target.temp_dir), log_to_driver=False)
    try:
        check_workers(ray)
        yield ray
    finally:
        ray.shutdown()


# ---------------------------------------------------------------------------------------------------------------
# Workers must run the kernels the driver runs


def worker_environment() -> dict:
    """(On any node) what its kernels would run with: the package's place, the sandbox, the kernel's versions."""
    import themisto
    from themisto.runtime.sandbox import kernel_environment
    from themisto.settings import settings

    kernel = {k: v for k, v in kernel_environment().items() if k != "interpreter"}
    package = Path(themisto.__file__).resolve().parent
    return {"host": socket.gethostname(), "themisto": str(package), "code": code_digest(package),
            "sandbox": settings().bwrap is not None, "kernel_python_source": settings().kernel_python_source,
            "kernel": kernel}


def code_digest(package: Path) -> str:
    """One sha256 over the package's Python files (paths and contents): equal on two nodes, equal code."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def environment_problems(driver: dict, worker: dict) -> list[str]:
    """How a worker's kernels would differ from the driver's (empty: they match)."""
    problems = []
    if driver.get("code") != worker.get("code"):
        problems.append("its themisto code differs from the driver's (install the same commit on every node)")
    if driver["sandbox"] and not worker["sandbox"]:
        problems.append("bubblewrap (bwrap) is missing, so its kernels would run without the sandbox")
    if driver["kernel_python_source"] != worker["kernel_python_source"]:
        problems.append(f"its kernels run the {worker['kernel_python_source']} interpreter, the driver's the "
                        f"{driver['kernel_python_source']} one (install .venv-kernel there: scripts/install.sh)")
    differ = sorted(k for k in set(driver["kernel"]) | set(worker["kernel"])
                    if driver["kernel"].get(k) != worker["kernel"].get(k))
    if differ:
        problems.append("its kernel environment differs: " + ", ".join(
            f"{k} {worker['kernel'].get(k)} (driver {driver['kernel'].get(k)})" for k in differ[:5]))
    return problems


def check_workers(ray) -> list[dict]:
    """Run `worker_environment` once on every alive node; ClusterError naming the node where kernels would differ."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = remote(ray, worker_environment, num_cpus=0)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in nodes]
    found = ray.get(refs)
    driver = worker_environment()
    for node, worker in zip(nodes, found):
        problems = environment_problems(driver, worker)
        if problems:
            raise ClusterError(f"Ray node {node.get('NodeManagerAddress')} ({worker['host']}): "
                               + "; ".join(problems))
    return found
