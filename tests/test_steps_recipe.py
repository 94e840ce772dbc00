"""The steps file records the recipe of the inputs it was replayed over, so `build --steps` and scoring make them
again without being told: replay a sample log, build from its steps, generate, and score with execution, no
workspace given anywhere. A steps file made before it had a header still builds, and scoring then asks for the
folder; a given folder is recorded by its hash, and a different one is refused."""

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from themisto.cli import main
from themisto.replay.steps_file import STEPS_HEADER, read_steps, read_steps_header
from themisto.replay.values import values_folder
from themisto.replay.workspace_recipe import RecipeError, given, workspace_from_recipe

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "2851258b-9d31-4a50-b2ec-a96ac55e075c.log"
LINES = 60  # the log's first executions: reading the look-alike pickles, then working on them


def _generate(release: Path, run: Path) -> None:
    assert main(["generate", "--release", str(release), "--task", "next_cell", "--context", "none", "--backend",
                 "baseline", "--model", "previous-cell", "--limit", "4", "-o", str(run)]) == 0


def test_replay_build_generate_and_score_need_no_workspace(tmp_path, allow_execution, capsys):
    log = tmp_path / SAMPLE.name
    log.write_bytes(b"".join(SAMPLE.read_bytes().splitlines(keepends=True)[:LINES]))
    steps = tmp_path / "steps.jsonl"
    # Seed 3, not the default 0: scoring must take the seed from the recipe, or its states differ from the replay's.
    assert main(["replay", str(log), "-o", str(steps), "--workspace-seed", "3", "--json"]) == 0
    recipe = {"look_alike_seed": 3, "size": "small", "tasks": ["task1", "task2"]}
    header = read_steps_header(steps)
    assert header["workspace"] == recipe and header["replay"]["cell_timeout_s"] == 120.0
    assert header["replay"]["cores"] == 1  # scoring replays on one core a kernel too
    assert len(read_steps(steps)) == len(steps.read_text().splitlines()) - 1  # the header is no step
    release = tmp_path / "release"
    assert main(["build", "--steps", str(steps), "--test-fraction", "1.0", "-o", str(release), "--json"]) == 0
    build = json.loads((release / "themisto_build.json").read_text())
    assert build["source"]["workspace"] == recipe and build["settings"]["replay"] == header["replay"]
    run = tmp_path / "run"
    _generate(release, run)
    capsys.readouterr()
    assert main(["score", str(run), "--execute"]) == 0, capsys.readouterr().err
    results = json.loads((run / "results.json").read_text())
    assert results["executed"] is True and results["counts"]["execution"] == {"scored": 4}
    examples = json.loads((run / "scorer_records.json").read_text())["examples"]
    # The data read from the inputs is what the replay read (a class whose lazy caches fitting filled may differ).
    assert [e["state_verified"] for e in examples[:3]] == [True] * 3
    assert not any({"data", "train", "val"} & set(e["state_differences"]) for e in examples)

    # A steps file made before steps files had a header: it builds the same rows, and scoring asks for the folder.
    old = tmp_path / "old.steps.jsonl"
    old.write_text("".join(steps.read_text().splitlines(keepends=True)[1:]))
    assert read_steps_header(old) == {} and read_steps(old) == read_steps(steps)
    shutil.copytree(values_folder(steps), values_folder(old))  # its values beside it, as the replay left them
    old_release = tmp_path / "old-release"
    assert main(["build", "--steps", str(old), "--test-fraction", "1.0", "-o", str(old_release)]) == 0
    for parquet in release.rglob("*.parquet"):  # the same rows; only the trajectories' rebuild records differ
        new_rows, old_rows = (pq.read_table(folder / parquet.relative_to(release)).to_pylist()
                              for folder in (release, old_release))
        assert [dict(r, rebuild=None) for r in old_rows] == [dict(r, rebuild=None) for r in new_rows]
        for row in old_rows:  # a steps file that does not say its inputs: a folder to be given, its hash unknown
            assert row.get("rebuild") is None or (row["rebuild"]["workspace_kind"], row["rebuild"]["files_sha256"]) \
                == ("given", None)
    old_run = tmp_path / "old-run"
    _generate(old_release, old_run)
    capsys.readouterr()
    assert main(["score", str(old_run), "--execute"]) == 2
    assert "does not record the workspace it was replayed over" in capsys.readouterr().err


def test_a_given_folder_is_recorded_by_its_hash_and_a_different_one_is_refused(tmp_path):
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "data.csv").write_text("a,b\n1,2\n")
    recipe = given(folder)
    assert recipe["given"] == "inputs" and len(recipe["files_sha256"]) == 64
    copy = tmp_path / "elsewhere" / "inputs"
    shutil.copytree(folder, copy)
    assert workspace_from_recipe(recipe, copy, tmp_path / "unused", what="the release r") == copy
    (copy / "data.csv").write_text("a,b\n1,3\n")
    with pytest.raises(RecipeError, match="its files differ from those the release r was replayed over"):
        workspace_from_recipe(recipe, copy, tmp_path / "unused", what="the release r")
    with pytest.raises(RecipeError, match="replayed over a given workspace .*inputs.*pass that folder"):
        workspace_from_recipe(recipe, None, tmp_path / "unused", what="the release r")
    assert workspace_from_recipe(given(None), None, tmp_path / "empty", what="r") == tmp_path / "empty"
    assert not any((tmp_path / "empty").iterdir())


def test_a_malformed_header_is_named(tmp_path):
    steps = tmp_path / "steps.jsonl"
    steps.write_text(json.dumps({STEPS_HEADER: {"workspace": "seed 0"}}) + "\n")
    with pytest.raises(ValueError, match=r"steps.jsonl:1: a malformed steps header"):
        read_steps_header(steps)
