"""`themisto score RUN/`: a run folder scored per context beside the baselines, with intervals, the paired effect, the
hard subset and breakdowns in results.json and results.md; bad run folders refused with the file, line or id."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_tasks import make_steps, rows_of

from themisto.cli import main
from themisto.generation.baselines import baseline_prediction, baselines_for
from themisto.release.folder import open_release
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings
from themisto.errors import InputError
from themisto.generation.run_folder import RunFolderError
from themisto.scoring.run_scores import score_run
from themisto.scoring.text_scores import normalize_whitespace
from themisto.settings import settings as env_settings


@pytest.fixture(scope="module")
def repeat_release(tmp_path_factory) -> Path:
    """Four trajectories in `test` where every fourth step re-runs the cell before it (as developers do), so the
    previous-cell and previous-output baselines get those examples right and the hard subset is a true subset."""
    trajectories = []
    for i in range(4):
        steps = make_steps(f"kernel-{i}", 26 + 4 * i, task=f"task{1 + i % 2}")
        for k in range(7, len(steps), 4):
            before = steps[k - 1]
            steps[k] = dataclasses.replace(before, step=k, state_hash=steps[k].state_hash)
        trajectories.append(steps)
    out = tmp_path_factory.mktemp("run-scores") / "release"
    build_release(rows_of(*trajectories), out, TaskSettings(seed=5, test_fraction=1.0), source={"kind": "test-rows"})
    return out


def write_run(folder: Path, release: Path, task: str, predict, *, contexts=("none", "variables"), samples=1,
              skip=(), kept=None) -> Path:
    """A run folder as `themisto generate` writes it; `predict(row, context, sample)` gives each prediction, the
    (id, context, sample) keys in `skip` are recorded as skipped over the prompt budget, and `kept(row, context)`
    what each prompt that was sent kept."""
    rows = sorted(open_release(release).task_rows(task).values(), key=lambda r: (r["kernel_id"], r["step"]))
    folder.mkdir(parents=True)
    meta = {"format": 1, "task": task, "contexts": list(contexts), "backend": "baseline", "model": "test-model",
            "sampling": {"n": samples, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64, "seed": 0},
            "release": {"path": str(release), "content_hash": open_release(release).content_hash}, "split": "test"}
    (folder / "run.json").write_text(json.dumps(meta), encoding="utf-8")
    with (folder / "generations.jsonl").open("w", encoding="utf-8") as fh:
        for row in rows:
            for context in contexts:
                for sample in range(samples):
                    skipped = (row["id"], context, sample) in skip
                    text = "" if skipped else predict(row, context, sample)
                    fh.write(json.dumps({"id": row["id"], "task": task, "context": context, "sample": sample,
                                         "prediction": text, "raw": text, "status": "skipped" if skipped else "ok",
                                         "reason": "prompt over budget" if skipped else None, "tokens_in": None,
                                         "tokens_out": None,
                                         "kept": kept(row, context) if kept and not skipped else None}) + "\n")
    return folder


def _first_baseline(task: str):
    """Predictions where `none` repeats the task's first baseline and `variables` knows the answer on every second
    sample."""
    def predict(row, context, sample):
        if context == "variables" and sample % 2 == 0:
            return row["target"]
        return baseline_prediction(baselines_for(task)[0], row, task)
    return predict


def _solved_by_a_baseline(row, task) -> bool:
    if task == "output_prediction":
        from themisto.scoring.equivalence import outputs_equivalent

        return any(outputs_equivalent(baseline_prediction(b, row, task), row["target"]).equal
                   for b in baselines_for(task))
    return any(normalize_whitespace(baseline_prediction(b, row, task)) == normalize_whitespace(row["target"])
               for b in baselines_for(task))


def _pick(entries, **keys):
    found = [e for e in entries if all(e.get(k) == v for k, v in keys.items())]
    assert len(found) == 1, (keys, found)
    return found[0]


@pytest.fixture(scope="module")
def next_cell_run(repeat_release, tmp_path_factory):
    rows = sorted(open_release(repeat_release).task_rows("next_cell").values(), key=lambda r: (r["kernel_id"],
                                                                                               r["step"]))
    skipped = (rows[3]["id"], "variables", 0)
    folder = write_run(tmp_path_factory.mktemp("runs") / "nc", repeat_release, "next_cell",
                       _first_baseline("next_cell"), samples=2, skip={skipped}, kept=_kept)
    return folder, rows, skipped, score_run(folder)


def _kept(row, context):
    """Every prompt shows its whole history but `variables` only half of it, and the first two variables."""
    total, count = len(row["history"]), len(row["variables_before"])
    if context == "none":
        return {"history_shown": total, "history_total": total, "variables_shown": None, "variables_total": None,
                "repr_chars": None, "reprs_cut": 0}
    return {"history_shown": total // 2, "history_total": total, "variables_shown": min(2, count),
            "variables_total": count, "repr_chars": 40, "reprs_cut": 1}


def test_results_give_what_the_prompts_kept_per_context(next_cell_run):
    folder, rows, skipped, results = next_cell_run
    by_context = {k["context"]: k for k in results["kept"]}
    assert by_context["none"] == {"context": "none", "prompts": len(rows), "skipped": 0, "history_shown": 1.0,
                                  "variables_shown": None, "reprs_cut": 0.0, "prompt_tokens": None,
                                  "recorded": True}  # a baseline backend counts no tokens
    sent = [r for r in rows if r["id"] != skipped[0]]
    variables = by_context["variables"]
    assert variables["prompts"] == len(rows) and variables["skipped"] == 1 and variables["reprs_cut"] == 1.0
    halves = [(len(r["history"]) // 2) / len(r["history"]) for r in sent if r["history"]]
    assert variables["history_shown"] == pytest.approx(sum(halves) / len(halves), abs=1e-4)
    shares = [min(2, len(r["variables_before"])) / len(r["variables_before"]) for r in sent if r["variables_before"]]
    assert variables["variables_shown"] == pytest.approx(sum(shares) / len(shares), abs=1e-4)
    assert variables["variables_shown"] < 1
    table = (folder / "results.md").read_text()
    assert "| variables | " + str(len(rows)) + " | 1 | " in table and "What the prompts kept" in table


def test_results_carry_the_interval_method_hard_subset_and_breakdowns(next_cell_run):
    folder, rows, _, results = next_cell_run
    assert json.loads((folder / "results.json").read_text()) == results
    assert results["format"] == 1 and results["run"]["task"] == "next_cell" and results["run"]["n"] == len(rows)
    assert results["release_hash"] == json.loads((folder / "run.json").read_text())["release"]["content_hash"]
    interval = results["interval"]
    assert (interval["method"], interval["clusters"], interval["confidence"]) == ("block_bootstrap", 4, 0.95)
    assert interval["blocks"] >= 10 and interval["block_length"] >= 2 and "between developers" in interval["warning"]
    hard = [not _solved_by_a_baseline(r, "next_cell") for r in rows]
    assert 0 < sum(hard) < len(rows) and results["hard_subset"]["examples"] == sum(hard)
    assert results["metrics"] == ["exact_match", "rouge_l", "chrf"] and results["executed"] is False
    for context in ("none", "variables"):
        for metric in results["metrics"]:
            for subset, n in (("all", len(rows)), ("hard", sum(hard))):
                entry = _pick(results["scores"], context=context, metric=metric, subset=subset)
                assert entry["n"] == n and entry["low"] <= entry["mean"] <= entry["high"]
    positions = {e["position"]: e["n"] for e in results["breakdown"]["position"]
                 if e["context"] == "none" and e["metric"] == "exact_match"}
    assert set(positions) == {"early", "middle", "late"} and sum(positions.values()) == len(rows)
    assert results["breakdown"]["output_type"] == []  # next_cell has no output types


def test_scores_match_the_predictions_the_run_made(next_cell_run):
    _, rows, skipped, results = next_cell_run
    none = _pick(results["scores"], context="none", metric="exact_match", subset="all")
    baseline = _pick(results["baselines"], baseline="previous-cell", metric="exact_match", subset="all")
    assert none["mean"] == baseline["mean"] > 0  # `none` repeats the previous cell
    assert _pick(results["scores"], context="none", metric="exact_match", subset="hard")["mean"] == 0.0
    # `variables`: sample 0 is the target (exact match 1), sample 1 the previous cell; one sample 0 was skipped (0).
    expected = [((0.0 if r["id"] == skipped[0] else 1.0) + float(_solved_by_a_baseline(r, "next_cell"))) / 2
                for r in rows]
    variables = _pick(results["scores"], context="variables", metric="exact_match", subset="all")
    assert variables["mean"] == pytest.approx(sum(expected) / len(rows))
    effect = _pick(results["paired"], context="variables", versus="none", metric="exact_match", subset="all",
                   examples="all")
    assert effect["diff"] == pytest.approx(variables["mean"] - none["mean"]) and 0 < effect["low"] <= effect["high"]
    # like with like: the example whose variables prompt was skipped is left out of the both-generated effect
    none_scores = [float(_solved_by_a_baseline(r, "next_cell")) for r in rows]
    kept = [k for k, r in enumerate(rows) if r["id"] != skipped[0]]
    both = _pick(results["paired"], context="variables", versus="none", metric="exact_match", subset="all",
                 examples="both_generated")
    assert both["n"] == len(rows) - 1 and both["unanswered"] == {"variables": 1, "none": 0}
    assert both["diff"] == pytest.approx(sum(expected[k] - none_scores[k] for k in kept) / len(kept))
    assert both["diff"] > effect["diff"]  # the skip, scored 0, pulled the all-examples effect down
    hard_both = _pick(results["paired"], context="variables", metric="exact_match", subset="hard",
                      examples="both_generated")
    hard = [not _solved_by_a_baseline(r, "next_cell") for r in rows]
    assert hard_both["n"] == sum(hard[k] for k in kept)
    assert results["counts"]["skipped"] == {"prompt over budget": 1} and results["counts"]["failed"] == {}
    assert results["counts"]["generations"] == len(rows) * 2 * 2
    assert results["counts"]["by_context"] == {"none": {"ok": len(rows) * 2, "skipped": 0, "failed": 0},
                                               "variables": {"ok": len(rows) * 2 - 1, "skipped": 1, "failed": 0}}


def test_results_md_is_the_table(next_cell_run):
    folder, rows, _, results = next_cell_run
    table = (folder / "results.md").read_text()
    assert "percentile block bootstrap (4 trajectories" in table and "**Warning:**" in table
    assert f"| metric | system | all (n={len(rows)}) | hard (n={results['hard_subset']['examples']}) |" in table
    effect = _pick(results["paired"], context="variables", metric="chrf", subset="all", examples="all")
    both = _pick(results["paired"], context="variables", metric="chrf", subset="all", examples="both_generated")
    assert (f"| chrf | variables | {effect['diff']:+.3f} [{effect['low']:+.3f}, {effect['high']:+.3f}] "
            f"(n={len(rows)}) | {both['diff']:+.3f} [") in table and "| 1 / 0 |" in table
    assert "Δ all examples, skips as 0" in table and "Δ both generated" in table
    assert "| chrf | model · variables |" in table and f"{effect['diff']:+.3f} [" in table
    assert "| exact_match | baseline · common-cell |" in table and "early (n=" in table


def test_output_prediction_runs_break_down_by_output_type(repeat_release, tmp_path):
    folder = write_run(tmp_path / "op", repeat_release, "output_prediction", _first_baseline("output_prediction"))
    results = score_run(folder)
    rows = open_release(repeat_release).task_rows("output_prediction").values()
    assert results["metrics"] == ["exact_match", "rouge_l", "chrf", "output_equivalent"]
    hard = sum(not _solved_by_a_baseline(r, "output_prediction") for r in rows)
    assert 0 < hard < len(rows) and results["hard_subset"]["examples"] == hard
    kinds = {e["output_type"]: e["n"] for e in results["breakdown"]["output_type"]
             if e["context"] == "none" and e["metric"] == "output_equivalent"}
    assert {"result", "stream"} <= set(kinds) and sum(kinds.values()) == len(rows)
    assert _pick(results["scores"], context="variables", metric="output_equivalent", subset="all")["mean"] == 1.0
    assert "By output type" in (folder / "results.md").read_text()


def test_cli_scores_a_run_folder_and_keeps_the_predictions_form(repeat_release, tmp_path, capsys):
    folder = write_run(tmp_path / "cli", repeat_release, "next_cell", _first_baseline("next_cell"))
    assert main(["score", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert (folder / "results.json").is_file() and (folder / "results.md").is_file()
    # The terminal gets the summary, the tables go to results.md (--tables prints them instead).
    assert "| exact_match |" not in printed and f"full tables: {folder / 'results.md'}" in printed
    assert "chrf over all examples, 95 % block bootstrap over 4 trajectories" in printed
    assert main(["score", str(folder), "--tables"]) == 0
    printed = capsys.readouterr().out
    assert "| exact_match | model · variables |" in printed and "block bootstrap" in printed
    # The scorer's options reach a run folder's scoring (they were once dropped there), and --k is refused.
    assert main(["score", str(folder), "--no-resume", "--prediction-timeout", "7", "--max-reference-s", "50",
                 "--continuation-cells", "1"]) == 0
    used = json.loads((folder / "scorer_records.json").read_text())["settings"]
    assert (used["timeout_s"], used["max_reference_s"], used["continuation_cells"]) == (7.0, 50.0, 1)
    capsys.readouterr()
    assert main(["score", str(folder), "--k", "1", "5"]) == 2
    assert "--k is for --predictions" in capsys.readouterr().err
    predictions = tmp_path / "preds.jsonl"
    rows = open_release(repeat_release).task_rows("next_cell").values()
    predictions.write_text("".join(json.dumps({"id": r["id"], "prediction": r["target"]}) + "\n" for r in rows))
    assert main(["score", "--release", str(repeat_release), "--predictions", str(predictions),
                 "-o", str(tmp_path / "plain.json")]) == 0
    assert json.loads((tmp_path / "plain.json").read_text())["scores"]["exact_match"] == 1.0


def hash_counter(monkeypatch, release: Path):
    """Each of `release`'s files as often as a release was opened over it (every open hashes every file)."""
    from collections import Counter

    from themisto.release import folder

    hashed, real = Counter(), folder.sha256_file
    monkeypatch.setattr(folder, "sha256_file",
                        lambda path: hashed.update([Path(path).relative_to(release).as_posix()]) or real(path))
    return hashed


