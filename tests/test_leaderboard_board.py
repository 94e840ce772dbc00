"""`themisto leaderboard` on a submissions folder over a release: re-scored (claims ignored), refusals with reasons,
the later of two same-model runs kept, scores cached by the predictions hash, baselines and hard-subset columns, every
file written, submitted strings escaped."""

import csv
import json

import pytest

from _leaderboard import HOSTILE_MODEL, board_submissions, write_run
from themisto.cli import main


@pytest.fixture(scope="module")
def board(tmp_path_factory, small_release):
    root = tmp_path_factory.mktemp("board")
    runs = board_submissions(root / "submissions", small_release)
    # One submission is refused ("missing"): the board is written all the same, and the exit status says so.
    assert main(["leaderboard", str(root / "submissions"), "--release", str(small_release), "-o",
                 str(root / "board")]) == 2
    data = json.loads((root / "board" / "leaderboard.json").read_text())
    return root / "board", data, runs


def _table(data, task, context):
    return next(t for t in data["tables"] if t["task"] == task and t["context"] == context)


def _row(table, model):
    (row,) = [r for r in table["rows"] if r["model"] == model]
    return row


def test_a_claimed_score_is_ignored_and_the_predictions_re_scored(board):
    _, data, runs = board
    for context in ("none", "variables"):
        assert _row(_table(data, "next_cell", context), "org/tampered")["values"]["exact_match/all"]["mean"] == 0.0
    (tampered,) = [s for s in data["submissions"] if s["model"] == "org/tampered"]
    assert tampered["ignored"] == ["results.json: claimed scores, ignored: the board re-scores the predictions"]


def test_an_invalid_submission_is_refused_with_its_reason_and_the_rest_stands(board):
    folder, data, runs = board
    (refused,) = data["refused"]
    # Named relative to the submissions folder: the maintainer's own paths stay off the public board.
    assert refused["folder"] == "missing" and str(runs["missing"].parent) not in json.dumps(data)
    assert refused["reason"].startswith("missing/generations.jsonl: 1 of ")
    assert "predictions missing, first: id" in refused["reason"]
    assert all(r["model"] != "org/missing" for t in data["tables"] for r in t["rows"])
    assert "## Refused" in (folder / "leaderboard.md").read_text()


def test_the_later_run_of_the_same_model_and_settings_replaces_the_earlier(board):
    _, data, runs = board
    assert data["notes"] == ["good replaces earlier: same model (org/good) and settings, the later one counts"]
    table = _table(data, "next_cell", "variables")
    assert [r["source"] for r in table["rows"] if r["model"] == "org/good"] == ["good"]
    # The kept run predicts every target with variables: rank 1, exact match 1, a positive paired effect.
    first = table["rows"][0]
    assert first["model"] == "org/good" and first["values"]["exact_match/all"]["mean"] == 1.0
    assert first["effect"]["diff"] > 0 and first["effect"]["low"] > 0


def test_baselines_are_rows_of_their_own_and_hard_subset_scores_sit_beside(board):
    _, data, _ = board
    for table in data["tables"]:
        kinds = {r["model"]: r["kind"] for r in table["rows"]}
        expected = {"next_cell": {"previous-cell", "common-cell"},
                    "output_prediction": {"previous-output", "last-repr"}}[table["task"]]
        assert {m for m, k in kinds.items() if k == "baseline"} == expected
        assert "exact_match/hard" in table["columns"] and "exact_match/all" in table["columns"]
    # The submitted previous-cell run is the baseline's row; the board's own copy is not shown twice.
    table = _table(data, "next_cell", "none")
    assert [r["source"] for r in table["rows"] if r["model"] == "previous-cell"] != ["computed by the board"]
    # No baseline solves a hard example, so a baseline's hard-subset exact match is 0.
    assert _row(table, "common-cell")["values"]["exact_match/hard"]["mean"] == 0.0


