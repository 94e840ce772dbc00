"""Helpers shared by the leaderboard tests: run folders written per the run-folder contract over a release (the
conftest's `small_release`), predicting the previous cell / previous output unless told otherwise."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def task_rows(release: Path, task: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(release / task / "test-00000-of-00001.parquet").to_pylist()


def previous(row: dict, task: str) -> str:
    """The model-free answer: the previous cell's code (next_cell) or its output (output_prediction)."""
    if not row["history"]:
        return ""
    return row["history"][-1]["code" if task == "next_cell" else "output"] or ""


def write_run(folder: Path, release: Path, *, task: str = "next_cell", model: str = "test/previous",
              backend: str = "transformers",
              contexts: tuple[str, ...] = ("none", "variables"), predict=None, finished: str = "2026-12-01T00:00:00Z",
              n: int = 1) -> Path:
    """A run folder per the contract; `predict(row, context, sample)` gives each prediction (default: previous)."""
    build = json.loads((release / "themisto_build.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    templates = {c: {"text": f"template {c}", "sha256": hashlib.sha256(c.encode()).hexdigest()} for c in contexts}
    run = {"format": 1, "task": task, "contexts": list(contexts), "backend": backend, "backend_version": "1",
           "model": model, "model_revision": None, "sampling": {"n": n, "temperature": 0.0, "top_p": 1.0,
                                                                "max_new_tokens": 64, "seed": 0},
           "templates": templates, "release": {"path": str(release), "content_hash": build["content_sha256"]},
           "split": "test", "limit": None, "packages": {}, "git_commit": None, "started": finished,
           "finished": finished, "tokens_in": 0, "tokens_out": 0, "generations_per_s": None}
    (folder / "run.json").write_text(json.dumps(run, indent=2))
    lines = []
    for context in contexts:
        for sample in range(n):
            for row in task_rows(release, task):
                text = predict(row, context, sample) if predict else previous(row, task)
                lines.append(json.dumps({"id": row["id"], "task": task, "context": context, "sample": sample,
                                         "prediction": text, "raw": text, "status": "ok", "reason": None,
                                         "tokens_in": None, "tokens_out": None, "kept": None, "probes": None}))
    (folder / "generations.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def baseline_run(folder: Path, release: Path, task: str, baseline: str) -> Path:
    """A real run folder: `themisto generate`'s own code with the model-free baseline backend."""
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run
    from themisto.release.folder import open_release

    generate_run(open_release(release), folder, RunSettings(ExampleSpec(tasks=(task,), contexts=("none", "variables")),
                                              backend="baseline", model=baseline), progress=False)
    return folder


HOSTILE_MODEL = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def board_submissions(folder: Path, release: Path) -> dict[str, Path]:
    """A submissions folder for board tests: a model helped by runtime context, a hostile name, a submitted
    baseline, an output_prediction run, a tampered run (claims 1.0, predicts nothing), a run with a missing id,
    and an earlier run of the same model and settings (replaced)."""
    def target_with_variables(row, context, sample):
        return row["target"] if context == "variables" else previous(row, "next_cell")

    runs = {
        "good": write_run(folder / "good", release, model="org/good", predict=target_with_variables,
                          finished="2026-12-01T02:00:00Z"),
        "earlier": write_run(folder / "earlier", release, model="org/good", finished="2026-11-30T00:00:00Z"),
        "hostile": write_run(folder / "hostile", release, model=HOSTILE_MODEL),
        "baseline": baseline_run(folder / "baseline", release, "next_cell", "previous-cell"),
        "output": write_run(folder / "output", release, task="output_prediction", model="org/good"),
        "output-baseline": baseline_run(folder / "output-baseline", release, "output_prediction", "last-repr"),
        "tampered": write_run(folder / "tampered", release, model="org/tampered", predict=lambda *a: ""),
        "missing": write_run(folder / "missing", release, model="org/missing"),
    }
    (runs["tampered"] / "results.json").write_text(json.dumps({"scores": [
        {"task": "next_cell", "context": c, "metric": "exact_match", "subset": "all", "mean": 1.0, "low": 1.0,
         "high": 1.0, "n": 1} for c in ("none", "variables")]}))
    # Three generations of the hostile run were over the prompt budget: skipped, empty, scored 0.
    records = [json.loads(line) for line in (runs["hostile"] / "generations.jsonl").read_text().splitlines()]
    for record in [r for r in records if r["context"] == "none"][:3]:
        record.update(status="skipped", reason="over_budget", prediction="", raw="")
    (runs["hostile"] / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = (runs["missing"] / "generations.jsonl").read_text().splitlines()
    (runs["missing"] / "generations.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    return runs
