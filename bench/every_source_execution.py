"""Execution of every test row of a release of several sources for the model-free baselines: wall time, ms per
candidate, and per source the share of rows given a functional verdict, the rest by reason.

A run folder of the previous-cell baseline over the release's next_cell test rows (the first --limit; 0: all) is
made (`--run`, default a temporary folder), then scored as `themisto score RUN --execute --cluster participant`
does: each row's previous-cell and common-cell predictions (each distinct text once) run in the developer's pre-cell
state, every trajectory replayed once over its own input files (the JuNE logs' look-alike inputs, a repository's kept
files: the corpus folders its build noted, or --sources), on `--workers` threads here (default: one per core) or with
--ray on a local Ray of --ray-workers CPUs. The run folder keeps results.json (the scores with intervals over
developers), so the timed run is also the run whose scores are reported. It needs the opt-in of any execution:
HF_ALLOW_CODE_EVAL=1. Prints a table and one JSON line; never asserts on time.

    HF_ALLOW_CODE_EVAL=1 python bench/every_source_execution.py --release DIR [--run RUN] [--sources DIR ...]
        [--limit N] [--ray] [--record]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, median, report  # noqa: E402


def baseline_run(release, folder: Path, limit: int) -> None:
    """The previous-cell baseline's run folder over the release's next_cell test rows (made anew)."""
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run

    shutil.rmtree(folder, ignore_errors=True)
    spec = ExampleSpec(tasks=("next_cell",), contexts=("none",), split="test", limit=limit or None)
    generate_run(release, folder, RunSettings(spec=spec, backend="baseline", model="previous-cell"), progress=False)


def per_source(results: dict) -> dict[str, dict]:
    """Per source: test rows, how many got a functional verdict (`scored`), the others by status or reason."""
    out = {}
    for source, counts in results["counts"]["execution_by_source"].items():
        rows = sum(counts.values())
        out[source] = {"rows": rows, "verdicts": counts.get("scored", 0),
                       "verdict_share": round(counts.get("scored", 0) / rows, 3) if rows else None,
                       "others": {k: v for k, v in sorted(counts.items()) if k != "scored"}}
    return out


def branch_figures(records: dict) -> dict:
    """From the scorer's records: candidates, branches, the median branch's cost beyond the cells' own run time."""
    by_id: dict[str, list] = {}
    for record in records["predictions"]:
        by_id.setdefault(record["id"], []).append(record)
    overheads, own_all, wall = [], [], 0.0
    for example in records["examples"]:
        if example.get("branch_wall_s") is None:
            continue
        own = ([(r.get("duration_s") or 0.0) + (r.get("continuation_s") or 0.0) for r in by_id[example["id"]]]
               + list(map(sum, zip(example["reference_durations_s"], example["reference_continuation_s"]))))
        overheads.append(1000 * (example["branch_wall_s"] - sum(own)) / len(own))
        own_all += own
        wall += example["branch_wall_s"]
    return {"candidates": len(records["predictions"]), "branches": len(own_all),
            "overhead_ms_per_branch_median": round(median(overheads), 1) if overheads else None,
            "own_ms_per_branch_median": round(1000 * median(own_all), 1) if own_all else None,
            "branching_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--release", type=Path, required=True, help="a release folder of several sources")
    parser.add_argument("--run", type=Path, help="the run folder to make and score (default: a temporary one)")
    parser.add_argument("--sources", type=Path, nargs="+", default=[], help="where its sources are, if moved")
    parser.add_argument("--limit", type=int, default=0, help="next_cell test rows to score (0: all)")
    parser.add_argument("--workers", type=int, default=None, help="trajectories at once here (default: per core)")
    parser.add_argument("--ray", action="store_true", help="on a local Ray of --ray-workers CPUs instead")
    parser.add_argument("--ray-workers", type=int, default=2)
    args = parser.parse_args(argv)

    from themisto.gate import ExecutionRefused
    from themisto.release.folder import open_release
    from themisto.release.workspaces import SourceFolders
    from themisto.scoring.intervals import IntervalSettings
    from themisto.scoring.run_scores import SCORER_RECORDS, score_run
    from themisto.scoring.execution import threads_runner

    release = open_release(args.release)
    with tempfile.TemporaryDirectory(prefix="themisto-bench-sources-") as tmp:
        run = args.run or Path(tmp) / "run"
        baseline_run(release, run, args.limit)
        runner = threads_runner(args.workers)
        if args.ray:
            from themisto.distributed.cluster import RayTarget
            from themisto.distributed.ray_scoring import scoring_runner

            runner = scoring_runner(RayTarget(num_cpus=args.ray_workers))
        started = time.perf_counter()
        try:
            results = score_run(run, release=release, execute=True, runner=runner, resume=False,
                                workspace=SourceFolders(sources=tuple(args.sources)),
                                settings=IntervalSettings(cluster="participant"),
                                progress=lambda message: print(message, file=sys.stderr, flush=True))
        except ExecutionRefused as refused:
            print(refused, file=sys.stderr)
            return 2
        total_s = time.perf_counter() - started
        records = json.loads((run / SCORER_RECORDS).read_text(encoding="utf-8"))
    figures = {"release": release.content_hash[:12], "rows": results["counts"]["examples"],
               "where": f"Ray, {args.ray_workers} local workers" if args.ray else f"{args.workers or 'per-core'} threads",
               "total_s": round(total_s, 1), **branch_figures(records),
               "ms_per_candidate_end_to_end": round(1000 * total_s / max(1, len(records["predictions"])), 1),
               "state_mismatches": results["counts"]["state_mismatches"],
               "text_only": {k: v for k, v in results["counts"]["text_only"].items() if v},
               "per_source": per_source(results)}
    table = [{"source": name, **{k: v for k, v in entry.items() if k != "others"},
              "others": ", ".join(f"{k} {v}" for k, v in entry["others"].items()) or "-"}
             for name, entry in figures["per_source"].items()]
    columns = [("source", "source"), ("rows", "test rows"), ("verdicts", "functional verdicts"),
               ("verdict_share", "share"), ("others", "the others")]
    report("every_source_execution", figures, table, columns, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