def test_skipped_generations_are_counted_per_context(board):
    folder, data, _ = board
    none, variables = _table(data, "next_cell", "none"), _table(data, "next_cell", "variables")
    n = _row(none, HOSTILE_MODEL)["values"]["exact_match/all"]["n"]
    assert _row(none, HOSTILE_MODEL)["answered"] == {"generations": n, "unanswered": 3}
    assert _row(variables, HOSTILE_MODEL)["answered"] == {"generations": n, "unanswered": 0}
    assert _row(none, "common-cell")["answered"] is None  # computed by the board, not submitted
    markdown = (folder / "leaderboard.md").read_text()
    assert f"| 3/{n} |" in markdown
    # the paired effect twice: over every example (the three skips scored 0), and like with like without them
    hostile = _row(variables, HOSTILE_MODEL)
    assert hostile["effect"]["n"] == n and "unanswered" not in hostile["effect"]
    assert hostile["effect_generated"]["n"] == n - 3
    assert hostile["effect_generated"]["unanswered"] == {"variables": 0, "none": 3}
    assert "vs none, all (skips as 0) | Δ exact_match vs none, both generated (n) |" in markdown
    assert f"{hostile['effect_generated']['diff']:+.3f} [" in markdown and f"(n={n - 3}) |" in markdown
    rows = [r for r in csv.DictReader((folder / "leaderboard.csv").open())
            if r["context"] == "variables" and r["metric"] == "exact_match" and r["subset"] == "all"
            and r["kind"] == "model" and r["task"] == "next_cell" and r["n_both_generated"]]
    assert {int(r["n_both_generated"]) for r in rows} == {n, n - 3}


def test_every_board_file_is_written(board):
    folder, data, _ = board
    assert (folder / "leaderboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((folder / "leaderboard.csv").open()))
    assert {(r["task"], r["context"]) for r in rows} == {(t["task"], t["context"]) for t in data["tables"]}
    readme = (folder / "space" / "README.md").read_text()
    assert readme.startswith("---\n") and "\nsdk: static\n" in readme
    page = (folder / "space" / "index.html").read_text()
    assert data["release"]["content_hash"] in page and data["release"]["built"] in page
    assert "data:image/png;base64," in page and 'rel="icon" href="data:' in page
    for outside in ("http://", "https://", "//cdn", "@import", "url("):
        assert outside not in page.replace("http://www.w3.org/2000/svg", "")


def test_submitted_strings_are_escaped_everywhere(board):
    folder, _, _ = board
    page = (folder / "space" / "index.html").read_text()
    assert HOSTILE_MODEL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x" in page
    markdown = (folder / "leaderboard.md").read_text()
    assert HOSTILE_MODEL not in markdown and "&lt;script&gt;" in markdown


def test_scores_are_cached_by_the_predictions_hash(tmp_path, small_release, capsys):
    run = write_run(tmp_path / "subs" / "a", small_release, model="=cmd()")
    args = ["leaderboard", str(tmp_path / "subs"), "--release", str(small_release), "-o", str(tmp_path / "b")]
    assert main(args) == 0
    first = json.loads((tmp_path / "b" / "leaderboard.json").read_text())
    assert main(args) == 0
    second = json.loads((tmp_path / "b" / "leaderboard.json").read_text())
    assert [s["scores_from_cache"] for s in first["submissions"] + second["submissions"]] == [False, True]
    assert first["tables"] == second["tables"]
    assert "re-scored" in capsys.readouterr().err
    lines = (run / "generations.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    lines[0] = json.dumps({**record, "prediction": record["prediction"] + "\n# changed"})
    (run / "generations.jsonl").write_text("\n".join(lines) + "\n")
    assert main(args) == 0
    third = json.loads((tmp_path / "b" / "leaderboard.json").read_text())
    assert third["submissions"][0]["scores_from_cache"] is False
    # A spreadsheet would run a cell that starts with "=": the CSV keeps the name as text.
    names = {row["model"] for row in csv.DictReader((tmp_path / "b" / "leaderboard.csv").open())}
    assert "'=cmd()" in names and "=cmd()" not in names


def test_execution_without_the_opt_in_is_refused_before_anything_is_written(tmp_path, small_release, monkeypatch,
                                                                             capsys):
    from themisto.settings import settings

    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    settings.cache_clear()
    write_run(tmp_path / "subs" / "a", small_release)
    code = main(["leaderboard", str(tmp_path / "subs"), "--release", str(small_release), "-o", str(tmp_path / "b"),
                 "--execute"])
    assert code == 2 and "HF_ALLOW_CODE_EVAL" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
