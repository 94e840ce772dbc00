"""Values stored in safe formats: written by a real kernel, read back exactly, put in a release that loads offline,
refused when a file is not the format it claims (a planted pickle never runs), and a step of the real task-1
trajectory restored from them with the replay's state hash."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from themisto.ingest.trajectory import Execution, KernelEvent, Trajectory
from themisto.release.folder import BUILD_FILE, content_hash, open_release, parquet_name
from themisto.release.values import ReleaseValues, ValueFormatError, check_row, decode
from themisto.replay.replay import ReplaySettings
from themisto.replay.steps_file import read_steps, replay_to_file
from themisto.replay.restore import FolderValues, plan_restore, restore_step
from themisto.replay.values import ValueFolder, values_folder
from themisto.runtime.kernel import KernelSession
from themisto.runtime.snapshot import take_snapshot

pytestmark = pytest.mark.slow

# The kinds a notebook holds, each with a safe format, and four without one.
_NAMESPACE = """
import collections, datetime, re
import numpy as np, pandas as pd, scipy.sparse as sp
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
frame = pd.DataFrame({"n": [1, 2, 3], "s": ["a", None, "c"], "t": pd.date_range("2023-05-01", periods=3, freq="D"),
                      "c": pd.Categorical(["x", "y", "x"]), "mixed": [[1], np.nan, "z"]}, index=[10, 20, 30])
same = frame
series = frame["s"]
labels = pd.Series(["a", np.nan, "b"], name="label")
hours = pd.date_range("2023-05-01", periods=4, freq="h")
grid = np.arange(12.0).reshape(3, 4)
objects = np.array([1, "a", None], dtype=object)
sparse = sp.random(6, 5, density=0.4, format="csr", random_state=0)
model = LogisticRegression().fit(grid[:, :2], [0, 1, 0])
grouped = frame.groupby("c")["n"]
by_label = frame.groupby("s")["n"]
data = {"train": frame, "grid": grid, "note": "x"}
numbers = [1, 2.5, float("nan"), -0.0, 10 ** 30, 1 + 2j, True, None]
shapes = (1, (2, 3), frozenset({4}), {5, 6}, b"\\x00\\xff", bytearray(b"ab"), range(2, 9, 3))
counts = collections.Counter("hello")
when = datetime.datetime(2023, 5, 1, 12, 30, tzinfo=datetime.timezone.utc)
stamp = pd.Timestamp("2023-05-01 10:00")
match = re.search(r"(\\w+)@(\\w+)", "mail a@b and c@d")
scalar = np.float64(2.5)
def ratio(a, b=2):
    return a / b
square = lambda x: x * x
class Base:
    def total(self):
        return 1
class Child(Base):
    def total(self):
        return super().total() + 1
stream = (i for i in range(3))
handle = open("notes.txt", "w")
figure = plt.figure()
holder = Base()
"""
_WITHOUT_FORMAT = {"stream": "generator", "handle": "open file", "figure": "matplotlib", "holder": "class the user"}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A kernel that ran _NAMESPACE, its snapshot with values, and the values folder the replay's way."""
    folder = ValueFolder(tmp_path_factory.mktemp("values") / "steps.jsonl.values")
    with KernelSession() as session:
        result = session.execute(_NAMESPACE)
        assert result.status == "ok", result.traceback
        snap = take_snapshot(session, store=True, timeout=600, store_seconds=500)  # all of it, however loaded
        folder.take(session.values_dir, snap.values.written)
        assert not list(session.values_dir.iterdir())  # the kernel's folder is emptied
        session.restart()
        yield session, snap, folder


def _row(snap, folder) -> dict:
    return {"kernel_id": "k", "step": 0, "code": "", "state_hash": snap.state_hash, "restarted_before": False,
            "kernel_restarted": False, "variables": [v.to_dict() for v in snap.variables.values()],
            "stored_values": {"unstored": [{"name": n, "reason": r} for n, r in snap.values.unstored.items()],
                              "modules": [{"name": n, "module": m} for n, m in snap.values.modules.items()],
                              "aliases": snap.values.aliases}}


