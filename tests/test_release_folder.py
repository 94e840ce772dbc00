"""The release folder has one owner (themisto/release/folder.py): every stage opens a release through it, each
Parquet file's sha256 is checked when the release is opened and again on every read, and its JSON and YAML are
read within bounds (an alias bomb in the card or eval.yaml is refused, never expanded)."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest
from test_bounded import BILLION_LAUGHS

from themisto.bounded import BoundError
from themisto.cli import main
from themisto.release.check import check_release
from themisto.release.eval_yaml import EvalYamlError, read_eval_yaml
from themisto.release.folder import (BUILD_FILE, CARD_FILE, EVAL_FILE, ReleaseError, content_hash, open_release,
                                     parquet_name, read_card)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def release(small_release, tmp_path) -> Path:
    copy = tmp_path / "release"
    shutil.copytree(small_release, copy)
    return copy


def test_a_release_opens_with_its_build_and_its_ids(small_release):
    info = open_release(small_release)
    build = json.loads((small_release / BUILD_FILE).read_text())
    assert info.content_hash == build["content_sha256"] == content_hash(build["files"])
    assert info.splits("next_cell") == ["test"] and info.has("trajectories", "test")  # every step in test
    ids = info.ids("next_cell")
    assert len(ids) == len(set(ids)) == build["sizes"]["next_cell"]["test"]
    assert [row["id"] for row in info.rows("next_cell", columns=["id"])] == list(ids)
    with pytest.raises(ReleaseError, match=r"has no no_such_task test split \(it has: next_cell, next_cell_prompts, "
                                           r"output_prediction,"):
        info.rows("no_such_task")


def test_a_changed_or_foreign_parquet_file_is_refused_at_open(release):
    kept = (release / parquet_name("output_prediction", "test")).read_bytes()
    (release / parquet_name("output_prediction", "test")).write_bytes(b"PAR1 not what the build wrote")
    with pytest.raises(ReleaseError, match=r"output_prediction/test-00000-of-00001.parquet: changed since the "
                                           r"release was built"):
        open_release(release)
    (release / parquet_name("output_prediction", "test")).write_bytes(kept)
    open_release(release)
    (release / "extra").mkdir()
    shutil.copy(release / parquet_name("next_cell", "test"), release / "extra" / "more.parquet")
    with pytest.raises(ReleaseError, match=r"extra/more.parquet: a Parquet file the build did not write"):
        open_release(release)


def test_every_read_checks_the_file_again(release):
    info = open_release(release)
    before = info.rows("next_cell")
    path = release / parquet_name("next_cell", "test")
    path.write_bytes(path.read_bytes() + b"\0")  # changed after the release was opened
    with pytest.raises(ReleaseError, match="changed since the release was built"):
        info.rows("next_cell")
    assert before  # what was read before came from the file as built


def test_a_removed_file_changes_the_content_hash(release):
    whole = open_release(release).content_hash
    (release / parquet_name("output_prediction", "test")).unlink()
    part = open_release(release)
    assert part.content_hash != whole and not part.has("output_prediction", "test")


def test_a_handle_crosses_a_process_as_its_path_and_hash_and_reopens_without_hashing(release, monkeypatch):
    import pickle

    from themisto.release import folder

    info = open_release(release)
    info.task_rows("next_cell")  # a view read here does not travel
    sent = pickle.dumps(info)
    assert len(sent) < 1_000 and b"next_cell" not in sent  # no rows, no file list: the path and the hash

    def no_hashing(path):
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(folder, "sha256_file", no_hashing)
    again = pickle.loads(sent)
    assert (again.path, again.files, again.content_hash) == (info.path, info.files, info.content_hash)
    assert again.task_rows("next_cell") == info.task_rows("next_cell")
    # The folder changed between the two sides: a file removed changes the content hash, and is refused.
    (release / parquet_name("output_prediction", "test")).unlink()
    with pytest.raises(ReleaseError, match="changed since it was opened"):
        pickle.loads(sent)


def test_the_views_are_read_once_and_shared(release, monkeypatch):
    from themisto.release import folder

    info = open_release(release)
    reads = []
    real = folder.read_parquet
    monkeypatch.setattr(folder, "read_parquet", lambda path, *a, **k: reads.append(path.name) or real(path, *a, **k))
    assert info.task_rows("next_cell") is info.task_rows("next_cell")
    assert info.trajectories_by_kernel() is info.trajectories_by_kernel()
    assert info.values() is info.values() and info.values().rows == {}  # the small release stores no values
    assert len(reads) == 2  # next_cell's test split and trajectories' (no values file to read)
    kernel = next(iter(info.trajectories_by_kernel()))
    assert [r["step"] for r in info.trajectory(kernel)] == sorted(r["step"] for r in info.trajectory(kernel))
    with pytest.raises(ReleaseError, match="no trajectories rows for nobody"):
        info.trajectory("nobody")


def test_a_build_report_nested_too_deep_or_of_another_shape_is_refused(release):
    (release / BUILD_FILE).write_text('{"files": ' + "[" * 10_000 + "]" * 10_000 + "}")
    with pytest.raises(ReleaseError, match=rf"{BUILD_FILE}:1: nested deeper than 32 levels \(bound: depth\)"):
        open_release(release)
    (release / BUILD_FILE).write_text(json.dumps({"files": [], "sizes": {}, "content_sha256": "x", "settings": {},
                                                  "source": {}, "tasks": {}}))
    with pytest.raises(ReleaseError, match=rf"{BUILD_FILE}: not a build report \(wrong type of files\)"):
        open_release(release)
    (release / BUILD_FILE).unlink()
    with pytest.raises(ReleaseError, match=f"not a release folder \\(no {BUILD_FILE}\\)"):
        open_release(release)


def test_a_results_table_goes_into_the_card_and_a_rerun_replaces_it(release, capsys):
    from themisto.release.card import RESULTS_NONE, write_results

    card = release / CARD_FILE
    before = open_release(release).content_hash
    assert RESULTS_NONE in card.read_text()
    write_results(release, "| metric | score |\n| --- | --- |\n| exact_match | 0.25 |")
    write_results(release, "| metric | score |\n| --- | --- |\n| exact_match | 0.5 |")
    text = card.read_text()
    assert "| exact_match | 0.5 |" in text and "0.25" not in text and RESULTS_NONE not in text
    assert text.count("## Results") == 1 and open_release(release).content_hash == before
    assert main(["check", str(release)]) == 0
    card.write_text(text.replace("<!-- results: end -->", ""))
    with pytest.raises(ReleaseError, match="README.md: no results section"):
        write_results(release, "| x |")


def test_an_alias_bomb_in_the_card_is_refused_and_named(release, capsys):
    text = (release / CARD_FILE).read_text()
    (release / CARD_FILE).write_text("---\n" + BILLION_LAUGHS + text.split("---\n", 2)[1] + "---\n"
                                     + text.split("---\n", 2)[2])
    with pytest.raises(BoundError, match=rf"{CARD_FILE}:2: an anchor or alias"):
        read_card(release)
    assert main(["check", str(release)]) == 1
    out = capsys.readouterr().out
    assert f"problem: {release / CARD_FILE}:2: an anchor or alias" in out and "Traceback" not in out


def test_an_alias_bomb_in_eval_yaml_is_refused_and_named(release, capsys):
    (release / EVAL_FILE).write_text(BILLION_LAUGHS)
    with pytest.raises(EvalYamlError, match=rf"{EVAL_FILE}:1: an anchor or alias"):
        read_eval_yaml(release)
    assert [p for p in check_release(release).problems if "anchor or alias" in p] == [
        f"{release / EVAL_FILE}:1: an anchor or alias (& or *): refused, since aliases can expand exponentially "
        "(\"billion laughs\")"]
    (release / EVAL_FILE).write_text("tasks: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(EvalYamlError, match=r"nested deeper than 32 levels"):
        read_eval_yaml(release)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_the_card_no_longer_imports_the_parquet_writer():
    release = REPO / "themisto" / "release"
    assert "themisto.release.parquet" not in _imports(release / "card.py")
    assert "themisto.release.card" in _imports(release / "parquet.py")


@pytest.mark.parametrize("module", ["generation/release_rows.py", "scoring/release_state.py",
                                    "leaderboard/submission.py", "release/check.py", "generation/run_folder.py",
                                    "training/export.py"])
def test_release_readers_read_through_the_owner(module):
    source = (REPO / "themisto" / module).read_text(encoding="utf-8")
    assert "themisto.release.folder" in source
    found = re.findall(r'/ (?:BUILD_FILE|README|CARD_FILE|EVAL_FILE)\)\.read|split_card\(|read_table\(|'
                       r'yaml\.safe_load\(|rglob\("\*\.parquet"\)', source)
    assert not found, f"{module} reads a release itself: {found}"
