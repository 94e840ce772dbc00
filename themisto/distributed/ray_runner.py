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

from themisto.distributed.cluster import RayTarget, check_reachable, ray_session, remote
from themisto.distributed.tasks import TaskFailed, run_tasks
from themisto.ingest.trajectory import Trajectory
from themisto.replay.replay import ReplayFailure, ReplaySettings, Runner, Step


def replay_one(trajectory: Trajectory, workspace: str | None, settings: ReplaySettings) -> dict:
    """(On a worker) replay one trajectory in its own fresh kernel; its steps as dicts, and where and how long."""
    from themisto.replay.replay import replay_trajectory

    if workspace is not None and not Path(workspace).is_dir():
        raise FileNotFoundError(f"workspace {workspace} is not on node {socket.gethostname()}: put it on storage "
                                f"every node mounts at the same path")
    began = time.perf_counter()
    steps = [step.to_dict() for step in replay_trajectory(trajectory, workspace, settings)]
    return {"steps": steps, "host": socket.gethostname(), "pid": os.getpid(),
            "seconds": round(time.perf_counter() - began, 3)}


def replay_runner(target: RayTarget) -> Runner:
    """A `replay_to_file` runner that replays each pending trajectory as one Ray task on `target`; an address
    that cannot be reached is refused here, before anything is written or started."""
    if target.address is not None:
        check_reachable(target.address, target.temp_dir)

    def run(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
            say: Callable[[str], None]) -> Iterator[tuple[str, list[Step] | ReplayFailure]]:
        if not pending:
            return
        with ray_session(target) as ray:
            task = remote(ray, replay_one, num_cpus=1, max_retries=target.max_retries)
            folder = None if workspace is None else str(workspace)
            say(f"Ray: {len(pending)} trajectories over {int(ray.cluster_resources().get('CPU', 0))} CPUs")
            # longest first, so that no long trajectory starts last and keeps one worker busy alone at the end
            # (the final file's order does not depend on it)
            ordered = sorted(pending, key=lambda t: len(t.executions), reverse=True)
            # the task's name is the worker's process title while it runs (`ray::replay <id>`), and Ray's listings'
            results = run_tasks(ray, lambda t: task.options(name=f"replay {t.id}").remote(t, folder, settings), ordered,
                                tries=1 + target.max_retries)
            # closed before Ray shuts down: tasks still running are cancelled while Ray can still reach them
            with closing(results):
                yield from _as_steps(results, len(pending), say)

    return run


def _as_steps(results, total: int, say: Callable[[str], None]) -> Iterator[tuple[str, list[Step] | ReplayFailure]]:
    for number, (trajectory, result) in enumerate(results, start=1):
        if isinstance(result, TaskFailed):
            say(f"[{number}/{total}] {trajectory.id}: failed: {result.reason}")
            yield trajectory.id, ReplayFailure(result.reason)
            continue
        say(f"[{number}/{total}] {trajectory.id}: {len(result['steps'])} steps in {result['seconds']:.1f} s "
            f"on {result['host']}")
        yield trajectory.id, [Step.from_dict(d) for d in result["steps"]]
