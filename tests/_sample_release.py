"""The sample's first steps, built into a release once per session for the `delta` mode's tests: the shipped sample
log of trajectory 9be066b9 (data/sample, task 1: a log file read into a frame, the frame reshaped and rebound, two
ValueErrors) cut to its first LOG_LINES lines, and beside it a short authored notebook that deletes a name (no sample
trajectory runs `del`), built by `themisto build` in real sandboxed kernels over the look-alike workspace, every
example in `test`."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE_KERNEL = "9be066b9-bed5-43af-bbc7-7d61fd74ed09"
LOG_LINES = 38  # its first 16 executions: steps 0-15
NOTEBOOK = "deletes.ipynb"
NOTEBOOK_CELLS = ["items = [3, 1, 2]", "total = sum(items)", "ratio = total / len(items)", "del items", "total += 1",
                  "print(total, ratio)", "ratio"]


def _notebook() -> dict:
    cells = [{"cell_type": "code", "execution_count": i + 1, "id": f"cell-{i}", "metadata": {}, "outputs": [],
              "source": code} for i, code in enumerate(NOTEBOOK_CELLS)]
    return {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def build_sample_release(root: Path) -> Path:
    """Write the cut log and the notebook under `root` and build them into `root/release`; the release folder."""
    from themisto.cli import main

    logs, notebooks = root / "logs", root / "notebooks"
    logs.mkdir(parents=True)
    notebooks.mkdir()
    lines = (REPO / "data" / "sample" / f"{SAMPLE_KERNEL}.log").read_text(encoding="utf-8").splitlines(keepends=True)
    (logs / f"{SAMPLE_KERNEL}.log").write_text("".join(lines[:LOG_LINES]), encoding="utf-8")
    (notebooks / NOTEBOOK).write_text(json.dumps(_notebook()), encoding="utf-8")
    release = root / "release"
    assert main(["build", str(logs), str(notebooks), "-o", str(release), "--test-fraction", "1.0", "--no-values",
                 "--json"]) == 0
    return release
