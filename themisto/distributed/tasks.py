"""Run one Ray task per item and hand results back as they finish; a task whose worker died runs once more.

Only a bounded number of tasks is in flight, so a run of 100k trajectories neither queues all of them at once nor
waits for the slowest before writing the first. On Ctrl-C (or any exception in the consumer) the tasks still
running are cancelled with a KeyboardInterrupt in their worker, so their kernels are cleaned up by the same
`finally` blocks as in a local run; whatever ignores that is killed after a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, TypeVar

Item = TypeVar("Item")
CANCEL_GRACE_S = 15.0
IN_FLIGHT_PER_CPU = 2
_REASON_CHARS = 300


@dataclass(frozen=True)
class TaskFailed:
    """A task that ended without a result: its worker died on every try, or it raised; `reason` says which."""

    reason: str


def failure_reason(exc: BaseException, tries: int) -> str:
    """One line saying why a task failed: the Ray error's kind and first line, or the exception it raised."""
    cause = getattr(exc, "cause", None)
    if cause is not None:  # RayTaskError: the task itself raised (not retried: it would raise again)
        text = f"{type(cause).__name__}: {cause}"
    else:
        first = (str(exc).strip().splitlines() or [""])[0]
        text = f"{type(exc).__name__} after {tries} tries: {first}"
    return text[:_REASON_CHARS]


def in_flight_limit(ray) -> int:
    """How many tasks to keep submitted: enough to keep every CPU of the cluster busy while results are written."""
    return max(2, IN_FLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))


def run_tasks(ray, submit: Callable[[Item], Any], items: Iterable[Item], *, tries: int,
              limit: int | None = None) -> Iterator[tuple[Item, Any]]:
    """Submit `submit(item)` for each item (an ObjectRef each) and yield (item, result or TaskFailed) as they end."""
    limit = limit or in_flight_limit(ray)
    queue = iter(items)
    in_flight: dict[Any, Item] = {}

    def fill() -> None:
        while len(in_flight) < limit:
            item = next(queue, _END)
            if item is _END:
                return
            in_flight[submit(item)] = item

    try:
        fill()
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in ready:
                item = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    result = TaskFailed(failure_reason(exc, tries))
                fill()
                yield item, result
    finally:
        if in_flight:
            cancel(ray, list(in_flight))


_END = object()


def cancel(ray, refs: list) -> None:
    """Interrupt running tasks (their `finally` blocks close kernels), then kill those still running after a grace."""
    for ref in refs:
        ray.cancel(ref)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)
    for ref in running:
        ray.cancel(ref, force=True)
