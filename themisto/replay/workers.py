"""Replay on this machine's cores: `workers` trajectories at once, each in its own sandboxed kernel.

A `replay_to_file` runner (see `themisto.replay.steps_file.Runner`): the driver writes each trajectory's steps as it
finishes and the final file in input order, so the steps file is the one a sequential run writes, and a stopped run
resumes the same way. Threads suffice: each trajectory's cells run in its own kernel process; the host only waits
on its sockets and turns the replies into steps.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator

from themisto.ingest.trajectory import Trajectory
from themisto.replay.replay import ReplaySettings, Step, kernel_session, replay
from themisto.replay.steps_file import Runner, local_runner, longest_first, with_progress
from themisto.replay.values import ValueFolder
from themisto.settings import usable_cores


class _Stopped(Exception):
    """The driver stopped the run (Ctrl-C, or an error elsewhere): this worker ends its trajectory here."""


def workers_runner(workers: int | None = None) -> Runner:
    """A runner that replays `workers` trajectories at once (default: one per usable core), one kernel each; with one
    worker (or one trajectory) it is `local_runner`, streaming steps as they come."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")

    def run(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
            say: Callable[[str], None], *, values: ValueFolder | None = None) -> Iterator[tuple[str, list[Step]]]:
        count = min(workers or usable_cores(), len(pending))
        if count <= 1:
            yield from local_runner(pending, workspace, settings, say, values=values)
            return
        yield from _in_threads(pending, workspace, settings, say, count, values if settings.values else None)

    return run


def _in_threads(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
                say: Callable[[str], None], count: int,
                values: ValueFolder | None) -> Iterator[tuple[str, list[Step]]]:
    from themisto.runtime.kernel import KernelSession

    stop = threading.Event()
    sessions: dict[str, KernelSession] = {}  # the kernels replaying now, by trajectory id

    def one(trajectory: Trajectory) -> list[Step]:
        if stop.is_set():
            raise _Stopped
        with kernel_session(trajectory, workspace, settings) as session:
            sessions[trajectory.id] = session
            try:
                steps = []
                for step in with_progress(trajectory, replay(trajectory, session, settings, values=values), say):
                    if stop.is_set():
                        raise _Stopped
                    steps.append(step)
                return steps
            finally:
                sessions.pop(trajectory.id, None)

    ordered = longest_first(pending)
    rank = {trajectory.id: i for i, trajectory in enumerate(ordered)}
    total = len(ordered)
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="themisto-replay")
    try:
        futures = {pool.submit(one, trajectory): trajectory for trajectory in ordered}
        say(f"replaying {total} trajectories, {count} at once")
        running = set(futures)
        finished = 0
        while running:
            # Timed waits: Ctrl-C reaches this (the main) thread within a second rather than at the next result.
            done, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: rank[futures[f].id]):
                steps = future.result()  # a worker's error ends the run here, as it would a sequential one
                finished += 1
                trajectory = futures[future]
                say(f"[{finished}/{total}] {trajectory.id}: {len(steps)} steps replayed")
                yield trajectory.id, steps
    finally:
        # Stopped early (Ctrl-C, an error, the consumer closed us): the other workers end their trajectories at the
        # next step; the cells running now are interrupted, and each worker's `with` closes its kernel.
        stop.set()
        for session in list(sessions.values()):
            session.interrupt()
        pool.shutdown(wait=True, cancel_futures=True)
