"""The sanity table every release should pass, through the `evaluate` metric on its next_cell test split.

Scores two prediction sets with execution: the developer's own cells (every deterministic example must reach exact
match 1.0 and functional match 1.0) and the previous cell of each example (a naive baseline that must score
visibly lower). Needs HF_ALLOW_CODE_EVAL=1: the cells run in sandboxed kernels.

    HF_ALLOW_CODE_EVAL=1 python eval/reference_check.py out/sample [--limit N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCORES = ("exact_match", "rouge_l", "chrf", "exec_ok", "output_match", "state_match", "functional_match",
          "continuation_match", "pass@1", "scored_examples", "nondeterministic_examples", "reference_diverged_examples",
          "refused_examples", "continuation_undefined_examples", "suspicious_predictions", "examples")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", type=Path, help="a release folder written by `themisto build`")
    parser.add_argument("--limit", type=int, help="only the first N examples")
    parser.add_argument("--json", action="store_true", help="print one JSON object with both tables")
    args = parser.parse_args()

    import datasets
    import evaluate

    rows = datasets.load_dataset(str(args.release), "next_cell", split="test").to_list()[: args.limit]
    metric = evaluate.load(str(REPO / "metrics" / "themisto"))
    ids = [row["id"] for row in rows]
    references = [row["target"] for row in rows]
    previous = [row["history"][-1]["code"] if row["history"] else "" for row in rows]
    tables, disagree = {}, {}
    for name, predictions in (("reference cell", references), ("previous cell", previous)):
        print(f"scoring {len(rows)} examples: {name} ...", file=sys.stderr, flush=True)
        result = metric.compute(predictions=predictions, references=references, ids=ids, release=str(args.release),
                                execute=True, return_records=True)
        tables[name] = {score: result.get(score) for score in SCORES}
        disagree[name] = [{"id": r["id"], "state_match": r["state_match"], "functional_match": r["functional_match"],
                           "continuation_match": r["continuation_match"], "reason": r["reason"]}
                          for r in result["records"] if r["continuation_match"] is not None
                          and r["state_match"] is not None and r["continuation_match"] != r["state_match"]]
    if args.json:
        print(json.dumps({"scores": tables, "state_vs_continuation": disagree}))
        return 0
    print(f"{'score':<28}" + "".join(f"{name:>18}" for name in tables))
    for score in SCORES:
        cells = "".join(f"{_fmt(tables[name][score]):>18}" for name in tables)
        print(f"{score:<28}{cells}")
    for name, found in disagree.items():
        # continuation_match also asks for the prediction's own output: where that differs, functional_match fails
        # alike, so only the others are disagreements about the state.
        own_output = [item for item in found if item["functional_match"] == item["continuation_match"]]
        print(f"\n{name}: state_match and continuation_match disagree on {len(found)} prediction(s), "
              f"{len(own_output)} of them because the prediction's own output differs")
        for item in found:
            if item not in own_output:
                print(f"  {item['id']}: state_match {item['state_match']}, continuation_match "
                      f"{item['continuation_match']} - {item['reason'][:200]}")
    return 0


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
