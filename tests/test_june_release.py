"""A release built from every real JuNE log under ../shared/data/june (read at run time, never copied into the
repository): no file of it carries a name or address found in the logs, the split keeps each participant on one side
with at least two in each task's `test`, and `themisto build --json` reports the replay's fidelity per trajectory.

Replaying every real log takes most of an hour on two cores, too long for the suite. So, unless
THEMISTO_JUNE_RELEASE=DIR names a release built by the README's command (`scripts/june_release.sh` runs these tests
against the real one, where the exact counts are checked too), the session builds one with `themisto build` itself
from a copy of the JuNE folder, made in a temporary folder at run time, in which every log is cut to its first
LOG_LINES lines (the notebooks and the participants' folders as they are) and each cell gets TEST_CELL_TIMEOUT
seconds. Every log still gives its trajectory, every kind of field of every file passes through the code of a full
build, and the names and addresses are looked for with what the finder found in the whole of every raw log; the
lines past the cut pass through the same ingest, whose output over every line of every log
`tests/test_june_participants.py` checks for the same names and addresses.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _personal_finder import find_personal, leaks

from themisto.cli import main
from themisto.vocabulary import TASKS

pytestmark = pytest.mark.slow

LOG_LINES = 16
TEST_CELL_TIMEOUT = 2.0


@pytest.fixture(scope="session")
def june_release(june_dir, tmp_path_factory) -> tuple[Path, dict, bool]:
    """The release folder, its build report (what `themisto build --json` printed, or the folder's own), and whether
    it is a release of the whole logs (given) or of their first lines (built here)."""
    given = os.environ.get("THEMISTO_JUNE_RELEASE")
    if given:
        folder = Path(given)
        if not (folder / "themisto_build.json").is_file():
            pytest.fail(f"THEMISTO_JUNE_RELEASE={given}: not a release folder (no themisto_build.json)")
        return folder, json.loads((folder / "themisto_build.json").read_text(encoding="utf-8")), True
    work = tmp_path_factory.mktemp("june-release")
    cut = work / "june"
    for path in sorted(p for p in june_dir.rglob("*") if p.is_file()):
        target = cut / path.relative_to(june_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".log":
            target.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:LOG_LINES]))
        else:
            shutil.copyfile(path, target)
    mapping = work / "participants.json"  # the two logs beside participants/ are student_7's (the MANIFEST)
    mapping.write_text(json.dumps({p.stem: "student_7" for p in june_dir.glob("*.log")}), encoding="utf-8")
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["build", str(cut), "--participants", str(mapping), "-o", str(work / "release"),
                     "--steps-out", str(work / "steps.jsonl"), "--cell-timeout", str(TEST_CELL_TIMEOUT),
                     "--allow-missing-files", "--json", "--workers", "2"]) == 0  # the steps file is the same
    return work / "release", json.loads(printed.getvalue()), False


def _texts(folder: Path):
    """(file, text) for every file of the release; a Parquet file's rows as JSON."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".parquet":
            yield rel, json.dumps(pq.read_table(path).to_pylist(), ensure_ascii=False, default=str)
        else:
            yield rel, path.read_text(encoding="utf-8")


def test_no_file_of_the_release_carries_a_name_or_address_found_in_the_logs(june_release, june_dir):
    folder, _, _ = june_release
    found = find_personal([*sorted(june_dir.rglob("*.log")), *sorted(june_dir.rglob("*.ipynb"))])
    assert len(found.names) >= 3 and len(found.ips) >= 5  # the finder finds what the MANIFEST says is there
    texts = dict(_texts(folder))
    assert {"README.md", "themisto_build.json", "eval.yaml", "trajectories/test-00000-of-00001.parquet"} <= set(texts)
    # The release does hold what the masking left in the participants' paths, so the check looks where names were.
    assert any("<user>" in text for name, text in texts.items() if name.endswith(".parquet"))
    assert [leak for name, text in texts.items() for leak in leaks(text, found, name)] == []


def test_no_participant_is_on_both_sides_and_each_tasks_test_holds_two(june_release):
    folder, report, _ = june_release
    sides: dict[str, set[str]] = {}
    owner: dict[str, str] = {}
    for split in ("test", "train"):
        for row in pq.read_table(folder / f"trajectories/{split}-00000-of-00001.parquet",
                                 columns=["kernel_id", "participant"]).to_pylist():
            sides.setdefault(row["participant"], set()).add(split)
            owner[row["kernel_id"]] = row["participant"]
    assert len(sides) == 6 and None not in sides  # six participants, every trajectory's participant known
    assert all(len(s) == 1 for s in sides.values())
    for task in TASKS:
        test_rows = pq.read_table(folder / f"{task}/test-00000-of-00001.parquet", columns=["kernel_id"]).to_pylist()
        assert len({owner[r["kernel_id"]] for r in test_rows}) >= 2, task
    split = report["split"]
    assert split["unit"] == "participant" and split["test_groups"]["task1"] >= 2 and split["test_groups"]["task2"] >= 2
    card = (folder / "README.md").read_text(encoding="utf-8")
    for group in split["groups"]:  # the card gives each participant's side and counts
        assert f"| `{group['group']}` | {group['split']} | {len(group['trajectories'])} | {group['steps']:,} |" in card
    assert "one per participant and notebook" in card  # the several-kernels rule


def test_the_build_reports_the_fidelity_of_every_trajectory(june_release):
    _, report, whole = june_release
    fidelity = report["fidelity"]
    assert len(fidelity) == 11  # every trajectory with an execution (one of student_1's test kernels has none)
    joined = [f for f in fidelity.values() if f["kernels"] == 8]
    assert len(joined) == 1  # student_0's eight task-1 kernels, one trajectory
    assert joined[0]["executions_replayed"] == 778 or not whole
    for kernel_id, f in fidelity.items():
        assert f["participant"] and f["executions_replayed"] >= 1
        if f["comparable"]:
            assert 0.0 <= f["status_match"] <= 1.0
            mismatched = sum(m["kind"] == "status" for m in f["mismatches"])
            assert round(1 - mismatched / f["comparable"], 4) == f["status_match"], kernel_id  # each one listed
            assert all(m["reason"] for m in f["mismatches"])
    # the final notebooks: every participant's task-1 trajectory has one, and some outputs were compared
    finals = [f["final_notebook"] for f in fidelity.values() if f["task"] == "task1"]
    assert len(finals) == 6 and all(finals)
    assert sum(sum(f["compared"].values()) for f in finals) >= (20 if whole else 1)