def test_scoring_a_run_folder_opens_and_hashes_its_release_once(repeat_release, tmp_path, monkeypatch, capsys):
    folder = write_run(tmp_path / "once", repeat_release, "next_cell", _first_baseline("next_cell"))
    hashed = hash_counter(monkeypatch, repeat_release)
    assert main(["score", str(folder)]) == 0
    assert main(["score", str(folder), "--release", str(repeat_release)]) == 0  # the release given: the same
    files = sorted(p.relative_to(repeat_release).as_posix() for p in repeat_release.rglob("*.parquet"))
    assert len(files) == 3 and dict(hashed) == {rel: 2 for rel in files}


def test_the_summary_leads_with_the_headline_metric_against_the_best_baseline(next_cell_run, repeat_release,
                                                                               tmp_path, capsys):
    folder, rows, _, results = next_cell_run
    other = write_run(tmp_path / "op", repeat_release, "output_prediction", _first_baseline("output_prediction"))
    score_run(other)
    assert main(["summary", str(folder), str(other)]) == 0
    printed = capsys.readouterr().out.splitlines()
    at = printed.index(next(line for line in printed if line.startswith("output_prediction ·")))
    first, second = printed[:at], printed[at:]
    chrf = {(e["context"]): e for e in results["scores"] if e["metric"] == "chrf" and e["subset"] == "all"}
    best = max((b for b in results["baselines"] if b["metric"] == "chrf" and b["subset"] == "all"),
               key=lambda b: b["mean"])
    effect = _pick(results["paired"], context="variables", metric="chrf", subset="all", examples="all")
    assert first[0].startswith("next_cell · test-model (baseline): 88 examples, without execution, 1 generation")
    assert any(line.split() == ["model", "·", "variables", f"{chrf['variables']['mean']:.3f}",
                                f"[{chrf['variables']['low']:.3f},", f"{chrf['variables']['high']:.3f}]"]
               for line in first)
    assert any(line.strip().startswith(f"best baseline · {best['baseline']}  ") for line in first)
    assert f"    runtime effect variables − none: {effect['diff']:+.3f} [" in "\n".join(first)
    assert "  output_equivalent over all examples" in second[1] and len(first) + len(second) <= 16
    assert main(["summary", str(tmp_path)]) == 2
    assert "no results (score the run first" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# bad input


