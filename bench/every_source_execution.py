"""Execution of every test row of a release of several sources for the model-free baselines: wall time, ms per
candidate, state rebuilds, and per source the share of rows given a functional verdict, the rest by reason.

Each next_cell test row (the first --limit of them; 0: all) is scored with execution for the previous-cell and the
common-cell baselines (each distinct text once), every trajectory replayed once over its own input files (the JuNE
logs' look-alike inputs, a repository's kept files: the corpus folders its build noted, or --sources), on
`--workers` threads here (default: one per core) or with --ray on a local Ray of --ray-workers CPUs. It needs the
opt-in of any execution: HF_ALLOW_CODE_EVAL=1. Prints a table and one JSON line; never asserts on time.

    HF_ALLOW_CODE_EVAL=1 python bench/every_source_execution.py --release DIR [--sources DIR ...] [--limit N]
        [--ray] [--record]
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, median, report  # noqa: E402


def candidates(rows: list[dict]) -> list[list[str]]:
    """Per row, the baselines' distinct predictions (previous-cell first)."""
    from themisto.generation.baselines import baseline_prediction, baselines_for

    names = baselines_for("next_cell")
    return [list(dict.fromkeys(baseline_prediction(name, row, "next_cell") for name in names)) for row in rows]


def per_source(result, rows: list[dict]) -> dict[str, dict]:
    """Per source: test rows, how many got a functional verdict (scored), and the others by status or reason."""
    source = {row["id"]: row.get("source") or "unknown" for row in rows}
    out: dict[str, Counter] = {}
    for example in result.examples:
        outcome = example.text_only_reason or example.status
        out.setdefault(source[example.id], Counter())[outcome] += 1
    return {name: {"rows": sum(c.values()), "verdicts": c.get("scored", 0),
                   "verdict_share": round(c.get("scored", 0) / sum(c.values()), 3), "others": dict(
                       sorted((k, v) for k, v in c.items() if k != "scored"))}
            for name, c in sorted(out.items())}


def figures(result, total_s: float, rows: list[dict], trajectories: list) -> dict:
    by_id: dict[str, list] = {}
    for record in result.predictions:
        by_id.setdefault(record.id, []).append(record)
    executed = [e for e in result.examples if e.branch_wall_s is not None]
    branches = sum(len(by_id[e.id]) + len(e.reference_durations_s) for e in executed)
    branch_s = sum(e.branch_wall_s for e in executed)
    own = [(r.duration_s or 0.0) + (r.continuation_s or 0.0) for e in executed for r in by_id[e.id]]
    return {"rows": len(rows), "candidates": sum(len(v) for v in by_id.values()), "total_s": round(total_s, 1),
            "ms_per_candidate_end_to_end": round(1000 * total_s / max(1, len(result.predictions)), 1),
            "ms_per_branch_wall": round(1000 * branch_s / max(1, branches), 1),
            "own_ms_per_candidate_median": round(1000 * median(own), 1) if own else None,
            "trajectories": len(trajectories), "rebuild_s_sum": round(sum(t.replay_s for t in trajectories), 1),
            "state_mismatches": sum(1 for e in result.examples if e.state_verified is False),
            "functional_match": result.scores.get("functional_match"),
            "continuation_match": result.scores.get("continuation_match"),
            "per_source": per_source(result, rows)}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--release", type=Path, required=True, help="a release folder of several sources")
    parser.add_argument("--sources", type=Path, nargs="+", default=[], help="where its sources are, if moved")
    parser.add_argument("--limit", type=int, default=0, help="next_cell test rows to score (0: all)")
    parser.add_argument("--workers", type=int, default=None, help="trajectories at once here (default: per core)")
    parser.add_argument("--ray", action="store_true", help="on a local Ray of --ray-workers CPUs instead")
    parser.add_argument("--ray-workers", type=int, default=2)
    args = parser.parse_args(argv)

    from themisto.gate import ExecutionRefused
    from themisto.release.folder import open_release
    from themisto.release.workspaces import SourceFolders
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.scorer import score

    release = open_release(args.release)
    rows = release.rows("next_cell", "test")
    rows = rows[: args.limit] if args.limit else rows
    runner = None
    if args.ray:
        from themisto.distributed.cluster import RayTarget
        from themisto.distributed.ray_scoring import scoring_runner

        runner = scoring_runner(RayTarget(num_cpus=args.ray_workers))
    trajectories: list = []
    started = time.perf_counter()
    try:
        result = score(candidates(rows), [r["target"] for r in rows], ids=[r["id"] for r in rows], execute=True,
                       release=release, settings=ScoreSettings(task="next_cell"), workers=args.workers,
                       runner=runner, workspace=SourceFolders(sources=tuple(args.sources)),
                       on_trajectory=trajectories.append,
                       progress=lambda message: print(message, file=sys.stderr, flush=True))
    except ExecutionRefused as refused:
        print(refused, file=sys.stderr)
        return 2
    found = figures(result, time.perf_counter() - started, rows, trajectories)
    where = f"Ray, {args.ray_workers} local workers" if args.ray else f"{args.workers or 'one per core'} threads"
    table = [{"source": name, **{k: v for k, v in entry.items() if k != "others"},
              "others": ", ".join(f"{k} {v}" for k, v in entry["others"].items()) or "-"}
             for name, entry in found["per_source"].items()]
    columns = [("source", "source"), ("rows", "test rows"), ("verdicts", "functional verdicts"),
               ("verdict_share", "share"), ("others", "the others")]
    report("every_source_execution", {"release": release.content_hash[:12], "where": where, **found}, table,
           columns, args=args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
