"""IPython histories from public repositories: the corpus reader, the static checks, the replay's health, and a
release built from a planted corpus that holds no credential, e-mail address, person or owner's name."""

import json
import sys
from pathlib import Path

import pytest

from _planted_corpus import OWNERS, PLANTED, SESSION, plant_corpus

from themisto.ingest.ipython_corpus import CorpusSettings, read_corpus
from themisto.ingest.session_checks import RepositoryFiles, first_blocker
from themisto.replay.health import apply, judge

# What the planted sessions import, so the reader needs no kernel environment to be asked.
MODULES = frozenset(sys.stdlib_module_names)
SMALL = CorpusSettings(min_inputs=5, min_steps=3, environment="wild")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return plant_corpus(tmp_path_factory.mktemp("planted") / "corpus")


def test_the_reader_keeps_the_good_session_once_and_refuses_each_bad_database_in_one_line(corpus):
    read = read_corpus(corpus, SMALL, modules=MODULES)
    report = read.report
    # The planted session is in two repositories: kept once; the other repository's second session imports a
    # package no environment has at its second input, so it is cut too short and left out.
    assert report.left_out.get("duplicate") == 1
    assert report.left_out.get("package_absent") == 1
    assert len(read.trajectories) == 1
    trajectory = read.trajectories[0]
    assert len(trajectory.executions) == len(SESSION)
    # Four hostile or broken databases, each refused in one line that names its file (the owner's folder hashed).
    assert report.files_refused == {"history": 4}
    assert len(report.refusals) == 4
    for line in report.refusals:
        assert "\n" not in line and ".sqlite" in line
        assert not any(owner in line for owner in OWNERS)
    reasons = " ".join(sorted(report.refusals))
    assert "holds a view" in reasons and "not an IPython history database" in reasons and "SQLite" in reasons
    # It replays in its repository's files, started in the folder of the notebook its inputs match.
    assert trajectory.notebook == "analysis/work.ipynb" and trajectory.start_dir == "analysis"
    assert trajectory.workspace in read.workspace_folders
    assert read.workspace_folders[trajectory.workspace].name == "files"
    assert trajectory.provenance["licence"] == "MIT" and trajectory.provenance["environment"] == "wild"


def test_nothing_of_a_person_or_a_credential_leaves_the_reader(corpus):
    read = read_corpus(corpus, SMALL, modules=MODULES)
    text = json.dumps([t.to_dict() for t in read.trajectories]) + json.dumps(read.report.to_dict())
    for name, value in PLANTED.items():
        if name.startswith("file_"):
            continue  # in a file of the repository, not in the session: the release's scrub is what removes it
        assert value not in text, name
    for owner in OWNERS:
        assert owner not in text
    assert read.trajectories[0].participant.startswith("p-")
    assert read.report.redactions  # counted by kind


def test_a_session_is_cut_at_its_first_input_the_replay_cannot_run():
    files = RepositoryFiles(listed=frozenset({"data/big.csv", "small.csv"}), kept=frozenset({"small.csv"}))
    codes = ["import pandas as pd", "df = pd.read_csv('small.csv')", "x = 1",
             "big = pd.read_csv('data/big.csv')", "import nosuchpackage"]
    blocker = first_blocker(codes, MODULES | {"pandas"}, files)
    assert (blocker.index, blocker.cause) == (3, "input_absent")
    assert first_blocker(codes[:3] + codes[4:], MODULES | {"pandas"}, files).cause == "package_absent"
    assert first_blocker(["print 'hello'"], MODULES, files).cause == "python2"
    assert first_blocker(["x = torch.zeros(3).cuda()"], MODULES, files).cause == "gpu_needed"
    assert first_blocker(["import urllib.request", "urllib.request.urlopen('https://example.org/x.csv')"],
                         MODULES, files).cause == "network_needed"
    assert first_blocker(codes[:3], MODULES | {"pandas"}, files) is None
    for waiting in ("!vim notes.py", "!less log.txt", "%edit f", "!python", "!ssh host", "vim deploy/app.py"):
        assert first_blocker(["x = 1", waiting], MODULES, files).cause == "interactive", waiting
    assert first_blocker(["!python run.py", "!ls data", "!pwd", "top = 3", "less = top - 1", "man(x)"], MODULES,
                         files) is None


def _row(step, code, status="ok", ename=None, evalue=None, logged_status="unknown", logged_ename=None):
    return {"kernel_id": "k", "step": step, "code": code, "status": status, "ename": ename, "evalue": evalue,
            "logged_status": logged_status, "logged_ename": logged_ename}