@pytest.fixture
def good_run(repeat_release, tmp_path) -> Path:
    return write_run(tmp_path / "run", repeat_release, "next_cell", _first_baseline("next_cell"))


def _lines(folder: Path) -> list[str]:
    return (folder / "generations.jsonl").read_text().splitlines(keepends=True)


def test_a_corrupt_line_is_named(good_run):
    lines = _lines(good_run)
    lines[4] = lines[4][: len(lines[4]) // 2] + "\n"
    (good_run / "generations.jsonl").write_text("".join(lines))
    with pytest.raises(InputError, match=r"generations\.jsonl:5: not JSON"):
        score_run(good_run)
    assert not (good_run / "results.json").exists()


@pytest.mark.parametrize("change, message", [
    (lambda r: {**r, "id": "kernel-9/7"}, None),
    (lambda r: {**r, "context": "full"}, r":3: example .*: context 'full' is not one of the run's none, variables"),
    (lambda r: {**r, "sample": 1}, r":3: example .*: sample 1, expected 0\.\.0"),
    (lambda r: {**r, "prediction": 7}, r":3: example .*: `prediction` must be a string, got int"),
    (lambda r: {**r, "status": "done"}, r":3: example .*: status 'done'"),
    (lambda r: {**r, "task": "output_prediction"}, r":3: example .*: task 'output_prediction'"),
    (lambda r: {**r, "kept": {"variables_shown": "all"}}, r":3: example .*: `kept` must be an object of counts"),
])
def test_bad_lines_are_named_by_line_or_id(good_run, change, message):
    lines = _lines(good_run)
    lines[2] = json.dumps(change(json.loads(lines[2]))) + "\n"
    (good_run / "generations.jsonl").write_text("".join(lines))
    with pytest.raises(RunFolderError, match=message or r"example kernel-9/7"):
        score_run(good_run)


def test_an_unknown_id_is_named(good_run):
    lines = _lines(good_run)
    lines += [json.dumps({**json.loads(line), "id": "kernel-9/7"}) + "\n" for line in lines[:2]]
    (good_run / "generations.jsonl").write_text("".join(lines))
    with pytest.raises(RunFolderError, match=r"example kernel-9/7 is not in the release"):
        score_run(good_run)


def test_duplicates_and_gaps_are_refused(good_run):
    lines = _lines(good_run)
    (good_run / "generations.jsonl").write_text("".join(lines + [lines[0]]))
    with pytest.raises(RunFolderError, match=rf":{len(lines) + 1}: example .* was already given on line 1"):
        score_run(good_run)
    (good_run / "generations.jsonl").write_text("".join(lines[:-1]))
    with pytest.raises(RunFolderError, match=r"has no line for context variables sample 0 \(the run is incomplete"):
        score_run(good_run)


def test_another_release_is_refused(good_run, small_release):
    with pytest.raises(RunFolderError, match=r"content hash .* differs from the run's .*refusing to mix"):
        score_run(good_run, release=open_release(small_release))
    meta = json.loads((good_run / "run.json").read_text())
    meta["release"]["content_hash"] = "0" * 64
    (good_run / "run.json").write_text(json.dumps(meta))
    assert main(["score", str(good_run)]) == 2
    assert not (good_run / "results.json").exists()


def test_bad_run_json_is_refused(good_run, capsys):
    (good_run / "run.json").write_text('{"format": 1, "task": "next_cell", "contexts": ["none", "verbose"]}')
    assert main(["score", str(good_run)]) == 2
    assert "run.json: contexts ['none', 'verbose']" in capsys.readouterr().err
    (good_run / "run.json").unlink()
    with pytest.raises(RunFolderError, match=r"run\.json: missing"):
        score_run(good_run)


def test_execution_needs_both_switches_before_anything_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    env_settings.cache_clear()
    assert main(["score", str(tmp_path / "no-such-run"), "--execute"]) == 2
    assert "Executing model-written code is off" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# with execution: a short trajectory replayed in a real kernel

EXEC_KERNEL = "exec-kernel"
# Step 7 computes what step 6 did in another way: re-running step 6 is a functional match, not an exact one.
EXEC_CELLS = ["x = 3", "y = x * 2", "print(y)", "z = [1, 2]", "z.append(x)", "print(len(z))", "w = x + 1",
              "w = 1 + x", "print(w)", "print(w)", "x = 10"]


@pytest.fixture(scope="module")
def executed_release(tmp_path_factory):
    from themisto.ingest.trajectory import Execution, Trajectory
    from themisto.release.tasks import trajectory_rows
    from themisto.replay.replay import ReplaySettings, replay_trajectory

    workspace = tmp_path_factory.mktemp("exec-ws")
    trajectory = Trajectory(id=EXEC_KERNEL, notebook="task1.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=code, status="ok")
                                        for i, code in enumerate(EXEC_CELLS)])
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20)))
    out = tmp_path_factory.mktemp("exec-release") / "release"
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test", "workspace": {"given": "exec-ws"}})
    return out, workspace


