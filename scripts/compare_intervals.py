"""The two-source release beside the JuNE-only one (scripts/corpus_release.sh): sources, intervals over developers.

    python scripts/compare_intervals.py RUNS/ TWO_SOURCE_BUILD.json [JUNE_ONLY_BUILD.json] > results.md

RUNS holds `two-source-baselines-<task>`, `june-only-baselines-<task>` and `two-source-smollm2-<task>-<n>` run
folders scored with `--cluster participant`; the build files are the releases' `themisto_build.json` (or `build
--json`'s output). Prints Markdown: the two-source release per source, and for each task the baseline's headline
metric on each release with its 95 % interval over developers and the interval's width.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEADLINE = {"next_cell": "chrf", "output_prediction": "output_equivalent"}


def _sources(build: dict) -> list[str]:
    lines = ["| source | trajectories | steps | developers | test developers | next_cell rows (test / train) | "
             "output_prediction rows (test / train) | steps the environment failed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for source, entry in build.get("sources", {}).items():
        if source == "corpora":
            continue
        rows = entry.get("rows", {})
        cells = [f"{rows.get(t, {}).get('test', 0):,} / {rows.get(t, {}).get('train', 0):,}"
                 for t in ("next_cell", "output_prediction")]
        causes = ", ".join(f"{k} {v}" for k, v in entry.get("replay_causes", {}).items()) or "none"
        lines.append(f"| {source} | {entry['trajectories']:,} | {entry['steps']:,} | {entry['developers']} | "
                     f"{entry['test_developers']} | {cells[0]} | {cells[1]} | {causes} |")
    for corpus in build.get("sources", {}).get("corpora", []):
        left = ", ".join(f"{k} {v:,}" for k, v in sorted(corpus["left_out"].items(), key=lambda kv: -kv[1]))
        cut = ", ".join(f"{k} {v:,}" for k, v in sorted(corpus["cut"].items(), key=lambda kv: -kv[1]))
        refused = sum(corpus["files_refused"].values())
        lines += ["", f"The corpus: {corpus['repositories']} repositories, {corpus['files_read']} history files read "
                      f"({refused} refused), {corpus['sessions_read']:,} sessions and {corpus['inputs_read']:,} "
                      f"inputs; {corpus['sessions_long_enough']:,} sessions of enough inputs; kept "
                      f"{corpus['trajectories']} ({corpus['trajectories'] / max(1, corpus['sessions_long_enough']):.1%}"
                      f") of {corpus['developers']} developers, {corpus['matched_notebook']} of them matched to a "
                      f"committed notebook; left out: {left or 'none'}; kept but cut before replay: "
                      f"{cut or 'none'}."]
    health = build.get("source", {}).get("health", {})
    if health:
        lines += ["", f"Replay health: steps the environment failed {health.get('steps', {})}; trajectories cut "
                      f"{health.get('trajectories_cut', {})}; texts scrubbed before release "
                      f"{health.get('scrubbed', {}).get('texts', 0):,}."]
    return lines


def _score(run: Path, task: str) -> dict | None:
    path = run / "results.json"
    if not path.is_file():
        return None
    results = json.loads(path.read_text(encoding="utf-8"))
    metric = HEADLINE[task]
    rows = [r for r in results["baselines"] + results["scores"] if r["metric"] == metric and r["subset"] == "all"]
    if not rows:
        return None
    row = rows[0]
    return {"name": row.get("baseline") or row.get("context"), "mean": row["mean"], "low": row["low"],
            "high": row["high"], "n": row["n"], "clusters": results["interval"]["clusters"],
            "method": results["interval"]["method"], "metric": metric}


def _intervals(runs: Path) -> list[str]:
    lines = ["| task | metric | release | baseline | test examples | developers (clusters) | interval method | "
             "mean [95 % interval] | width |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for task in HEADLINE:
        for release in ("june-only", "two-source"):
            score = _score(runs / f"{release}-baselines-{task}", task)
            if score is None:
                continue
            width = score["high"] - score["low"]
            lines.append(f"| {task} | {score['metric']} | {release} | {score['name']} | {score['n']:,} | "
                         f"{score['clusters']} | {score['method']} | {score['mean']:.3f} [{score['low']:.3f}, "
                         f"{score['high']:.3f}] | {width:.3f} |")
    return lines


def main(argv: list[str]) -> int:
    runs, two = Path(argv[0]), json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    print("### The two-source release, per source\n")
    print("\n".join(_sources(two)))
    print("\n### Baselines with intervals over developers, beside the JuNE-only release\n")
    print("\n".join(_intervals(runs)))
    for model in sorted(runs.glob("two-source-smollm2-*")):
        if (model / "results.md").is_file():
            print(f"\n### {model.name} (intervals over developers)\n")
            print((model / "results.md").read_text(encoding="utf-8").strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
