"""Reproducibility across processes: two fresh `themisto build` replays of a sample trajectory give identical ids and
targets in every config and split, and two `themisto score --execute` runs of the same predictions give identical
records. Each process gets another PYTHONHASHSEED, so set order or an object address that leaks shows up here."""

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import pytest

from themisto.ingest.trajectory import Execution, Trajectory
from themisto.release.parquet import build_release
from themisto.release.tasks import TaskSettings, trajectory_rows
from themisto.replay.replay import ReplaySettings, replay_trajectory
from themisto.replay.steps_file import read_steps

REPO = Path(__file__).resolve().parents[1]
# A sample trajectory whose 12th cell shows a matplotlib object's address; its first 40 log lines hold 16 cells.
SAMPLE_LOG = REPO / "data" / "sample" / "2851258b-9d31-4a50-b2ec-a96ac55e075c.log"
SAMPLE_LINES = 40
ADDRESS = re.compile(r"\bat 0x[0-9a-fA-F]{4,}\b")
# Timing and memory differ between any two runs; everything else in a record must not.
TIMING = {"duration_s", "continuation_s", "branch_wall_s", "reference_durations_s", "reference_continuation_s",
          "replay_s", "execution_time", "memory_bytes"}


def _cli_twice(args: Callable[[str], list[str]], extra_env: dict | None = None) -> None:
    """`themisto args(seed)` for seeds 1 and 2, at the same time (one kernel each: the machine's two cores)."""
    running = []
    try:
        for seed in ("1", "2"):
            env = {**os.environ, "PYTHONHASHSEED": seed, **(extra_env or {})}
            err = tempfile.TemporaryFile()  # a file, not a pipe: neither process waits on a full pipe
            running.append((subprocess.Popen([sys.executable, "-m", "themisto.cli", *args(seed)], env=env, cwd=REPO,
                                             stdout=subprocess.DEVNULL, stderr=err), err))
        for process, err in running:
            process.wait(timeout=300)
            err.seek(0)
            assert process.returncode == 0, err.read()[-2000:].decode(errors="replace")
    finally:
        for process, err in running:
            if process.poll() is None:
                process.kill()
                process.wait()
            err.close()


def _contents(folder: Path) -> dict:
    """Per config and split: ids with targets and history outputs (task configs), step outputs (trajectories), the
    stored values' content hashes, types, formats and the sha256 of their bytes (values)."""
    found = {}
    for path in sorted(folder.glob("*/*.parquet")):
        rows = pq.read_table(path).to_pylist()
        if path.parent.name == "trajectories":
            found[path.parent.name, path.stem] = [(r["kernel_id"], r["step"], r["status"], r["output"]) for r in rows]
        elif path.parent.name == "values":  # each stored value by its content hash and its bytes' sha256
            found[path.parent.name, path.stem] = sorted((r["hash"], r["type"], r["format"], r["sha256"]) for r in rows)
        elif path.parent.name.endswith("_prompts"):  # the text track: ids and targets (`full` shows the timings)
            found[path.parent.name, path.stem] = [(r["id"], r["target"]) for r in rows]
        else:
            found[path.parent.name, path.stem] = [(r["id"], r["target"], [h["output"] for h in r["history"]])
                                                 for r in rows]
    return found


def test_addresses_and_counters_are_masked_alike_in_targets_and_predictions():
    from themisto.runtime.outputs import mask_volatile
    from themisto.scoring.scorer import ScoreSettings, score

    target = mask_volatile("<matplotlib.colorbar.Colorbar at 0x7f6b6822c490>\n<Figure size 640x480 with 2 Axes>")
    assert target == "<matplotlib.colorbar.Colorbar at 0x…>\n<Figure size 640x480 with 2 Axes>"
    predicted = "<matplotlib.colorbar.Colorbar at 0x7f00deadbeef>\n<Figure size 640x480 with 2 Axes>"
    error = mask_volatile(f"ZeroDivisionError: division by zero\n{'-' * 75}\nCell In[28], line 1\n----> 1 1/0")
    assert "Cell In[…], line 1" in error
    result = score([predicted, "<Colorbar at 0x7f00deadbeef>", error.replace("In[…]", "In[3]")],
                   [target, target, error], settings=ScoreSettings(task="output_prediction"))
    assert [(p.exact_match, p.output_equivalent) for p in result.predictions] == [(1.0, True), (0.0, False),
                                                                                  (1.0, True)]
    assert result.predictions[0].prediction == predicted  # the record keeps what was submitted


