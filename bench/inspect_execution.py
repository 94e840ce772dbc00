"""Per-sample cost of execution in the Inspect scorer (themisto/harness), beside `themisto score --execute`'s.

Inspect scores sample by sample in no fixed order, so the harness serves each sample's pre-cell state in a kernel of
its own: restored from the release's stored values where they restore it, else by replaying the prefix
(`ScoreSettings.restore`). `themisto score --execute` replays each trajectory once and branches every example of it
from that one walk. This bench scores the same predictions (the previous-cell baseline's, of `--limit` next_cell test
examples spread over the release) both ways, one at a time (one worker), through the same door
(`themisto.scoring.scorer.score`), and prints the seconds per sample of each and their ratio; it also runs the whole
Inspect task on the same examples with the mock model (whose answers are then the mock's text, so the functional
scores differ) to show what Inspect adds around the scorer. Needs HF_ALLOW_CODE_EVAL=1. Prints figures; never asserts.

    HF_ALLOW_CODE_EVAL=1 python bench/inspect_execution.py --release out/sample [--limit 8]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arguments, median, report  # noqa: E402


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--release", type=Path, default=Path("out/sample"), help="a release folder (themisto build)")
    parser.add_argument("--limit", type=int, default=8, help="next_cell test examples, spread over the release")
    parser.add_argument("--no-inspect", action="store_true", help="skip the whole Inspect run")
    args = parser.parse_args()

    from themisto.generation.baselines import baseline_prediction
    from themisto.generation.release_rows import load_task_rows
    from themisto.release.folder import open_release
    from themisto.harness.scorer import ScorerDoor
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.scorer import score

    info = open_release(args.release)
    rows = load_task_rows(info, "next_cell", ("none",), limit=args.limit)
    ids = [r["id"] for r in rows]
    predictions = [baseline_prediction("previous-cell", r, "next_cell") for r in rows]
    targets = [r["target"] for r in rows]

    door = ScorerDoor(info, "next_cell", None, execute=True)
    door.workspace_folder()  # made once per task: not a per-sample cost
    print(f"scoring {len(ids)} example(s) one by one, as the Inspect scorer does...", file=sys.stderr, flush=True)
    per_sample, statuses, matches = [], [], []
    for example_id, prediction, target in zip(ids, predictions, targets):
        began = time.perf_counter()
        example, record = door.score(example_id, prediction, target)
        per_sample.append(time.perf_counter() - began)
        print(f"{example_id}: {per_sample[-1]:.1f} s ({example.status})", file=sys.stderr, flush=True)
        statuses.append(example.status)
        if example.status == "scored":
            matches.append(float(bool(record.functional_match)))

    print("scoring them again in one walk per trajectory, as themisto score --execute does...", file=sys.stderr,
          flush=True)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        from themisto.scoring.release_state import prepare_workspace

        workspace = prepare_workspace(door.release, None, Path(tmp))
        result = score(predictions, targets, ids=ids, settings=ScoreSettings(task="next_cell"), execute=True,
                       release=door.release, workspace=workspace, workers=1, progress=lambda _: None)
    walk_s = time.perf_counter() - began
    figures = {
        "examples": len(ids), "trajectories": len({r["kernel_id"] for r in rows}),
        "inspect_scorer_s_per_sample_median": round(median(per_sample), 2),
        "inspect_scorer_s_per_sample_mean": round(sum(per_sample) / len(per_sample), 2),
        "themisto_score_execute_s_per_sample": round(walk_s / len(ids), 2),
        "ratio_inspect_over_walk": round(sum(per_sample) / walk_s, 2),
        "scored_inspect": statuses.count("scored"),
        "scored_walk": sum(e.status == "scored" for e in result.examples),
        # The same predictions judged the same way by both paths (a check, not a timing).
        "functional_match_inspect_path": round(sum(matches) / len(matches), 4) if matches else None,
        "functional_match_walk": result.scores.get("functional_match"),
    }
    rows_out = [{"sample": i, "seconds": round(s, 2), "status": st} for i, s, st in zip(ids, per_sample, statuses)]
    report("inspect_execution", figures, rows_out, [("sample", "sample"), ("seconds", "inspect scorer s"),
                                                     ("status", "status")])
    if not args.no_inspect:
        print("the whole Inspect task on the same examples (the mock model's answers)...", file=sys.stderr,
              flush=True)
        report("inspect_execution_eval", _inspect_run(args.release, args.limit))


def _inspect_run(release: Path, limit: int) -> dict:
    """The whole Inspect task with execution, the mock model answering (its output carries usage: no tokenizer
    download), as seconds per sample end to end."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from themisto.harness.tasks import next_cell

    def outputs():
        while True:
            output = ModelOutput.from_content("mockllm", "```python\nprint(1)\n```")
            output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
            yield output

    with tempfile.TemporaryDirectory() as logs:
        began = time.perf_counter()
        [log] = inspect_eval(next_cell, task_args={"release": str(release), "limit": limit, "execute": True},
                             model=get_model("mockllm/model", custom_outputs=outputs()), display="none",
                             log_dir=logs)
        seconds = time.perf_counter() - began
    scores = {s.name: s for s in log.results.scores} if log.results else {}
    return {"status": log.status, "samples": limit, "s_per_sample": round(seconds / limit, 2),
            "scored": {name: s.scored_samples for name, s in scores.items()},
            "means": {name: round(s.metrics["mean"].value, 4) for name, s in scores.items()}}


if __name__ == "__main__":
    main()