def test_every_kind_with_a_safe_format_comes_back_with_its_hash(stored):
    session, snap, folder = stored
    assert set(snap.values.unstored) == set(_WITHOUT_FORMAT)
    for name, why in _WITHOUT_FORMAT.items():
        assert why in snap.values.unstored[name], (name, snap.values.unstored[name])
    formats = {entry.type: entry.format for entry in folder.entries().values()}
    assert formats["pandas.core.frame.DataFrame"] == "parquet" and formats["numpy.ndarray"] in ("npy", "json")
    assert formats["scipy.sparse._csr.csr_matrix"] == "npz" and formats[
        "sklearn.linear_model._logistic.LogisticRegression"] == "skops"
    assert all(entry.exact for entry in folder.entries().values()), [
        e for e in folder.entries().values() if not e.exact]
    for entry in folder.entries().values():  # nothing pickled: each file is its format, the arrays need no pickle
        data = folder.file(entry).read_bytes()
        assert not data.startswith(b"\x80")
        if entry.format == "npy":
            np.load(io.BytesIO(data), allow_pickle=False)
    row = _row(snap, folder)
    plan = plan_restore([row], 0, FolderValues(folder))
    assert set(plan.missing) == set(_WITHOUT_FORMAT) and plan.modules["pd"] == "pandas"
    assert ["frame", "same"] in plan.aliases
    # the kernel holds another state first (as the scorer's does when it restores again): none of it stays
    assert session.execute("import json as leftover_module\nleftover = 1").status == "ok"
    result = restore_step(session, [row], dataclasses.replace(plan, rerun=[]), FolderValues(folder))
    assert result.failures == {}
    gone = session.execute("print('leftover_module' in globals(), 'leftover' in globals(), 'pd' in globals())")
    assert gone.outputs[0]["text"] == "False False True\n"
    assert sorted(result.differing) == sorted(_WITHOUT_FORMAT)  # those four are not there; the rest hash the same
    check = session.execute("assert same is frame and Child().total() == 2 and ratio(4) == 2.0 and square(3) == 9\n"
                            "print(type(model).__name__, train_test_split.__module__, grouped.sum().to_dict(),\n"
                            "      by_label.sum().to_dict())")
    assert check.status == "ok", check.traceback
    assert "LogisticRegression sklearn.model_selection._split {'x': 4, 'y': 2} {'a': 1, 'c': 3}" in \
        check.outputs[0]["text"]


_OVER_CAP = """
import io, json, os, zipfile
import numpy as np
import skops.io as sio
from sklearn.ensemble import RandomForestClassifier
from themisto.runtime.agent import values as V
from themisto.runtime.agent.formats import skops as S
from themisto.runtime.agent.hashing import content_hash
from themisto.release.folder import open_release

rng = np.random.default_rng(0)
X, y = rng.normal(size=(400, 5)), rng.integers(0, 3, 400)
values = {
    "forest": RandomForestClassifier(n_estimators=40, random_state=0).fit(X, y),
    "stumps": RandomForestClassifier(n_estimators=S.MEMBERS // 4, max_depth=1, random_state=0).fit(X, y),
    "array": np.zeros(CAP // 8 + 1),
    "small": RandomForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(X, y),
}
caps = {"forest": CAP, "stumps": 1 << 30, "array": CAP, "small": CAP}
report = {}
for name, value in values.items():
    folder = "over-cap-" + name
    os.makedirs(folder)
    writer = V._Writer(folder, V.Caps(value_bytes=caps[name]), lambda digest: False, {}, None)
    try:
        report[name] = {"stored": writer.store(value, content_hash(value))}
    except V.Unstorable as error:
        report[name] = {"refused": str(error)}
    report[name]["files"] = sorted(os.listdir(folder))
    if name in ("forest", "small"):
        report[name]["skops_bytes"] = len(sio.dumps(value))
# The stumps' whole file would take long to write (that is the point): its members counted on ten of them.
ten = RandomForestClassifier(n_estimators=10, max_depth=1, random_state=0).fit(X, y)
report["stumps"]["members"] = len(zipfile.ZipFile(io.BytesIO(sio.dumps(ten))).namelist()) * len(
    values["stumps"].estimators_) // 10
small = values["small"]
report["small"]["same_bytes"] = open(os.path.join("over-cap-small", report["small"]["files"][0]), "rb").read() == (
    S.canonical(sio.dumps(small)))
print(json.dumps(report))
"""


