"""The shipped sample trajectories (data/sample): real JuNE format, realistic development, reproducible."""

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from themisto.ingest.june_format import decode_log_line, encode_log_line

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
LOGS = sorted(SAMPLE.glob("*.log"))
EVENT_FIELDS = ["ip_address", "time", "kernel_id", "notebook_name", "event", "cell_index", "cell_num",
                "cell_source", "cell_type", "session_id", "cell_output"]


def _load_make_sample():
    spec = importlib.util.spec_from_file_location("make_sample", REPO / "data" / "make_sample.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_sample"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _events(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as fh:
        return [decode_log_line(line) for line in fh]


def _runs(events: list[dict]) -> list[dict]:
    """Pair events into runs by the real logs' rule, checking the pairing holds everywhere (independent of
    themisto.ingest.june): `execute` then the same cell's `finished_execute` without error; an errored run has no
    `execute`, only a `finished_execute` ending in an error output, immediately followed by its `error` event."""
    runs, pending = [], None
    for i, ev in enumerate(events):
        kind = ev["event"]
        if kind == "execute":
            assert pending is None, f"event {i}: execute while another run is pending"
            assert ev["cell_output"] is None
            pending = ev
        elif kind == "finished_execute":
            outputs = json.loads(ev["cell_output"])
            types = [o["output_type"] for o in outputs]
            if pending is not None:
                assert (ev["cell_index"], ev["cell_source"]) == (pending["cell_index"], pending["cell_source"]), i
                assert "error" not in types, f"event {i}: a run that raised was logged with an execute event"
                assert ev["time"] > pending["time"]
                runs.append({"code": ev["cell_source"], "outputs": outputs, "ename": None})
                pending = None
            else:
                nxt = events[i + 1]
                assert nxt["event"] == "error", f"event {i}: finished_execute with neither execute nor error"
                assert (nxt["cell_index"], nxt["time"]) == (ev["cell_index"], ev["time"]), i
                assert "error" in types and all(o["size"] == 0 for o in outputs if o["output_type"] == "error")
                err = json.loads(nxt["cell_source"])
                assert err["output_type"] == "error" and isinstance(err["evalue"], str)
                runs.append({"code": ev["cell_source"], "outputs": outputs, "ename": err["ename"]})
        elif kind == "error":
            assert events[i - 1]["event"] == "finished_execute", f"event {i}: error without its finished event"
        elif kind == "kernel_restarting":
            runs.append({"restart": True})
    assert pending is None, "a run never finished"
    return runs


def test_sample_files_exist():
    assert len(LOGS) >= 4, f"expected at least 4 sample logs in {SAMPLE}"


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem[:8])
def test_every_line_round_trips(path):
    with path.open(encoding="utf-8", newline="") as fh:
        for lineno, line in enumerate(fh, start=1):
            assert line.endswith("\n") and not line.endswith("\r\n"), f"{path.name}:{lineno}"
            assert encode_log_line(decode_log_line(line)) + "\n" == line, f"{path.name}:{lineno}"


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem[:8])
def test_events_follow_the_real_log_format(path):
    events = _events(path)
    first = events[0]
    assert first["event"] == "save_notebook"
    assert list(first) == ["ip_address", "time", "kernel_id", "notebook_name", "event", "cell_source", "session_id"]
    cells = json.loads(first["cell_source"])
    assert cells and all(set(c) == {"id", "cell_type", "source", "execution_count"} for c in cells)
    assert path.name == f"{first['kernel_id']}.log"
    times = [ev["time"] for ev in events]
    assert times == sorted(times), "timestamps must not go back"
    for ev in events:
        assert len(ev["time"]) == 24 and ev["time"].endswith("Z") and ev["time"][19] == "."
        assert (ev["kernel_id"], ev["session_id"]) == (first["kernel_id"], first["session_id"])
        assert ev["notebook_name"] in ("task1.ipynb", "task2.ipynb")
        if ev["event"] == "save_notebook":
            continue
        expected = [f for f in EVENT_FIELDS if ev["event"] != "error" or f not in ("ip_address", "cell_output")]
        assert list(ev) == expected, ev["event"]
        assert ev.get("ip_address") is None
        if ev["event"] in ("kernel_restarting", "kernel_interrupting"):
            assert ev["cell_index"] == "" and ev["cell_source"] == ""
        else:
            assert len(ev["cell_index"]) == 32 and int(ev["cell_index"], 16) >= 0
            assert ev["cell_type"] == "code"
        if ev["event"] == "create":
            assert ev["cell_source"] == ""


