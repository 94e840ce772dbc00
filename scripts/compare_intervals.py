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


def _per_source(runs: Path) -> list[str]:
    """Each two-source baseline run's headline metric (and, executed, continuation and functional match) per source,
    with the intervals over developers of the run's one resampling plan."""
    lines = ["| task | metric | baseline | " + " | ".join(("source (test examples): mean [95 % interval]",)) + " |",
             "| --- | --- | --- | --- |"]
    for run in sorted(runs.glob("two-source-baselines-*")):
        path = run / "results.json"
        if not path.is_file():
            continue
        results = json.loads(path.read_text(encoding="utf-8"))
        task = results["run"]["task"]
        metrics = [m for m in ("continuation_match", "functional_match", HEADLINE[task]) if m in results["metrics"]]
        for metric in metrics:
            for name in sorted({e["baseline"] for e in results["breakdown"].get("source", []) if "baseline" in e}):
                cells = [f"{e['source']} ({e['n']:,}): {e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}]"
                         for e in results["breakdown"]["source"] if e.get("baseline") == name
                         and e["metric"] == metric and e["mean"] is not None]
                lines.append(f"| {task} | {metric} | {name} | {'; '.join(cells)} |")
    return lines if len(lines) > 2 else []


def resolvable(run: Path, metric: str) -> str | None:
    """The paired interval of the task's two baselines on every example of a scored baseline run, over developers:
    its half-width is about the smallest paired effect the split can tell from zero."""
    from themisto.generation.baselines import baseline_prediction, baselines_for
    from themisto.generation.run_folder import find_release, read_run
    from themisto.scoring.intervals import IntervalSettings, paired_interval, plan_resamples
    from themisto.scoring.run_scores import SCORER_RECORDS, clusters_of

    if not (run / SCORER_RECORDS).is_file():
        return None
    folder = read_run(run)
    info = find_release(folder, None)
    rows = [info.task_rows(folder.task)[i] for i in folder.ids]
    scored = {(r["id"], r["prediction"]): r.get(metric) for r in
              json.loads((run / SCORER_RECORDS).read_text(encoding="utf-8"))["predictions"]}
    first, second = baselines_for(folder.task)
    values = [[scored.get((i, baseline_prediction(name, row, folder.task))) for i, row in zip(folder.ids, rows)]
              for name in (first, second)]
    values = [[None if v is None else float(v) for v in vs] for vs in values]
    plan = plan_resamples(clusters_of(rows, info, "participant"), [(r["kernel_id"], r["step"]) for r in rows],
                          IntervalSettings(cluster="participant"))
    effect = paired_interval(values[0], values[1], plan)
    return (f"{folder.task} {metric}, {first} − {second} on {effect.n:,} test examples over "
            f"{len(set(clusters_of(rows, info, 'participant')))} developers: {effect.mean:+.3f} "
            f"[{effect.low:+.3f}, {effect.high:+.3f}], half-width {(effect.high - effect.low) / 2:.3f}")


def main(argv: list[str]) -> int:
    runs, two = Path(argv[0]), json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    print("### The two-source release, per source\n")
    print("\n".join(_sources(two)))
    print("\n### Baselines with intervals over developers, beside the JuNE-only release\n")
    print("\n".join(_intervals(runs)))
    by_source = _per_source(runs)
    if by_source:
        print("\n### The baselines per source (intervals over developers)\n")
        print("\n".join(by_source))
    widths = [line for task in HEADLINE for line in [resolvable(runs / f"two-source-baselines-{task}", HEADLINE[task])]
              if line]
    if widths:
        print("\n### The smallest paired effect the test split resolves\n")
        print("The paired interval of two systems on every test example, over developers (here the task's two "
              "baselines): an effect of about its half-width or more is told from zero.\n")
        print("\n".join(f"- {line}" for line in widths))
    for model in sorted(runs.glob("two-source-smollm2-*")):
        if (model / "results.md").is_file():
            print(f"\n### {model.name} (intervals over developers)\n")
            print((model / "results.md").read_text(encoding="utf-8").strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
