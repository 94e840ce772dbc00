"""Execution for sessions from public repositories: a release built from a corpus written here by hand (two
repositories, one session each, nothing of the real corpus) records how to rebuild each trajectory's states, and its
predictions run in the developer's own files, started where the session was; a repository whose folder moved or
changed costs only its own rows, which are scored by text only and counted by reason."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from _planted_corpus import write_history
from themisto.cli import main

# Repository "alpha": its session matches the notebook in work/ and reads data beside it; "beta": a session at the top.
ALPHA = ["import csv", "rows = list(csv.reader(open('data/values.csv')))", "header = rows[0]",
         "total = sum(int(r[1]) for r in rows[1:])", "print(total)", "names = sorted(r[0] for r in rows[1:])",
         "print(names)", "count = len(names)", "print(count * 2)", "label = header[0].upper()", "print(label)",
         "print(total + count)"]
BETA = ["text = open('numbers.txt').read()", "values = [int(x) for x in text.split()]", "print(sum(values))",
        "largest = max(values)", "print(largest)", "values.append(largest + 1)", "print(len(values))",
        "half = [v / 2 for v in values]", "print(half[:3])", "small = min(values)", "print(small)",
        "print(largest - small)"]


def _repo(root: Path, name: str, session: list[str], files: dict[str, str]) -> Path:
    folder = root / "repos" / f"handwritten+{name}"
    (folder / "history").mkdir(parents=True)
    for path, text in files.items():
        (folder / "files" / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / "files" / path).write_text(text)
    (folder / "repo.json").write_text(json.dumps({"repo": f"handwritten/{name}", "commit": "1" * 40,
                                                  "licence": "LICENSE:MIT", "tree": [[p, 1] for p in files]}))
    write_history(folder / "history" / "history.sqlite", {1: session})
    return folder


def _notebook(cells: list[str]) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": c}
        for i, c in enumerate(cells)]})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The hand-written corpus, and the release `themisto build` makes of it (every row in test)."""
    root = tmp_path_factory.mktemp("handwritten-corpus")
    _repo(root, "alpha", ALPHA, {"work/data/values.csv": "name,count\nb,2\na,1\nc,3\n",
                                 "work/analysis.ipynb": _notebook(ALPHA[:5])})
    _repo(root, "beta", BETA, {"numbers.txt": "4 8 15 16 23 42\n"})
    release = tmp_path_factory.mktemp("handwritten-release") / "release"
    assert main(["build", str(root), "-o", str(release), "--min-inputs", "10", "--test-fraction", "1.0",
                 "--no-values", "--json"]) == 0
    return root, release


def _previous_cells(release):
    """Every next_cell test row's id and its previous cell, the model-free baseline's prediction."""
    from themisto.release.folder import open_release

    info = open_release(release)
    rows = info.rows("next_cell", "test")
    return info, [r["id"] for r in rows], [r["history"][-1]["code"] if r["history"] else "" for r in rows], \
        [r["target"] for r in rows]


def _score(info, ids, predictions, references, sources=()):
    from themisto.release.workspaces import SourceFolders
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.scorer import score

    return score(predictions, references, ids=ids, settings=ScoreSettings(task="next_cell"), execute=True,
                 release=info, workspace=SourceFolders(sources=tuple(sources)), progress=lambda _: None)


def test_the_release_records_how_to_rebuild_each_trajectory_and_notes_its_sources_beside_it(built):
    from themisto.release.check import check_release
    from themisto.release.folder import open_release
    from themisto.release.workspaces import read_sources_note, sources_note

    root, release = built
    info = open_release(release)
    records = {rows[0]["rebuild"]["start_dir"]: rows[0]["rebuild"]
               for rows in info.trajectories_by_kernel().values()}
    assert set(records) == {"work", None}  # alpha started beside its notebook, beta at its repository's top
    for record in records.values():
        assert record["workspace_kind"] == "repository" and record["workspace"].startswith("ipython/r-")
        assert len(record["files_sha256"]) == 64 and record["environment"] == "wild"
        assert record["cell_timeout_s"] == 30.0 and record["hidden_modules"] == []
    # The host's folders are noted beside the release, never inside it (what is pushed).
    assert read_sources_note(release)["corpora"] == [str(root.resolve())]
    assert sources_note(release).parent == release.parent and check_release(release).ok
    assert str(root) not in (release / "themisto_build.json").read_text()


def test_predictions_run_in_each_sessions_own_files_where_it_started(built, allow_execution):
    _, release = built
    info, ids, predictions, references = _previous_cells(release)
    result = _score(info, ids, predictions, references)
    kernels = {e.kernel_id for e in result.examples}
    assert len(kernels) == 2 and len(ids) >= 10
    # Every reference ran as in the build (the session's reads resolved in its files): each example is judged.
    assert {e.status for e in result.examples} == {"scored"}, {e.id: e.reason for e in result.examples}
    assert all(e.state_verified is not False for e in result.examples)
    assert result.scores["text_only_examples"] == {"sources_missing": 0, "sources_changed": 0,
                                                   "environment_missing": 0}
    # Known answers: the developer's own cell does what it did; a previous cell here never prints the same.
    again = _score(info, ids, references, references)
    assert all(p.functional_match and p.continuation_match is not False for p in again.predictions)
    assert again.scores["functional_match"] == 1.0 and result.scores["functional_match"] < 1.0


