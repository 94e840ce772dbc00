"""The run folder has one owner (themisto/generation/run_folder.py): generation writes it, and scoring and the
leaderboard read it through the same code; a generation line has one schema (`Generation`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from _leaderboard import write_run
from themisto.generation.run_folder import (GENERATIONS_FILE, RECORD_KEYS, RUN_FILE, Generation, RunFolderError,
                                            read_generations, read_run, read_run_json)
from themisto.scoring.run_scores import score_run
from themisto.release.folder import open_release

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(tmp_path, small_release):
    return write_run(tmp_path / "run", small_release)


def test_a_line_has_one_schema_written_and_read_back(run):
    meta = read_run_json(run)
    lines = [json.loads(line) for line in (run / GENERATIONS_FILE).read_text().splitlines()]
    assert all(tuple(line) == RECORD_KEYS for line in lines)  # generation writes exactly the record's fields
    # The line format the README documents: where the line belongs first, then what the backend gave.
    assert RECORD_KEYS == ("id", "task", "context", "sample", "prediction", "raw", "status", "reason", "tokens_in",
                           "tokens_out", "kept", "probes")
    for number, line in enumerate(lines, start=1):
        record = Generation.from_line(line, f"line {number}", meta)
        assert record.to_dict() == line
    found = read_generations(run, meta)
    assert list(found.records.values()) == [Generation(**line) for line in lines]


def test_a_field_of_the_record_is_read_checked_and_written_with_no_other_edit():
    # A subclass stands for one edit to Generation: a new field is written by to_dict and read by from_line.
    Kept = dataclasses.make_dataclass("Kept", [("kept_cells", int | None, dataclasses.field(default=None))],
                                      bases=(Generation,), frozen=True)
    meta = {"task": "next_cell", "contexts": ["none"], "sampling": {"n": 1}}
    line = Kept(id="k/1", task="next_cell", context="none", kept_cells=3).to_dict()
    assert list(line)[-1] == "kept_cells" and Kept.from_line(line, "x", meta).kept_cells == 3


def test_scoring_a_run_writes_no_scorer_input_file(run, small_release):
    score_run(run, release=open_release(small_release), progress=lambda message: None)
    assert sorted(p.name for p in run.iterdir()) == ["generations.jsonl", "results.json", "results.md", "run.json",
                                                     "scorer_records.json"]


def test_the_reader_refuses_what_it_cannot_use(run):
    meta = json.loads((run / RUN_FILE).read_text())
    (run / RUN_FILE).write_text(json.dumps({**meta, "sampling": {"n": 0}}))
    with pytest.raises(RunFolderError, match=r"run.json: sampling.n 0, expected a positive integer"):
        read_run(run)
    (run / RUN_FILE).write_text(json.dumps({**meta, "release": {}}))
    with pytest.raises(RunFolderError, match=r"release.content_hash missing"):
        read_run(run)
    (run / RUN_FILE).write_text(json.dumps(meta))
    lines = (run / GENERATIONS_FILE).read_text().splitlines()
    line = json.loads(lines[1])
    (run / GENERATIONS_FILE).write_text("\n".join([lines[0], json.dumps({**line, "tokens_in": "many"})]) + "\n")
    with pytest.raises(RunFolderError, match=r"generations.jsonl:2: example .*: `tokens_in` must be an integer"):
        read_run(run)


@pytest.mark.parametrize("module", ["scoring/run_scores.py", "leaderboard/submission.py", "generation/runs.py"])
def test_run_folder_readers_read_through_the_owner(module):
    source = (REPO / "themisto" / module).read_text(encoding="utf-8")
    assert "themisto.generation.run_folder" in source
    found = re.findall(r"json\.loads\(|\.readline\(|open\(|GENERATION_KEYS|class Generation\b", source)
    assert not found, f"{module} reads a run folder itself: {found}"
    assert not (REPO / "themisto" / "scoring" / "run_files.py").exists()
