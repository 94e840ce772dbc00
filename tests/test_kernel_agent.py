"""The kernel agent's pieces in this process: content hashes, variable records, the workdir guard, and branches
forked from an in-process IPython shell (the kernel tests exercise the same code inside a real sandboxed kernel)."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from themisto.runtime import agent as ka
from themisto.runtime.agent import snapshots as ka_snapshots

# Values whose hashes must agree across processes (set order of str depends on the hash seed).
_VALUES_CODE = r"""
import json, re, sys
import numpy as np, pandas as pd
from themisto.runtime.agent import content_hash
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
    "stamps": list(pd.date_range("2023-01-01", periods=100, freq="min")) + [None],
    "dated": pd.DataFrame({"t": pd.date_range("2023-01-01", periods=3), "s": ["a", None, "c"],
                           "c": pd.Categorical(["x", "y", "x"])}),
    "match": re.search("b+", "abbbc"),
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


# ----- records kept between snapshots: every reuse must give what a fresh description gives --------------------


def _records(shell) -> dict:
    return {v["name"]: v for v in json.loads(ka.snapshot(shell))["variables"]}


def _fresh(shell) -> dict:
    """What an uncached snapshot records: each variable described from scratch."""
    return {name: ka.describe(name, value)[0] for name, value in ka.user_variables(shell).items()}


_KEPT_SETUP = """
import re
import pandas as pd
words = ["w%d" % i for i in range(5000)]
numbers = list(range(5000))
stamps = list(pd.Timestamp("2023-05-01 10:00") + pd.to_timedelta(range(4000), unit="s")) + [float("nan")]
lookup = {"k%d" % i: i for i in range(300)}
pair = ("a", 1, 2.5)
text = "some text"
found = re.search(r"(\\w+) (\\w+)", "hello world")
frame = pd.DataFrame({"n": range(300), "s": ["x%d" % (i % 7) for i in range(300)],
                      "t": pd.date_range("2023-01-01", periods=300, freq="h")})
series = frame["n"] * 2
"""


@pytest.fixture
def kept_shell(shell):
    shell.run_cell(_KEPT_SETUP, store_history=False)
    yield shell
    shell.run_cell("import gc; gc.collect()", store_history=False)


def test_kept_records_equal_fresh_ones_and_unchanged_values_keep_their_hash(kept_shell):
    first = _records(kept_shell)
    assert not any(v["hash"].startswith(ka.UNHASHABLE) for v in first.values())
    assert ka_snapshots.CACHE.by_id and ka_snapshots.CACHE.by_content  # both kinds of record were kept
    second = _records(kept_shell)
    assert second == first == _fresh(kept_shell)


@pytest.mark.parametrize("mutation, name", [
    ("words[2500] = 'changed'", "words"),
    ("words[0] = ''.join(['w', '1'])", "words"),  # another object, another content (w1 instead of w0)
    ("numbers.append(1); numbers.pop(0)", "numbers"),  # same length
    ("numbers.sort(reverse=True)", "numbers"),
    ("stamps[10] = stamps[10] + pd.Timedelta(1, 'ns')", "stamps"),
    ("stamps[-1] = None", "stamps"),  # NaN and None are different content
    ("lookup['k5'] = 6", "lookup"),
    ("lookup['extra'] = 1", "lookup"),
    ("del lookup['k0']; lookup['k0'] = 0", "lookup"),  # same items, another order
    ("frame.loc[17, 'n'] = -1", "frame"),
    ("frame.iloc[3, 1] = 'y'", "frame"),
    ("frame.loc[5, 's'] = None", "frame"),
    ("frame.columns.name = 'cols'", "frame"),  # shown in the repr
    ("series.iat[0] = 99", "series"),
    ("series.index = series.index + 1", "series"),
    ("pair = ('a', 1, 2.5, 'b')", "pair"),
    ("found = re.search(r'(\\w+) (\\w+)', 'hello world!')", "found"),  # same span and text, another subject
])
def test_a_change_between_snapshots_changes_the_record(kept_shell, mutation, name):
    before = _records(kept_shell)
    result = kept_shell.run_cell(mutation, store_history=False)
    assert result.success, result.error_in_exec
    after = _records(kept_shell)
    assert after[name]["hash"] != before[name]["hash"]
    assert {n: r for n, r in after.items() if n != name} == {n: r for n, r in before.items() if n != name}
    assert after == _fresh(kept_shell)


def test_an_equal_rebuild_keeps_the_hash_and_a_reverted_change_restores_it(kept_shell):
    before = _records(kept_shell)
    kept_shell.run_cell("words = ['w%d' % i for i in range(5000)]\nframe = frame.copy()\n"
                        "stamps = list(stamps)", store_history=False)
    rebuilt = _records(kept_shell)
    for name in ("words", "frame", "stamps"):
        assert rebuilt[name]["hash"] == before[name]["hash"]
    kept_shell.run_cell("frame.loc[0, 'n'] += 1", store_history=False)
    assert _records(kept_shell)["frame"]["hash"] != before["frame"]["hash"]
    kept_shell.run_cell("frame.loc[0, 'n'] -= 1", store_history=False)
    assert _records(kept_shell)["frame"] == before["frame"]


def test_display_options_are_part_of_a_kept_frame_repr(kept_shell):
    import pandas

    before = _records(kept_shell)["frame"]
    with pandas.option_context("display.show_dimensions", False):
        narrow = _records(kept_shell)["frame"]
        assert narrow == ka.describe("frame", kept_shell.user_ns["frame"])[0]
    assert narrow["hash"] == before["hash"] and narrow["repr"] != before["repr"]