def test_a_value_over_a_cap_is_refused_while_it_is_written():
    """A model whose skops file would pass the per-value cap, or hold more members than SKOPS_MEMBERS, is refused as
    the file passes it, not once all of it is encoded (a real task-2 log held a bagging 689 MB long as skops, and one
    whose snapshots each ran past their time); an array is refused by its size before it is copied;
    a model within the caps is written exactly as skops writes it."""
    cap = 200_000
    with KernelSession() as session:
        result = session.execute(_OVER_CAP.replace("CAP", str(cap)), timeout=300)
        assert result.status == "ok", result.traceback
    report = json.loads(result.outputs[-1]["text"])
    forest, stumps, array, small = (report[name] for name in ("forest", "stumps", "array", "small"))
    assert forest["skops_bytes"] > 5 * cap and forest["refused"].startswith(f"more than {cap:,} bytes as skops")
    assert stumps["members"] > 10_000  # refused on its members, its bytes far under the 1 GiB cap it had
    assert stumps["refused"].startswith("more than 10,000 arrays and parts as skops")
    assert array["refused"] == f"{cap + 8:,} bytes of data, over the per-value cap of {cap:,}"
    assert forest["files"] == stumps["files"] == array["files"] == []  # nothing half-written is left
    assert small["stored"] == ["skops", True] and small["skops_bytes"] < cap and small["same_bytes"]


_NAMES_CELLS = """
import json, sys
import numpy as np
from sklearn.preprocessing import StandardScaler
before = set(sys.modules)
scaler = StandardScaler().fit(np.arange(8.0).reshape(4, 2))
"""
_NAMES_AFTER = """
table = sys.modules["skops.io._trusted_types"]
print(json.dumps({"seeded": getattr(table, "__file__", None) is None,
                  "names": {n: list(getattr(table, n)) for n in ("PRIMITIVE_TYPE_NAMES", "SKLEARN_ESTIMATOR_TYPE_NAMES",
                                                                 "SCIPY_UFUNC_TYPE_NAMES")},
                  "imported": sorted(m for m in set(sys.modules) - before if m.startswith("sklearn."))}))
"""


def _stored_model(workspace: Path | None = None, extra_env: dict | None = None) -> tuple[dict, list]:
    with KernelSession(workspace, extra_env=extra_env) as session:
        assert session.execute(_NAMES_CELLS, timeout=120).status == "ok"
        snap = take_snapshot(session, store=True)
        result = session.execute(_NAMES_AFTER, timeout=60)
        assert result.status == "ok", result.traceback
    return json.loads(result.outputs[-1]["text"]), [w for w in snap.values.written if w.format == "skops"]


def test_a_kernel_imports_skops_with_the_hosts_table_of_trusted_names(tmp_path):
    """The first model a kernel life stores imports skops.io with skops's table of trusted type names computed once
    per environment by the host, not by importing every module of scikit-learn into the user's kernel (1.3-2.8 s a
    life, and modules the developer never imported); the table is skops's own and the stored file the same. A table
    computed for other versions is not used."""
    seeded, files = _stored_model()
    assert seeded["seeded"] and "sklearn.ensemble._forest" not in seeded["imported"]
    from themisto.runtime.sandbox import kernel_python, skops_names

    table = json.loads(skops_names(kernel_python()))
    table["versions"]["scikit-learn"] = "0.0.1"
    (tmp_path / "names.json").write_text(json.dumps(table))  # in the kernel's work folder, which it reads from
    own, own_files = _stored_model(tmp_path, {"THEMISTO_SKOPS_NAMES": "names.json"})
    assert not own["seeded"] and "sklearn.ensemble._forest" in own["imported"]  # skops computed its own
    assert seeded["names"] == own["names"] and len(own["names"]["SKLEARN_ESTIMATOR_TYPE_NAMES"]) > 100
    assert [(f.hash, f.bytes, f.exact) for f in files] == [(f.hash, f.bytes, f.exact) for f in own_files]
    assert files and files[0].exact


