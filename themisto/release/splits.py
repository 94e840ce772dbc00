"""The train/test split: whole groups (a participant where the source names one, else a trajectory) on one side.

The participant is the unit a benchmark generalises over, so no participant is on both sides. Groups are ordered by
sha256 of `<seed>/<group>` and go to `test` until it holds `test_fraction` of the steps (the first always does, and
one stays in `train` when there are two or more). Then each notebook task (`task1`, `task2`, or none) gets at least
`min_test_groups` groups in `test` where it has that many: the next groups of that task in the same order move to
`test`, as long as `train` keeps a group of every task that has more than `min_test_groups`. The split depends only
on the group names, their steps and the seed.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Mapping

NO_TASK = "none"  # the notebook task of a trajectory whose notebook names none


@dataclass
class SplitGroup:
    """One group of the split: its side, trajectories, steps (all, and per notebook task) and rows per config."""

    group: str  # `participant:<pseudonym>` or `trajectory:<kernel id>`
    split: str
    trajectories: list[str]
    steps: int
    tasks: dict[str, int]  # notebook task -> steps
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # config -> split -> rows (build_tasks fills it)


@dataclass
class SplitPlan:
    """Which side every trajectory and group is on, and what the split's rules could not give (notes)."""

    split_of: dict[str, str]  # kernel_id -> split
    groups: list[SplitGroup]
    notes: list[str] = field(default_factory=list)

    def unit(self) -> str:
        """`participant`, `trajectory`, or `mixed` (some trajectories name no participant)."""
        kinds = {g.group.split(":", 1)[0] for g in self.groups}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def test_groups(self, task: str | None = None) -> int:
        """How many groups (of a notebook task, or in all) `test` holds."""
        return sum(g.split == "test" and (task is None or task in g.tasks) for g in self.groups)

    def to_dict(self) -> dict:
        """The split as the build report and the card give it."""
        tasks = sorted({t for g in self.groups for t in g.tasks})
        return {"unit": self.unit(), "groups": [asdict(g) for g in self.groups],
                "test_groups": {"all": self.test_groups(), **{t: self.test_groups(t) for t in tasks}},
                "train_groups": len(self.groups) - self.test_groups()}


def _rank(seed: int, group: str) -> str:
    return hashlib.sha256(f"{seed}/{group}".encode("utf-8")).hexdigest()


def _groups(kernels: Mapping[str, list[dict]]) -> dict[str, SplitGroup]:
    groups: dict[str, SplitGroup] = {}
    for kernel_id, steps in kernels.items():
        participant = steps[0].get("participant") if steps else None
        key = f"participant:{participant}" if participant else f"trajectory:{kernel_id}"
        group = groups.setdefault(key, SplitGroup(key, "train", [], 0, {}))
        group.trajectories.append(kernel_id)
        group.steps += len(steps)
        task = (steps[0].get("task") if steps else None) or NO_TASK
        group.tasks[task] = group.tasks.get(task, 0) + len(steps)
    return groups


def assign_splits(kernels: Mapping[str, list[dict]], seed: int, test_fraction: float,
                  min_test_groups: int) -> SplitPlan:
    """Send whole groups to `test` or `train` by the rule of the module docstring."""
    groups = _groups(kernels)
    order = [groups[key] for key in sorted(groups, key=lambda g: _rank(seed, g))]
    total = sum(g.steps for g in order)
    in_test = 0
    for i, group in enumerate(order):
        if i == 0 or test_fraction >= 1.0 or (in_test < test_fraction * total and i < len(order) - 1):
            group.split = "test"
            in_test += group.steps
    notes = []
    tasks = sorted({t for g in order for t in g.tasks})
    having = {t: [g for g in order if t in g.tasks] for t in tasks}

    def train_keeps(moved: SplitGroup) -> bool:
        left = [g for g in order if g.split == "train" and g is not moved]
        return bool(left) and all(any(t in g.tasks for g in left) for t in moved.tasks
                                  if len(having[t]) > min_test_groups)

    for task in tasks:
        wanted = min(min_test_groups, len(having[task]))
        for group in having[task]:
            if sum(g.split == "test" for g in having[task]) >= wanted:
                break
            if group.split == "train" and train_keeps(group):
                group.split = "test"
        held = sum(g.split == "test" for g in having[task])
        if held < min_test_groups:
            notes.append(f"notebook task {task}: `test` holds {held} group(s), fewer than {min_test_groups} "
                         f"({len(having[task])} in all)")
    if len(order) == 1:
        notes.append("only one trajectory group: every trajectory is in `test`, `train` is empty")
    split_of = {k: g.split for g in order for k in g.trajectories}
    return SplitPlan(dict(sorted(split_of.items())), order, notes)
