"""Submission validation: a run folder is accepted only when complete and honest about its release; every refusal
names the file and line or id; claimed scores are dropped and listed, never read."""

import json

import pytest

from _leaderboard import baseline_run, task_rows, write_run
from themisto.errors import InputError
from themisto.leaderboard.submission import (SubmissionError, find_submissions, read_submission, submission_slug,
                                             write_submission)
from themisto.release.folder import open_release


@pytest.fixture(scope="module")
def release(small_release):
    return open_release(small_release)


@pytest.fixture
def run(tmp_path, small_release):
    return write_run(tmp_path / "run", small_release)


def _lines(run):
    return (run / "generations.jsonl").read_text().splitlines()


def _write_lines(run, lines, end="\n"):
    (run / "generations.jsonl").write_text("\n".join(lines) + end)


def test_a_complete_run_is_accepted_with_every_id_once_per_context(run, release, small_release):
    sub = read_submission(run, release)
    ids = [r["id"] for r in task_rows(small_release, "next_cell")]
    assert len(ids) > 20
    assert sorted(r.id for r in sub.generations if r.context == "variables") == sorted(ids)
    assert sub.contexts == ("none", "variables") and sub.ignored == []
    assert len(sub.predictions_sha256) == 64


@pytest.mark.parametrize("task,baseline", [("next_cell", "common-cell"), ("output_prediction", "previous-output")])
def test_a_real_generate_run_is_a_valid_submission(tmp_path, release, small_release, task, baseline):
    sub = read_submission(baseline_run(tmp_path / "run", small_release, task, baseline), release)
    assert (sub.task, sub.model, sub.run["backend"], sub.ignored) == (task, baseline, "baseline", [])
    assert len(sub.generations) == 2 * len(task_rows(small_release, task))


def test_claimed_scores_are_ignored_and_reported(run, release, tmp_path):
    (run / "results.json").write_text(json.dumps({"scores": [{"metric": "exact_match", "mean": 1.0}]}))
    data = json.loads((run / "run.json").read_text())
    data["scores"] = {"exact_match": 1.0}
    (run / "run.json").write_text(json.dumps(data))
    lines = [json.dumps({**json.loads(line), "exact_match": 1.0}) for line in _lines(run)]
    _write_lines(run, lines)
    sub = read_submission(run, release)
    text = "\n".join(sub.ignored)
    assert "results.json: claimed scores, ignored" in text
    assert "run.json: key `scores` ignored (a claimed score)" in text
    assert f"key `exact_match` on {len(lines)} line(s) ignored (a claimed score)" in text
    copy = write_submission(sub, tmp_path / "copy")
    assert sorted(p.name for p in copy.iterdir()) == ["generations.jsonl", "run.json"]
    assert "scores" not in json.loads((copy / "run.json").read_text())
    assert "exact_match" not in (copy / "generations.jsonl").read_text()
    # The same predictions give the same hash: the claim changed nothing the board reads.
    assert read_submission(copy, release).predictions_sha256 == sub.predictions_sha256


def test_a_linked_file_is_refused_without_reading_its_target(run, release, tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"id": "the-secret-token"}\n')
    (run / "generations.jsonl").unlink()
    (run / "generations.jsonl").symlink_to(secret)
    with pytest.raises(SubmissionError, match="not a plain file") as info:
        read_submission(run, release)
    assert "the-secret-token" not in str(info.value)


def test_a_missing_id_is_refused_naming_it(run, release):
    lines = _lines(run)
    dropped = json.loads(lines[3])
    _write_lines(run, lines[:3] + lines[4:])
    with pytest.raises(SubmissionError, match=rf"1 of {len(lines)} predictions missing, first: id "
                                              rf"{dropped['id']} \(context {dropped['context']}, sample 0\)"):
        read_submission(run, release)


def test_a_duplicate_id_is_refused_with_both_lines(run, release):
    lines = _lines(run)
    _write_lines(run, lines + [lines[1]])
    with pytest.raises(InputError, match=rf"generations.jsonl:{len(lines) + 1}: example .* was already given on "
                                         r"line 2"):
        read_submission(run, release)


def test_another_releases_hash_is_refused(run, release):
    data = json.loads((run / "run.json").read_text())
    data["release"]["content_hash"] = "0" * 64
    (run / "run.json").write_text(json.dumps(data))
    with pytest.raises(SubmissionError, match=r"run.json: made on release 000000000000…, the board's release is"):
        read_submission(run, release)