def test_a_failed_import_whose_name_is_used_later_cuts_the_trajectory_before_it():
    rows = [_row(0, "x = 1"), _row(1, "import seaborn as sns", "error", "ModuleNotFoundError", "No module named"),
            _row(2, "y = open('gone.csv')", "error", "FileNotFoundError", "No such file or directory: 'gone.csv'"),
            _row(3, "sns.histplot(x)")]
    health = judge({"k": rows})
    assert health.cut == {"k": {"at": 1, "cause": "package_absent"}}
    assert [r["step"] for r in apply(rows, health)] == [0]


def test_a_failure_whose_names_nobody_uses_is_flagged_not_cut_and_a_logged_error_is_the_developers():
    rows = [_row(0, "x = 1"), _row(1, "y = open('gone.csv')", "error", "FileNotFoundError", "No such file"),
            _row(2, "import nothing", "error", "ModuleNotFoundError", "No module named 'nothing'", "error",
                 "ModuleNotFoundError"),
            _row(3, "import pandas as pd", "error", "ImportError", "Unable to import required dependencies: numpy",
                 "error", "ModuleNotFoundError"),
            _row(4, "print(x, pd)")]
    health = judge({"k": rows})
    assert health.cut == {}
    kept = apply(rows, health)
    assert [r["replay_cause"] for r in kept] == [None, "input_absent", None, None, None]
    # A script run into the namespace binds names nobody can list: its failure cuts.
    ran = [_row(0, "x = 1"), _row(1, "%run -i setup.py", "error", "Exception", "File `'setup.py'` not found."),
           _row(2, "print(x)")]
    assert judge({"k": ran}).cut == {"k": {"at": 1, "cause": "input_absent"}}


def _release_texts(folder: Path) -> str:
    """Every text a release folder holds: its JSON, YAML and Markdown files as they are, every Parquet file's rows
    decoded (binary values read as text)."""
    import pyarrow.parquet as pq

    parts = []
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".parquet":
            for row in pq.read_table(path).to_pylist():
                parts.append(json.dumps(row, default=lambda b: b.decode("utf-8", "replace")
                                        if isinstance(b, bytes) else str(b)))
        elif path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def corpus_release(corpus, tmp_path_factory):
    """The planted corpus replayed (one session, in the wild kernel environment) and built into a release."""
    from themisto.release.parquet import BuildInputs, build_release, release_rows, replay_values
    from themisto.release.tasks import TaskSettings

    out = tmp_path_factory.mktemp("corpus-release")
    inputs = BuildInputs(paths=(corpus,), corpus=SMALL, steps_out=out / "steps.jsonl")
    rows, source, extra, fidelity = release_rows(inputs, out / "steps.jsonl")
    report = build_release(rows, out / "release", TaskSettings(test_fraction=1.0, length_quantile=1.0),
                           source=source, extra_settings=extra, allow_missing_files=True, fidelity=fidelity,
                           values=replay_values(inputs, out / "steps.jsonl"))
    return out / "release", report


def test_a_release_from_the_planted_corpus_holds_no_credential_person_or_owner(corpus_release):
    folder, report = corpus_release
    text = _release_texts(folder)
    for name, value in PLANTED.items():
        assert value not in text, f"{name} reached the release"
    for owner in OWNERS:
        assert owner not in text
    # The session ran: its file was read and printed (the scrub, not an empty output, kept the key out).
    assert "owner mail <email> key <redacted:" in text
    # Values were stored, but not the one that holds the file's key and address.
    assert (folder / "values").is_dir()
    assert "holds personal data or a credential" in text
    counts = report.source["health"]["scrubbed"]
    assert counts["texts"] > 0 and counts["credentials"]


def test_the_kernel_environments_folder_becomes_a_placeholder_in_every_text_a_release_keeps(sample_release):
    import pyarrow.parquet as pq

    from themisto.release.scrub import KERNEL_ENV, Scrubber, kernel_env_roots
    from themisto.settings import KERNEL_VENV

    roots = kernel_env_roots()
    assert str(KERNEL_VENV) in roots  # the environment the suite's kernels run in (install.sh made it)
    scrub = Scrubber()
    where = f"{KERNEL_VENV}/lib/python3.11/site-packages/pandas/core/generic.py"
    assert scrub(f"File {where}:6299, in NDFrame.__getattr__") == \
        f"File {KERNEL_ENV}/lib/python3.11/site-packages/pandas/core/generic.py:6299, in NDFrame.__getattr__"
    assert (scrub.host_paths, scrub.texts_changed) == (1, 0)  # a path, not personal data or a credential
    assert scrub(f"{KERNEL_VENV}-wild/lib/x.py") == f"{KERNEL_ENV}/lib/x.py"  # the longer folder first
    # Nothing a replay printed in the sample release says where this checkout lies.
    texts = [repr(pq.read_table(path).to_pylist()) for path in sorted(sample_release.rglob("*.parquet"))]
    assert texts and not any(root in text for root in roots for text in texts)
    assert any(KERNEL_ENV in text for text in texts)  # its tracebacks through pandas show the placeholder instead


