"""Replay on Ray: one task per trajectory (one CPU, one sandboxed kernel), steps sent back to the driver, which
writes them with `replay_to_file` — the same files, resume and final order as a local replay.

>>> runner = replay_runner(RayTarget())  # nothing starts (or imports Ray) until the runner is iterated
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import closing
from pathlib import Path
from typing import Callable, Iterator

from themisto.distributed.cluster import RayTarget, check_reachable, node_folder, ray_session, remote
from themisto.distributed.tasks import TaskFailed, run_tasks
from themisto.ingest.trajectory import Trajectory
from themisto.replay.replay import ReplaySettings, Step
from themisto.replay.steps_file import ReplayFailure, Runner, longest_first
from themisto.replay.values import ValueEntry, ValueFolder


# A workspace up to this size travels with the tasks (once, through Ray's object store) to nodes that do not see
# the driver's folder; a larger one must lie on storage every node mounts at the same path.
SHIPPED_WORKSPACE_BYTES = 256 * 2**20


def pack_workspace(folder: str | Path) -> bytes | None:
    """The folder as a gzipped tar, or None when it is larger than SHIPPED_WORKSPACE_BYTES."""
    import io
    import tarfile

    folder = Path(folder)
    if sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) > SHIPPED_WORKSPACE_BYTES:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def node_workspace(workspace: str | None, packed: bytes | None) -> str | None:
    """The workspace on this node: the driver's path where this node sees it, else the shipped copy, unpacked once
    per node."""
    import hashlib
    import io
    import tarfile

    if workspace is None or Path(workspace).is_dir():
        return workspace
    if packed is None:
        raise FileNotFoundError(f"workspace {workspace} is not on node {socket.gethostname()} and is too large to "
                                f"ship: put it on storage every node mounts at the same path")

    def unpack(folder: Path) -> None:
        with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
            tar.extractall(folder, filter="data")  # the driver's own files; "data" refuses links out of the folder

    return str(node_folder("ws-" + hashlib.sha256(packed).hexdigest()[:24], unpack))


def replay_one(trajectory: Trajectory, workspace: str | None, packed: bytes | None, settings: ReplaySettings,
               values: bool = False) -> dict:
    """(On a worker) replay one trajectory in its own fresh kernel; its steps as dicts, the values they stored
    (entry and bytes, when `values`), and where and how long."""
    import tempfile
    from dataclasses import asdict

    from themisto.replay.replay import replay_trajectory
    from themisto.replay.values import ValueFolder

    began = time.perf_counter()
    folder = node_workspace(workspace, packed)
    with tempfile.TemporaryDirectory(prefix="themisto-values-") as tmp:
        store = ValueFolder(tmp) if values else None
        steps = [step.to_dict() for step in replay_trajectory(trajectory, folder, settings, values=store)]
        shipped = [(asdict(entry), store.file(entry).read_bytes()) for entry in store.entries().values()] \
            if store is not None else []
    return {"steps": steps, "values": shipped, "host": socket.gethostname(), "pid": os.getpid(),
            "seconds": round(time.perf_counter() - began, 3)}


def replay_runner(target: RayTarget) -> Runner:
    """A `replay_to_file` runner that replays each pending trajectory as one Ray task on `target`; an address
    that cannot be reached is refused here, before anything is written or started."""
    if target.address is not None:
        check_reachable(target.address, target.temp_dir)

    def run(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
            say: Callable[[str], None], *,
            values: ValueFolder | None = None) -> Iterator[tuple[str, list[Step] | ReplayFailure]]:
        if not pending:
            return
        with ray_session(target) as ray:
            task = remote(ray, replay_one, num_cpus=1, max_retries=target.max_retries)
            folder = None if workspace is None else str(workspace)
            packed = None if folder is None else ray.put(pack_workspace(folder))
            say(f"Ray: {len(pending)} trajectories over {int(ray.cluster_resources().get('CPU', 0))} CPUs")
            ordered = longest_first(pending)

            def submit(trajectory: Trajectory):
                # the task's name is its worker's process title while it runs (`ray::replay <id>`) and its name in
                # Ray's listings (`ray list tasks`)
                return task.options(name=f"replay {trajectory.id}").remote(trajectory, folder, packed, settings,
                                                                           values is not None)

            results = run_tasks(ray, submit, ordered, tries=1 + target.max_retries)
            # closed before Ray shuts down: tasks still running are cancelled while Ray can still reach them
            with closing(results):
                yield from _as_steps(results, len(pending), say, values)

    return run


def _as_steps(results, total: int, say: Callable[[str], None],
              values: ValueFolder | None) -> Iterator[tuple[str, list[Step] | ReplayFailure]]:
    for number, (trajectory, result) in enumerate(results, start=1):
        if isinstance(result, TaskFailed):
            say(f"[{number}/{total}] {trajectory.id}: failed: {result.reason}")
            yield trajectory.id, ReplayFailure(result.reason)
            continue
        say(f"[{number}/{total}] {trajectory.id}: {len(result['steps'])} steps in {result['seconds']:.1f} s "
            f"on {result['host']}")
        for entry, data in result.get("values", []) if values is not None else []:
            values.add_bytes(ValueEntry(**entry), data)  # the driver writes everything, values included
        yield trajectory.id, [Step.from_dict(d) for d in result["steps"]]
