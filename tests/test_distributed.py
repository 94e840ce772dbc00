"""Replay, build, scoring and generation on a local Ray (2 CPUs, started by these tests in their own folder): the same
files and records as a local run, a worker killed mid-run costs nothing, a trajectory whose worker dies twice is
recorded as failed and resumed later, Ctrl-C cleans the kernels up, an unreachable address starts nothing, workers
unlike the driver are named, and nothing imports Ray without --ray."""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from themisto.cli import main
from themisto.distributed.cluster import ClusterError, RayTarget, check_workers, environment_problems
from themisto.distributed.ray_runner import replay_runner
from themisto.ingest.trajectory import Execution, Trajectory
from themisto.replay.replay import ReplaySettings
from themisto.replay.steps_file import ReplayIncomplete, read_steps, replay_to_file
from themisto.vocabulary import TASKS

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
# A task1 and a task2 trajectory, cut to their first 30 log lines (12-13 executions each).
SHORT_LOGS = ("e50c32e4-ef80-44d3-9535-36a5662816af.log", "2851258b-9d31-4a50-b2ec-a96ac55e075c.log")
FAST = ReplaySettings(cell_timeout_s=20.0, interrupted_timeout_s=2.0)
# What differs between two replays of the same cells: timings, memory, and object addresses in reprs.
_VOLATILE = ("execution_time", "memory_bytes")
_ADDRESS = re.compile(r"0x[0-9a-f]{6,}")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs in its own folder (never /tmp/ray), shut down after the module."""
    import ray  # in requirements.txt: a missing Ray fails here, it is not skipped
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def short_logs(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("logs")
    paths = []
    for name in SHORT_LOGS:
        lines = (SAMPLE / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / name).write_text("".join(lines[:30]), encoding="utf-8")
        paths.append(folder / name)
    return paths


def _traj(tid: str, codes: list[str]) -> Trajectory:
    return Trajectory(id=tid, notebook="nb.ipynb", source="test",
                      executions=[Execution(cell_id=f"c{i}", code=code, status="ok") for i, code in enumerate(codes)])


def _worker_processes(trajectory_id: str | None = None) -> list[psutil.Process]:
    """Ray workers of this test process now replaying `trajectory_id` (any, if None): Ray titles a worker with the
    running task's name, `ray::replay <id>`."""
    title = "ray::replay " + (trajectory_id or "")
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if cmdline and (cmdline[0] == title if trajectory_id else cmdline[0].startswith(title)):
            found.append(proc)
    return found


def _with_kernel(proc: psutil.Process) -> bool:
    """Whether a worker holds a kernel (its sandbox and kernel processes are the worker's children)."""
    try:
        return bool(proc.children(recursive=True))
    except psutil.Error:
        return False


def _comparable(step) -> dict:
    data = {k: v for k, v in step.to_dict().items() if k not in _VOLATILE}
    return json.loads(_ADDRESS.sub("0x…", json.dumps(data, sort_keys=True)))


@pytest.fixture(scope="module")
def ray_build(local_ray, short_logs, tmp_path_factory) -> Path:
    """`themisto build --ray` of the two short logs: the release folder (its steps beside it, DIR.steps.jsonl)."""
    release = tmp_path_factory.mktemp("ray-build") / "A"
    assert main(["build", *map(str, short_logs), "-o", str(release), "--json", "--ray"]) == 0
    return release