def test_reading_a_value_runs_no_code(stored, tmp_path):
    _, _, folder = stored
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    planted = pickle.dumps(Planted())
    fake_npy = io.BytesIO()
    np.save(fake_npy, np.array([Planted()], dtype=object), allow_pickle=True)  # an .npy that holds a pickle
    for fmt, data, why in [("json", planted, "pickle"), ("npy", planted, "pickle"),
                           ("npy", b"\x93NUMPY not really", "without pickle"), ("npy", fake_npy.getvalue(), "pickle"),
                           ("parquet", planted, "pickle"), ("skops", b"PK\x03\x04junk", "skops"),
                           ("pickle", planted, "unknown value format")]:
        row = {"hash": "0" * 32, "format": fmt, "data": data, "sha256": hashlib.sha256(data).hexdigest()}
        with pytest.raises(ValueFormatError, match=why):
            check_row(row)
        with pytest.raises(ValueFormatError):
            decode(row)
    assert not marker.exists()


def test_a_later_kernel_does_not_write_again_what_the_folder_holds(tmp_path, monkeypatch):
    """A value the replay's folder holds exactly (an earlier kernel life or another trajectory stored it) is not
    encoded, written and read back again by a later kernel; its steps record it as the first life's do."""
    cells = ["import numpy as np", "grid = np.arange(12.0).reshape(3, 4)", "fresh = np.arange(5.0)"]
    trajectory = Trajectory(id="held", notebook="held.ipynb", source="test",
                            executions=[Execution(cell_id=f"c{i}", code=code) for i, code in enumerate(cells * 2)],
                            events=[KernelEvent("restart", before=3)])
    written: list[str] = []
    take = ValueFolder.take

    def counting_take(self, source, records):
        written.extend(record.hash for record in records)
        return take(self, source, records)

    monkeypatch.setattr(ValueFolder, "take", counting_take)
    replay_to_file([trajectory], tmp_path / "steps.jsonl", None, ReplaySettings(cell_timeout_s=30))
    steps = read_steps(tmp_path / "steps.jsonl")
    assert [s.status for s in steps] == ["ok"] * 6 and steps[3].restarted_before
    grid = {v["name"]: v["hash"] for v in steps[1].variables}["grid"]
    assert written.count(grid) == 1  # the second life heard the folder holds it (before: written by both lives)
    assert [s.values for s in steps[:3]] == [s.values for s in steps[3:]] and steps[2].values["unstored"] == {}
    assert [s.variables for s in steps[:3]] == [s.variables for s in steps[3:]]


# ---------------------------------------------------------------------------------------------------------------
# In a release


