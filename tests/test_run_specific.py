"""Run-specific values (`themisto.release.run_specific`): what a cell computes from the clock, the system's entropy
or its process is marked, with what is computed from it, until a clean cell binds it again; the state hash a release
records leaves them out, and a check counts a difference in them apart."""

from themisto.release.run_specific import mark_run_specific, run_specific_names
from themisto.runtime.agent.hashing import state_hash
from themisto.runtime.snapshot import Snapshot, VariableInfo


def _rows(cells: list[tuple[str, dict[str, str]]], restart_before: int | None = None) -> list[dict]:
    return [{"kernel_id": "k", "step": i, "code": code, "restarted_before": i == restart_before,
             "variables": [{"name": n, "hash": h} for n, h in names.items()],
             "state_hash": state_hash(names), "stored_values": {"unstored": [], "modules": [], "aliases": []}}
            for i, (code, names) in enumerate(cells)]


def test_a_clock_reading_taints_what_is_computed_from_it_until_a_clean_cell_binds_it_again():
    rows = _rows([
        ("import datetime as dt\nfrom time import time as clock", {}),
        ("started = dt.datetime.now()\nn = 3", {"started": "a", "n": "1"}),  # both changed by the cell
        ("label = f'run {started}'", {"started": "a", "n": "1", "label": "b"}),  # computed from it
        ("total = n * 2", {"started": "a", "n": "1", "label": "b", "total": "c"}),  # clean
        ("def stamp():\n    return clock()", {"started": "a", "n": "1", "label": "b", "total": "c", "stamp": "f"}),
        ("t = stamp()", {"started": "a", "n": "1", "label": "b", "total": "c", "stamp": "f", "t": "d"}),
        ("label = 'fixed'\nn = 4", {"started": "a", "n": "2", "label": "e", "total": "c", "stamp": "f", "t": "d"}),
        ("rng = __import__('numpy').random.default_rng(0)\nimport numpy as np\ng = np.random.default_rng()",
         {"rng": "r", "g": "s"}),
    ], restart_before=7)
    marked = run_specific_names(rows)
    assert marked[1] == {"started", "n"} and marked[2] == {"started", "n", "label"}
    assert marked[3] == {"started", "n", "label", "total"}  # `total` computed from `n`: the cell reads it
    assert marked[4] == marked[3] and "stamp" not in marked[4]  # a function's code is stable; calling it is not
    assert "t" in marked[5]
    assert marked[6] == {"started", "total", "t"}  # `label` and `n` bound again by a clean cell
    assert marked[7] == {"g", "rng"}  # a fresh kernel; an unseeded generator (the cell also made a seeded one)


def test_the_recorded_state_hash_leaves_them_out_and_a_check_counts_them_apart():
    rows = _rows([("import time\nx = 1", {"x": "1"}), ("t0 = time.time()", {"x": "1", "t0": "run-a"})])
    marked, counts = mark_run_specific(rows)
    assert counts == {"variables": 1, "steps": 1, "trajectories": 1}
    assert rows[1]["state_hash"] == state_hash({"x": "1", "t0": "run-a"})  # the caller's rows are left as they were
    assert marked[1]["state_hash"] == state_hash({"x": "1"}) and marked[0]["state_hash"] == rows[0]["state_hash"]
    assert [v["stable"] for v in marked[1]["variables"]] == [True, False]
    assert [u["name"] for u in marked[1]["stored_values"]["unstored"]] == ["t0"]  # its value is not stored
    # Another run of the same cells: the clock differs, the state the release vouches for does not.
    live = Snapshot(variables={n: VariableInfo(name=n, type="float", size=24, repr="", hash=h)
                               for n, h in {"x": "1", "t0": "run-b"}.items()}, memory_bytes=0, state_hash="")
    assert live.vouched(marked[1]["variables"]) == (marked[1]["state_hash"], ["t0"])
    other = Snapshot(variables={n: VariableInfo(name=n, type="int", size=24, repr="", hash=h)
                                for n, h in {"x": "2", "t0": "run-a"}.items()}, memory_bytes=0, state_hash="")
    assert other.vouched(marked[1]["variables"]) == (state_hash({"x": "2"}), [])  # a stable difference still counts


def test_a_catboost_model_is_run_specific_with_what_it_makes_but_not_its_data():
    # Fitted twice on the same data, a CatBoost model differs in the identifier it drew (`model_guid`).
    rows = _rows([
        ("from catboost import CatBoostClassifier\nimport pandas as pd\nX = pd.DataFrame({'a': [1, 2]})", {"X": "x"}),
        ("cbc = CatBoostClassifier(iterations=5)", {"X": "x", "cbc": "m"}),
        ("cbc.fit(X, [0, 1])\npred = cbc.predict(X)", {"X": "x", "cbc": "m2", "pred": "p"}),
        ("n = len(X)", {"X": "x", "cbc": "m2", "pred": "p", "n": "2"}),
    ])
    marked = run_specific_names(rows)
    assert marked[0] == set() and marked[1] == {"cbc"}
    assert marked[2] == {"cbc", "pred"} and marked[3] == marked[2]  # the data and what reads only it are not