@contextlib.contextmanager
def _beta_moved(root: Path, tmp_path: Path):
    """The second repository moved out of the corpus folder the build noted, to `tmp_path/moved/repos/`; put back
    (its file as planted) afterwards. Yields the folder that now holds it."""
    elsewhere = tmp_path / "moved"
    (elsewhere / "repos").mkdir(parents=True)
    beta = root / "repos" / "handwritten+beta"
    shutil.move(str(beta), elsewhere / "repos" / beta.name)
    try:
        yield elsewhere
    finally:
        shutil.rmtree(beta, ignore_errors=True)
        shutil.move(str(elsewhere / "repos" / beta.name), beta)
        (beta / "files" / "numbers.txt").write_text("4 8 15 16 23 42\n")


def test_a_moved_or_altered_repository_costs_only_its_own_rows(built, allow_execution, tmp_path):
    root, release = built
    info, ids, predictions, references = _previous_cells(release)
    with _beta_moved(root, tmp_path) as elsewhere:
        moved = _score(info, ids, predictions, references)
        by_kernel: dict[str, set] = {}
        for example in moved.examples:
            by_kernel.setdefault(example.kernel_id, set()).add((example.status, example.text_only_reason))
        assert sorted(map(sorted, by_kernel.values())) == [[("scored", "")], [("text_only", "sources_missing")]]
        beta_rows = sum(1 for e in moved.examples if e.text_only_reason)
        assert beta_rows and moved.scores["text_only_examples"]["sources_missing"] == beta_rows
        assert any("scored by text only" in note and "--sources" in note for note in moved.notes)
        # Named where it moved, it is executed again; changed there, it is refused by its hash.
        assert {e.status for e in _score(info, ids, predictions, references, [elsewhere]).examples} == {"scored"}
        (elsewhere / "repos" / "handwritten+beta" / "files" / "numbers.txt").write_text("1 2 3\n")
        altered = _score(info, ids, predictions, references, [elsewhere])
        reasons = {e.text_only_reason for e in altered.examples}
        assert reasons == {"", "sources_changed"}
        assert altered.scores["text_only_examples"]["sources_changed"] == beta_rows


def test_rows_scored_by_text_only_for_want_of_files_are_executed_by_the_run_that_names_them(built, allow_execution,
                                                                                          tmp_path):
    from themisto.release.workspaces import SourceFolders
    from themisto.scoring.records import ScoreSettings
    from themisto.scoring.scorer import score_texts_to_file

    root, release = built
    info, ids, predictions, _ = _previous_cells(release)
    out = tmp_path / "results.json"

    def run(sources=()):
        return score_texts_to_file(info, ids, predictions, out, ScoreSettings(task="next_cell"), execute=True,
                                   workspace=SourceFolders(sources=tuple(sources)), progress=lambda _: None)

    with _beta_moved(root, tmp_path) as elsewhere:
        first = run()
        text_only = {e.kernel_id for e in first.result.examples if e.status == "text_only"}
        assert len(text_only) == 1
        # The finished run's verdicts are reused, except the trajectory that lacked its files: named, it executes.
        second = run([elsewhere])
        assert set(second.resumed) == {e.kernel_id for e in first.result.examples} - text_only
        assert {e.status for e in second.result.examples} == {"scored"}
        assert second.result.scores["text_only_examples"]["sources_missing"] == 0


@pytest.mark.parametrize("held", ["no rebuild records", "an earlier way of hashing"])
def test_a_release_built_before_trajectories_recorded_how_to_rebuild_them_is_refused_with_how(built, tmp_path, held,
                                                                                               allow_execution):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from themisto.release.folder import BUILD_FILE, content_hash, open_release, sha256_file
    from themisto.scoring.records import ScoreError

    old = tmp_path / "old-release"
    shutil.copytree(built[1], old)
    report = json.loads((old / BUILD_FILE).read_text())
    for rel in [r for r in report["files"] if r.startswith("trajectories/")]:
        table = pq.read_table(old / rel)
        if held == "no rebuild records":  # as a release of 2026-12-06 held it
            table = table.drop(["rebuild"])
        else:  # as one of 2026-12-07 held it: rebuild records without the hashing scheme
            rows = table.to_pylist()
            for row in rows:
                row["rebuild"].pop("state_hashes")
            table = pa.Table.from_pylist(rows)
        pq.write_table(table, old / rel)
        report["files"][rel] = sha256_file(old / rel)
    report["content_sha256"] = content_hash(report["files"])
    (old / BUILD_FILE).write_text(json.dumps(report))
    info, ids, predictions, references = _previous_cells(old)
    why = (r"do not record how to rebuild their states" if held == "no rebuild records" else
           r"state hashes were made by an earlier way of hashing \(none recorded; this Themisto's is 20")
    with pytest.raises(ScoreError, match=why + r".* rebuild it with `themisto build` from the same inputs"):
        _score(info, ids[:1], predictions[:1], references[:1])
    assert open_release(old).content_hash == report["content_sha256"]  # a release that opens: only execution refuses


def test_the_inspect_probe_tool_serves_a_sessions_state_in_its_own_files(built, allow_execution):
    from themisto.gate import permit
    from themisto.generation.probe_protocol import ProbeSettings
    from themisto.harness.probe_tool import ServedState
    from themisto.release.folder import open_release
    from themisto.release.workspaces import SourceFolders

    info = open_release(built[1])
    alpha = next(k for k, rows in info.trajectories_by_kernel().items() if rows[0]["rebuild"]["start_dir"] == "work")
    tool = ServedState(permit(execute=True), info, alpha, 4, ProbeSettings(protocol="native"), SourceFolders())
    tool.start()
    try:
        assert tool.failure is None, tool.failure
        # The state before step 4 (total computed at step 3), in the folder the session started in.
        assert tool.probe("print(total, open('data/values.csv').read().split()[0])").output.strip() == "6 name,count"
    finally:
        tool.close()