def test_the_cache_lets_go_of_deleted_and_large_values(kept_shell):
    kept_shell.run_cell("big = ['x%d' % i for i in range(400_000)]", store_history=False)  # ~25 MB deep
    _records(kept_shell)
    ids = {name: id(value) for name, value in ka.user_variables(kept_shell).items()}
    assert ids["words"] in ka_snapshots.CACHE.by_id and ids["big"] not in ka_snapshots.CACHE.by_id
    assert _records(kept_shell)["big"] == ka.describe("big", kept_shell.user_ns["big"])[0]
    kept_shell.run_cell("del words", store_history=False)
    _records(kept_shell)
    assert ids["words"] not in ka_snapshots.CACHE.by_id


def test_frame_hashes_are_exact_where_pandas_hashes_are_not():
    with_none = pd.DataFrame({"s": ["a", None]})
    with_nan = pd.DataFrame({"s": ["a", float("nan")]})
    assert ka.content_hash(with_none) != ka.content_hash(with_nan)
    assert ka.content_hash(pd.Series([1, "b"], dtype=object)) != ka.content_hash(pd.Series(["1", "b"]))
    stamps = pd.DataFrame({"t": pd.to_datetime(["2023-01-01", None])})
    assert not ka.content_hash(stamps).startswith(ka.UNHASHABLE)  # datetime64 columns refuse the buffer protocol
    assert not ka.content_hash(stamps["t"].to_numpy()).startswith(ka.UNHASHABLE)
    aware = stamps.assign(t=stamps["t"].dt.tz_localize("UTC"))
    assert ka.content_hash(aware) != ka.content_hash(stamps)
    cats = pd.Series(["a", "b"], dtype="category")
    assert ka.content_hash(cats) != ka.content_hash(cats.cat.add_categories(["c"]))  # unused categories show
    nullable = pd.Series([1, None], dtype="Int64")
    assert ka.content_hash(nullable) != ka.content_hash(pd.Series([1, 2], dtype="Int64"))
    multi = pd.DataFrame({"v": [1, 2]}, index=pd.MultiIndex.from_tuples([("a", 1), ("b", 2)]))
    assert ka.content_hash(multi) != ka.content_hash(multi.swaplevel().sort_index())
    daily = pd.Series([1, 2], index=pd.date_range("2023-01-01", periods=2, freq="D"))
    assert ka.content_hash(daily) != ka.content_hash(pd.Series([1, 2], index=pd.DatetimeIndex(list(daily.index))))


def test_timestamp_lists_hash_by_value_unit_and_timezone():
    base = pd.Timestamp("2023-05-01 10:00")
    stamps = [base + pd.Timedelta(seconds=i) for i in range(200)]
    copies = pickle.loads(pickle.dumps(stamps))
    assert copies[0] is not stamps[0] and ka.content_hash(stamps) == ka.content_hash(copies)
    assert ka.content_hash(stamps) != ka.content_hash(stamps[:-1] + [stamps[-1] + pd.Timedelta(1, "ns")])
    other_unit = "ms" if stamps[0].unit != "ms" else "s"
    assert ka.content_hash(stamps) != ka.content_hash([t.as_unit(other_unit) for t in stamps])  # `.unit` is observable
    assert ka.content_hash(stamps) != ka.content_hash([t.tz_localize("UTC") for t in stamps])
    assert ka.content_hash(stamps) != ka.content_hash(tuple(stamps))
    assert ka.content_hash(stamps + [None]) != ka.content_hash(stamps + [float("nan")])
    assert ka.content_hash(stamps + ["x", 1]) != ka.content_hash(stamps + [1, "x"])


def test_a_kept_frame_size_follows_its_index_lookup_table(shell):
    shell.run_cell("import pandas as pd\nkeyed = pd.DataFrame({'a': range(500)}, index=['k%d' % i for i in range(500)])",
                   store_history=False)
    before = _records(shell)["keyed"]
    shell.run_cell("keyed.loc['k5']", store_history=False)  # builds the index's hash table, which memory_usage counts
    after = _records(shell)["keyed"]
    assert after["hash"] == before["hash"] and after["size"] > before["size"]
    assert after == ka.describe("keyed", shell.user_ns["keyed"])[0]


def test_frames_of_objects_are_described_anew_not_kept_by_hash(shell):
    # The hash pickles the object, which leaves `shown` out; the repr shows it. Only plain frames are kept by hash.
    shell.run_cell("import pandas as pd\nclass Shown:\n    def __init__(self):\n        self.shown = 'before'\n"
                   "    def __getstate__(self):\n        return {}\n    def __repr__(self):\n        return self.shown\n"
                   "boxes = pd.DataFrame({'o': [Shown(), Shown()]})", store_history=False)
    before = _records(shell)["boxes"]
    shell.run_cell("boxes.iloc[0, 0].shown = 'after'", store_history=False)
    after = _records(shell)["boxes"]
    assert after["hash"] == before["hash"] and "after" in after["repr"] and "after" not in before["repr"]


def test_a_snapshot_does_not_change_a_groupby_it_describes(shell):
    shell.run_cell("import pandas as pd\ngrouped = pd.DataFrame({'u': [1, 2, 1, 3] * 50, 'v': range(200)})"
                   ".groupby('u')['v']", store_history=False)
    first = _records(shell)["grouped"]
    assert _records(shell)["grouped"] == first  # len() or .dtype would have computed (and cached) the groups
    assert "dtype" not in first and not first["hash"].startswith(ka.UNHASHABLE)
