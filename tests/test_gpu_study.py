"""The rented-GPU path on the CPU (`scripts/gpu_stage.py`, `scripts/gpu_study.sh --cpu`): a prepared study staged in
two calls' folders, the model cut in two parts joined and checked there, the generate-only part run and packed into
the files that come back, and the scoring command finishing the study from them; a damaged part or another model is
refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from themisto.cli import main

REPO = Path(__file__).resolve().parents[1]
# A reduced study: the baseline mode alone, one seed, two test examples a task.
STUDY = ("--preset", "cpu-check", "--contexts", "none", "--seeds", "1", "--test-limit", "2", "--json")

pytestmark = pytest.mark.slow


def _script(*args: str, out: Path, kept: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "THEMISTO_GPU_KEPT": str(kept)}
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_study.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _stage(tmp_path: Path, release: Path, model: Path, study: Path) -> Path:
    staged = tmp_path / "staged"
    subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_stage.py"), "stage", "--release", str(release),
                    "--model", str(model), "--study", str(study), "-o", str(staged), "--budget-s", "300"],
                   check=True, capture_output=True, text=True)
    return staged


@pytest.fixture(scope="module")
def prepared(sample_release, tiny_model_dir, tmp_path_factory) -> Path:
    study = tmp_path_factory.mktemp("gpu-study") / "prepared"
    assert main(["study", "--release", str(sample_release), "--model", str(tiny_model_dir), "-o", str(study),
                 "--prepare-only", *STUDY]) == 0
    return study


def test_staged_in_two_calls_run_packed_and_scored_back_here(prepared, sample_release, tiny_model_dir, tmp_path,
                                                             capsys):
    study = prepared
    assert sorted(p.name for p in study.iterdir()) == ["rows.json", "study.json"]  # nothing trained
    staged = _stage(tmp_path, sample_release, tiny_model_dir, study)
    stage = json.loads((staged / "call2" / "stage.json").read_text())
    assert [p["name"] for p in stage["parts"]] == ["model.tar.part1", "model.tar.part2"]
    assert stage["study_options"] == ["--preset", "cpu-check", "--contexts", "none", "--seeds", "1", "--test-limit", "2"]
    out, kept = tmp_path / "out", tmp_path / "kept"
    first = _script("stage", str(staged / "call1"), out=out, kept=kept)
    assert first.returncode == 0, first.stderr
    second = _script("run", str(staged / "call2"), "--cpu", out=out, kept=kept)
    assert second.returncode == 0, second.stderr
    assert len(list(out.iterdir())) <= 8 and (out / "study.tgz").is_file()
    report = json.loads((out / "gpu.json").read_text())
    assert report["units_done"] == ["base", "none-s0"] and report["study_exit"] == "0"
    back = tmp_path / "back"
    with tarfile.open(out / "study.tgz") as tar:
        names = tar.getnames()
        assert not any("/models" in n or "/exports" in n for n in names)
        tar.extractall(back, filter="data")
    capsys.readouterr()
    assert main(["study", "--release", str(sample_release), "--model", str(tiny_model_dir), "-o",
                 str(back / "study"), "--score-only", *STUDY]) == 0
    results = json.loads((back / "study" / "results.json").read_text())
    assert results["seeds"] == {"none": 1} and results["units_left"] == []
    assert not (back / "study" / "models").exists()  # scored here, trained there


def test_a_damaged_part_or_another_model_is_refused_before_anything_runs(prepared, sample_release, tiny_model_dir,
                                                                         tmp_path):
    study = prepared
    staged = _stage(tmp_path, sample_release, tiny_model_dir, study)
    out, kept = tmp_path / "out", tmp_path / "kept"
    assert _script("stage", str(staged / "call1"), out=out, kept=kept).returncode == 0
    part = staged / "call2" / "model.tar.part2"
    part.write_bytes(part.read_bytes()[:-1] + bytes([part.read_bytes()[-1] ^ 1]))
    damaged = _script("run", str(staged / "call2"), "--cpu", out=out, kept=kept)
    assert damaged.returncode == 3 and "a part is missing or damaged" in damaged.stderr
    # Whole parts of other weights than the study's: the study's weights decide.
    staged = _stage(tmp_path, sample_release, tiny_model_dir, study)
    stage = json.loads((staged / "call2" / "stage.json").read_text())
    stage["weights_sha256"] = "0" * 64
    (staged / "call2" / "stage.json").write_text(json.dumps(stage))
    other = _script("run", str(staged / "call2"), "--cpu", out=out, kept=kept)
    assert other.returncode == 3 and "differ from the study's base model" in other.stderr
    assert not (kept / "study" / "units").exists()  # nothing ran