@pytest.mark.slow
def test_execution_scores_lead_and_a_functional_match_leaves_the_hard_subset(executed_release, tmp_path, monkeypatch):
    release, workspace = executed_release
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        folder = write_run(tmp_path / "exec", release, "next_cell", _first_baseline("next_cell"))
        results = score_run(folder, execute=True, workspace=workspace)
        # Scoring the run again reuses its verdicts (nothing executed); --no-resume executes everything again.
        again, fresh = [], []
        score_run(folder, execute=True, workspace=workspace, progress=again.append)
        score_run(folder, execute=True, workspace=workspace, progress=fresh.append, resume=False)
        assert any("kept from the earlier run" in m for m in again)
        assert not any("kept from the earlier run" in m for m in fresh)
    finally:
        monkeypatch.delenv("HF_ALLOW_CODE_EVAL")
        env_settings.cache_clear()
    steps = sorted(int(i.rsplit("/", 1)[1]) for i in open_release(release).task_rows("next_cell"))
    assert steps == list(range(5, len(EXEC_CELLS)))
    assert results["executed"] is True and results["metrics"][:2] == ["continuation_match", "functional_match"]
    assert results["counts"]["execution"] == {"scored": len(steps)}
    # Step 9 repeats step 8 (an exact match); step 7 is functionally step 6 again: both leave the hard subset.
    assert results["hard_subset"]["examples"] == len(steps) - 2 and "functional match" in results["hard_subset"]["rule"]
    none = _pick(results["scores"], context="none", metric="functional_match", subset="all")
    assert none["mean"] == pytest.approx(2 / len(steps))
    variables = _pick(results["scores"], context="variables", metric="functional_match", subset="all")
    assert variables["mean"] == 1.0 and variables["n"] == len(steps)
    assert _pick(results["scores"], context="none", metric="functional_match", subset="hard")["mean"] == 0.0
    assert "| continuation_match | model · none |" in (folder / "results.md").read_text()
    # The summary leads with the scorer's headline once predictions were run.
    from themisto.scoring.results_table import render_summary

    summary = render_summary(results)
    assert "next_cell · test-model (baseline): " in summary and "examples, with execution." in summary
    assert "  continuation_match over all examples, 95 % " in summary


