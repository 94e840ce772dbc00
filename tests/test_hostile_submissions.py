"""Hostile submissions (issue 23): every file a submission brings is read within bounds, so one hostile file costs
only its own submission. For each case the board is still written with the valid submission on it and the hostile
one refused, naming its file and bound; `themisto leaderboard`, `themisto submit` and `themisto score RUN/` exit 2
with one line for it, and nothing raises (in particular no RecursionError from Python's recursive JSON decoder).
The alias bombs in a release's card and eval.yaml are in tests/test_release_folder.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _leaderboard import write_run
from themisto.cli import main

DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB, far under every size bound: the case


def _nested_run_json(run: Path) -> None:
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "backend_info": "X"}).replace('"X"', DEEP))


def _nested_generation_line(run: Path) -> None:
    lines = (run / "generations.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"reason": null', '"reason": ' + DEEP)
    (run / "generations.jsonl").write_text("\n".join(lines) + "\n")


def _nested_submission_json(run: Path) -> None:
    (run / "submission.json").write_text('{"submitter": "x", "link": ' + DEEP[:10_000] + DEEP[-10_000:] + "}")


def _millions_of_short_lines(run: Path) -> None:
    with (run / "generations.jsonl").open("a") as fh:
        fh.write("{}\n" * 3_000_000)


def _many_megabytes_of_run_json(run: Path) -> None:
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "notes": "x" * (8 << 20)}))


def _a_link_to_a_folder_inside(run: Path) -> None:
    (run / "elsewhere").symlink_to(run.parent.parent, target_is_directory=True)


# (change, the file it is named by, the bound or reason, whether `themisto score RUN/` reads that file)
CASES = {
    "nested_run_json": (_nested_run_json, "run.json:1", "nested deeper than 16 levels (bound: depth)", True),
    "nested_generation_line": (_nested_generation_line, "generations.jsonl:3",
                               "nested deeper than 16 levels (bound: depth)", True),
    "nested_submission_json": (_nested_submission_json, "submission.json:1",
                               "nested deeper than 4 levels (bound: depth)", False),
    "millions_of_short_lines": (_millions_of_short_lines, "generations.jsonl:", "(bound: lines)", True),
    "many_megabytes_of_run_json": (_many_megabytes_of_run_json, "run.json: ",
                                   "more than 1,048,576 (bound: file_bytes)", True),
    "a_link_to_a_folder_inside": (_a_link_to_a_folder_inside, "elsewhere: ", "not a plain file (a link or a folder)",
                                  False),
}


@pytest.fixture(scope="module")
def valid(tmp_path_factory, small_release) -> Path:
    return write_run(tmp_path_factory.mktemp("valid") / "valid", small_release, model="org/valid")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("board-cache")  # the valid run is scored once, then read from the cache


def _board(submissions: Path, small_release: Path, out: Path, cache: Path, capsys) -> tuple[int, dict, list[str]]:
    if (out / "cache").exists() or out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "cache").symlink_to(cache, target_is_directory=True)
    code = main(["leaderboard", str(submissions), "--release", str(small_release), "-o", str(out)])
    printed = capsys.readouterr()
    return code, json.loads((out / "leaderboard.json").read_text()), printed.out.splitlines()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_submission_costs_only_itself(case, valid, cache, small_release, tmp_path, capsys):
    change, file, bound, scored = CASES[case]
    submissions = tmp_path / "submissions"
    shutil.copytree(valid, submissions / "valid")
    hostile = write_run(submissions / "hostile", small_release, model="org/hostile")
    change(hostile)

    code, data, out = _board(submissions, small_release, tmp_path / "board", cache, capsys)
    assert code == 2  # the board is written, and the exit status says a submission was refused
    assert [s["model"] for s in data["submissions"]] == ["org/valid"]
    (refused,) = data["refused"]
    assert refused["folder"] == "hostile" and refused["reason"].startswith(f"hostile/{file}")
    assert bound in refused["reason"] and str(tmp_path) not in json.dumps(data)
    assert [line for line in out if line.startswith("refused: ")] == [f"refused: {refused['reason']}"]

    assert main(["submit", str(hostile), "--release", str(small_release), "--to-dir", str(tmp_path / "to")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"themisto submit: error: {hostile}/{file}") and bound in err[0]
    assert not (tmp_path / "to").exists()
    if scored:
        assert main(["score", str(hostile)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"themisto score: error: {hostile}/{file}") and bound in err[0]
        assert not (hostile / "results.json").exists()


def test_a_submission_folder_that_is_a_link_is_refused_unread(valid, cache, small_release, tmp_path, capsys):
    submissions = tmp_path / "submissions"
    shutil.copytree(valid, submissions / "valid")
    private = write_run(tmp_path / "private" / "run", small_release, model="org/private")
    (submissions / "linked").symlink_to(private, target_is_directory=True)
    (submissions / "deeper").mkdir()
    (submissions / "deeper" / "linked").symlink_to(private.parent, target_is_directory=True)

    code, data, out = _board(submissions, small_release, tmp_path / "board", cache, capsys)
    assert code == 2 and [s["model"] for s in data["submissions"]] == ["org/valid"]
    assert sorted((r["folder"], r["reason"]) for r in data["refused"]) == [
        ("deeper/linked", "deeper/linked: a link to a folder, not followed (a submission is a folder of plain files)"),
        ("linked", "linked: a link to a folder, not followed (a submission is a folder of plain files)")]
    assert "org/private" not in json.dumps(data)
    code, data, _ = _board(submissions / "linked", small_release, tmp_path / "board", cache, capsys)
    assert code == 2 and data["refused"] == [{"folder": "linked", "reason": "linked: a link, not followed (a "
                                                                            "submission is a folder of plain files)"}]
