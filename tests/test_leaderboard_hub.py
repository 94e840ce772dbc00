"""`themisto submit` and `--push-space` against HubStandIn (tests/_hub_standin.py): a local HTTP server standing in
for the Hub, reached by the real huggingface_hub client through HF_ENDPOINT in a subprocess. Checks the exact files,
the pull-request flag, and eval-results YAML that huggingface_hub parses back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from huggingface_hub import parse_eval_result_entries

from _hub_standin import DATASET_SHA, HubStandIn
from _leaderboard import write_run

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def hub():
    stand_in = HubStandIn().start()
    yield stand_in
    stand_in.stop()


def themisto(hub, tmp_path, *args, token="hf_standin_token"):
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_TOKEN", None)
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "themisto.cli", *map(str, args)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def run(tmp_path, small_release):
    """Context `variables` predicts every target (exact match 1), `none` predicts nothing (0); it claims 1.0."""
    folder = write_run(tmp_path / "run", small_release, model="org/model",
                       predict=lambda row, context, sample: row["target"] if context == "variables" else "")
    (folder / "results.json").write_text(json.dumps({"scores": [{"context": "none", "mean": 1.0}]}))
    (folder / "submission.json").write_text(json.dumps({"submitter": "someone", "model_id": "org/model",
                                                        "link": "https://example.org/paper"}))
    return folder


def test_submit_opens_a_pr_with_the_predictions_and_one_with_eval_results(hub, tmp_path, run, small_release):
    done = themisto(hub, tmp_path, "submit", run, "--release", small_release, "--to", "org/submissions",
                    "--eval-results", "org/model", "--dataset-id", "org/themisto")
    assert done.returncode == 0, done.stderr
    assert "ignored: results.json: claimed scores, ignored" in done.stderr
    assert [(c.repo_type, c.repo_id, c.create_pr) for c in hub.commits] == [
        ("dataset", "org/submissions", True), ("model", "org/model", True)]
    submission, eval_results = hub.commits
    prefix = next(iter(submission.files)).rsplit("/", 1)[0]
    assert prefix.startswith("submissions/next_cell/org-model/")
    assert sorted(submission.files) == [f"{prefix}/{n}" for n in ("generations.jsonl", "run.json", "submission.json")]
    sent = [json.loads(line) for line in submission.files[f"{prefix}/generations.jsonl"].decode().splitlines()]
    given = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
    assert sent == given
    assert json.loads(submission.files[f"{prefix}/submission.json"])["submitter"] == "someone"
    assert list(eval_results.files) == [".eval_results/themisto.yaml"]
    entries = parse_eval_result_entries(yaml.safe_load(eval_results.files[".eval_results/themisto.yaml"]))
    pr_url = f"{hub.url}/datasets/org/submissions/discussions/1"
    assert f"submission pull request: {pr_url}" in done.stdout
    assert f"eval results pull request: {hub.url}/org/model/discussions/2" in done.stdout
    assert [(e.dataset_id, e.task_id, e.dataset_revision, e.source_url) for e in entries] == [
        ("org/themisto", f"next_cell_{mode}", DATASET_SHA, pr_url) for mode in ("none", "variables")]
    # Re-scored, not the claimed 1.0: `none` predicted nothing, `variables` every target.
    assert [(e.notes.split(";")[0], e.value) for e in entries] == [("context mode: none", 0.0),
                                                                   ("context mode: variables", 1.0)]


def test_no_token_is_a_clear_error_and_nothing_is_sent(hub, tmp_path, run, small_release):
    done = themisto(hub, tmp_path, "submit", run, "--release", small_release, "--to", "org/submissions",
                    token=None)
    assert done.returncode == 2
    assert "HF_TOKEN" in done.stderr and "hf auth login" in done.stderr and "nothing was uploaded" in done.stderr
    assert hub.requests == []


def test_a_transient_hub_error_is_retried_once(hub, tmp_path, run, small_release):
    hub.fail_commits = [500]
    done = themisto(hub, tmp_path, "submit", run, "--release", small_release, "--to", "org/submissions")
    assert done.returncode == 0, done.stderr
    assert sum(r.startswith("POST /api/datasets/org/submissions/commit/") for r in hub.requests) == 2
    assert len(hub.commits) == 1 and hub.commits[0].create_pr


@pytest.mark.parametrize("failures,attempts,named", [([500, 503], 2, "HTTP 503 (after one retry)"),
                                                      ([403], 1, "HTTP 403:")])
def test_a_hub_error_is_named_and_nothing_is_written(hub, tmp_path, run, small_release, failures, attempts, named):
    hub.fail_commits = failures
    done = themisto(hub, tmp_path, "submit", run, "--release", small_release, "--to", "org/submissions",
                    "--to-dir", tmp_path / "local")
    assert done.returncode == 2
    assert f"opening the submission PR on org/submissions: the Hub answered {named}" in done.stderr
    assert sum(r.startswith("POST /api/datasets/org/submissions/commit/") for r in hub.requests) == attempts
    assert hub.commits == [] and not (tmp_path / "local").exists()


def test_an_invalid_submission_sends_nothing(hub, tmp_path, run, small_release):
    lines = (run / "generations.jsonl").read_text().splitlines()
    (run / "generations.jsonl").write_text("\n".join(lines[1:]) + "\n")
    done = themisto(hub, tmp_path, "submit", run, "--release", small_release, "--to", "org/submissions")
    assert done.returncode == 2 and "predictions missing" in done.stderr
    assert hub.requests == []


def test_push_space_creates_a_static_space_and_uploads_the_page(hub, tmp_path, run, small_release):
    done = themisto(hub, tmp_path, "leaderboard", run, "--release", small_release, "-o", tmp_path / "board",
                    "--push-space", "org/themisto-board")
    assert done.returncode == 0, done.stderr
    assert [(c["type"], c["organization"], c["name"], c.get("sdk")) for c in hub.created] == [
        ("space", "org", "themisto-board", "static")]
    (commit,) = hub.commits
    assert (commit.repo_type, commit.repo_id, commit.create_pr) == ("space", "org/themisto-board", False)
    assert sorted(commit.files) == ["README.md", "index.html"]
    assert commit.files["index.html"] == (tmp_path / "board" / "space" / "index.html").read_bytes()
    assert b"sdk: static" in commit.files["README.md"]
