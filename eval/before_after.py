"""Before/after fine-tuning: two scored run folders of the same task and release, side by side with their intervals.

    python eval/before_after.py RUN_BEFORE/ RUN_AFTER/ [--subset all|hard] [--json]

Each run folder must have been scored (`themisto score RUN/` writes results.json). Every cell is `mean [low, high]`,
the 95 % interval that `themisto score` computed (cluster or block bootstrap over trajectories, as it says below).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _results(run: Path) -> dict:
    path = run / "results.json"
    if not path.is_file():
        raise SystemExit(f"before_after: error: {path}: missing (score the run first: themisto score {run})")
    return json.loads(path.read_text(encoding="utf-8"))


def table(before: dict, after: dict, subset: str) -> list[dict]:
    """One row per (metric, context): the before and after score entries of `subset`."""
    index = [{(s["metric"], s["context"]): s for s in r["scores"] if s["subset"] == subset} for r in (before, after)]
    keys = [key for key in index[0] if key in index[1]]
    return [{"metric": m, "context": c, "before": index[0][(m, c)], "after": index[1][(m, c)]} for m, c in keys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="run folder of the base model")
    parser.add_argument("after", type=Path, help="run folder of the fine-tuned model")
    parser.add_argument("--subset", choices=("all", "hard"), default="all")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    args = parser.parse_args(argv)
    from themisto.scoring.results_table import cell

    before, after = _results(args.before), _results(args.after)
    for key in ("release_hash",):
        if before[key] != after[key]:
            raise SystemExit(f"before_after: error: the runs were scored on different releases ({key} differs)")
    if before["run"]["task"] != after["run"]["task"]:
        raise SystemExit("before_after: error: the runs answer different tasks")
    rows = table(before, after, args.subset)
    if args.json:
        print(json.dumps({"task": before["run"]["task"], "subset": args.subset, "rows": rows,
                          "interval": {"before": before["interval"], "after": after["interval"]}}))
        return 0
    print(f"{before['run']['task']}, {args.subset} examples: {before['run']['model']} -> {after['run']['model']}")
    print(f"{'metric':<12} {'context':<10} {'n':>4}  {'before':<26} {'after':<26}")
    for row in rows:
        print(f"{row['metric']:<12} {row['context']:<10} {row['after']['n']:>4}  {cell(row['before']):<26} "
              f"{cell(row['after']):<26}")
    interval = after["interval"]
    print(f"intervals: {interval['method']} ({interval['clusters']} trajectories, {interval['resamples']} "
          f"resamples){'; ' + interval['warning'] if interval.get('warning') else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