def test_build_on_ray_equals_a_local_build_of_its_steps_and_a_fresh_one_under_load(ray_build, short_logs, tmp_path):
    on_ray = ray_build
    steps_file = on_ray.with_name("A.steps.jsonl")
    steps = read_steps(steps_file)
    # the steps file lists trajectories in input order, each one's steps in order, whatever order Ray finished them
    ids = [p.stem for p in short_logs]
    counts = {i: sum(1 for s in steps if s.kernel_id == i) for i in ids}
    assert [(s.kernel_id, s.step) for s in steps] == [(i, n) for i in ids for n in range(counts[i])]
    assert min(counts.values()) >= 12
    # a local build (no Ray: it must not even be imported) from those steps writes byte-identical Parquet files
    local = tmp_path / "B"
    code = ("import sys; from themisto.cli import main; "
            f"rc = main(['build', '--steps', {str(steps_file)!r}, '-o', {str(local)!r}]); "
            "assert 'ray' not in sys.modules, 'a build without --ray imported ray'; sys.exit(rc)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, capture_output=True)
    parquet = sorted(p.relative_to(on_ray) for p in on_ray.rglob("*.parquet"))
    assert parquet and parquet == sorted(p.relative_to(local) for p in local.rglob("*.parquet"))
    for rel in parquet:
        assert hashlib.sha256((on_ray / rel).read_bytes()).digest() == hashlib.sha256((local / rel).read_bytes()).digest()
    build_a = json.loads((on_ray / "themisto_build.json").read_text())
    build_b = json.loads((local / "themisto_build.json").read_text())
    assert build_a["content_sha256"] == build_b["content_sha256"]
    # and a fresh local build, replayed again here while two busy processes load both cores, gives the Ray build's
    # ids and targets in every config and split (what drifts between replays is masked alike in both) and the same
    # steps once timings and addresses are set aside (the same sandbox, kernel and cells)
    fresh = tmp_path / "C"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        assert main(["build", *map(str, short_logs), "-o", str(fresh), "--workers", "1", "--json"]) == 0
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert _ids_and_targets(fresh) == _ids_and_targets(on_ray)
    assert [_comparable(s) for s in read_steps(fresh.with_name("C.steps.jsonl"))] == [_comparable(s) for s in steps]


def _ids_and_targets(folder: Path) -> dict:
    """Per task config and split: the (id, target) of every row, in file order."""
    import pyarrow.parquet as pq

    found = {(p.parent.name, p.stem): [(r["id"], r["target"]) for r in pq.read_table(p).to_pylist()]
             for p in sorted(folder.glob("*/*.parquet")) if p.parent.name in TASKS}  # not trajectories, values
    assert {config for config, _ in found} == {"next_cell", "output_prediction"} and all(found.values())
    return found


def _generate(release: Path, out: Path, *extra: str, backend=("baseline", "previous-cell")) -> dict:
    args = ["generate", "--release", str(release), "--task", "next_cell", "--context", "none", "full",
            "--backend", backend[0], "--model", backend[1], "--batch-size", "5", "-o", str(out), "--json", *extra]
    assert main(args) == 0
    return json.loads((out / "run.json").read_text())


# When and from which commit a run was made (the shared tree may move between two runs), not what it holds.
_RUN_TIMES = ("started", "finished", "generations_per_s", "seconds", "git_commit")


def test_generation_on_ray_writes_the_run_folder_a_local_run_writes_and_resumes_it(ray_build, tmp_path, capsys):
    local = _generate(ray_build, tmp_path / "local")
    on_ray = _generate(ray_build, tmp_path / "ray", "--ray-actors", "2", "--ray")
    expected = (tmp_path / "local" / "generations.jsonl").read_bytes()
    assert expected.count(b"\n") >= 10  # two contexts x the test examples, in batches of 5 split over 2 engines
    assert (tmp_path / "ray" / "generations.jsonl").read_bytes() == expected
    assert {k: v for k, v in on_ray.items() if k not in _RUN_TIMES} == {
        k: v for k, v in local.items() if k not in _RUN_TIMES}
    # a local run cut short resumes on Ray into the same folder, and ends with the same records
    cut = tmp_path / "cut"
    _generate(ray_build, cut)
    lines = (cut / "generations.jsonl").read_bytes().splitlines(keepends=True)
    (cut / "generations.jsonl").write_bytes(b"".join(lines[:3]))
    _generate(ray_build, cut, "--ray-actors", "2", "--ray")
    assert (cut / "generations.jsonl").read_bytes() == expected


def _gpu_with_vllm() -> bool:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _gpu_with_vllm(), reason="vLLM (and a GPU for it) is absent")
def test_vllm_engines_on_ray_match_one_engine(ray_build, tiny_model_dir, tmp_path):
    backend = ("vllm", str(tiny_model_dir))
    _generate(ray_build, tmp_path / "one", "--max-new-tokens", "16", backend=backend)
    _generate(ray_build, tmp_path / "ray", "--max-new-tokens", "16", "--ray-actors", "1", "--ray", backend=backend)
    one = [json.loads(line) for line in (tmp_path / "one" / "generations.jsonl").read_text().splitlines()]
    spread = [json.loads(line) for line in (tmp_path / "ray" / "generations.jsonl").read_text().splitlines()]
    assert [(r["id"], r["context"], r["prediction"]) for r in spread] == [
        (r["id"], r["context"], r["prediction"]) for r in one]