def test_totals_and_variety():
    per_file = {path.name: _runs(_events(path)) for path in LOGS}
    runs = [r for rs in per_file.values() for r in rs if "restart" not in r]
    enames = Counter(r["ename"] for r in runs if r["ename"])
    assert len(runs) >= 300
    assert len(enames) >= 5, enames
    assert {"NameError", "KeyError", "AttributeError", "SyntaxError", "TypeError", "ValueError", "IndexError"} \
        <= set(enames)
    kinds = Counter()
    for r in runs:
        if r["ename"] is None:
            kinds.update({o["output_type"] for o in r["outputs"]} or {"nothing"})
    assert {"execute_result", "display_data", "stream", "nothing"} <= set(kinds), kinds
    # Plots are real PNGs (base64 of tens of KB), not placeholders.
    assert max(o["size"] for r in runs for o in r["outputs"] if o["output_type"] == "display_data") > 5000
    # Real development: the same code re-run, and edits of the same cell.
    codes = Counter(r["code"] for r in runs)
    assert sum(n - 1 for n in codes.values()) >= 50
    assert sum("check_logging(" in r["code"] and not r["code"].startswith("#") for r in runs) >= 2


def test_restarts_wipe_the_state():
    restarts = forgot = 0
    for path in LOGS:
        runs = _runs(_events(path))
        for i, r in enumerate(runs):
            if "restart" not in r:
                continue
            restarts += 1
            after = [x for x in runs[i + 1:i + 12] if "restart" not in x]
            # Nothing defined before the restart exists after it: the notebook's imports are run again ...
            first_import = next(j for j, x in enumerate(after) if "import " in x["code"] and x["ename"] is None)
            # ... and the developer often finds out from a NameError first.
            forgot += any(x["ename"] == "NameError" for x in after[:first_import])
    assert restarts >= 1 and forgot >= 1


def test_both_tasks_are_covered():
    code = {"task1.ipynb": "", "task2.ipynb": ""}
    for path in LOGS:
        events = _events(path)
        code[events[0]["notebook_name"]] += "\n".join(r.get("code", "") for r in _runs(events))
    assert "jetnet_logs.txt" in code["task1.ipynb"]
    for column in ("user_id", "session_num", "action_time", "action_name"):
        assert column in code["task1.ipynb"]
    assert "read_pickle" in code["task2.ipynb"] and "f1_score" in code["task2.ipynb"]
    assert ".fit(" in code["task2.ipynb"]
    # No cell reaches the network or leaves the workspace.
    for text in code.values():
        assert "http" not in text.replace("http://collector.invalid:9999", "")
        assert "open('/" not in text and 'open("/' not in text


def test_reader_agrees_with_the_pairing_rule():
    from themisto.ingest import june_log as june

    for path in LOGS:
        runs = [r for r in _runs(_events(path)) if "restart" not in r]
        trajectory = june.read_june_log(path)
        assert len(trajectory.executions) == len(runs), path.name
        assert [e.code for e in trajectory.executions] == [r["code"] for r in runs]
        assert [e.ename for e in trajectory.executions] == [r["ename"] for r in runs]
        assert trajectory.count_events("restart") == sum(1 for r in _runs(_events(path)) if "restart" in r)


def test_readme_says_authored_and_lists_every_log():
    text = (SAMPLE / "README.md").read_text(encoding="utf-8")
    assert "authored" in text.lower() and "not study data" in text
    for path in LOGS:
        assert path.name in text
    assert "python data/make_sample.py" in text


def test_authored_scripts_match_the_shipped_logs():
    """Cheap check without kernels: the shipped logs hold exactly the authored steps, in order."""
    make_sample = _load_make_sample()
    scripts = make_sample.scripts()
    assert len(scripts) == len(LOGS)
    by_name = {}
    for path in LOGS:
        runs = _runs(_events(path))
        by_name[tuple(r.get("code") for r in runs)] = runs
    for script in scripts:
        steps = [s for s in script.steps if s.action != "delete"]
        key = tuple(None if s.action == "restart" else s.code for s in steps)
        assert key in by_name, f"{script.name}: no shipped log holds its steps (regenerate the sample)"
        runs = by_name[key]
        assert [s.expect for s in steps if s.action == "run"] == [r["ename"] for r in runs if "restart" not in r]


def test_authoring_errors_name_the_script_and_step():
    make_sample = _load_make_sample()
    script = make_sample.Script("demo", "task1.ipynb", "2023-05-06T08:00:00.000Z")
    script.run("a", "x = 1")
    with pytest.raises(make_sample.SampleError, match=r"demo: step 1: 'y = 1' is not in cell 'a'"):
        script.run("a", edit=("y = 1", "y = 2"))
    with pytest.raises(make_sample.SampleError, match=r"demo: step 1: cell 'b' has no source yet"):
        script.run("b")


@pytest.mark.slow
def test_regeneration_is_byte_identical(tmp_path):
    make_sample = _load_make_sample()
    make_sample.generate(tmp_path / "sample")
    assert make_sample.digests(tmp_path / "sample") == make_sample.digests(SAMPLE), \
        "data/sample is stale (workspace, library or script changed): run `python data/make_sample.py`"
