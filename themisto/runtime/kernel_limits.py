"""A kernel's resource limits (`Limits`): what the session is given, and what its layout and its request runner read
(the kernel's memory, processes, file size, CPU and cores, a cell's timeout and its clock, the output cap, the network
and what of the host it sees). A module of its own so that the session's parts need not import the session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Limits:
    """Resource limits of one kernel; they hold for the kernel and everything it forks."""

    memory_bytes: int = 4 * 2**30  # RLIMIT_DATA in the kernel (MemoryError, kernel lives on)
    max_processes: int = 256  # RLIMIT_NPROC for the kernel's own uid (threads count too)
    file_size_bytes: int = 2**30  # RLIMIT_FSIZE
    cpu_seconds: int | None = None  # RLIMIT_CPU counts the kernel's whole life: off by default
    # Cores the kernel is pinned to, its own while there are free ones (themisto.runtime.sandbox.claim_cores says
    # why one); None: all of this process's cores.
    cores: int | None = 1
    cell_timeout_s: float = 120.0
    # What a cell's timeout counts: "wall" seconds, or "cpu" seconds of the kernel and everything it started (the
    # replay's: a cell's outcome must not depend on the host's load; `kernel_requests.CPU_CLOCK_WALL_FACTOR` x the
    # timeout in wall seconds still ends a cell that waits without computing). Model-written code keeps "wall".
    cell_clock: Literal["wall", "cpu"] = "wall"
    output_bytes: int = 2**20  # per cell; beyond it outputs are cut with a visible marker
    network: bool = False
    isolate_fs: bool = True  # bubblewrap: rest of the filesystem read-only, private /tmp, private pids
    # What of the host's filesystem the kernel sees (with isolate_fs and bubblewrap): "host", all of it read-only;
    # "minimal", only the system folders, its interpreter, the themisto package and its own folder: no project
    # checkout, release, run folder or data (a probe must not read the answers, or a log's later cells).
    view: Literal["host", "minimal"] = "host"
