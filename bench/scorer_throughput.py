"""Scorer throughput with execution on the shipped sample: predictions per second, and what each branch costs
beyond the cell's own execution time. Prints figures, then one JSON line; never asserts on time.

Runs the reference cell and the previous cell as the predictions of each next_cell test example (the first
--limit of them), so it needs the same opt-in as any execution: HF_ALLOW_CODE_EVAL=1. The same examples are scored
with continuation_match off (k=0) and on (k=--continuation-cells, default 3: k more cells per branch), to show what
the continuation costs.

    HF_ALLOW_CODE_EVAL=1 python bench/scorer_throughput.py [--release DIR] [--limit N] [--continuation-cells K]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def release_resources(given: Path | None, tmp: str) -> Path:
    if given is not None:
        return given
    from themisto.release.parquet import BuildInputs, build_release, release_rows

    out = Path(tmp) / "release"
    print("building the sample release (replays the shipped sample, a few minutes)...", file=sys.stderr)
    rows, source, extra = release_rows(BuildInputs(), Path(tmp) / "steps.jsonl")
    build_release(rows, out, source=source, extra_settings=extra)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, help="a release folder (default: build the sample into a temp dir)")
    parser.add_argument("--limit", type=int, default=40, help="next_cell test examples to score (0: all)")
    parser.add_argument("--continuation-cells", type=int, default=3, metavar="K",
                        help="k of continuation_match for the second pass (the first runs k=0)")
    args = parser.parse_args(argv)

    from themisto.scoring.gate import ExecutionRefused
    from themisto.scoring.scorer import ScoreSettings, load_release, score

    with tempfile.TemporaryDirectory(prefix="themisto-bench-score-") as tmp:
        folder = release_resources(args.release, tmp)
        release = load_release(folder, "next_cell")
        import pyarrow.parquet as pq

        rows = pq.read_table(folder / "next_cell" / "test-00000-of-00001.parquet").to_pylist()
        rows = rows[: args.limit] if args.limit else rows
        ids = [r["id"] for r in rows]
        references = [r["target"] for r in rows]
        predictions = [[r["target"], r["history"][-1]["code"]] for r in rows]
        passes = {}
        for k in sorted({0, args.continuation_cells}):
            started = time.perf_counter()
            try:
                result = score(predictions, references, ids=ids, execute=True, release=release,
                               settings=ScoreSettings(continuation_cells=k))
            except ExecutionRefused as refused:
                print(refused, file=sys.stderr)
                return 2
            passes[k] = _figures(result, time.perf_counter() - started)
    for k, figures in passes.items():
        print(f"continuation_cells={k}: {figures['examples']} examples, {figures['candidates']} candidates "
              f"({figures['branches']} branches with the reference runs, {figures['continuation_cells']} "
              "continuation cells)")
        print(f"  branching: {figures['candidates_per_s_branching']} candidates/s; end to end (replay included): "
              f"{figures['candidates_per_s_end_to_end']} candidates/s")
        print(f"  per branch: {figures['overhead_ms_per_branch']} ms overhead beyond the cell's own "
              f"{figures['own_execution_ms_per_branch']} ms")
    summary = {"passes": {str(k): f for k, f in passes.items()}}
    if len(passes) == 2:
        off, on = passes[0], passes[args.continuation_cells]
        summary["continuation_wall_ratio"] = round(on["branch_wall_s"] / off["branch_wall_s"], 2) \
            if off["branch_wall_s"] else None
        print(f"continuation (k={args.continuation_cells}) costs {summary['continuation_wall_ratio']}x the branch "
              "time of k=0")
    print(json.dumps(summary, sort_keys=True))
    return 0


def _figures(result, total_s: float) -> dict:
    executed = [e for e in result.examples if e.branch_wall_s is not None]
    by_id = {}
    for record in result.predictions:
        by_id.setdefault(record.id, []).append(record)
    candidates = sum(len(by_id[e.id]) for e in executed)
    branches = candidates + sum(len(e.reference_durations_s) for e in executed)
    wall = sum(e.branch_wall_s for e in executed)
    # The candidate's own time only: the continuation cells are in the branch wall time, so they show as overhead.
    own = sum(r.duration_s or 0.0 for e in executed for r in by_id[e.id]) + sum(
        sum(e.reference_durations_s) for e in executed)
    return {
        "examples": len(executed),
        "candidates": candidates,
        "branches": branches,  # candidates + two reference runs per example
        "continuation_cells": sum((e.continuation_cells or 0) * (len(by_id[e.id]) + len(e.reference_durations_s))
                                  for e in executed),
        "candidates_per_s_branching": round(candidates / wall, 2) if wall else None,
        # End to end: replay, kernel starts and state checks included.
        "candidates_per_s_end_to_end": round(candidates / total_s, 2),
        "overhead_ms_per_branch": round(1000 * (wall - own) / branches, 1) if branches else None,
        "own_execution_ms_per_branch": round(1000 * own / branches, 1) if branches else None,
        "branch_wall_s": round(wall, 2),
        "total_s": round(total_s, 2),
        "functional_match": result.scores.get("functional_match"),
        "continuation_match": result.scores.get("continuation_match"),
    }


if __name__ == "__main__":
    sys.exit(main())
