"""Scorer throughput with execution on the shipped sample: predictions per second, and what each branch costs
beyond the cell's own run time, with the page check (delta "pages") and with the exact full rehash ("hash").

Runs the reference cell and the previous cell as the predictions of each next_cell test example (the first --limit
of them), once per delta mode and round, alternating which mode goes first; the trajectories run `--workers` at a
time (default: one per core). It needs the same opt-in as any execution: HF_ALLOW_CODE_EVAL=1. Prints a table and
one JSON line; never asserts on time. Every branch also runs --continuation-cells logged cells (default 3) for
continuation_match; their own run time counts as the cells' own (the records keep it), the rest of what they cost
as overhead; `--continuation-cells 0` leaves them out.

    HF_ALLOW_CODE_EVAL=1 python bench/scorer_throughput.py [--release DIR] [--limit N] [--rounds R] [--workers W]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, median, report  # noqa: E402

MODES = ("pages", "hash")


def release_folder(given: Path | None, tmp: str) -> Path:
    if given is not None:
        return given
    from themisto.release.parquet import BuildInputs, build_release, release_rows

    out = Path(tmp) / "release"
    print("building the sample release (replays the shipped sample, a few minutes)...", file=sys.stderr)
    rows, source, extra, _ = release_rows(BuildInputs(), Path(tmp) / "steps.jsonl")
    build_release(rows, out, source=source, extra_settings=extra)
    return out


def figures(result, total_s: float) -> dict:
    """Per branch: the step's branch call minus the cells' own times, over its branches (references included)."""
    by_id: dict[str, list] = {}
    for record in result.predictions:
        by_id.setdefault(record.id, []).append(record)
    executed = [e for e in result.examples if e.branch_wall_s is not None]
    overheads, own_all, candidates, wall = [], [], 0, 0.0
    for example in executed:
        # The cells' own run time: the candidate's and, after it, its continuation cells'.
        own = ([(r.duration_s or 0.0) + (r.continuation_s or 0.0) for r in by_id[example.id]]
               + list(map(sum, zip(example.reference_durations_s, example.reference_continuation_s))))
        overheads.append(1000 * (example.branch_wall_s - sum(own)) / len(own))
        own_all += own
        candidates += len(by_id[example.id])
        wall += example.branch_wall_s
    return {"examples": len(executed), "candidates": candidates, "branches": len(own_all),
            "overhead_ms_median": round(median(overheads), 1) if overheads else None,
            "overhead_ms_mean": round(sum(overheads) / len(overheads), 1) if overheads else None,
            "own_ms_median": round(1000 * median(own_all), 1) if own_all else None,
            "predictions_per_s_branching": round(candidates / wall, 2) if wall else None,
            "predictions_per_s_end_to_end": round(candidates / total_s, 2),
            "total_s": round(total_s, 1), "functional_match": result.scores.get("functional_match"),
            "continuation_match": result.scores.get("continuation_match"),
            # k cells more in every branch (the predictions' and the reference's two): what continuation_match costs
            "continuation_cells": sum((e.continuation_cells or 0) * (len(by_id[e.id]) + len(e.reference_durations_s))
                                      for e in executed)}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--release", type=Path, help="a release folder (default: build the sample into a temp dir)")
    parser.add_argument("--limit", type=int, default=40, help="next_cell test examples to score (0: all)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per delta mode (the median run is reported)")
    parser.add_argument("--workers", type=int, default=None, help="trajectories at once (default: one per core)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="delta modes to measure")
    parser.add_argument("--continuation-cells", type=int, default=3, metavar="K",
                        help="logged cells run after each branch for continuation_match (0: off; compare the two)")
    args = parser.parse_args(argv)

    import pyarrow.parquet as pq

    from themisto.gate import ExecutionRefused
    from themisto.scoring.records import ScoreSettings
    from themisto.release.folder import open_release
    from themisto.scoring.scorer import score

    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    with tempfile.TemporaryDirectory(prefix="themisto-bench-score-") as tmp:
        folder = release_folder(args.release, tmp)
        release = open_release(folder)
        rows = pq.read_table(folder / "next_cell" / "test-00000-of-00001.parquet").to_pylist()
        rows = rows[: args.limit] if args.limit else rows
        ids = [r["id"] for r in rows]
        references = [r["target"] for r in rows]
        predictions = [[r["target"], r["history"][-1]["code"]] for r in rows]
        for round_ in range(args.rounds):
            for mode in args.modes if round_ % 2 == 0 else args.modes[::-1]:
                started = time.perf_counter()
                try:
                    result = score(predictions, references, ids=ids, execute=True, release=release,
                                   settings=ScoreSettings(branch_delta=mode,
                                                          continuation_cells=args.continuation_cells),
                                   workers=args.workers,
                                   progress=lambda _: None)
                except ExecutionRefused as refused:
                    print(refused, file=sys.stderr)
                    return 2
                runs[mode].append(figures(result, time.perf_counter() - started))
                print(f"{mode}: {runs[mode][-1]}", file=sys.stderr, flush=True)
    chosen = {mode: sorted(found, key=lambda f: f["total_s"])[len(found) // 2] for mode, found in runs.items()}
    rows_out = [{"delta": mode, **chosen[mode]} for mode in args.modes]
    columns = [("delta", "delta"), ("overhead_ms_median", "overhead ms/branch (median)"),
               ("overhead_ms_mean", "(mean)"), ("own_ms_median", "own ms/branch"),
               ("predictions_per_s_branching", "predictions/s branching"),
               ("predictions_per_s_end_to_end", "predictions/s end to end"), ("total_s", "total s")]
    report("scorer_throughput", {"workers": args.workers, "rounds": args.rounds,
                                 "continuation_cells": args.continuation_cells, **chosen},
           rows_out, columns, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
