"""Run folders: one record per (example, context, sample), run.json per the contract, resume after kill -9 / Ctrl-C /
a torn line, refusal to mix settings or releases, bad input named, prompts over budget recorded as skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_tasks import make_steps, rows_of

from themisto.cli import main
from themisto.errors import InputError
from themisto.generation.backends import Sampling
from themisto.generation.prompts import extract_answer, template_sha256
from themisto.generation.run_folder import RunFolderError
from themisto.generation.example_spec import ExampleSpec, ExampleSpecError
from themisto.generation.runs import RunSettings, generate_run
from themisto.release.folder import ReleaseError
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings
from themisto.release.folder import open_release

REPO = Path(__file__).resolve().parents[1]
CONTRACT_RUN_KEYS = {"format", "task", "contexts", "backend", "backend_version", "model", "sampling", "templates",
                     "release", "split", "limit", "packages", "git_commit", "started", "finished", "tokens_in",
                     "tokens_out", "generations_per_s"}


def _ids(release: Path, task: str) -> list[str]:
    return pq.read_table(release / task / "test-00000-of-00001.parquet", columns=["id"]).column("id").to_pylist()


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]


def _baseline(task="output_prediction", model="previous-output", **kw) -> RunSettings:
    spec = ExampleSpec(tasks=(task,), contexts=kw.pop("contexts", ("none", "variables", "full")),
                       **{k: kw.pop(k) for k in ("limit", "max_prompt_tokens", "split", "delta") if k in kw})
    return RunSettings(spec, backend="baseline", model=model, **kw)


def test_a_baseline_run_writes_one_record_per_example_context_and_sample(small_release, tmp_path):
    settings = _baseline(sampling=Sampling(n=2))
    report = generate_run(open_release(small_release), tmp_path / "run", settings, progress=False)
    ids = _ids(small_release, "output_prediction")
    lines = _lines(tmp_path / "run")
    assert Counter((r["id"], r["context"], r["sample"]) for r in lines) == {
        (i, c, s): 1 for i in ids for c in ("none", "variables", "full") for s in (0, 1)}
    assert all(r["status"] == "ok" and r["prediction"] == r["raw"] for r in lines)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert CONTRACT_RUN_KEYS <= set(run) and run["finished"] and run["split"] == "test"
    build = json.loads((small_release / "themisto_build.json").read_text())
    assert run["release"]["content_hash"] == build["content_sha256"]
    assert run["templates"]["full"]["sha256"] == template_sha256("output_prediction", "full")
    assert run["sampling"] == {"n": 2, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 256, "seed": 0}
    assert report.written == len(lines) and report.counts == {"generations": len(lines), "ok": len(lines)}
    again = generate_run(open_release(small_release), tmp_path / "run", settings, progress=False)
    assert again.written == 0 and again.resumed == len(lines) and len(_lines(tmp_path / "run")) == len(lines)


def test_a_torn_last_line_is_redone_and_a_corrupt_line_is_named(small_release, tmp_path):
    run = tmp_path / "run"
    settings = _baseline(task="next_cell", model="common-cell", contexts=("none",), limit=6)
    generate_run(open_release(small_release), run, settings, progress=False)
    path = run / "generations.jsonl"
    whole = path.read_text()
    path.write_text(whole[: len(whole) - 40])  # the process died inside the last write
    report = generate_run(open_release(small_release), run, settings, progress=False)
    assert report.torn_line_dropped and report.written == 1 and path.read_text() == whole
    lines = whole.splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + '{"id": "x", "task\n' + "".join(lines[3:]))
    with pytest.raises(InputError, match=r"generations.jsonl:3: not JSON"):
        generate_run(open_release(small_release), run, settings, progress=False)
    assert path.read_text().count("\n") == len(lines)  # left as it was
    path.write_text("".join(lines) + lines[1])
    with pytest.raises(RunFolderError, match=rf"generations.jsonl:{len(lines) + 1}: example .* was already given on "
                                             r"line 2"):
        generate_run(open_release(small_release), run, settings, progress=False)


def test_a_run_folder_refuses_other_settings_and_another_release(small_release, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["generate", "--release", str(small_release), "--task", "next_cell", "--backend", "baseline",
            "--context", "none", "variables", "--limit", "4", "-o", str(run), "--json"]
    assert main(args + ["--model", "previous-cell"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 8
    assert main(args + ["--model", "common-cell"]) == 2
    assert 'written with model = "previous-cell", this run has "common-cell"' in capsys.readouterr().err
    assert main(args + ["--model", "previous-cell", "--seed", "3"]) == 2
    assert "written with sampling" in capsys.readouterr().err
    # refused before any model loads (this one could not load at all)
    other = [a if a != "baseline" else "transformers" for a in args]
    assert main(other + ["--model", str(tmp_path / "no-such-model")]) == 2
    assert 'written with backend = "baseline", this run has "transformers"' in capsys.readouterr().err
    meta = json.loads((run / "run.json").read_text())
    meta["release"]["content_hash"] = "0" * 64
    (run / "run.json").write_text(json.dumps(meta))
    assert main(args + ["--model", "previous-cell"]) == 2
    assert "written against another release (content hash 0000" in capsys.readouterr().err
    assert len(_lines(run)) == 8


def test_bad_input_is_named(small_release, tmp_path, capsys):
    base = ["generate", "--release", str(small_release), "--task", "next_cell", "-o", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as exited:  # --backend's choices are the registry's (BACKENDS)
        main(base + ["--backend", "llamacpp", "--model", "m"])
    assert exited.value.code == 2 and "invalid choice: 'llamacpp'" in capsys.readouterr().err
    assert main(base + ["--backend", "baseline", "--model", "last-repr"]) == 2
    assert "does not apply to next_cell" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse's own refusal of a name outside --context's choices
        main(base + ["--backend", "baseline", "--model", "previous-cell", "--context", "vars"])
    assert exited.value.code == 2 and "invalid choice: 'vars'" in capsys.readouterr().err
    with pytest.raises(ExampleSpecError, match="context modes must be distinct names from none, variables, full"):
        ExampleSpec(tasks=("next_cell",), contexts=("none", "none"))
    assert main(base + ["--backend", "transformers", "--model", str(tmp_path / "no-such-model")]) == 2
    assert "cannot load model" in capsys.readouterr().err
    lacking = tmp_path / "lacking"
    shutil.copytree(small_release, lacking)
    (lacking / "output_prediction" / "test-00000-of-00001.parquet").unlink()
    with pytest.raises(ReleaseError, match="has no output_prediction test split"):
        generate_run(open_release(lacking), tmp_path / "r2", _baseline(), progress=False)
    with (lacking / "next_cell" / "test-00000-of-00001.parquet").open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ReleaseError, match="changed since the release was built"):
        generate_run(open_release(lacking), tmp_path / "r3", _baseline(task="next_cell", model="previous-cell"), progress=False)
    assert not (tmp_path / "r").exists()


def test_a_context_mode_needs_the_snapshots_the_release_has(tmp_path):
    rows = rows_of(make_steps("k1", 20), make_steps("k2", 20))
    for row in rows:
        row["variables"] = []
    release = tmp_path / "no-snapshots"
    build_release(rows, release, TaskSettings(test_fraction=1.0))
    with pytest.raises(ReleaseError, match="context mode variables needs runtime snapshots"):
        generate_run(open_release(release), tmp_path / "r", _baseline(task="next_cell", model="previous-cell"), progress=False)
    report = generate_run(open_release(release), tmp_path / "r", _baseline(task="next_cell", model="previous-cell",
                                                             contexts=("none",)), progress=False)
    assert report.counts["ok"] == len(_ids(release, "next_cell"))


def test_prompts_over_budget_are_recorded_as_skipped(small_release, tmp_path):
    settings = _baseline(contexts=("none", "full"), limit=3, max_prompt_tokens=60)
    report = generate_run(open_release(small_release), tmp_path / "run", settings, progress=False)
    assert report.counts == {"generations": 6, "skipped": 6}
    for record in _lines(tmp_path / "run"):
        assert record["status"] == "skipped" and "over budget" in record["reason"] and record["prediction"] == ""
        assert record["tokens_in"] > 60


def test_a_transformers_run_extracts_answers_and_records_the_model(small_release, tiny_model_dir, tmp_path):
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("none", "full"), limit=2),
                           backend="transformers", model=str(tiny_model_dir), sampling=Sampling(max_new_tokens=6),
                           backend_options={"device": "cpu", "dtype": "bfloat16"})
    report = generate_run(open_release(small_release), tmp_path / "run", settings, progress=False)
    lines = _lines(tmp_path / "run")
    assert len(lines) == 4 and all(r["status"] == "ok" and r["tokens_out"] for r in lines)
    assert all(r["prediction"] == extract_answer(r["raw"], "next_cell") for r in lines)
    run = report.run
    assert len(run["weights_sha256"]) == 64 and run["backend_version"] and run["tokens_in"] > 0
    assert run["generations_per_s"] > 0 and run["packages"]["transformers"]
    # the number format asked for, and the one the model ran in
    assert run["backend_options"]["dtype"] == "bfloat16" and run["backend_info"]["dtype"] == "bfloat16"


def _generate(release: Path, model: Path, run: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "themisto.cli", "generate", "--release", str(release), "--task", "next_cell",
               "--context", "none", "variables", "full", "--backend", "transformers", "--model", str(model),
               "--device", "cpu", "--n", "2", "--temperature", "0.8", "--max-new-tokens", "8", "--limit", "4",
               "--batch-size", "1", "-o", str(run), "--json"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})


def _wait_for_lines(run: Path, proc: subprocess.Popen, at_least: int, timeout_s: float = 120) -> int:
    path, deadline = run / "generations.jsonl", time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        count = path.read_bytes().count(b"\n") if path.exists() else 0
        if count >= at_least:
            return count
        time.sleep(0.05)
    pytest.fail(f"generate wrote fewer than {at_least} lines (exit {proc.poll()}): {proc.stderr.read()[-2000:]}")


@pytest.mark.slow
def test_ctrl_c_and_kill_9_then_the_same_command_gives_exactly_one_record_each(small_release, tiny_model_dir,
                                                                               tmp_path):
    run = tmp_path / "run"
    first = _generate(small_release, tiny_model_dir, run)
    _wait_for_lines(run, first, 2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130 and "rerun the same command to resume" in err
    interrupted = len(_lines(run))
    second = _generate(small_release, tiny_model_dir, run)
    seen = _wait_for_lines(run, second, len(_lines(run)) + 4)
    second.send_signal(signal.SIGKILL)
    second.wait(timeout=30)
    assert second.returncode == -signal.SIGKILL
    before = len(_lines_tolerant(run))
    assert seen <= before < 4 * 3 * 2  # killed mid-run
    third = _generate(small_release, tiny_model_dir, run)
    out, err = third.communicate(timeout=300)
    assert third.returncode == 0, err
    summary = json.loads(out)
    lines = _lines(run)
    keys = Counter((r["id"], r["context"], r["sample"]) for r in lines)
    assert len(keys) == 4 * 3 * 2 and set(keys.values()) == {1}
    assert summary["resumed"] == before and summary["written"] == 24 - before
    assert json.loads((run / "run.json").read_text())["finished"]
    print(f"Ctrl-C after {interrupted} lines (exit 130); kill -9 after {before} lines; rerun wrote {summary['written']},"
          f" resumed {summary['resumed']}: {len(keys)} records, each (example, context, sample) once")


def _lines_tolerant(run: Path) -> list[str]:
    """Complete lines only: a SIGKILL may land inside a write."""
    return (run / "generations.jsonl").read_text().split("\n")[:-1]
