"""Runtime snapshots read from a real sandboxed kernel through the silent channel, on the real JuNE task-2 features."""

import json
import shutil

import pandas as pd
import pytest

from themisto.runtime import agent as kernel_agent
from themisto.runtime.kernel import KernelSession
from themisto.runtime.snapshot import AgentError, Snapshot, VariableInfo, take_snapshot

pytestmark = pytest.mark.slow

# About 18 variables of the kinds a notebook holds, built on the real features table.
_SETUP = """
import numpy as np
import pandas as pd
features = pd.read_pickle("test_features.pkl")
counts = features["cell_type"].value_counts()
code_cells = features[features["cell_type"] == "code"]
lines = features["linesofcode"].to_numpy()
mean_lines = float(lines.mean())
names = sorted(features["filename"].unique())
by_notebook = {name: int(n) for name, n in features["filename"].value_counts().items()}
matrix = np.arange(120, dtype="float64").reshape(10, 12)
threshold = 0.5
label = "code"
flags = {True, False}
pairs = [(1, "a"), (2, "b")]
blob = b"raw bytes"
nothing = None
def ratio(a, b=1):
    return a / b
class Holder:
    def __init__(self):
        self.values = [1, 2, 3]
holder = Holder()
handle = open("test_features.pkl", "rb")
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, june_dir):
    folder = tmp_path_factory.mktemp("snapshot-workspace")
    shutil.copy(june_dir / "test_features.pkl", folder / "test_features.pkl")  # a temp copy, never the repo
    return folder


@pytest.fixture(scope="module")
def session(workspace):
    with KernelSession(workspace) as session:
        result = session.execute(_SETUP)
        assert result.status == "ok", result.traceback
        yield session


def _counters(session) -> dict:
    content = session.execute_silent("", user_expressions={
        "count": "get_ipython().execution_count", "inputs": "len(In)", "outputs": "len(Out)"})
    return {k: v["data"]["text/plain"] for k, v in content["user_expressions"].items()}


def test_snapshots_leave_in_out_and_the_execution_count_untouched(session):
    session.execute("threshold")  # an Out entry, so that Out's length is tested too
    before = _counters(session)
    for _ in range(10):
        take_snapshot(session)
    assert _counters(session) == before
    assert session.execute("label").execution_count == int(before["count"])


def test_snapshot_describes_the_real_features_table(session, june_dir):
    snap = take_snapshot(session)
    host = pd.read_pickle(june_dir / "test_features.pkl")
    features = snap.variables["features"]
    assert features.type == "pandas.core.frame.DataFrame"
    assert features.shape == host.shape == (1918, 21)
    assert list(features.columns) == [str(c) for c in host.columns]
    in_kernel = session.execute("int(features.memory_usage(deep=True).sum())").outputs[0]["data"]["text/plain"]
    assert features.size == int(in_kernel)  # the kernel's pandas may differ from this process's
    assert features.hash == kernel_agent.content_hash(host)  # the same content hash in the kernel and here
    assert snap.variables["lines"].size == host["linesofcode"].to_numpy().nbytes
    assert snap.variables["counts"].len == host["cell_type"].nunique()
    assert set(snap.variables) >= {"features", "counts", "code_cells", "by_notebook", "ratio", "Holder", "holder",
                                   "handle", "matrix", "nothing"}
    assert not set(snap.variables) & {"np", "pd", "In", "Out", "get_ipython", "exit", "quit"}
    assert all(len(v.repr) <= kernel_agent.REPR_CHARS for v in snap.variables.values())
    assert snap.memory_bytes > 50 * 2**20 and snap.uss_bytes > 0
    assert snap.failures == {}
    assert len(json.dumps(snap.to_dict())) < 16_000  # bounded reprs keep ~18 variables to a few KB


def test_state_hash_follows_the_namespace(session):
    start = take_snapshot(session).state_hash
    session.execute("features.loc[0, 'linesofcode'] += 1")
    changed = take_snapshot(session)
    assert changed.state_hash != start
    session.execute("features.loc[0, 'linesofcode'] -= 1")
    assert take_snapshot(session).state_hash == start
    session.execute("extra = 1")
    assert take_snapshot(session).state_hash != start
    session.execute("del extra")
    assert take_snapshot(session).state_hash == start


def test_snapshot_round_trips_and_speaks_the_paper_names(session):
    snap = take_snapshot(session)
    again = Snapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap
    paper = snap.runtime_variables()
    assert paper["threshold"] == {"size": snap.variables["threshold"].size, "repr": "0.5"}
    with pytest.raises(ValueError, match="'broken'"):
        VariableInfo.from_dict({"name": "broken", "type": "builtins.int"})


def test_a_broken_variable_does_not_hide_the_others(session):
    session.execute("class Weird:\n    def __repr__(self):\n        raise RuntimeError('boom')\n"
                    "    def __len__(self):\n        raise OSError('no len')\nweird = Weird()")
    try:
        snap = take_snapshot(session)
        assert snap.variables["weird"].repr_error == "RuntimeError: boom"
        assert "weird" in snap.failures and "no len" in snap.failures["weird"]
        assert snap.variables["features"].shape == (1918, 21)
    finally:
        session.execute("del weird, Weird")


def test_an_agent_failure_names_the_call(session):
    with pytest.raises(AgentError, match="restore"):
        from themisto.runtime.snapshot import agent_call

        agent_call(session, "restore", folder="/proc/not-a-folder", plan=[], timeout=30)
