"""Shared test settings: offline Hub access, and where the real JuNE data lies (read at run time, never copied)."""

import os
from pathlib import Path

import pytest

# No test reaches a network; without these a Hub lookup retries for ~23 s before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
JUNE_DIR = Path(os.environ.get("THEMISTO_JUNE_DIR", REPO_ROOT.parent / "shared" / "data" / "june"))
TASK1_LOG = JUNE_DIR / "bc147b33-fa74-4bff-9f48-c88809c5bdcd.log"
TASK2_LOG = JUNE_DIR / "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"


@pytest.fixture(scope="session")
def june_dir() -> Path:
    if not TASK1_LOG.exists():
        pytest.fail(f"the real JuNE logs are expected in {JUNE_DIR} (../shared/data/june beside the repo)")
    return JUNE_DIR
