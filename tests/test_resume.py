"""The one resume scheme (themisto.resume) and its users: the scorer's partial file and header, replay's progress."""

import json

import pytest

from themisto.ingest.trajectory import Execution, Trajectory
from themisto.replay.replay import ReplaySettings
from themisto.replay.steps_file import read_steps, replay_to_file
from themisto.resume import ResumeError, folder_fingerprint, read_lines, settings_difference
from themisto.scoring import scorer as sc
from themisto.scoring.records import TrajectoryScore
from themisto.release.folder import open_release


def test_settings_difference_names_the_first_differing_setting():
    recorded = {"settings": {"k": [1], "timeout_s": 30}, "workspace": {"path": "/a", "files_sha256": "1"}}
    assert settings_difference(recorded, {"settings": {"k": (1,), "timeout_s": 30},
                                          "workspace": {"path": "/a", "files_sha256": "1"}}) is None
    changed = {"settings": {"k": [1], "timeout_s": 30}, "workspace": {"path": "/a", "files_sha256": "2"}}
    assert settings_difference(recorded, changed) == 'workspace.files_sha256 is "1" there, "2" here'
    assert settings_difference({}, {"continuation_cells": 3}) == "continuation_cells is unset there, 3 here"


def test_read_lines_cuts_a_torn_tail_and_names_a_corrupt_line(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": ')
    assert read_lines(path) == ([{"a": 1}, {"a": 2}], True)
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'  # cut, so the next line appends cleanly
    path.write_bytes(b'{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(ResumeError, match=r"out.jsonl:2: corrupt line"):
        read_lines(path)
    assert path.read_bytes() == b'{"a": 1}\nnot json\n{"a": 3}\n'  # left as it is


def test_folder_fingerprint_sees_input_changes_but_not_the_runs_own_files(tmp_path):
    (tmp_path / "input.csv").write_text("a\n1\n")
    before = folder_fingerprint(tmp_path, output=tmp_path / "steps.jsonl")
    for own in ("steps.jsonl.partial", "steps.jsonl.progress.json", ".steps.jsonl.progress.json.x1"):
        (tmp_path / own).write_text("{}")
    assert folder_fingerprint(tmp_path, output=tmp_path / "steps.jsonl") == before
    (tmp_path / "input.csv").write_text("a\n2\n")  # same size, other content
    assert folder_fingerprint(tmp_path, output=tmp_path / "steps.jsonl") != before
    elsewhere = tmp_path / "regenerated"  # the same inputs written again into a fresh folder: the same fingerprint
    elsewhere.mkdir()
    (elsewhere / "input.csv").write_text("a\n1\n")
    assert folder_fingerprint(elsewhere) == before


def _predictions(release_dir, path):
    loaded = open_release(release_dir)
    chosen = sorted(loaded.task_rows("next_cell"))[:3]
    path.write_text("".join(json.dumps({"id": i, "prediction": loaded.task_rows("next_cell")[i]["target"]}) + "\n"
                            for i in chosen))
    return path


def test_text_only_score_leaves_an_execute_runs_partial_file_alone(small_release, tmp_path):
    out = tmp_path / "results.json"
    partial = out.with_name(out.name + ".partial.jsonl")
    partial.write_text('{"settings": {}}\n{"kernel_id": "k", "examples": [], "predictions": []}\n')
    run = sc.score_to_file(open_release(small_release), _predictions(small_release, tmp_path / "p.jsonl"), out)
    assert run.result.scores["exact_match"] == 1.0 and out.exists()
    assert partial.read_text() == '{"settings": {}}\n{"kernel_id": "k", "examples": [], "predictions": []}\n'


def test_scorer_header_records_the_workspace_and_names_what_changed(small_release, tmp_path):
    one, two = tmp_path / "ws1", tmp_path / "ws2"
    for folder, text in ((one, "a\n"), (two, "b\n")):
        folder.mkdir()
        (folder / "input.csv").write_text(text)
    out = tmp_path / "results.json"
    settings = sc.ScoreSettings()
    header = sc.resume_header(open_release(small_release), ["k/5"], ["x"], settings, one, out)
    assert header["workspace"] == folder_fingerprint(one) and header["release_content_sha256"]
    partial = tmp_path / "partial.jsonl"
    finished = TrajectoryScore(kernel_id="kernel-0", examples=[], predictions=[])
    partial.write_text(json.dumps(header) + "\n" + json.dumps(finished.to_dict()) + "\n")
    said = []
    assert list(sc._load_partial(partial, header, said.append)) == ["kernel-0"]
    other = sc.resume_header(open_release(small_release), ["k/5"], ["x"], settings, two, out)
    assert sc._load_partial(partial, other, said.append) == {}
    assert "written by another run (workspace.files_sha256 is" in said[-1] and "starting over" in said[-1]
    changed = sc.resume_header(open_release(small_release), ["k/5"], ["x"], sc.ScoreSettings(continuation_cells=0), one, out)
    assert sc._load_partial(partial, changed, said.append) == {}
    assert "settings.continuation_cells is 3 there, 0 here" in said[-1]


@pytest.mark.slow
def test_replay_resume_redoes_when_settings_changed_and_says_which(tmp_path):
    out = tmp_path / "steps.jsonl"
    trajectories = [Trajectory(id=tid, notebook="nb.ipynb", source="test",
                               executions=[Execution(cell_id="c0", code=f"{tid} = 1", status="ok"),
                                           Execution(cell_id="c1", code=f"print({tid})", status="ok")])
                    for tid in ("first", "second")]

    def stop_in_second(message):
        if message.startswith("second"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        replay_to_file(trajectories, out, tmp_path, ReplaySettings(cell_timeout_s=5.0), progress=stop_in_second)
    said = []
    run = replay_to_file(trajectories, out, tmp_path, ReplaySettings(cell_timeout_s=6.0), progress=said.append)
    assert run.resumed == [] and run.replayed == ["first", "second"]
    assert any("settings.cell_timeout_s is 5.0 there, 6.0 here" in m for m in said), said
    assert [(s.kernel_id, s.step) for s in read_steps(out)] == [("first", 0), ("first", 1), ("second", 0),
                                                               ("second", 1)]


def test_a_whole_fingerprint_sees_a_change_in_a_large_files_middle_that_a_sampled_one_does_not(tmp_path):
    from themisto.resume import folder_fingerprint

    data = bytearray(range(256)) * 12_000  # 3 MiB: sampled, its first and last MiB are read
    (tmp_path / "big.bin").write_bytes(bytes(data))
    (tmp_path / "small.csv").write_text("a,b\n1,2\n")
    before = folder_fingerprint(tmp_path), folder_fingerprint(tmp_path, whole=True)
    data[1_500_000] ^= 1
    (tmp_path / "big.bin").write_bytes(bytes(data))
    assert folder_fingerprint(tmp_path) == before[0]  # a resume's identity, not a check against someone else's files
    assert folder_fingerprint(tmp_path, whole=True) != before[1]
    (tmp_path / "big.bin").unlink()
    assert folder_fingerprint(tmp_path) == folder_fingerprint(tmp_path, whole=True)  # small files: the same digest