_TIMINGS = ("duration_s", "continuation_s", "branch_wall_s", "reference_durations_s",
            "reference_continuation_s")


def _without_timings(results: dict) -> dict:
    return {**results, "examples": [{k: v for k, v in e.items() if k not in _TIMINGS} for e in results["examples"]],
            "predictions": [{k: v for k, v in p.items() if k not in _TIMINGS} for p in results["predictions"]]}


def test_scoring_on_ray_gives_the_records_of_a_local_run(ray_build, tmp_path, monkeypatch):
    from themisto import settings as settings_module
    from themisto.release.folder import open_release

    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")  # the workers get it with each task
    settings_module.settings.cache_clear()
    rows = open_release(ray_build).task_rows("next_cell")
    # the two earliest examples of each trajectory (replay stops after the last scored step)
    chosen = []
    for kernel_id in sorted({row["kernel_id"] for row in rows.values()}):
        own = sorted((row["step"], i) for i, row in rows.items() if row["kernel_id"] == kernel_id)
        chosen += [i for _, i in own[:2]]
    predictions = tmp_path / "predictions.jsonl"
    # per example: the developer's own cell and one that fails
    predictions.write_text("".join(json.dumps({"id": i, "prediction": [rows[i]["target"], "1/0"]}) + "\n"
                                   for i in chosen), encoding="utf-8")
    common = ["score", "--release", str(ray_build), "--predictions", str(predictions), "--execute", "--json"]
    try:
        assert main([*common, "-o", str(tmp_path / "local.json")]) == 0
        assert main([*common, "-o", str(tmp_path / "ray.json"), "--ray"]) == 0
    finally:
        settings_module.settings.cache_clear()
    local = json.loads((tmp_path / "local.json").read_text())
    on_ray = json.loads((tmp_path / "ray.json").read_text())
    assert len(chosen) == 4 and local["scores"]["scored_examples"] >= 3 and local["scores"]["outcomes"]["error"] >= 3
    assert _without_timings(on_ray) == _without_timings(local)


def test_a_trajectory_lost_on_ray_has_its_examples_refused_with_the_reason(ray_build):
    from themisto.distributed.ray_scoring import refused_trajectory
    from themisto.scoring.records import ScoreSettings, make_examples, text_records
    from themisto.release.folder import open_release

    release = open_release(ray_build)
    kernel_id = sorted({row["kernel_id"] for row in release.task_rows("next_cell").values()})[0]
    ids = sorted(i for i, row in release.task_rows("next_cell").items() if row["kernel_id"] == kernel_id)[:2]
    examples = make_examples(["x = 1", ["a = 1", "b = 2"]], [release.task_rows("next_cell")[i]["target"] for i in ids], ids)
    records: dict[str, list] = {}
    for record in text_records(examples, ScoreSettings()):
        records.setdefault(record.id, []).append(record)
    lost = refused_trajectory(release, "next_cell", kernel_id, examples, records, "WorkerCrashedError after 2 tries: gone")
    assert [(e.id, e.status) for e in lost.examples] == [(ids[0], "refused"), (ids[1], "refused")]
    assert all("on Ray failed: WorkerCrashedError after 2 tries" in e.reason for e in lost.examples)
    assert [(p.id, p.index, p.outcome) for p in lost.predictions] == [
        (ids[0], 0, "refused"), (ids[1], 0, "refused"), (ids[1], 1, "refused")]
    assert records[ids[0]][0].outcome is None  # the driver's own records are left as they were


