"""The kernel agent's pieces in this process: content hashes, variable records, the workdir guard, and branches
forked from an in-process IPython shell (the kernel tests exercise the same code inside a real sandboxed kernel)."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from themisto import kernel_agent as ka

# Values whose hashes must agree across processes (set order of str depends on the hash seed).
_VALUES_CODE = r"""
import json, sys
import numpy as np, pandas as pd
from themisto.kernel_agent import content_hash
def f(a, b=2):
    return a + b * 3
values = {
    "set": {"alpha", "beta", "gamma", "delta"},
    "dict": {"b": [1, 2.5, None], "a": ("x", b"y", 3 + 4j)},
    "frame": pd.DataFrame({"n": [1, 2, 3], "s": ["a", "b", None]}, index=[10, 20, 30]),
    "array": np.arange(12, dtype="float32").reshape(3, 4),
    "objects": np.array(["a", 1, None], dtype=object),
    "big_int": 7 ** 5000,
    "function": f,
    "nested": {"frame": pd.Series([1.5, float("nan")]), "tokens": frozenset({"p", "q"})},
}
json.dump({k: content_hash(v) for k, v in values.items()}, sys.stdout)
"""


def _hashes_in_subprocess(seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", _VALUES_CODE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_content_hashes_are_stable_across_processes_and_hash_seeds():
    first, second = _hashes_in_subprocess("1"), _hashes_in_subprocess("2")
    assert first == second
    assert not any(h.startswith(ka.UNHASHABLE) for h in first.values())
    assert len(set(first.values())) == len(first)


def test_content_hash_follows_content_not_identity():
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert ka.content_hash(df) == ka.content_hash(df.copy())
    changed = df.copy()
    changed.loc[1, "a"] = 3
    assert ka.content_hash(changed) != ka.content_hash(df)
    assert ka.content_hash(df.rename(columns={"b": "c"})) != ka.content_hash(df)
    assert ka.content_hash(df.astype({"a": "int32"})) != ka.content_hash(df)
    word = "".join(["ab", "c"])
    assert ka.content_hash([word, word]) == ka.content_hash([word, "".join(["a", "bc"])])
    assert len({ka.content_hash(v) for v in (1, 1.0, True, "1", b"1", [1], (1,))}) == 7
    assert ka.content_hash({"a": 1, "b": 2}) != ka.content_hash({"b": 2, "a": 1})  # dict order is observable
    assert ka.content_hash({1, 2, 3}) == ka.content_hash({3, 2, 1})
    big = list(range(300_000))  # past the canonical budget: hashed by its memo-free pickle
    assert ka.content_hash(big) == ka.content_hash(list(range(300_000)))
    assert ka.content_hash(big) != ka.content_hash(list(range(1, 300_001)))


def test_unhashable_values_are_recorded_not_raised():
    generator = (i for i in range(3))
    assert ka.content_hash(generator).startswith(ka.UNHASHABLE)
    cyclic: list = []
    cyclic.append(cyclic)
    assert not ka.content_hash(cyclic).startswith(ka.UNHASHABLE)  # a cycle falls back to pickle, which handles it


class _BrokenRepr:
    def __repr__(self):
        raise ValueError("no repr for you")


def test_describe_records_shapes_sizes_and_broken_reprs():
    frame = pd.DataFrame({"x": np.arange(1000), "label": ["word"] * 1000})
    record, failure = ka.describe("frame", frame)
    assert failure is None
    assert record["type"] == "pandas.core.frame.DataFrame"
    assert record["shape"] == [1000, 2] and record["len"] == 1000 and record["columns"] == ["x", "label"]
    assert record["size"] == int(frame.memory_usage(deep=True).sum())
    array_record, _ = ka.describe("a", np.zeros((4, 5)))
    assert array_record["size"] == 160 and array_record["dtype"] == "float64" and array_record["shape"] == [4, 5]
    long_record, _ = ka.describe("long", list(range(100_000)))
    assert len(long_record["repr"]) <= ka.REPR_CHARS and long_record["len"] == 100_000
    assert long_record["size"] > 100_000 * 8  # deep: the list and its ints, extrapolated past the walk budget
    broken, _ = ka.describe("broken", _BrokenRepr())
    assert broken["repr_error"] == "ValueError: no repr for you"
    assert broken["repr"].startswith("<repr failed")


def test_large_frame_size_is_estimated_close_to_exact():
    frame = pd.DataFrame({"n": np.arange(300_000), "s": np.array(["short", "a longer string"] * 150_000)})
    exact = int(frame.memory_usage(deep=True).sum())
    assert abs(ka.size_of(frame) - exact) / exact < 0.05


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.reset(new_session=False)
    shell.run_cell("import math\nimport random\n_private = 1\nrandom.seed(7)\nnumbers = [1, 2, 3]\n"
                   "table = {'k': 'v'}", store_history=True)
    yield shell
    shell.reset(new_session=False)


def test_user_variables_leave_out_modules_ipython_names_and_underscores(shell):
    assert set(ka.user_variables(shell)) == {"numbers", "table"}
    snapshot = json.loads(ka.snapshot(shell))
    assert [v["name"] for v in snapshot["variables"]] == ["numbers", "table"]
    assert snapshot["memory_bytes"] > 0 and snapshot["failures"] == {}


def test_branch_in_a_forked_shell_captures_outputs_and_leaves_the_parent_alone(shell):
    before = json.loads(ka.snapshot(shell))["state_hash"]
    import random

    state = random.getstate()
    random_after_seed = random.random()
    random.setstate(state)
    codes = [
        "import os\nprint('py')\nos.write(1, b'fd-level\\n')\nnumbers.append(4)\nnumbers",
        "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\ndel table\nfresh = 1",
        "import random\nrandom.random()",
        "raise KeyError('k')",
    ]
    answer = json.loads(ka.branch(codes, timeout_s=10, shell=shell))
    first, second, third, fourth = answer["results"]
    assert first["status"] == "ok"
    kinds = [(o["output_type"], o.get("name")) for o in first["outputs"]]
    assert ("execute_result", None) in kinds
    texts = "".join(o.get("text", "") for o in first["outputs"])
    assert "py\n" in texts and "fd-level\n" in texts
    result = [o for o in first["outputs"] if o["output_type"] == "execute_result"]
    assert result[0]["data"]["text/plain"] == "[1, 2, 3, 4]"
    assert set(first["changed"]) == {"numbers"} and first["added"] == {} and first["deleted"] == {}
    assert second["outputs"][0]["output_type"] == "display_data"
    assert second["outputs"][0]["data"]["text/html"] == "<b>x</b>"
    assert set(second["deleted"]) == {"table"} and set(second["added"]) == {"fresh", "display", "HTML"}
    assert third["outputs"][0]["data"]["text/plain"] == repr(random_after_seed)  # the parent's random state, not a reseed
    assert fourth["status"] == "error" and fourth["ename"] == "KeyError"
    assert [o["output_type"] for o in fourth["outputs"]] == ["error"]
    assert shell.user_ns["numbers"] == [1, 2, 3] and "table" in shell.user_ns and "fresh" not in shell.user_ns
    assert json.loads(ka.snapshot(shell))["state_hash"] == before == answer["state_hash_before"]


def test_workdir_guard_restores_deleted_modified_and_added_files(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "input.csv").write_text("a,b\n1,2\n")
    (tmp_path / "notes.txt").write_text("keep me")
    guard = ka.WorkdirGuard(str(tmp_path))
    try:
        guard.refresh()
        assert guard.check_and_restore() == {"added": [], "deleted": [], "modified": [], "unrestored": []}
        (tmp_path / "data" / "input.csv").unlink()
        (tmp_path / "notes.txt").write_text("overwritten")
        (tmp_path / "new").mkdir()
        (tmp_path / "new" / "out.txt").write_text("x")
        report = guard.check_and_restore()
        assert report["deleted"] == [os.path.join("data", "input.csv")]
        assert report["modified"] == ["notes.txt"]
        assert report["added"] == ["new", os.path.join("new", "out.txt")]
        assert report["unrestored"] == []
        assert (tmp_path / "data" / "input.csv").read_text() == "a,b\n1,2\n"
        assert (tmp_path / "notes.txt").read_text() == "keep me"
        assert not (tmp_path / "new").exists()
        assert guard.check_and_restore()["modified"] == []  # the restored state is the recorded state again
    finally:
        guard.close()