def test_the_corpus_release_loads_passes_check_and_reports_per_source(corpus_release):
    import datasets

    from themisto.release.check import check_release

    folder, report = corpus_release
    assert check_release(folder).ok
    steps = datasets.load_dataset(str(folder), "trajectories", split="test")
    assert set(steps["source"]) == {"ipython-history"}
    assert all(p["repository"].startswith("r-") and p["licence"] == "MIT" for p in steps["provenance"])
    mine = report.sources["ipython-history"]
    assert (mine["trajectories"], mine["developers"], mine["test_developers"]) == (1, 1, 1)
    assert mine["steps"] == len(SESSION)
    assert report.sources["corpora"][0]["files_refused"] == {"history": 4}
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "| `ipython-history` | 1 |" in card and "MIT 1" in card and "license_name: mixed-public-repositories" in card


IPYTHON_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ipython"


def test_no_owner_name_or_address_of_real_repositories_leaves_the_reader(tmp_path):
    """A fixed subset of the real corpus (its first 15 repositories, linked, never copied): every owner's name and
    every e-mail address their databases hold stays out of what the reader gives."""
    import re
    import sqlite3

    if not (IPYTHON_DIR / "repos").is_dir():
        pytest.fail(f"the real IPython corpus is expected in {IPYTHON_DIR} (../shared/data/ipython beside the repo)")
    subset = sorted((IPYTHON_DIR / "repos").iterdir())[:15]
    (tmp_path / "repos").mkdir()
    for folder in subset:
        (tmp_path / "repos" / folder.name).symlink_to(folder, target_is_directory=True)
    owners = {json.loads((f / "repo.json").read_text())["repo"].split("/")[0] for f in subset}
    addresses = set()
    for database in (p for f in subset for p in (f / "history").glob("*") if p.is_file()):
        try:
            con = sqlite3.connect(f"file:{database}?mode=ro&immutable=1", uri=True)
            for (text,) in con.execute("SELECT source_raw FROM history"):
                addresses |= set(re.findall(r"[\w.%+-]+@[\w.-]+\.[A-Za-z]{2,}", text or ""))
            con.close()
        except sqlite3.DatabaseError:
            continue
    read = read_corpus(tmp_path, CorpusSettings(min_inputs=10, min_steps=5))
    assert read.report.sessions_read > 0 and read.trajectories
    text = json.dumps([t.to_dict() for t in read.trajectories]) + json.dumps(read.report.to_dict())
    leaked = [o for o in owners if len(o) >= 4 and re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not leaked, f"{len(leaked)} owner name(s) reached the trajectories"
    assert not [a for a in addresses if a in text], "an e-mail address reached the trajectories"


def test_themisto_ingest_reads_a_corpus_and_prints_its_refusals(corpus, tmp_path, capsys):
    from themisto.cli import main

    out = tmp_path / "t.jsonl"
    assert main(["ingest", str(corpus), "--min-inputs", "5", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "corpus: 3 repositories" in printed and printed.count("  refused: ") == 4
    assert not any(owner in printed for owner in OWNERS)
    assert len(out.read_text().splitlines()) == 1
    assert main(["ingest", str(corpus), "--min-inputs", "0"]) == 2  # a setting out of range: one line, exit 2
    assert "--min-inputs must be at least 1" in capsys.readouterr().err


def test_a_corpus_sessions_untimed_cells_get_the_corpus_limit_and_a_fixed_limit_wins(corpus):
    from dataclasses import replace

    from themisto.replay.replay import ReplaySettings, cell_limits

    trajectory = read_corpus(corpus, SMALL, modules=MODULES).trajectories[0]
    assert set(cell_limits(trajectory, ReplaySettings())) == {SMALL.cell_timeout_s}
    assert SMALL.cell_timeout_s < ReplaySettings().cell_timeout_s
    fixed = ReplaySettings(cell_timeout_s=7.0, logged_time_factor=None)
    assert set(cell_limits(trajectory, fixed)) == {7.0}
    assert set(cell_limits(replace(trajectory, cell_timeout_s=None), ReplaySettings())) == {
        ReplaySettings().cell_timeout_s}
