"""Scoring on Ray: one task per trajectory (one CPU, one kernel that replays it once and branches its predictions),
records sent back to the driver, which writes and aggregates them exactly as a local run does.

Each worker passes the opt-in gate itself (HF_ALLOW_CODE_EVAL travels with the task), opens the release from the
path and content hash its handle travels as (`themisto.release.folder.reopened_release`: the release folder must lie on
storage the nodes share, at the same path), rebuilds the release's look-alike inputs on its own node, once per node,
and finds the repositories' files in the source folders the driver named (shared storage too). A trajectory whose
worker died on both tries, or whose task raised, gets its examples `refused` with the reason; the other trajectories are not affected.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Iterator, Mapping

from themisto.distributed.cluster import RayTarget, check_reachable, node_folder, ray_session, remote
from themisto.distributed.tasks import TaskFailed, run_tasks
from themisto.release.workspaces import SourceFolders

def _inputs(release, folders):
    """The release's input files on this node (`themisto.release.workspaces.ReleaseInputs`): the look-alike inputs
    made once per node; a given workspace and the source folders as the driver named them (on storage the nodes
    share, or at the same paths on each)."""
    import hashlib
    import json

    from themisto.scoring.release_state import release_inputs

    folders = SourceFolders.of(folders)
    key = "score-" + hashlib.sha256(json.dumps(release.workspace, sort_keys=True).encode("utf-8")).hexdigest()[:24]
    shared = node_folder(key, lambda folder: release_inputs(release, folders, folder).prepare())
    return release_inputs(release, folders, shared)


def score_one(release, kernel_id: str, group: list, records: dict, folders, settings):
    """(On a worker) replay one trajectory once and score its examples' predictions in branches of it."""
    from themisto.scoring.execution import unsafe_execute_trajectory
    from themisto.gate import permit

    return unsafe_execute_trajectory(permit(execute=True), release, kernel_id, group, records,
                                     _inputs(release, folders), settings)


def refused_trajectory(release, task: str, kernel_id: str, group: list, records: Mapping[str, list], reason: str):
    """The TrajectoryScore of a trajectory that could not be scored: every example refused with `reason`."""
    from themisto.scoring.judging import refused
    from themisto.scoring.records import ExampleRecord, TrajectoryScore

    why = f"scoring {kernel_id} on Ray failed: {reason}"
    examples = [refused(ExampleRecord(id=e.id, predictions=len(e.predictions), kernel_id=kernel_id,
                                      step=int(release.task_rows(task)[e.id]["step"])), why) for e in group]
    return TrajectoryScore(kernel_id=kernel_id, examples=examples,
                           predictions=[refused(r, why) for e in group for r in records[e.id]], replay_s=0.0)


def scoring_runner(target: RayTarget):
    """A `themisto.scoring.execution` trajectory runner that scores each pending trajectory as one Ray task on
    `target`; an address that cannot be reached is refused here, before anything runs."""
    if target.address is not None:
        check_reachable(target.address, target.temp_dir)

    def run(permit, release, pending: list, by_id: Mapping[str, list], settings,
            workspace: "SourceFolders | str | Path | None") -> Iterator[tuple[tuple, object]]:
        permit.check()  # the driver's own opt-in; each worker checks its own as well
        with ray_session(target) as ray:
            task = remote(ray, score_one, num_cpus=1, max_retries=target.max_retries)
            shared = ray.put(release)  # once in the object store, not once per task
            folders = SourceFolders.of(workspace)  # paths travel; each node finds the files itself

            def submit(item: tuple):
                _, kernel_id, group = item
                records = {e.id: by_id[e.id] for e in group}
                return task.options(name=f"score {kernel_id}").remote(shared, kernel_id, group, records, folders,
                                                                      settings)

            # in the order given (themisto.scoring.execution.execute_examples: longest replay first)
            with closing(run_tasks(ray, submit, pending, tries=1 + target.max_retries)) as results:
                for item, result in results:
                    if isinstance(result, TaskFailed):
                        result = refused_trajectory(release, settings.task, item[1], item[2], by_id, result.reason)
                    yield item, result

    return run