# ---------------------------------------------------------------------------------------------------------------
# the real task-1 log: one trajectory, so intervals come from blocks of consecutive steps


@pytest.fixture(scope="module")
def task1_release(june_dir, tmp_path_factory) -> Path:
    """A release of the real task-1 log whose steps carry the logged code but are not replayed: next_cell's targets
    and history code are those of the replayed release (outputs are a placeholder), and building takes seconds."""
    from conftest import TASK1_LOG

    from themisto.ingest.june_log import read_june_log
    from themisto.release.tasks import trajectory_rows
    from themisto.replay.replay import LoggedOutcome, Step

    trajectory = read_june_log(TASK1_LOG)
    restarts = {event.before for event in trajectory.events if event.kind == "restart"}
    steps = [Step(kernel_id=trajectory.id, step=i, cell_id=ex.cell_id, code=ex.code, replayed_code=ex.code,
                  cleaning=[], restarted_before=i in restarts, status="error" if ex.status == "error" else "ok",
                  ename=ex.ename, evalue=ex.evalue, output="(not replayed)", outputs=[], output_types=ex.output_types,
                  execution_time=0.0, memory_bytes=None, state_hash=None, variables=[], snapshot_failures={},
                  kernel_restarted=False, rebuilt_steps=0,
                  logged=LoggedOutcome(ex.status, ex.ename, ex.evalue, ex.output_types),
                  notebook=trajectory.notebook, task=trajectory.task)
             for i, ex in enumerate(trajectory.executions)]
    out = tmp_path_factory.mktemp("task1") / "release"
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0), source={"kind": "test"})
    return out