class WorkerKiller(threading.Thread):
    """Kills (SIGKILL) the Ray worker replaying each given trajectory, as many times as given, each `after_s` after
    its kernel appeared (so mid-trajectory)."""

    def __init__(self, kills: dict[str, int], after_s: float = 1.0):
        super().__init__(daemon=True)
        self.kills, self.after_s = dict(kills), after_s
        self.killed: dict[str, list[int]] = {tid: [] for tid in kills}

    def run(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(len(self.killed[t]) < n for t, n in self.kills.items()):
            for tid, count in self.kills.items():
                for proc in _worker_processes(tid):
                    if len(self.killed[tid]) < count and proc.pid not in self.killed[tid] and _with_kernel(proc):
                        time.sleep(self.after_s)
                        proc.send_signal(signal.SIGKILL)
                        self.killed[tid].append(proc.pid)
            time.sleep(0.05)


def test_killed_workers_cost_nothing_but_a_trajectory_killed_twice_is_failed_and_resumed(local_ray, tmp_path):
    trajectories = [_traj("fine", ["a = 1"]),
                    _traj("slow", ["import time", "time.sleep(3)", "x = 1", "x"]),
                    _traj("doomed", ["import time", "time.sleep(3)", "z = 3"])]
    killer = WorkerKiller({"slow": 1, "doomed": 2})  # `slow` once, mid-cell: retried; `doomed` on both tries
    killer.start()
    out = tmp_path / "steps.jsonl"
    with pytest.raises(ReplayIncomplete, match=r"doomed: WorkerCrashedError") as raised:
        replay_to_file(trajectories, out, tmp_path, FAST, runner=replay_runner(RayTarget()),
                       progress=lambda msg: None)
    killer.join(timeout=5)
    assert len(killer.killed["slow"]) == 1 and len(killer.killed["doomed"]) == 2
    assert list(raised.value.failed) == ["doomed"] and "after 2 tries" in raised.value.failed["doomed"]
    assert not out.exists()  # nothing half-written under the final name
    progress = json.loads((tmp_path / "steps.jsonl.progress.json").read_text())
    assert sorted(progress["done"]) == ["fine", "slow"] and list(progress["failed"]) == ["doomed"]
    # the rerun keeps `fine` and the retried `slow`, and replays only `doomed`
    run = replay_to_file(trajectories, out, tmp_path, FAST, runner=replay_runner(RayTarget()),
                         progress=lambda msg: None)
    assert sorted(run.resumed) == ["fine", "slow"] and run.replayed == ["doomed"]
    steps = read_steps(out)
    assert [(s.kernel_id, s.step) for s in steps] == [("fine", 0), ("slow", 0), ("slow", 1), ("slow", 2),
                                                      ("slow", 3), ("doomed", 0), ("doomed", 1), ("doomed", 2)]
    assert steps[4].output.strip() == "1" and all(s.status == "ok" for s in steps)


def test_ctrl_c_cancels_the_tasks_cleans_their_kernels_and_the_run_resumes(local_ray, tmp_path):
    trajectories = [_traj("short", ["s = 1"]), _traj("long", ["import time", "time.sleep(30)", "t = 2"])]
    out = tmp_path / "steps.jsonl"
    progress = tmp_path / "steps.jsonl.progress.json"

    def press_ctrl_c_once_short_is_written() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if progress.exists() and "short" in progress.read_text():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.1)

    threading.Thread(target=press_ctrl_c_once_short_is_written, daemon=True).start()
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        replay_to_file(trajectories, out, tmp_path, FAST, runner=replay_runner(RayTarget()),
                       progress=lambda msg: None)
    assert time.monotonic() - began < 25  # the 30 s cell was interrupted, not waited for
    deadline = time.monotonic() + 10
    while any(_with_kernel(p) for p in _worker_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_with_kernel(p) for p in _worker_processes()), "a cancelled task kept its kernel"
    assert not out.exists()
    quick = [trajectories[0], _traj("long", ["t = 2"])]  # same ids; `short` must not run again
    run = replay_to_file(quick, out, tmp_path, FAST, runner=replay_runner(RayTarget()), progress=lambda m: None)
    assert run.resumed == ["short"] and run.replayed == ["long"]