def test_ids_from_another_release_are_refused_by_line(run, release):
    lines = _lines(run)
    lines[5] = json.dumps({**json.loads(lines[5]), "id": "other-kernel/7"})
    _write_lines(run, lines)
    with pytest.raises(InputError, match=r"generations.jsonl:6: id 'other-kernel/7' is not a next_cell test id"):
        read_submission(run, release)


@pytest.mark.parametrize("bad", [1.0, None, ["a", "b"], {"text": "x"}])
def test_a_prediction_that_is_not_a_string_is_refused(run, release, bad):
    lines = _lines(run)
    lines[2] = json.dumps({**json.loads(lines[2]), "prediction": bad})
    _write_lines(run, lines)
    with pytest.raises(InputError, match=r"generations.jsonl:3: example .*: `prediction` must be a string"):
        read_submission(run, release)


@pytest.mark.parametrize("bad", ["all", [1, 2], {"history_shown": "lots"}, {"history_shown": -1},
                                 {"history_shown": True}, {"history_shown": {"deep": 1}}, {"score": 1}])
def test_what_a_prompt_kept_is_counts_or_nothing(run, release, bad):
    lines = _lines(run)
    lines[2] = json.dumps({**json.loads(lines[2]), "kept": {"history_shown": 3, "history_total": 10}})
    _write_lines(run, lines)
    assert read_submission(run, release).generations[2].kept == {"history_shown": 3, "history_total": 10}
    lines[2] = json.dumps({**json.loads(lines[2]), "kept": bad})
    _write_lines(run, lines)
    with pytest.raises(InputError, match=r"generations.jsonl:3: example .*: `kept` must be an object of counts or "):
        read_submission(run, release)


def test_a_truncated_file_is_named_by_line(run, release):
    lines = _lines(run)
    _write_lines(run, lines[:-1] + [lines[-1][: len(lines[-1]) // 2]], end="")
    with pytest.raises(InputError, match=rf"generations.jsonl:{len(lines)}: not JSON .*; no newline ends it: the "
                                         r"file is cut"):
        read_submission(run, release)


def test_a_truncated_run_json_is_named(run, release):
    text = (run / "run.json").read_text()
    (run / "run.json").write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match=r"run.json:\d+: not JSON \("):
        read_submission(run, release)


@pytest.mark.parametrize("field,value,message", [
    ("sampling", {"n": 1}, "`sampling` must give n, temperature, top_p, max_new_tokens, seed"),
    ("contexts", ["none", "everything"], r"contexts \['none', 'everything'\], expected distinct names"),
    ("templates", {}, "`templates` must give"),
    ("model", "", "`model` must be a non-empty string"),
    ("split", "train", "`split` must be"),
])
def test_incomplete_settings_are_refused(run, release, field, value, message):
    data = json.loads((run / "run.json").read_text())
    data[field] = value
    (run / "run.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=message):
        read_submission(run, release)


def test_a_flooding_line_is_refused_without_reading_it_whole(run, release):
    with (run / "generations.jsonl").open("a") as fh:
        fh.write('{"id": "' + "x" * (2 << 20) + '"}\n')
    with pytest.raises(InputError, match=r"generations.jsonl:\d+: longer than 1,048,576 bytes \(bound: line_bytes\)"):
        read_submission(run, release)


def test_submissions_are_found_below_a_folder(tmp_path, small_release):
    write_run(tmp_path / "subs" / "b", small_release)
    write_run(tmp_path / "subs" / "a" / "deep", small_release)
    found = find_submissions([tmp_path / "subs"])
    assert [(f.folder, f.name, f.refusal) for f in found] == [(tmp_path / "subs" / "a" / "deep", "a/deep", None),
                                                              (tmp_path / "subs" / "b", "b", None)]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SubmissionError, match="empty: no run.json in this folder or below it"):
        find_submissions([tmp_path / "empty"])


def test_the_slug_of_a_hostile_model_name_is_path_safe(run, release):
    data = json.loads((run / "run.json").read_text())
    data["model"] = "../../<script>alert(1)</script>"
    (run / "run.json").write_text(json.dumps(data))
    slug = submission_slug(read_submission(run, release))
    assert ".." not in slug and "<" not in slug and slug.count("/") == 2
