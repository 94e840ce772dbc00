"""A plain (non-editable) install runs kernels from the kernel environment, not from the folder it was installed
into, and finds the files it ships (the card template, the sample)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from themisto.settings import settings

REPO_ROOT = Path(__file__).resolve().parents[1]
_BUILD_INPUTS = ("pyproject.toml", "README.md", "themisto_dataset.py", "dataset_card.md", "themisto", "data/sample")

_CHECK = """
from themisto.release.card import CARD_TEMPLATE
from themisto.release.parquet import SAMPLE_DIR
from themisto.runtime.kernel import KernelSession
import themisto
print(themisto.__file__)
print(CARD_TEMPLATE.is_file(), len(list(SAMPLE_DIR.glob('*.log'))))
with KernelSession() as session:
    result = session.execute("import numpy, themisto; numpy.__version__ + ' ' + themisto.__file__")
    print(result.status, result.outputs[0]["data"]["text/plain"] if result.outputs else result.evalue)
"""


@pytest.mark.slow
def test_a_plain_install_runs_kernels_from_the_kernel_environment(tmp_path):
    if settings().kernel_python_source == "host":
        pytest.fail("no kernel environment (.venv-kernel): run scripts/install.sh")
    source = tmp_path / "source"
    for name in _BUILD_INPUTS:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(source)], check=True, capture_output=True, timeout=300)
    # A numpy in the install's own folder, as a host's numpy 2 would be: the kernel must not import it.
    (target / "numpy").mkdir()
    (target / "numpy" / "__init__.py").write_text("__version__ = '999+host'\n")
    env = {**os.environ, "PYTHONPATH": str(target), "THEMISTO_KERNEL_PYTHON": settings().kernel_python}
    done = subprocess.run([sys.executable, "-c", _CHECK], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    package, shipped, kernel = done.stdout.splitlines()[-3:]
    assert package.startswith(str(target))
    assert shipped == "True 6"
    status, numpy_version, kernel_package = kernel.replace("'", "").split(" ", 2)
    assert status == "ok" and not numpy_version.startswith("999") and numpy_version.startswith("1.")
    assert kernel_package.endswith("/lib/themisto/__init__.py")  # the package alone, linked into the session
