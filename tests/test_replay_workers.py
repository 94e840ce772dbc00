"""Replay on this machine's cores (`--workers`): the steps file a sequential run writes, in input order; a parallel
run stopped by Ctrl-C leaves no kernel behind and resumes into the same file; a bad --workers is refused."""

import json
import re
from pathlib import Path

import psutil
import pytest

from themisto.cli import main
from themisto.ingest.june_log import read_june_logs
from themisto.ingest.workspace import write_workspace
from themisto.replay.replay import ReplaySettings
from themisto.replay.steps_file import replay_to_file
from themisto.replay.workers import workers_runner

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"
# What two replays of the same cells measure differently: the cells' run times and the kernel's memory on every
# line; object addresses in reprs and in the pickles some hashes are made of (scikit-learn's vectorizers keep an
# id()). Two sequential runs show which; a parallel run may differ from a sequential one there and nowhere else.
_MEASURED_KEYS = ("execution_time", "memory_bytes")
_MEASURED = re.compile(rb'"(' + "|".join(_MEASURED_KEYS).encode() + rb')": [0-9.e+-]+')

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def short_logs(tmp_path_factory) -> list[Path]:
    """Four sample trajectories cut to their first 16 log lines (six or seven executions each): more than two per
    worker, of unequal lengths, and replayed four times over in this module, so kept short."""
    folder = tmp_path_factory.mktemp("logs")
    for log in sorted(SAMPLE.glob("*.log"))[:4]:
        lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / log.name).write_text("".join(lines[:16]), encoding="utf-8")
    return sorted(folder.glob("*.log"))


def _masked(path: Path) -> list[bytes]:
    """The steps file's step lines (its header aside), its measured figures masked in the file's own bytes."""
    return [_MEASURED.sub(rb'"\1": ...', line) for line in path.read_bytes().splitlines(keepends=True)[1:]]


def _leaves(value, path=()) -> dict[tuple, object]:
    if isinstance(value, dict):
        return {p: v for key, item in value.items() for p, v in _leaves(item, (*path, key)).items()}
    if isinstance(value, list):
        return {p: v for i, item in enumerate(value) for p, v in _leaves(item, (*path, i)).items()} or {path: []}
    return {path: value}


def _differences(a: Path, b: Path) -> set[tuple]:
    """Where two steps files differ, measured figures aside: (line, key path) of each differing value, or the line
    alone where the lines differ in shape."""
    found: set[tuple] = set()
    lines_a, lines_b = (path.read_text(encoding="utf-8").splitlines()[1:] for path in (a, b))
    assert len(lines_a) == len(lines_b)
    for n, (x, y) in enumerate(zip(lines_a, lines_b)):
        leaves_x, leaves_y = ({p: v for p, v in _leaves(json.loads(line)).items() if p[0] not in _MEASURED_KEYS}
                              for line in (x, y))
        if leaves_x.keys() != leaves_y.keys():
            found.add((n,))
        found |= {(n, *p) for p in leaves_x.keys() & leaves_y.keys() if leaves_x[p] != leaves_y[p]}
    return found


def _same_as_sequential(out: Path, sequential: tuple[Path, Path]) -> None:
    """`out` is byte for byte the first sequential run's file on every line the two sequential runs agree on (once
    measured figures are masked), and elsewhere differs from it only where the second sequential run does too."""
    first, second = sequential
    assert len(_masked(out)) == len(_masked(first))
    agree = [a == b for a, b in zip(_masked(first), _masked(second))]
    assert [line for line, same in zip(_masked(out), agree) if same] == \
        [line for line, same in zip(_masked(first), agree) if same]
    assert _differences(first, out) <= _differences(first, second)


def _replay(logs: list[Path], out: Path, workers: int) -> list[str]:
    """`themisto replay --workers N`; the ids of the steps file's lines, in file order."""
    assert main(["replay", *map(str, logs), "-o", str(out), "--workers", str(workers), "--json"]) == 0
    return [json.loads(line)["kernel_id"] for line in out.read_text(encoding="utf-8").splitlines()[1:]]