@pytest.mark.slow
def test_task1_baseline_intervals_are_not_degenerate(task1_release, tmp_path, capsys):
    run = tmp_path / "previous-cell"
    assert main(["generate", "--release", str(task1_release), "--task", "next_cell", "--context", "none",
                 "--backend", "baseline", "--model", "previous-cell", "-o", str(run), "--json"]) == 0
    assert main(["score", str(run), "--tables"]) == 0
    printed = capsys.readouterr().out
    results = json.loads((run / "results.json").read_text())
    interval = results["interval"]
    assert (interval["method"], interval["clusters"], interval["block_length"]) == ("block_bootstrap", 1, 8)
    assert interval["blocks"] >= 60 and "percentile block bootstrap (1 trajectory, " in printed
    assert results["counts"]["examples"] > 500
    for metric in ("exact_match", "rouge_l", "chrf"):
        entry = _pick(results["scores"], context="none", metric=metric, subset="all")
        assert 0 < entry["low"] < entry["mean"] < entry["high"] < 1, entry
    # Developers re-run edited cells: the previous cell alone is close to the developer's next cell.
    exact = _pick(results["baselines"], baseline="previous-cell", metric="exact_match", subset="all")
    rouge = _pick(results["baselines"], baseline="previous-cell", metric="rouge_l", subset="all")
    assert exact["mean"] == pytest.approx(0.047, abs=0.01) and rouge["mean"] == pytest.approx(0.72, abs=0.02)
    assert exact["high"] - exact["low"] > 0.02


