"""The steps file: a resumable replay of many trajectories into one JSONL file, and the one reader of it.

Its first line is a header: the recipe of the inputs the replay ran over (`themisto.replay.workspace_recipe`) and the
replay settings, so that the build and scoring make the same inputs again; every other line is one `Step`, the
trajectories in input order whatever order they finished in. An interrupted run leaves `<out>.partial` and
`<out>.progress.json` and resumes from them (`themisto.resume`). Where the replay stores values, they go into
`<out>.values/` (themisto.replay.values) as the steps complete.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from themisto.ingest.trajectory import Trajectory
from themisto.replay.replay import ReplaySettings, Step, replay_in_turn
from themisto.replay.values import ValueFolder, values_folder
from themisto.resume import LineWriter, hold_file, write_json_atomic


@dataclass(frozen=True)
class ReplayFailure:
    """A trajectory a runner could not replay (e.g. its worker died on every try); `reason` says why."""

    reason: str


# A runner replays the pending trajectories and yields, for each as it finishes (in any order), the trajectory's id
# and its steps in step order, or a ReplayFailure; the steps' values are in the ValueFolder it is given (keyword
# `values`, None: not stored) before their steps are yielded. `local_runner` replays one after the other in this
# process; themisto.replay.workers on this machine's cores; themisto.distributed.ray_runner over a Ray cluster.
Runner = Callable[..., Iterator[tuple[str, "Iterable[Step] | ReplayFailure"]]]


class ReplayIncomplete(RuntimeError):
    """Some trajectories failed; the finished ones are kept and a rerun replays only the failed ones."""

    def __init__(self, out: Path, failed: dict[str, str]):
        self.failed = dict(failed)
        listed = "; ".join(f"{tid}: {reason}" for tid, reason in sorted(failed.items())[:5])
        super().__init__(f"{out}: {len(failed)} trajectory(ies) failed ({listed}); the others are kept in "
                         f"{_partial_path(out)}, and a rerun replays only the failed ones")


def longest_first(pending: list[Trajectory]) -> list[Trajectory]:
    """The order a runner that replays several trajectories at once starts them in: costliest first, so that no long
    trajectory starts last and keeps one worker busy alone at the end (the final file's order does not depend on it).
    The cost is the replay time this user's last replay of the same trajectory took (themisto.replay.costs), else
    its step count at the known trajectories' seconds per step."""
    from themisto.replay.costs import estimated_costs

    costs = estimated_costs(pending)
    return sorted(pending, key=lambda t: costs[t.id], reverse=True)


def local_runner(pending: list[Trajectory], workspace: str | Path | None, settings: ReplaySettings,
                 say: Callable[[str], None], *,
                 values: ValueFolder | None = None) -> Iterator[tuple[str, Iterable[Step]]]:
    """Replay the trajectories one after the other in this process, streaming each one's steps (the next one's
    kernel starting meanwhile)."""
    for trajectory, steps in replay_in_turn(pending, workspace, settings, values=values):
        yield trajectory.id, with_progress(trajectory, steps, say)


def with_progress(trajectory: Trajectory, steps: Iterable[Step], say: Callable[[str], None]) -> Iterator[Step]:
    """`steps` as they come, saying every 25 steps how far the trajectory is; the time of a whole replay is kept as
    its cost for the next run's order (`longest_first`)."""
    from themisto.replay.costs import remember_cost

    n, t0 = len(trajectory.executions), time.perf_counter()
    for step in steps:
        yield step
        if (step.step + 1) % 25 == 0 or step.step + 1 == n:
            say(f"{trajectory.id}: {step.step + 1}/{n} steps ({time.perf_counter() - t0:.1f} s)")
        if step.step + 1 == n:
            remember_cost(trajectory, time.perf_counter() - t0)


@dataclass
class ReplayRun:
    """What a replay to file did: steps written, trajectories replayed now and resumed from an earlier run."""

    path: Path
    steps: int
    replayed: list[str]
    resumed: list[str]
    seconds: float


def _progress_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress.json")


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _resume_header(workspace: str | Path | None, settings: ReplaySettings, out: Path) -> dict:
    """What changes a replay's steps besides the trajectory itself: the settings, the workspace's files and the
    kernel's environment (interpreter, hash seed, package versions)."""
    from themisto.resume import folder_fingerprint
    from themisto.runtime.sandbox import kernel_environment

    return {"settings": asdict(settings), "workspace": folder_fingerprint(workspace, output=out),
            "kernel": kernel_environment()}


def _load_progress(out: Path, header: dict, digests: dict[str, str],
                   say: Callable[[str], None]) -> tuple[list[str], int]:
    """Trajectories an earlier interrupted run finished with the same settings, workspace and trajectory content
    (themisto.resume); partial lines of the others are dropped, and a changed setting starts everything anew."""
    from themisto.resume import ResumeError, read_lines, settings_difference, write_text_atomic

    progress, partial = _progress_path(out), _partial_path(out)
    recorded = json.loads(progress.read_text(encoding="utf-8")) if progress.exists() and partial.exists() else None
    difference = None if recorded is None else settings_difference(recorded.get("header") or {}, header)
    try:
        lines = read_lines(partial)[0] if recorded is not None and difference is None else []
    except ResumeError as error:
        difference = str(error)
    if recorded is None or difference is not None:
        if difference is not None:
            say(f"{out}: the earlier replay cannot be resumed ({difference}); replaying every trajectory anew")
        partial.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
        return [], 0
    earlier = recorded.get("digests") or {}
    done = [t for t in recorded["done"] if t in digests and earlier.get(t) == digests[t]]
    for changed in sorted(set(recorded["done"]) - set(done)):
        say(f"{changed}: the trajectory differs from the one replayed earlier (or is no longer given); replayed anew")
    kept = [line for line in lines if isinstance(line, dict) and line.get("kernel_id") in done]
    write_text_atomic(partial, "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in kept))
    return done, len(kept)


def replay_to_file(trajectories: Iterable[Trajectory], out: str | Path, workspace: str | Path | None,
                   settings: ReplaySettings = ReplaySettings(), *, resume: bool = True,
                   progress: Callable[[str], None] | None = None, runner: Runner | None = None,
                   recipe: dict | None = None) -> ReplayRun:
    """Replay every trajectory, writing steps as they complete; the final file appears only when all are done.

    Its first line is a header with the recipe of the inputs (`recipe`, from `themisto.replay.workspace_recipe`;
    default: `workspace` as a given folder, with its hash) and the replay settings, so that the build and scoring
    can make the same inputs again (`read_steps_header`).

    An interrupted run leaves `<out>.partial` and `<out>.progress.json`; the next run with `resume=True` keeps the
    trajectories that finished and replays the rest (a trajectory is replayed whole: its state needs its prefix).
    A run with other settings or another workspace replays everything anew and says which setting differs.
    Trajectories may finish in any order (`runner`); the final file lists them in input order, so it is the same
    whichever runner wrote it. A trajectory the runner reports failed raises ReplayIncomplete once the rest is done.
    One process writes `out` and its files at a time (`themisto.resume.hold_file`): another is refused with its pid.
    """
    with hold_file(out, "steps file") as out:
        return _replay_held(trajectories, out, workspace, settings, resume, progress, runner, recipe)


def _replay_held(trajectories: Iterable[Trajectory], out: Path, workspace: str | Path | None,
                 settings: ReplaySettings, resume: bool, progress: Callable[[str], None] | None, runner: Runner | None,
                 recipe: dict | None) -> ReplayRun:
    started = time.perf_counter()
    trajectories = list(trajectories)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    header, digests = _resume_header(workspace, settings, out), {t.id: t.digest() for t in trajectories}
    done, steps = _load_progress(out, header, digests, say) if resume else ([], 0)
    if not resume:
        _partial_path(out).unlink(missing_ok=True)
        _progress_path(out).unlink(missing_ok=True)
    resumed = list(done)
    replayed: list[str] = []
    failed: dict[str, str] = {}
    for trajectory in trajectories:
        if trajectory.id in done:
            say(f"{trajectory.id}: already replayed, kept from the earlier run")
    pending = [t for t in trajectories if t.id not in done]
    folder = ValueFolder(values_folder(out)) if settings.snapshots and settings.values else None
    results = (runner or local_runner)(pending, workspace, settings, say, values=folder)
    try:
        with LineWriter(_partial_path(out), sort_keys=True) as writer:
            for trajectory_id, result in results:
                if isinstance(result, ReplayFailure):
                    failed[trajectory_id] = result.reason
                else:
                    for step in result:
                        writer.write(step.to_dict())
                        steps += 1
                    done.append(trajectory_id)
                    replayed.append(trajectory_id)
                write_json_atomic(_progress_path(out), {"header": header, "done": done, "failed": failed,
                                                        "digests": {t: digests[t] for t in done}})
    finally:
        # A runner holding workers (Ray tasks and their kernels) releases them here, also on Ctrl-C.
        close = getattr(results, "close", None)
        if close is not None:
            close()
    if failed:
        raise ReplayIncomplete(out, failed)
    from themisto.replay.workspace_recipe import given

    inputs = {"workspace": recipe if recipe is not None else given(workspace, output=out), "replay": asdict(settings)}
    _write_in_order(_partial_path(out), out, [t.id for t in trajectories], {STEPS_HEADER: inputs})
    _progress_path(out).unlink(missing_ok=True)
    return ReplayRun(out, steps, replayed, resumed, time.perf_counter() - started)


def _write_in_order(partial: Path, out: Path, order: list[str], header: dict) -> None:
    """Write `header`, then the lines of `partial` with their trajectories in `order` (each one's lines kept
    together, as written), to `out`, and remove `partial`."""
    rank = {tid: i for i, tid in enumerate(order)}
    spans: list[tuple[int, int, int]] = []  # (rank, offset, length) of each line
    offset = 0
    with partial.open("rb") as fh:
        for line in fh:
            spans.append((rank[json.loads(line)["kernel_id"]], offset, len(line)))
            offset += len(line)
    spans.sort(key=lambda span: span[0])  # stable: steps keep their order within a trajectory
    tmp = out.with_name(out.name + ".ordering")
    with partial.open("rb") as src, tmp.open("wb") as dst:
        dst.write((json.dumps(header, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
        for _, start, length in spans:
            src.seek(start)
            dst.write(src.read(length))
    tmp.replace(out)
    partial.unlink()


# The key of a steps file's first line: the recipe of the inputs and the replay settings (see replay_to_file).
STEPS_HEADER = "themisto_steps"


def read_steps(path: str | Path) -> list[Step]:
    """Read a steps JSONL file (its header line aside); a malformed line is an error naming the file and line."""
    path = Path(path)
    steps = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if lineno == 1 and isinstance(record, dict) and STEPS_HEADER in record:
                    continue
                steps.append(Step.from_dict(record))
            except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a replayed step ({exc})") from exc
    return steps


def read_steps_header(path: str | Path) -> dict:
    """What a steps file's header says it was replayed over: {"workspace": recipe, "replay": settings}; {} for a
    file written before steps files had a header. A malformed header is an error naming the file."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        first = fh.readline()
    try:
        record = json.loads(first) if first.strip() else None
    except json.JSONDecodeError:
        return {}  # not a header: read_steps names the line if it is not a step either
    if not isinstance(record, dict) or STEPS_HEADER not in record:
        return {}
    header = record[STEPS_HEADER]
    if not (isinstance(header, dict) and isinstance(header.get("workspace"), dict)
            and isinstance(header.get("replay", {}), dict)):
        raise ValueError(f"{path}:1: a malformed steps header (expected workspace and replay objects)")
    return header