_CELLS = ["import pandas as pd", "frame = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', None, 'z']})",
          "total = int(frame['a'].sum())", "def twice(x):\n    return 2 * x", "names = list(frame['b'])",
          "frame['c'] = frame['a'].map(twice)", "print(frame)", "summary = {'total': total, 'frame': frame}",
          "print(summary['total'])"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from themisto.release.parquet import build_release
    from themisto.release.tasks import TaskSettings, trajectory_rows

    root = tmp_path_factory.mktemp("values-release")
    trajectory = Trajectory(id="values-demo", notebook="demo.ipynb", source="test",
                            executions=[Execution(cell_id=f"c{i}", code=code) for i, code in enumerate(_CELLS)])
    replay_to_file([trajectory], root / "steps.jsonl", None, ReplaySettings(cell_timeout_s=30))
    steps = read_steps(root / "steps.jsonl")
    out = root / "release"
    build_release(trajectory_rows(steps), out, TaskSettings(test_fraction=1.0, length_quantile=1.0),
                  source={"kind": "test-rows"}, values=values_folder(root / "steps.jsonl"))
    return out


def test_the_values_load_offline_and_decode_to_what_the_kernel_held(release):
    import datasets
    import pandas as pd

    values = datasets.load_dataset(str(release), "values", split="test")
    rows = {row["hash"]: row for row in values}
    steps = datasets.load_dataset(str(release), "trajectories", split="test")
    last = steps[len(steps) - 1]
    held = {v["name"]: rows[v["hash"]] for v in last["variables"]}
    assert set(held) == {"frame", "total", "twice", "names", "summary"}
    assert last["stored_values"]["unstored"] == [] and {"name": "pd", "module": "pandas"} in \
        last["stored_values"]["modules"]
    pd.testing.assert_frame_equal(decode(held["frame"]), pd.DataFrame({"a": [1, 2, 3], "b": ["x", None, "z"],
                                                                      "c": [2, 4, 6]}))
    assert decode(held["total"]) == 6 and decode(held["names"]) == ["x", None, "z"]
    twice = decode(held["twice"])
    assert (twice["$"], twice["kind"], twice["binds"]) == ("source", "function", "twice")
    assert twice["source"].strip() == "def twice(x):\n    return 2 * x"
    summary = decode(held["summary"], rows)
    assert summary["total"] == 6 and summary["frame"].shape == (3, 3)
    # the existing configs load as before
    assert len(datasets.load_dataset(str(release), "next_cell", split="test")) > 0
    # the build counts the stored values by kind: every data value and the function's source are there
    note = next(n for n in json.loads((release / BUILD_FILE).read_text())["notes"] if n.startswith("values:"))
    kinds = dict((kind, (int(stored), int(n))) for kind, stored, n in re.findall(r"(\w+) (\d+) of (\d+) \(", note))
    assert set(kinds) == {"data", "definition"} and all(stored == n > 0 for stored, n in kinds.values()), note


def _tamper(release: Path, change) -> None:
    """Rewrite the values rows through `change` and record the new file's hash as the build's own: only the format
    check can then find what was done."""
    rel = parquet_name("values", "test")
    table = pq.read_table(release / rel)
    rows = [change(row) for row in table.to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), release / rel)
    report = json.loads((release / BUILD_FILE).read_text())
    report["files"][rel] = hashlib.sha256((release / rel).read_bytes()).hexdigest()
    report["content_sha256"] = content_hash(report["files"])
    (release / BUILD_FILE).write_text(json.dumps(report))


def test_check_refuses_a_planted_pickle_and_a_fake_npy(release, tmp_path):
    import shutil

    from themisto.release.check import check_release

    assert check_release(release).ok, check_release(release).problems
    copy = tmp_path / "tampered"
    shutil.copytree(release, copy)
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    planted = pickle.dumps(Planted())
    kinds = iter(["pickle", "npy"])

    def change(row):
        if row["format"] != "parquet":
            return row
        kind = next(kinds, None)
        if kind is None:
            return row
        data = planted if kind == "pickle" else b"\x93NUMPY" + planted
        return {**row, "format": "json" if kind == "pickle" else "npy", "data": data,
                "sha256": hashlib.sha256(data).hexdigest()}

    _tamper(copy, change)
    (copy / "values" / "extra.pkl").write_bytes(planted)
    problems = check_release(copy).problems
    assert any("refused: a pickle" in p for p in problems), problems
    assert any("refused: not a .npy array" in p for p in problems), problems
    assert any("values/extra.pkl: a file the build did not write" in p for p in problems), problems
    with pytest.raises(ValueFormatError):  # a restore from the release refuses it as well
        source = ReleaseValues.of(open_release(copy), "test")
        for digest, row in source.rows.items():
            if row["format"] in ("json", "npy"):
                source.data(digest)
    assert not marker.exists()


