"""Whether two builds of the same logs hold the same benchmark: per task and split, the ids each has, the ids only one
has, and the ids whose target differs; the steps whose `state_hash` differs (and the variables that differ there),
and the stored values only one build holds; with their steps files, the steps that ended otherwise (status). Exit 0
when both tasks' ids and targets, every state hash and the values are identical, 1 when they are not.

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


def states(folder: Path) -> tuple[dict[tuple[str, int], tuple[str, dict]], dict[str, str]]:
    """{(kernel_id, step): (state_hash, {variable: hash})} of a release's trajectories, and {hash: sha256} of its
    stored values."""
    info = open_release(folder)
    steps = {(row["kernel_id"], row["step"]): (row["state_hash"],
                                                {v["name"]: v["hash"] for v in row["variables"] or []})
             for rows in info.trajectories_by_kernel().values() for row in rows}
    return steps, {digest: row["sha256"] for digest, row in info.values().rows.items()}


def compare_states(first: Path, second: Path) -> bool:
    """Print the steps whose state hash differs (with the variables that differ) and the values only one build
    stores; True when there are none."""
    (a, values_a), (b, values_b) = states(first), states(second)
    shared = sorted(set(a) & set(b))
    differ = [key for key in shared if a[key][0] != b[key][0]]
    names: dict[str, int] = {}
    for key in differ:
        for name in set(a[key][1]) | set(b[key][1]):
            if a[key][1].get(name) != b[key][1].get(name):
                names[name] = names.get(name, 0) + 1
    print(f"state_hash: {len(shared)} steps in both, {len(differ)} differ"
          + (f" (variables: {', '.join(f'{n} {c}' for n, c in sorted(names.items(), key=lambda kv: -kv[1])[:10])})"
             if differ else ""))
    only = set(values_a) ^ set(values_b)
    changed = sum(1 for digest in set(values_a) & set(values_b) if values_a[digest] != values_b[digest])
    print(f"values: {len(values_a)} and {len(values_b)}; in one only {len(only)}; same hash, other bytes {changed}")
    return not differ and not only and not changed and set(a) == set(b)


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
    same = compare_states(args.first, args.second) and same
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
