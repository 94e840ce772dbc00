"""The fine-tuning study (`themisto study`): on the sample trajectories (cut short, replayed in real kernels) with the
tiny local model, two modes x two seeds with execution; the same rows in every mode, no test kernel in any export,
results with seed-aware intervals, resume and refusal; and the interval's own arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from themisto.cli import main
from themisto.scoring.intervals import IntervalSettings, mean_interval, paired_interval, plan_resamples
from themisto.study.effects import seeded_interval, seeded_paired

REPO = Path(__file__).resolve().parents[1]
STUDY_ARGS = ("--contexts", "variables", "--seeds", "2", "--max-steps", "1", "--batch-size", "2", "--max-length", "1024",
              "--max-prompt-tokens", "600", "--max-new-tokens", "12", "--test-limit", "4", "--train-limit", "6",
              "--execute", "--execute-limit", "2", "--device", "cpu", "--generation-batch", "8", "--resamples", "200",
              "--json")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def opted_in():
    from themisto.settings import settings

    before = os.environ.get("HF_ALLOW_CODE_EVAL")
    os.environ["HF_ALLOW_CODE_EVAL"] = "1"
    settings.cache_clear()
    yield
    if before is None:
        del os.environ["HF_ALLOW_CODE_EVAL"]
    else:
        os.environ["HF_ALLOW_CODE_EVAL"] = before
    settings.cache_clear()


def _study(release: Path, model: Path, out: Path, *extra: str) -> int:
    return main(["study", "--release", str(release), "--model", str(model), "-o", str(out), *STUDY_ARGS, *extra])


HASHED: dict[str, int] = {}  # how often each file of the release was hashed while the `study` fixture ran


@pytest.fixture(scope="module")
def study(sample_release, tiny_model_dir, opted_in, tmp_path_factory) -> Path:
    from collections import Counter

    from themisto.release import folder

    out = tmp_path_factory.mktemp("study") / "study"
    hashed, real = Counter(), folder.sha256_file
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(folder, "sha256_file",
                   lambda path: hashed.update([Path(path).relative_to(sample_release).as_posix()]) or real(path))
        assert _study(sample_release, tiny_model_dir, out) == 0
    HASHED.update(hashed)
    return out


def test_the_whole_study_opens_and_hashes_the_release_once(study, sample_release):
    # Trained, generated and scored with execution, two modes and two seeds: one open at the command's edge.
    files = sorted(p.relative_to(sample_release).as_posix() for p in sample_release.rglob("*.parquet"))
    assert len(files) > 5 and HASHED == {rel: 1 for rel in files}


def _examples(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "examples.jsonl").read_text(encoding="utf-8").splitlines()]


def test_every_mode_trains_on_the_same_rows_steps_and_completions(study):
    none, variables = _examples(study / "exports" / "none"), _examples(study / "exports" / "variables")
    assert [(e["task"], e["id"]) for e in none] == [(e["task"], e["id"]) for e in variables]
    assert len(none) == json.loads((study / "rows.json").read_text())["rows"] == 6
    assert [e["completion"] for e in none] == [e["completion"] for e in variables]
    assert all(a["prompt"] != b["prompt"] for a, b in zip(none, variables))  # only the prompt differs
    units = [json.loads(p.read_text()) for p in sorted((study / "units").glob("*.json"))]
    assert [u["unit"] for u in units] == ["base", "none-s0", "none-s1", "variables-s0", "variables-s1"]
    assert {(u["steps"], u["trained_on"]) for u in units[1:]} == {(1, 6)}
    # what a plan measures throughput from: tokens trained, prompts generated, seconds, side by side
    assert all(u["train_tokens"] > 0 and u["prompts"] == 8 * (1 + (u["mode"] == "variables")) for u in units[1:])
    assert units[0]["prompts"] == 16 and all(u["generate_seconds"] > 0 and u["parallel"] == 1 for u in units)
    tokens = json.loads((study / "results.json").read_text())["rows"]["tokens"]
    assert tokens["variables"]["prompt_mean"] > tokens["none"]["prompt_mean"]  # runtime modes see more: said
    assert tokens["variables"]["completion_mean"] == tokens["none"]["completion_mean"]
    # the prompt budget was counted with the base model's tokenizer, in training as in generation
    manifest = json.loads((study / "exports" / "variables" / "manifest.json").read_text())
    assert manifest["prompt_tokens_counted_with"].startswith("tokenizer of ")


def test_no_kernel_of_the_test_split_appears_in_any_export(study, sample_release):
    import datasets

    kernels = {split: set() for split in ("train", "test")}
    ids = {}
    for config in ("next_cell", "output_prediction"):
        for split in kernels:
            rows = datasets.load_dataset(str(sample_release), config, split=split)
            kernels[split] |= set(rows["kernel_id"])
            ids.update({(config, i): k for i, k in zip(rows["id"], rows["kernel_id"])})
    assert kernels["test"] and not kernels["test"] & kernels["train"]
    for mode in ("none", "variables"):
        exported = {ids[(e["task"], e["id"])] for e in _examples(study / "exports" / mode)}
        assert exported and not exported & kernels["test"], f"{mode}: a test kernel was trained on"


def test_results_hold_each_cell_with_seeds_and_the_paired_effects(study):
    results = json.loads((study / "results.json").read_text())
    assert results["path_check"] is None and results["steps"] == 1
    next_cell = results["tasks"]["next_cell"]
    assert next_cell["executed"] == 2 and next_cell["headline"] == "functional_match"
    cells = {(c["system"], c["metric"]): c for c in next_cell["cells"]}
    own = cells[("trained:variables@variables", "functional_match")]
    assert own["seeds"] == 2 and own["n"] <= 2 and len(own["seed_means"]) == 2
    assert cells[("trained:variables@variables", "chrf")]["n"] == 4  # text scores cover every generated example
    assert cells[("baseline:previous-cell", "functional_match")]["seeds"] == 1
    assert ("base@variables", "chrf") in cells and ("trained:variables@none", "chrf") in cells
    tuned = next(e for e in next_cell["effects"] if e["effect"] == "fine-tuning" and e["metric"] == "chrf")
    assert len(tuned["seed_means"]) == 2  # each trained seed against the base model's one
    assert results["seeds"] == {"none": 2, "variables": 2} and results["units_left"] == []
    kinds = {(e["effect"], e["mode"]) for e in next_cell["effects"] if e["metric"] == "functional_match"}
    assert kinds == {("fine-tuning", "none"), ("runtime", "variables"), ("reliance", "variables"),
                     ("transfer", "variables"), ("untrained", "variables")}
    assert results["tasks"]["output_prediction"]["headline"] == "output_equivalent"
    text = (study / "results.md").read_text()
    assert "## next_cell (4 test examples, 2 executed)" in text and "| runtime | `variables` |" in text
    assert (study / "effects.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_writer_then_a_rerun_trains_nothing_and_other_settings_are_refused(study, sample_release,
                                                                              tiny_model_dir, tmp_path, capsys):
    weights = sorted((study / "models").rglob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in weights]
    assert len(weights) == 4
    # A second study into the folder while one holds it (the real command, paused once it took the folder's lock)
    # is refused at once, naming the holder; the holder killed there, a rerun is not blocked.
    ready, go = tmp_path / "ready", tmp_path / "go"
    holder = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "_paused_writer.py"), str(ready), str(go), "hold", "--", "study",
         "--release", str(sample_release), "--model", str(tiny_model_dir), "-o", str(study), *STUDY_ARGS],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline, "the first study never took its folder"
            time.sleep(0.05)
        capsys.readouterr()
        assert _study(sample_release, tiny_model_dir, study) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert _study(sample_release, tiny_model_dir, study) == 0
    assert [p.stat().st_mtime_ns for p in weights] == stamps
    capsys.readouterr()
    assert _study(sample_release, tiny_model_dir, study, "--max-new-tokens", "13") == 2
    err = capsys.readouterr().err
    assert "other settings" in err and "max_new_tokens is 12 there, 13 here" in err


def test_a_study_generated_on_one_machine_is_scored_on_another(study, sample_release, tiny_model_dir, tmp_path,
                                                                 capsys):
    # As from a GPU machine: the folder without its models and exports, the release and the base model elsewhere.
    import shutil

    moved, release, model = tmp_path / "moved", tmp_path / "release-here", tmp_path / "model-here"
    shutil.copytree(study, moved, ignore=shutil.ignore_patterns("models", "exports", "scored", "results.*",
                                                                 "effects.png"))
    shutil.copytree(sample_release, release)
    shutil.copytree(tiny_model_dir, model)
    capsys.readouterr()
    assert _study(release, model, moved, "--generate-only") == 0
    # seed 0 of every mode first, then the base model, then seed 1
    assert json.loads(capsys.readouterr().out)["generated"] == ["none-s0", "variables-s0", "base", "none-s1",
                                                                 "variables-s1"]
    assert not (moved / "results.json").exists()
    assert _study(release, model, moved) == 0
    assert not (moved / "models").exists() and not (moved / "exports").exists()  # nothing trained again
    here, there = (json.loads((folder / "results.json").read_text()) for folder in (moved, study))
    for task in ("next_cell", "output_prediction"):
        assert here["tasks"][task]["cells"] == there["tasks"][task]["cells"]
        assert here["tasks"][task]["effects"] == there["tasks"][task]["effects"]
    # Other weights under the same name are another model.
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    weights = next(other.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert _study(release, other, moved) == 2
    assert "another base model" in capsys.readouterr().err


def test_the_plan_gives_each_unit_in_run_order_with_figures_that_say_where_they_come_from(study, sample_release,
                                                                                        tiny_model_dir, capsys):
    capsys.readouterr()
    assert _study(sample_release, tiny_model_dir, study, "--plan") == 0
    plan = json.loads(capsys.readouterr().out)
    assert [u["unit"] for u in plan["units"]] == ["none-s0", "variables-s0", "base", "none-s1", "variables-s1"]
    assert all(u["done"] for u in plan["units"]) and plan["wall_seconds"] == 0
    # 4 test examples a task, in the model's own mode and in `none`; the base model in both modes
    assert [u["prompts"] for u in plan["units"]] == [8, 16, 16, 8, 16]
    variables = plan["units"][1]
    assert (variables["rows"], variables["steps"]) == (6, 1) and variables["train_tokens"] > plan["units"][0]["train_tokens"]
    assert {f["kind"] for f in plan["throughput"].values()} == {"measured here"}
    # A third seed extends the study: units of its own, planned after the others, nothing done redone.
    assert _study(sample_release, tiny_model_dir, study, "--plan", "--seeds", "3") == 0
    more = json.loads(capsys.readouterr().out)["units"]
    assert [(u["unit"], u["done"]) for u in more[5:]] == [("none-s2", False), ("variables-s2", False)]
    assert all(u["done"] for u in more[:5])
    # Told to re-plan from scratch (a folder of its own) the figures are stated, each with its source.
    fresh = study.parent / "plan-only"
    assert _study(sample_release, tiny_model_dir, fresh, "--plan", "--budget-s", "45") == 0
    assert not fresh.exists()  # nothing written
    plan = json.loads(capsys.readouterr().out)
    assert {f["kind"] for f in plan["throughput"].values()} == {"measured elsewhere", "assumed"}
    assert all("DESIGN.md" in f["source"] for f in plan["throughput"].values() if f["kind"] == "measured elsewhere")


def test_a_budget_starts_no_unit_it_cannot_finish_and_score_only_scores_the_whole_ones(study, sample_release,
                                                                                        tiny_model_dir, tmp_path,
                                                                                        capsys):
    import shutil

    # As if a budget had stopped the study after seed 0 of every mode and the base model.
    moved = tmp_path / "stopped"
    shutil.copytree(study, moved, ignore=shutil.ignore_patterns("models", "exports", "results.*", "effects.png"))
    for unit in ("none-s1", "variables-s1"):
        (moved / "units" / f"{unit}.json").unlink()
        shutil.rmtree(moved / "runs" / unit)
    capsys.readouterr()
    assert _study(sample_release, tiny_model_dir, moved, "--generate-only", "--budget-s", "0.001") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["generated"] == ["none-s0", "variables-s0", "base"] and out["left"] == ["none-s1", "variables-s1"]
    assert not (moved / "models").exists()  # nothing started: the study took more than a millisecond to begin
    assert _study(sample_release, tiny_model_dir, moved, "--score-only") == 0
    results = json.loads((moved / "results.json").read_text())
    assert results["seeds"] == {"none": 1, "variables": 1} and results["units_left"] == ["none-s1", "variables-s1"]
    cells = {(c["system"], c["metric"]): c for c in results["tasks"]["next_cell"]["cells"]}
    assert cells[("trained:variables@variables", "chrf")]["seeds"] == 1
    assert "A partial study: 2 of its units are not run yet" in (moved / "results.md").read_text()
    assert not (moved / "models").exists()  # scoring trained nothing


def test_units_side_by_side_in_processes_of_their_own_do_the_same_work(study, sample_release, tiny_model_dir,
                                                                         tmp_path, capsys):
    # What a GPU runs: units in spawned processes, the modes' exports written at once beside them.
    side = tmp_path / "side"
    capsys.readouterr()
    assert _study(sample_release, tiny_model_dir, side, "--seeds", "1", "--parallel", "2", "--generate-only") == 0
    assert json.loads(capsys.readouterr().out)["generated"] == ["none-s0", "variables-s0", "base"]
    for unit in ("none-s0", "variables-s0"):
        here, alone = (json.loads((folder / "units" / f"{unit}.json").read_text()) for folder in (side, study))
        assert here["parallel"] == 2 and alone["parallel"] == 1
        assert (here["first_loss"], here["steps"], here["prompts"]) == (alone["first_loss"], alone["steps"],
                                                                        alone["prompts"])
    assert sorted(p.name for p in (side / "exports").iterdir()) == ["none", "variables"]


def _plan(n: int = 60, clusters: int = 12, resamples: int = 2000):
    return plan_resamples([f"k{i % clusters}" for i in range(n)], list(range(n)),
                          IntervalSettings(resamples=resamples))


def test_one_seed_gives_the_scorers_own_interval_and_copies_of_a_seed_change_nothing():
    rng = np.random.default_rng(7)
    plan = _plan()
    treated, control = rng.integers(0, 2, plan.size).astype(float), rng.integers(0, 2, plan.size).astype(float)
    one = seeded_paired([treated], [control], plan)
    scorer = paired_interval(list(treated), list(control), plan)
    assert (one.mean, one.low, one.high, one.n) == (scorer.mean, scorer.low, scorer.high, scorer.n)
    assert seeded_interval([treated], plan).low == mean_interval(list(treated), plan).low
    copies = seeded_paired([treated] * 3, [control] * 3, plan)
    assert (copies.low, copies.high) == pytest.approx((one.low, one.high), abs=1e-12) and copies.seed_sd == pytest.approx(0.0, abs=1e-12)


def test_seeds_that_disagree_widen_the_paired_interval():
    rng = np.random.default_rng(11)
    plan = _plan()
    control = rng.integers(0, 2, plan.size).astype(float)
    treated = control.copy()
    treated[rng.choice(plan.size, 8, replace=False)] = 1.0  # a small true effect, the same for both seeds
    agree = seeded_paired([treated, treated], [control, control], plan)
    lucky = treated.copy()
    lucky[rng.choice(plan.size, 20, replace=False)] = 1.0  # one seed's model answers many more by chance
    unlucky = treated.copy()
    unlucky[rng.choice(plan.size, 20, replace=False)] = 0.0
    disagree = seeded_paired([lucky, unlucky], [control, control], plan)
    assert disagree.seed_sd > 0.1 and agree.seed_sd == pytest.approx(0.0, abs=1e-12)
    assert disagree.high - disagree.low > (agree.high - agree.low) * 1.3
    # the point estimate is the mean over seeds: the two seeds' effects average out
    assert disagree.mean == pytest.approx(np.mean([np.mean(lucky - control), np.mean(unlucky - control)]))


def test_each_seed_pairs_with_a_single_control_so_the_spread_exists():
    # The fine-tuning effect: three trained seeds against the base model's one.
    rng = np.random.default_rng(5)
    plan = _plan()
    control = rng.integers(0, 2, plan.size).astype(float)
    seeds = [rng.integers(0, 2, plan.size).astype(float) for _ in range(3)]
    effect = seeded_paired(seeds, [control], plan)
    own = [float(np.mean(s - control)) for s in seeds]
    assert effect.seed_means == pytest.approx(own)
    assert effect.seed_sd == pytest.approx(float(np.std(own, ddof=1))) and effect.seed_sd > 0
    reverse = seeded_paired([control], seeds, plan)  # the single seed on the other side pairs the same way
    assert reverse.seed_means == pytest.approx([-x for x in own])


def test_a_preset_fills_what_the_user_did_not_give_and_bad_settings_are_refused():
    from themisto.study.settings import PRESETS, StudyError, is_path_check, with_preset

    check = with_preset("cpu-check", {"release": "r", "model": "m", "seeds": 3})
    assert check.seeds == 3 and check.max_steps == PRESETS["cpu-check"]["max_steps"] and is_path_check(check)
    assert check.contexts[0] == "none"  # the paired effects' control is always in, first
    gpu = with_preset("gpu", {"release": "r", "model": "m"})
    assert (gpu.device, gpu.dtype, gpu.parallel, gpu.seeds) == ("cuda", "bfloat16", 3, 1) and not is_path_check(gpu)
    assert gpu.batch_size * gpu.grad_accum == 16 and gpu.batching == "memory"
    for preset, given, message in (("fast", {}, "unknown preset"), ("custom", {"lr": 1}, "unknown study setting"),
                                   ("custom", {"max_prompt_tokens": 4000}, "leave room"),
                                   ("custom", {"contexts": ("probe",)}, "cannot be trained on")):
        with pytest.raises(StudyError, match=message):
            with_preset(preset, {"release": "r", "model": "m", **given})


def test_a_planted_or_foreign_study_file_is_refused_in_one_line(tmp_path):
    from themisto.errors import InputError  # StudyError, or the bounded reader's BoundError: exit 2, one line
    from themisto.study.run import STUDY_FILE, open_study
    from themisto.study.settings import StudySettings

    settings = StudySettings(release="r", model="m")
    for text in ('{"format": 1, "settings": [1, 2]}', "[]", '{"format": 99}', "{"):
        (tmp_path / STUDY_FILE).write_text(text)
        with pytest.raises(InputError, match=STUDY_FILE):
            open_study(tmp_path, settings, "hash")
