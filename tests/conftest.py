"""Shared test settings: offline Hub access, and where the real JuNE data lies (read at run time, never copied)."""

import os
import signal
from pathlib import Path

import pytest

# No test reaches a network; without these a Hub lookup retries for ~23 s before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
JUNE_DIR = Path(os.environ.get("THEMISTO_JUNE_DIR", REPO_ROOT.parent / "shared" / "data" / "june"))
TASK1_LOG = JUNE_DIR / "bc147b33-fa74-4bff-9f48-c88809c5bdcd.log"
TASK2_LOG = JUNE_DIR / "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"


def pytest_configure(config):
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored, and so does every child
    # it starts: the Ctrl-C tests would see nothing stop. Python's own handler back, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def allow_execution(monkeypatch):
    """Execution of model-written code switched on (HF_ALLOW_CODE_EVAL=1) for one test, the settings read anew."""
    from themisto.settings import settings

    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    settings.cache_clear()
    yield
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL")
    settings.cache_clear()


@pytest.fixture(scope="session")
def june_dir() -> Path:
    if not TASK1_LOG.exists():
        pytest.fail(f"the real JuNE logs are expected in {JUNE_DIR} (../shared/data/june beside the repo)")
    return JUNE_DIR


@pytest.fixture(scope="session")
def small_release(tmp_path_factory) -> Path:
    """A release built once per session from replayed-step records (tests/test_tasks.py), every step in `test`, with
    the text track and its eval.yaml as `themisto build` writes them."""
    from test_tasks import make_steps, rows_of

    from themisto.generation.prompts import text_track_renderer
    from themisto.release.parquet import build_release
    from themisto.release.tasks import TaskSettings

    trajectories = [make_steps(f"kernel-{i}", 24 + 5 * i, task=f"task{1 + i % 2}", restarts=(10,)) for i in range(3)]
    out = tmp_path_factory.mktemp("small-release") / "release"
    build_release(rows_of(*trajectories), out, TaskSettings(seed=3, test_fraction=1.0), source={"kind": "test-rows"},
                  prompts=text_track_renderer())
    return out


# Two trajectories the build puts in train and two in test, each cut to its first 40 log lines (about 16 steps).
SAMPLE_LOGS = ("07eaff00-25ed-4330-8ff3-a87cc639a862", "359cb2f2-cec2-4a7a-93b5-c30607c0b518",
               "2851258b-9d31-4a50-b2ec-a96ac55e075c", "e50c32e4-ef80-44d3-9535-36a5662816af")


@pytest.fixture(scope="session")
def sample_release(tmp_path_factory) -> Path:
    """Four shipped sample trajectories, cut short, replayed in real kernels and built once per session (the
    study's tests and the generation parity test share it)."""
    from themisto.cli import main

    logs = tmp_path_factory.mktemp("sample-logs")
    for name in SAMPLE_LOGS:
        lines = (REPO_ROOT / "data" / "sample" / f"{name}.log").read_text(encoding="utf-8").splitlines(keepends=True)
        (logs / f"{name}.log").write_text("".join(lines[:40]), encoding="utf-8")
    release = tmp_path_factory.mktemp("sample-release") / "release"
    assert main(["build", str(logs), "-o", str(release), "--json"]) == 0
    return release


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama with a locally trained tokenizer and a chat template (tests/_tiny_model.py)."""
    from _tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> str:
    """One real `transformers serve` process for the session (tests/_serve.py): its /v1 base URL. It serves the model
    folder a request names, so the tests of each model share its start-up (seconds of imports on a busy machine)."""
    from _serve import serve

    with serve(tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="session")
def probe_release(tmp_path_factory) -> tuple[Path, Path]:
    """A short trajectory replayed in a real kernel, built into a release (tests/_probe_release.py): the release
    folder and the workspace it was replayed over."""
    from _probe_release import build_probe_release

    return build_probe_release(tmp_path_factory.mktemp("probe-release"))


@pytest.fixture(scope="session")
def sample_steps_release(tmp_path_factory) -> Path:
    """The sample's first 16 steps of one trajectory and a short notebook that deletes a name, built by `themisto build`
    in real kernels (tests/_sample_release.py): the release folder."""
    from _sample_release import build_sample_release

    return build_sample_release(tmp_path_factory.mktemp("sample-steps"))