# ---------------------------------------------------------------------------------------------------------------
# a run over every split, its intervals by participant


def test_a_run_over_every_split_is_scored_per_split_with_participants_drawn_whole(tmp_path, capsys):
    # Six participants with a task-1 and a task-2 trajectory each: the split keeps each participant on one side.
    trajectories = [make_steps(f"p{p}-t{t}", 18 + 2 * p + t, task=f"task{t}") for p in range(6) for t in (1, 2)]
    owner = {steps[0].kernel_id: f"student_{p}" for p, steps in zip([p for p in range(6) for _ in (1, 2)],
                                                                   trajectories)}
    release = tmp_path / "release"
    build_release(rows_of(*trajectories, participants=owner), release, TaskSettings(seed=3),
                  source={"kind": "test-rows"})
    info = open_release(release)
    test_ids, train_ids = set(info.ids("next_cell", "test")), set(info.ids("next_cell", "train"))
    assert test_ids and train_ids
    run = tmp_path / "run"
    assert main(["generate", "--release", str(release), "--task", "next_cell", "--context", "none", "--backend",
                 "baseline", "--model", "previous-cell", "--split", "all", "-o", str(run), "--json"]) == 0
    made = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
    assert {g["id"] for g in made} == test_ids | train_ids
    assert json.loads((run / "run.json").read_text())["split"] == "all"
    capsys.readouterr()
    assert main(["score", str(run), "--cluster", "participant", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    interval = results["interval"]
    assert (interval["unit"], interval["clusters"], interval["method"]) == ("participant", 6, "cluster_bootstrap")
    assert "6 participants (< 10)" in interval["warning"]
    by_split = {(e["split"], e.get("context") or e["baseline"], e["metric"]): e
                for e in results["breakdown"]["split"]}
    assert by_split["test", "none", "exact_match"]["n"] == len(test_ids)
    assert by_split["train", "none", "exact_match"]["n"] == len(train_ids)
    assert "By split" in (run / "results.md").read_text()
    # by trajectory (the default) the same run has twelve clusters
    assert main(["score", str(run), "--json", "-o", str(tmp_path / "by-trajectory.json")]) == 0
    assert json.loads(capsys.readouterr().out)["interval"]["clusters"] == 12
    with pytest.raises(SystemExit):
        main(["generate", "--release", str(release), "--task", "next_cell", "--backend", "baseline", "--model",
              "previous-cell", "--split", "validation", "-o", str(tmp_path / "bad")])
