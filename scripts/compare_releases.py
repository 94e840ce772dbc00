"""Whether two builds of the same logs hold the same benchmark: per task and split, the ids each has, the ids only one
has, and the ids whose target differs; with their steps files, the steps that ended otherwise (status). Exit 0 when
both tasks' ids and targets are identical, 1 when they are not.

    python scripts/compare_releases.py A B [--steps A-steps.jsonl B-steps.jsonl]

Used for two builds on differently loaded hosts (docs/replay.md#how-long-a-replayed-cell-may-run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from themisto.release.folder import open_release
from themisto.vocabulary import TASKS


def targets(folder: Path, task: str) -> dict[str, dict[str, str]]:
    """{split: {id: target}} of one task of the release in `folder`."""
    info = open_release(folder)
    return {split: {row["id"]: row["target"] for row in info.rows(task, split, columns=["id", "target"])}
            for split in info.splits(task)}


def step_statuses(path: Path) -> dict[tuple[str, int], str]:
    """{(kernel_id, step): status} of a steps JSONL file (themisto replay -o, themisto build --steps-out)."""
    from themisto.replay.steps_file import read_steps

    return {(step.kernel_id, step.step): step.status for step in read_steps(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--steps", nargs=2, type=Path, metavar=("FIRST", "SECOND"), help="the two builds' steps files")
    args = parser.parse_args(argv)
    same = True
    for task in TASKS:
        first, second = targets(args.first, task), targets(args.second, task)
        for split in sorted(set(first) | set(second)):
            a, b = first.get(split, {}), second.get(split, {})
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            changed = sorted(i for i in set(a) & set(b) if a[i] != b[i])
            same = same and not (only_a or only_b or changed)
            print(f"{task}/{split}: {len(a)} and {len(b)} ids; only in the first {len(only_a)}, only in the second "
                  f"{len(only_b)}; same id, another target {len(changed)}")
            for name, ids in (("only in the first", only_a), ("only in the second", only_b), ("target", changed)):
                if ids:
                    print(f"  {name}: {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}")
    if args.steps:
        first, second = (step_statuses(path) for path in args.steps)
        differ = sorted(k for k in set(first) & set(second) if first[k] != second[k])
        print(f"steps: {len(first)} and {len(second)}; {len(set(first) ^ set(second))} in one only; "
              f"{len(differ)} ended otherwise")
        for kernel_id, step in differ[:20]:
            print(f"  {kernel_id} step {step}: {first[(kernel_id, step)]} / {second[(kernel_id, step)]}")
    print("identical ids and targets" if same else "the builds differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
