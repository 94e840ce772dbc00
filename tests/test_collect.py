"""A release anyone may download and anyone can rebuild: bare git repositories planted by hand (tests/_planted_git.py)
collected over file://, built into a full release, a content release and a pointer list, the pointers collected
again into the same trajectories; the opt-out list at collect and at build; the push's refusal naming licences."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _hub_standin import HubStandIn
from _planted_corpus import PLANTED
from _planted_git import BIG_BYTES, FILE_CAP, OWNERS, REPOS, plant_git

from themisto.cli import main
from themisto.ingest.git_fetch import GitRefused, TreeEntry

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_OPTIONS = ["--min-inputs", "5", "--max-steps", "20"]


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The planted repositories collected from a list, then built (the opted-out owner's repository removed) into the
    full release, the content release and the pointer list: three tiny sessions replayed, 32 steps in all."""
    root = tmp_path_factory.mktemp("git")
    base_url, commits = plant_git(root)
    (root / "repos.txt").write_text("\n".join(REPOS) + "\n")
    (root / "removals.txt").write_text(f"# asked by mail\n2026-12-01 {OWNERS[2]}\n")
    code, out, err = _cli("collect", "--repos", root / "repos.txt", "--base-url", base_url, "-o", root / "corpus",
                          "--max-file-mb", FILE_CAP / 2**20, "--json")
    assert code == 0, err
    collected = json.loads(out)
    code, out, err = _cli("build", root / "corpus", *CORPUS_OPTIONS, "--removals", root / "removals.txt",
                          "-o", root / "full", "--content-release", root / "content", "--pointers",
                          root / "pointers.jsonl", "--allow-missing-files", "--no-values", "--test-fraction", "1",
                          "--json")
    assert code == 0, err
    return {"root": root, "base_url": base_url, "commits": commits, "collected": collected, "build": json.loads(out)}


def test_collect_takes_a_deleted_history_refuses_the_symlink_and_the_oversized_file_and_redacts_the_credential(built):
    collected, root = built["collected"], built["root"]
    assert (collected["collected"], collected["failed"], collected["histories"], collected["logs"]) == (3, 0, 2, 1)
    # The analysis repository deleted its database at its newest commit: it is read at the commit before.
    assert collected["taken_before_deletion"] == 1
    record = json.loads((root / "corpus/repos" / f"{OWNERS[0]}+analysis" / "repo.json").read_text())
    assert record["commit"] == built["commits"][REPOS[0]] and record["read_before_deletion"]
    assert record["licence"] == "LICENSE:MIT"
    # One line each for the symlink that points out of the repository and the file over the size cap.
    assert collected["refusals"] == [
        f"{REPOS[0]}: data/linked.csv: refused: a symlink pointing out of the repository (not followed)",
        f"{REPOS[0]}: data/big.csv: refused: {BIG_BYTES + 11:,} bytes, more than {FILE_CAP:,} (bound: file size)"]
    kept = sorted(p.relative_to(root / "corpus").as_posix() for p in (root / "corpus").rglob("*") if p.is_file())
    assert f"repos/{OWNERS[0]}+analysis/files/data/values.csv" in kept
    assert not any(p.endswith(("linked.csv", "big.csv")) for p in kept)
    # The planted token is in the session and nowhere in what was collected: the database was written again from
    # what the reader gave (credentials redacted), not copied.
    assert collected["redactions"] == {"github_token": 1}
    for path in (root / "corpus").rglob("*"):
        if path.is_file():
            assert PLANTED["github"].encode() not in path.read_bytes(), path


def test_the_content_release_passes_check_and_holds_no_unlicensed_trajectory_and_pointers_cover_the_rest(built):
    import datasets

    from themisto.ingest.pointers import read_pointers

    root, build = built["root"], built["build"]
    assert _cli("check", root / "content")[0] == 0
    full = datasets.load_dataset(str(root / "full"), "trajectories", split="test")
    content = datasets.load_dataset(str(root / "content"), "trajectories", split="test")
    licences = {row["kernel_id"]: row["provenance"]["licence"] for row in full}
    assert sorted(licences.values()) == ["MIT", "none"]  # the opted-out repository's session is not there
    assert {row["provenance"]["licence"] for row in content} == {"MIT"}
    header, pointers = read_pointers(root / "pointers.jsonl")
    unlicensed = {k for k, v in licences.items() if v == "none"}
    assert {p.id for p in pointers} == unlicensed and header["release"] == build["content_sha256"]
    (pointer,) = pointers
    assert (pointer.repository, pointer.commit, pointer.path, pointer.session) == (
        REPOS[1], built["commits"][REPOS[1]], "history.sqlite", 1)
    assert pointer.licence == "none" and pointer.split == "test" and pointer.steps == 10 and pointer.blob_of == "commit"
    text = (root / "pointers.jsonl").read_text()
    assert "print(" not in text and "x + 1" not in text  # no code, no output
    assert build["source"]["sharing"]["by_licence"] == {"MIT": {"shared": 1, "pointed": 0},
                                                        "none": {"shared": 0, "pointed": 1}}
    card = (root / "full" / "README.md").read_text()
    assert "extra_gated_prompt:" in card and "extra_gated_fields:" in card and "full release" in card
    assert "| 2026-12-01 | 0 | 1 |" in card  # the removal, by date, no name
    assert OWNERS[2] not in card and REPOS[1] not in card
    assert "content release" in (root / "content" / "README.md").read_text()


