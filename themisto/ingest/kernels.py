"""Several kernels, one notebook: a participant's kernels on one notebook form one trajectory, with a restart
where each next kernel took over.

The rule: the JuNE kernels of one participant and one notebook, ordered by time, join into one trajectory when
each one's executions all come after the previous one's; a kernel whose executions overlap another's (two kernels
of the notebook running at once) starts a trajectory of its own. Each joined kernel begins with a restart
(`KernelEvent("restart", kernel_id=<the kernel>)`); a kernel without executions only adds its file to `sources`.
The trajectory keeps the first kernel's id.

Why: a new kernel on the same notebook is what a restart is, an empty namespace under the same cells, and replay
already restarts there; the notebook the developer kept working in carried its cells and outputs across kernels,
so the history a model is shown goes on across the restart as it did for the developer, files the developer's
earlier kernel wrote are still in the replay's workspace, and a short kernel does not lose its first actions as
targets (`release.tasks` needs five prior actions) to a boundary the developer did not see. student_0's eight
task-1 kernels (09:29 to 16:49, one after the other, among them a 4-second "run all" after a reopen) become one
task-1 trajectory of 8 kernels. Kernels without a known participant are never joined: the same notebook name
(everyone's is `task1.ipynb`) says nothing of who worked in it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

from themisto.ingest.trajectory import KernelEvent, Trajectory

JOINED_SOURCES: frozenset[str] = frozenset({"june-log", "june-table"})


def _times(traj: Trajectory) -> list[str]:
    return [t for ex in traj.executions for t in (ex.started_at, ex.finished_at) if t]


def _copy(traj: Trajectory) -> Trajectory:
    return replace(traj, executions=list(traj.executions), events=list(traj.events), sources=list(traj.sources),
                   ignored=dict(traj.ignored), logged_events=dict(traj.logged_events))


def _append(chain: Trajectory, nxt: Trajectory, at: str | None) -> None:
    offset = len(chain.executions)
    if nxt.executions:
        chain.events.append(KernelEvent("restart", before=offset, time=at, kernel_id=nxt.id))
    chain.executions.extend(nxt.executions)
    chain.events.extend(replace(ev, before=ev.before + offset) for ev in nxt.events)
    chain.sources.extend(nxt.sources)
    for counts, more in ((chain.ignored, nxt.ignored), (chain.logged_events, nxt.logged_events)):
        for key, value in more.items():
            counts[key] = counts.get(key, 0) + value
    chain.ignored = dict(sorted(chain.ignored.items()))
    chain.logged_events = dict(sorted(chain.logged_events.items()))


def join_kernels(trajectories: Iterable[Trajectory], first_event: Mapping[str, str]) -> list[Trajectory]:
    """Join each participant's kernels on one notebook (module docstring); `first_event` maps a kernel id to the
    time of its first event. The others come back unchanged, in their order."""
    trajectories = list(trajectories)
    groups: dict[tuple[str, str, str], list[Trajectory]] = {}
    for traj in trajectories:
        if traj.participant and traj.source in JOINED_SOURCES:
            groups.setdefault((traj.source, traj.participant, traj.notebook), []).append(traj)
    merged_into: dict[str, Trajectory] = {}
    for kernels in groups.values():
        if len(kernels) < 2:
            continue
        kernels.sort(key=lambda t: (first_event.get(t.id) or min(_times(t), default=""), t.id))
        chains: list[Trajectory] = []
        for traj in kernels:
            times = _times(traj)
            last = chains[-1] if chains else None
            ended = max(_times(last), default="") if last is not None else ""
            if last is not None and not last.executions and times:
                # The kernels so far ran nothing: this one heads the trajectory, theirs are only its files.
                head = _copy(traj)
                _append(head, last, None)
                head.sources = [*last.sources, *traj.sources]
                chains[-1] = head
                for kernel, chain in merged_into.items():
                    if chain is last:
                        merged_into[kernel] = head
                merged_into[traj.id] = head
            elif last is not None and (not times or min(times) > ended):
                _append(last, traj, first_event.get(traj.id) or min(times, default=None))
                merged_into[traj.id] = last
            else:
                chains.append(_copy(traj))
                merged_into[traj.id] = chains[-1]
    out, seen = [], set()
    for traj in trajectories:
        chain = merged_into.get(traj.id, traj)
        if id(chain) not in seen:
            seen.add(id(chain))
            out.append(chain)
    return out