def test_a_step_of_the_real_task1_trajectory_restores_with_the_replays_state_hash(june_dir, tmp_path):
    """Replay the first 28 steps of the real task-1 log with values (frames, series, regex matches, a function),
    build a release from them, and restore the last step from the release's values in a fresh kernel."""
    from conftest import TASK1_LOG

    from themisto.ingest.june_log import read_june_log
    from themisto.ingest.workspace import write_workspace
    from themisto.release.parquet import build_release
    from themisto.release.tasks import TaskSettings, trajectory_rows

    full = read_june_log(TASK1_LOG)
    end = 28
    trajectory = Trajectory(id=full.id, notebook=full.notebook, source=full.source, task=full.task,
                            executions=full.executions[:end], events=[e for e in full.events if e.before < end])
    workspace = write_workspace(tmp_path / "ws", ["task1"], seed=0).root
    replay_to_file([trajectory], tmp_path / "steps.jsonl", workspace, ReplaySettings())
    steps = read_steps(tmp_path / "steps.jsonl")
    build_release(trajectory_rows(steps), tmp_path / "release", TaskSettings(test_fraction=1.0),
                  source={"kind": "test-rows"}, values=values_folder(tmp_path / "steps.jsonl"))
    info = open_release(tmp_path / "release")
    rows = sorted(info.rows("trajectories", "test"), key=lambda r: r["step"])
    source = ReleaseValues.of(info, "test")
    plan = plan_restore(rows, end - 1, source)
    kinds = {v["type"] for v in rows[end - 1]["variables"]}
    assert {"pandas.core.frame.DataFrame", "pandas.core.series.Series", "re.Match", "builtins.function"} <= kinds
    assert plan.complete and not plan.rerun
    with KernelSession(workspace) as session:
        result = restore_step(session, rows, plan, source)
    assert result.matched, (result.differing, result.failures)
    assert result.state_hash == rows[end - 1]["state_hash"]


def test_the_scorer_starts_from_the_restored_state_and_judges_as_after_a_replay(release, tmp_path, monkeypatch):
    from themisto.scoring import scorer as sc
    from themisto.settings import settings as env_settings

    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    loaded = open_release(release)
    last = max(loaded.task_rows("next_cell").values(), key=lambda r: r["step"])
    early = next(r for r in sorted(loaded.task_rows("next_cell").values(), key=lambda r: r["step"]) if r["step"] >= 2)
    # The replay's record says the cells between the two steps are slow: the scorer's kernel restores again
    # (themisto.release.states._worth_restoring) instead of replaying them.
    for row in loaded.trajectory(last["kernel_id"]):
        if early["step"] <= row["step"] < last["step"]:
            row["execution_time"] = 60.0
    predictions = [[early["target"], "print(1)"], [last["target"], "print(summary['total'] + 1)", "print(twice(total))"]]
    found = {}
    try:
        for restore in (False, True):
            trajectories = []
            result = sc.score(predictions, [early["target"], last["target"]], ids=[early["id"], last["id"]],
                              execute=True, release=loaded, workspace=tmp_path,
                              settings=sc.ScoreSettings(restore=restore, continuation_cells=0),
                              on_trajectory=trajectories.append)
            found[restore] = result, trajectories[0]
    finally:
        env_settings.cache_clear()
    replayed, restored = found[False][1], found[True][1]
    assert replayed.restored_step is None and restored.restored_step == early["step"], restored.restore_note
    assert restored.restores == 2 and restored.restore_note == "" and restored.restore_s > 0
    verdicts = {restore: [(p.id, p.prediction, p.exec_ok, p.output_match, p.state_match, p.functional_match)
                          for p in result.predictions] for restore, (result, _) in found.items()}
    assert verdicts[True] == verdicts[False]
    assert [v[-1] for v in verdicts[True]] == [True, False, True, False, False]  # the references; other outputs
    assert all(e.state_verified for e in found[True][0].examples)  # each restored state hashes as the release's