def test_workers_match_the_driver_and_a_different_worker_is_named(local_ray):
    (found,) = check_workers(local_ray)
    assert found["themisto"] == str((REPO / "themisto").resolve())  # workers import this working tree
    driver = dict(found)
    assert environment_problems(driver, found) == []
    other = {**found, "sandbox": False, "kernel": {**found["kernel"], "numpy": "2.0.0"}, "code": "0" * 64}
    problems = environment_problems({**driver, "sandbox": True}, other)
    assert any("bwrap" in p for p in problems) and any("numpy 2.0.0" in p for p in problems)
    assert any("code differs" in p for p in problems)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_address_is_refused_before_anything_starts(tmp_path, capsys):
    address = f"127.0.0.1:{_free_port()}"  # nobody listens there
    with pytest.raises(ClusterError, match=re.escape(address)):
        replay_runner(RayTarget(address=address))
    assert main(["build", "-o", str(tmp_path / "rel"), "--ray", address]) == 2
    assert address in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # no steps, no release, no temporary folder


def test_ray_auto_finds_the_cluster_ray_start_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(ClusterError, match="no running Ray cluster"):
        replay_runner(RayTarget(address="auto"))
    address = f"127.0.0.1:{_free_port()}"
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(address + "\n", encoding="utf-8")  # as `ray start` does
    with pytest.raises(ClusterError, match=re.escape(f"({address})")):  # found, then found dead
        replay_runner(RayTarget(address="auto"))


def test_a_workspace_the_node_cannot_see_travels_with_the_tasks(local_ray, tmp_path):
    from themisto.distributed.ray_runner import node_workspace, pack_workspace

    (tmp_path / "ws" / "data").mkdir(parents=True)
    (tmp_path / "ws" / "data" / "a.csv").write_text("x,y\n1,2\n", encoding="utf-8")
    packed = pack_workspace(tmp_path / "ws")
    assert node_workspace(str(tmp_path / "ws"), packed) == str(tmp_path / "ws")  # seen here: used as it is
    elsewhere = node_workspace("/no/such/driver/folder", packed)  # as on a node without the driver's disk
    assert (Path(elsewhere) / "data" / "a.csv").read_text(encoding="utf-8") == "x,y\n1,2\n"
    # unpacked once per node: another worker process (or task) finds the same folder, no second copy
    assert node_workspace("/no/such/driver/folder", packed) == elsewhere
    assert not [p for p in Path(elsewhere).parent.iterdir() if p.name.startswith("." + Path(elsewhere).name)]
    with pytest.raises(FileNotFoundError, match="shared|mounts"):
        node_workspace("/no/such/other/folder", None)
    context = local_ray.get_runtime_context()  # in Ray's own session folder, removed with Ray's temp folder
    assert Path(elsewhere).parent == Path(context.get_temp_dir()) / context.get_session_name() / "themisto"


def test_nothing_imports_ray_without_the_flag():
    code = ("import sys, themisto, themisto.cli, themisto.replay.replay, themisto.release.parquet, "
            "themisto.scoring.scorer, themisto.distributed, themisto.distributed.ray_runner; "
            "from themisto.cli import build_parser; build_parser().parse_args(['build', '-o', 'x']); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    found = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert found == "[]"


def test_the_documented_scaling_commands_parse():
    import shlex

    from themisto.cli import build_parser

    text = (REPO / "docs" / "scaling-out.md").read_text(encoding="utf-8")
    section = text[:text.index("\n## ")]  # the page's opening: what it is for and its commands
    commands = [line.split("#")[0] for line in section.splitlines() if re.match(r"(\w+=\S+ )*themisto ", line)]
    assert len(commands) >= 5
    for command in commands:
        words = [w for w in shlex.split(command) if "=" not in w or w.startswith("-")]
        args = build_parser().parse_args(words[1:])
        assert args.ray == "HEAD:6379", command