@pytest.fixture(scope="module")
def sequential(short_logs, tmp_path_factory) -> tuple[Path, Path]:
    """Two sequential replays (`--workers 1`) of the short logs: what one run writes and where two runs differ."""
    folder = tmp_path_factory.mktemp("sequential")
    runs = (folder / "first.jsonl", folder / "second.jsonl")
    for out in runs:
        _replay(short_logs, out, workers=1)
    return runs


def test_two_workers_write_the_steps_file_of_a_sequential_run(short_logs, sequential, tmp_path, capsys):
    ids = _replay(short_logs, tmp_path / "steps.jsonl", workers=2)
    assert "replaying 4 trajectories, 2 at once" in capsys.readouterr().err
    # trajectories in input order (the longest went first), each one's lines together
    order = [t.id for t in read_june_logs(short_logs)]
    assert ids == sorted(ids, key=order.index) and list(dict.fromkeys(ids)) == order
    assert all(ids.count(i) >= 6 for i in order)
    _same_as_sequential(tmp_path / "steps.jsonl", sequential)
    header = (tmp_path / "steps.jsonl").read_text(encoding="utf-8").splitlines()[0]
    assert header == sequential[0].read_text(encoding="utf-8").splitlines()[0]  # the same inputs and settings


class _StopAfterFirst:
    """A runner that passes on the first finished trajectory, then raises KeyboardInterrupt as Ctrl-C would."""

    def __init__(self, runner):
        self.runner = runner

    def __call__(self, *args, **options):
        results = self.runner(*args, **options)
        try:
            yield next(results)
            raise KeyboardInterrupt
        finally:
            results.close()


def _kernels(sandboxes: bool = True) -> list[psutil.Process]:
    """Kernel processes (and, with `sandboxes`, their sandboxes) still started from this test process."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            kernel = ("ipykernel", "themisto.runtime.kernel_main")
            if any(any(name in part for name in kernel) or (sandboxes and part.endswith("bwrap"))
                   for part in proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_a_stopped_parallel_run_leaves_no_kernel_and_resumes_into_the_same_file(short_logs, sequential, tmp_path):
    trajectories = read_june_logs(short_logs)
    workspace = write_workspace(tmp_path / "ws", seed=0, size="small").root
    out = tmp_path / "steps.jsonl"
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        replay_to_file(trajectories, out, workspace, runner=_StopAfterFirst(workers_runner(2)), progress=said.append)
    assert not out.exists() and not _kernels()
    first = json.loads(out.with_name(out.name + ".progress.json").read_text())["done"]
    assert len(first) == 1
    said.clear()
    run = replay_to_file(trajectories, out, workspace, runner=workers_runner(2), progress=said.append)
    assert run.resumed == first and sorted(run.replayed) == sorted(t.id for t in trajectories if t.id not in first)
    assert f"{first[0]}: already replayed, kept from the earlier run" in said
    _same_as_sequential(out, sequential)


@pytest.mark.parametrize("extra", [["--workers", "0"], ["--workers", "2", "--ray"]])
def test_a_bad_workers_option_is_refused_before_anything_runs(short_logs, tmp_path, capsys, extra):
    out = tmp_path / "steps.jsonl"
    assert main(["replay", *map(str, short_logs), "-o", str(out), *extra]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--workers" in error[0] and not out.exists()


def test_a_sequential_run_starts_the_next_kernel_ahead_and_a_stop_leaves_none(short_logs, tmp_path):
    """One worker replays the trajectories one after the other, the next one's kernel started while the current one
    replays (its start hides behind the cells); stopped midway, it leaves neither kernel behind."""
    import time

    trajectories = read_june_logs(short_logs)
    workspace = write_workspace(tmp_path / "ws", seed=0, size="small").root
    results = workers_runner(1)(trajectories, workspace, ReplaySettings(), lambda message: None)
    first_id, steps = next(results)
    assert first_id == trajectories[0].id and next(iter(steps)).step == 0
    deadline = time.monotonic() + 60
    while len(_kernels(sandboxes=False)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_kernels(sandboxes=False)) == 2  # the first trajectory's kernel, and the second's, ready before its turn
    results.close()
    assert not _kernels()