# Step 2 kills its kernel only where the workspace holds a file named `lose`: replay then rebuilds the state from
# steps 0-1, so the kernel has run one cell fewer when step 3 raises, and its traceback says `Cell In[3]`, not 4.
COUNTER_CELLS = ["x = 1", "y = x + 1", "import os\nif os.path.exists('lose'):\n    os._exit(1)", "y / 0", "x",
                 # unseeded draws: the same in both replays (each kernel life seeds random and numpy's generator)
                 "import random\nimport numpy as np\nprint(random.random(), np.random.rand())"]


@pytest.mark.slow
def test_a_rebuild_in_one_replay_changes_no_target_of_the_steps_after_it(tmp_path):
    trajectory = Trajectory(id="counter", notebook="nb.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=c, status="ok")
                                        for i, c in enumerate(COUNTER_CELLS)])
    tasks = TaskSettings(test_fraction=1.0, length_quantile=1.0, min_prior_actions=1, output_sample_size=None)
    outputs, targets = [], []
    for name, files in (("quiet", []), ("lost", ["lose"])):
        workspace = tmp_path / f"ws-{name}"
        workspace.mkdir()
        for file in files:
            (workspace / file).write_text("")
        steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=30)))
        outputs.append(steps[3].output)
        out = tmp_path / name
        build_release(trajectory_rows(steps), out, tasks, source={"kind": "test", "workspace": {"given": name}})
        rows = pq.read_table(out / "output_prediction" / "test-00000-of-00001.parquet").to_pylist()
        targets.append({r["id"]: (r["target"], [h["output"] for h in r["history"]]) for r in rows})
    assert "Cell In[4]" in outputs[0] and "Cell In[3]" in outputs[1]  # the replays themselves differ
    assert targets[0]["counter/3"][0].startswith("ZeroDivisionError") and "Cell In[…]" in targets[0]["counter/3"][0]
    assert targets[0]["counter/3"] == targets[1]["counter/3"] and targets[0]["counter/4"] == targets[1]["counter/4"]
    assert targets[0]["counter/5"] == targets[1]["counter/5"] and targets[0]["counter/5"][0].startswith("0.")


@pytest.mark.slow
def test_the_draws_after_a_cell_stopped_by_its_limit_do_not_depend_on_how_far_it_got(tmp_path):
    # A developer-interrupted cell that draws until it is stopped: stopped after 1 CPU second in one replay and 2 in
    # the other (as a busy host and an idle one may stop a cell near its limit), it drew a different number of times.
    cells = ["import random\nimport numpy as np",
             "n = 0\nwhile True:\n    np.random.random(64)\n    random.random()\n    n += 1",
             "print(n > 0, np.random.randint(10**9), random.randrange(10**9))"]
    statuses = ["ok", "error", "ok"]
    trajectory = Trajectory(id="stopped-draws", notebook="nb.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=c, status=s,
                                                  ename=None if s == "ok" else "KeyboardInterrupt")
                                        for i, (c, s) in enumerate(zip(cells, statuses))])
    replays = []
    for i, seconds in enumerate((1.0, 2.0)):
        workspace = tmp_path / f"ws-{i}"
        workspace.mkdir()
        settings = ReplaySettings(cell_timeout_s=30, interrupted_timeout_s=seconds, interrupted_lines=None,
                                  snapshots=False, values=False)
        replays.append(list(replay_trajectory(trajectory, workspace, settings)))
    assert [s.status for s in replays[0]] == [s.status for s in replays[1]] == ["ok", "timeout", "ok"]
    assert not any(s.kernel_restarted for steps in replays for s in steps)  # stopped, the state kept
    assert replays[0][2].output.startswith("True ")
    assert replays[0][2].output == replays[1][2].output


# A host whose other core is busy, inside one kernel: a thread started before the cell takes half the interpreter.
_BUSY_HOST = "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()"