def test_collecting_the_pointers_rebuilds_the_same_trajectories(built):
    from themisto.ingest.ipython_corpus import CorpusSettings, read_corpus
    from themisto.ingest.pointers import read_pointers

    root = built["root"]
    code, out, err = _cli("collect", root / "pointers.jsonl", "--base-url", built["base_url"], "-o",
                          root / "rebuilt", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["pointers"] == {"pointed": 1, "rebuilt": 1, "changed": [], "missing": [], "not_fetchable": 0}
    again = read_corpus(root / "rebuilt", CorpusSettings(min_inputs=5), modules=frozenset(sys.stdlib_module_names))
    (pointer,) = read_pointers(root / "pointers.jsonl")[1]
    assert [(t.id, t.provenance["inputs_sha256"]) for t in again.trajectories] == [(pointer.id, pointer.inputs_sha256)]
    # A second run resumes: nothing is fetched again.
    assert json.loads(_cli("collect", root / "pointers.jsonl", "--base-url", built["base_url"], "-o",
                           root / "rebuilt", "--json")[1])["resumed"] == 1


def test_an_opt_out_entry_removes_a_repository_at_collect_and_at_build_counted_in_both_reports(built):
    root = built["root"]
    assert built["build"]["source"]["corpora"][0]["removed"] == 1
    assert built["build"]["source"]["removals"] == {"by_date": {"2026-12-01": {"repositories": 0, "owners": 1}}}
    gamma = root / "corpus/repos" / f"{OWNERS[2]}+course"
    assert gamma.is_dir()  # collected before the owner opted out
    code, out, err = _cli("collect", "--repos", root / "repos.txt", "--base-url", built["base_url"], "-o",
                          root / "corpus", "--removals", root / "removals.txt", "--json")
    report = json.loads(out)
    assert code == 0 and (report["removed"], report["resumed"], report["collected"]) == (1, 2, 0)
    assert not gamma.exists() and "removed (opt-out list)" in err


def test_push_of_the_mixed_release_to_a_public_repository_is_refused_naming_the_licences(built, tmp_path):
    root = built["root"]
    code, _, err = _cli("push", root / "full", "--repo-id", "someone/themisto", "--dry-run")
    assert code == 2 and "may not be pushed to a public repository" in err and "1 trajectories under none" in err
    assert _cli("push", root / "full", "--repo-id", "someone/themisto", "--dry-run", "--private")[0] == 0
    assert _cli("push", root / "content", "--repo-id", "someone/themisto", "--dry-run")[0] == 0
    # Against the Hub's stand-in: the public push is refused before any request, the private one is committed.
    hub = HubStandIn().start()
    try:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf"),
               "HF_TOKEN": "hf_standin_token", "HF_HUB_DISABLE_TELEMETRY": "1"}
        push = [sys.executable, "-m", "themisto.cli", "push", str(root / "full"), "--repo-id", "someone/themisto"]
        # (Return codes are not compared: now and then pyarrow aborts the interpreter at exit, after the command's
        # work, "terminate called without an active exception", in any command that read Parquet; what was sent is.)
        refused = subprocess.run(push, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "under none" in refused.stderr and hub.requests == []
        done = subprocess.run(push + ["--private"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert "uploaded" in done.stdout, done.stderr
        assert [(c.repo_id, sorted(c.files)[0]) for c in hub.commits] == [("someone/themisto", "README.md")]
        assert [c.get("visibility") for c in hub.created] == ["private"]
    finally:
        hub.stop()


def test_the_git_door_and_the_refusals_of_what_a_tree_holds():
    from themisto.ingest.collect_files import entry_refusal
    from themisto.ingest.git_fetch import opened, repository_url

    for base in ("http://example.org", "ssh://host/x", "/srv/git"):
        with pytest.raises(GitRefused, match="only https:// or file://"):
            with opened(base, "owner/name", 5):
                pass
    for name in ("owner/../name", "owner", "-x/y"):
        with pytest.raises(GitRefused, match="not an owner/name"):
            repository_url("https://github.com", name)

    def entry(path, mode="100644", kind="blob"):
        return TreeEntry(path, mode, kind, "0" * 40, 10)

    assert entry_refusal(entry("vendor/lib", "160000", "commit")) == "a submodule (not followed)"
    assert entry_refusal(entry("d/x.csv", "120000"), b"../../etc/passwd") == \
        "a symlink pointing out of the repository (not followed)"
    assert entry_refusal(entry("d/x.csv", "120000"), b"y.csv") == "a symlink (not followed)"
    assert entry_refusal(entry("d/model.csv"), b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\n") == \
        "a Git LFS pointer, not the data"
    assert entry_refusal(entry("keys/id_rsa")) == "named like a key or credential file"
    assert entry_refusal(entry("a/../b.csv")) == "a path that is no plain repository path"
    assert entry_refusal(entry("d/x.csv"), b"a,b\n") is None


def test_licences_are_named_by_spdx_id_and_the_setting_takes_only_spdx_ids():
    from _planted_git import MIT

    from themisto.ingest.licences import (LicenceSettingError, identify_licence, recorded_licence,
                                          redistribution_setting)

    assert identify_licence(MIT, "LICENSE").spdx == "MIT"
    assert identify_licence("All rights reserved. Do not copy.").spdx == "other"
    assert recorded_licence("LICENSE:BSD").spdx == "other"  # a family, not a licence anyone can check
    assert recorded_licence("LICENSE:Apache-2.0").spdx == "Apache-2.0" and recorded_licence(None).spdx == "none"
    assert redistribution_setting("MIT, Apache-2.0") == ("Apache-2.0", "MIT")
    for bad in ("none", "MIT,other", "BSD", ""):
        with pytest.raises(LicenceSettingError):
            redistribution_setting(bad)