@pytest.mark.slow
def test_a_cell_its_developer_interrupted_stops_at_the_same_point_on_a_busy_host(tmp_path):
    # The developer interrupted a loop that fills a list; replay interrupts it too. By seconds, a busy host stops it
    # with a shorter list; by executed lines (themisto.runtime.line_budget), busy or idle, with the same one.
    def replayed(busy: bool, settings: ReplaySettings, name: str) -> list:
        cells = [_BUSY_HOST if busy else "import threading", "rows = []\nwhile True:\n    rows.append(len(rows))",
                 "print(len(rows))"]
        trajectory = Trajectory(id=name, notebook="nb.ipynb", source="test", task="task1", executions=[
            Execution(cell_id=f"c{i}", code=code, status="ok" if i != 1 else "error",
                      ename=None if i != 1 else "KeyboardInterrupt") for i, code in enumerate(cells)])
        workspace = tmp_path / name
        workspace.mkdir()
        return list(replay_trajectory(trajectory, workspace, settings))

    by_lines = ReplaySettings(interrupted_timeout_s=30, interrupted_lines=300_000, snapshots=False, values=False)
    idle, busy = replayed(False, by_lines, "idle"), replayed(True, by_lines, "busy")
    for steps in (idle, busy):  # stopped as a cell stopped by seconds is: the generators reseeded after it
        assert [(s.status, s.ename) for s in steps] == [("ok", None), ("timeout", "CellTimeout"), ("ok", None)]
        assert "300,000 lines" in steps[1].evalue and "LineBudgetSpent" in steps[1].output
        assert not steps[1].kernel_restarted
    assert int(idle[2].output) > 0 and idle[2].output == busy[2].output
    by_seconds = replace(by_lines, interrupted_timeout_s=1.0, interrupted_lines=None)
    idle, busy = replayed(False, by_seconds, "idle-s"), replayed(True, by_seconds, "busy-s")
    assert idle[1].status == busy[1].status == "timeout"
    assert int(busy[2].output) < int(idle[2].output)  # what the budget is for


@pytest.mark.slow
def test_two_fresh_builds_give_identical_ids_and_targets(tmp_path):
    log = tmp_path / SAMPLE_LOG.name
    log.write_bytes(b"".join(SAMPLE_LOG.read_bytes().splitlines(keepends=True)[:SAMPLE_LINES]))
    folders = [tmp_path / f"build-{seed}" for seed in ("1", "2")]
    _cli_twice(lambda seed: ["build", str(log), "-o", str(tmp_path / f"build-{seed}"), "--json"])
    raw = [[step.output for step in read_steps(Path(f"{f}.steps.jsonl"))] for f in folders]
    addresses = [[m.group(0) for text in outputs for m in ADDRESS.finditer(text)] for outputs in raw]
    assert addresses[0] and addresses[0] != addresses[1]  # the replays themselves differ: the masking is needed
    first, second = (_contents(f) for f in folders)
    assert set(first) == set(second) and {c for c, _ in first} == {
        "trajectories", "next_cell", "output_prediction", "values", "next_cell_prompts", "output_prediction_prompts"}
    for key in first:
        assert first[key] == second[key], key
    assert any("at 0x…" in row[3] for row in first["trajectories", "test-00000-of-00001"])


CELLS = [
    "words = {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}",
    "counts = {w: len(w) for w in words}",
    "marker = object()",
    "order = list(words)",  # set order: differs between hash seeds unless the kernel's seed is fixed
    "print(sorted(words))",
    "print(sorted(counts.items()))",
    "longest = max(words, key=len)\nprint(longest)",
]


@pytest.fixture(scope="module")
def tiny_release(tmp_path_factory):
    trajectory = Trajectory(id="seed-kernel", notebook="nb.ipynb", source="test", task="task1",
                            executions=[Execution(cell_id=f"c{i}", code=c, status="ok") for i, c in enumerate(CELLS)])
    workspace = tmp_path_factory.mktemp("repro-ws")
    steps = list(replay_trajectory(trajectory, workspace, ReplaySettings(cell_timeout_s=20)))
    out = tmp_path_factory.mktemp("repro-release") / "release"
    tasks = TaskSettings(test_fraction=1.0, length_quantile=1.0, min_prior_actions=3)
    build_release(trajectory_rows(steps), out, tasks, source={"kind": "test", "workspace": {"given": "repro-ws"}})
    return out, workspace


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


@pytest.mark.slow
def test_two_scorer_processes_give_identical_records(tiny_release, tmp_path):
    release, workspace = tiny_release
    rows = pq.read_table(release / "next_cell" / "test-00000-of-00001.parquet").to_pylist()
    candidates = ["print(words)", "print(marker)", "print(order)", "print(set(order))", "words", "order.sort()"]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text("".join(json.dumps({"id": r["id"], "prediction": [r["target"], *candidates]}) + "\n"
                                   for r in rows))
    _cli_twice(lambda seed: ["score", "--release", str(release), "--predictions", str(predictions), "--workspace",
                             str(workspace), "--execute", "--prediction-timeout", "10", "-o",
                             str(tmp_path / f"results-{seed}.json")], {"HF_ALLOW_CODE_EVAL": "1"})
    written = [_without_timing(json.loads((tmp_path / f"results-{seed}.json").read_text())) for seed in ("1", "2")]
    first, second = written
    assert first["scores"]["scored_examples"] == len(rows) and first["scores"]["state_mismatch_examples"] == 0
    assert [p["reason"] for p in first["predictions"]] == [p["reason"] for p in second["predictions"]]
    assert first["predictions"] == second["predictions"] and first["examples"] == second["examples"]
    assert first["scores"] == second["scores"]
