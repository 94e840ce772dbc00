"""The replay kernel's own environment: kernels run the 2023 stack of requirements-kernel.txt (numpy 1.x, where the
participants' `np.NaN` works) while the host keeps numpy 2; the interpreter is chosen once and reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy
import pytest
from _isolation import needs_isolation

from themisto import settings as settings_module
from themisto.runtime import sandbox as kernel_module
from themisto.runtime.kernel import KernelSession, Limits
from themisto.runtime.sandbox import SandboxWarning, kernel_environment, sandbox_available

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements-kernel.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


def _clear_choice() -> None:
    settings_module.settings.cache_clear()
    kernel_module.kernel_python.cache_clear()


@pytest.fixture
def fresh_choice():
    """Let a test choose the interpreter anew from the environment, and forget its choice afterwards."""
    _clear_choice()
    yield
    _clear_choice()


@pytest.fixture(scope="module")
def kernel_venv() -> str:
    chosen = settings_module.settings()
    if chosen.kernel_python_source == "host":
        pytest.fail(f"no kernel environment: {settings_module.KERNEL_VENV} is missing (run scripts/install.sh)")
    return chosen.kernel_python


@pytest.fixture(scope="module")
def session(kernel_venv):
    with KernelSession(limits=Limits(cell_timeout_s=60)) as kernel:
        yield kernel


def _stdout(result) -> str:
    assert result.status == "ok", (result.ename, result.evalue, result.traceback[-3:])
    return "".join(o["text"] for o in result.outputs if o["output_type"] == "stream" and o["name"] == "stdout")


def test_kernel_runs_the_2023_stack_where_np_nan_works(session, kernel_venv):
    assert session.kernel_python == kernel_venv
    out = _stdout(session.execute("import sys, numpy as np, pandas as pd\n"
                                  "print(sys.executable); print(np.__version__); print(pd.__version__)\n"
                                  "print(np.isnan(np.NaN), pd.DataFrame({'a': [1, np.NaN]})['a'].isna().sum())"))
    executable, numpy_version, pandas_version, nan_line = out.splitlines()
    assert executable == kernel_venv
    assert numpy_version.startswith("1.") and numpy_version == _pins()["numpy"]
    assert pandas_version == _pins()["pandas"]
    assert nan_line == "True 1"


def test_kernel_fails_as_the_participant_did_on_pandas_2_removals(session):
    # The participant's `df.append` raised AttributeError (removed in pandas 2.0): replay must fail the same way.
    result = session.execute("import pandas as pd\npd.DataFrame({'a': [1]}).append({'a': 2}, ignore_index=True)")
    assert result.status == "error"
    assert result.ename == "AttributeError"
    assert "append" in result.evalue


def test_participant_imports_and_the_kernel_agent_load_inside(session):
    out = _stdout(session.execute(
        "import seaborn, lightgbm, sklearn, scipy.stats, matplotlib.pyplot as plt\n"
        "import os, themisto.runtime.agent, themisto.runtime.launcher\n"
        "print(os.path.realpath(themisto.runtime.agent.__file__))"))
    # The kernel's path holds a link to this checkout's package alone (not the host's site-packages).
    assert Path(out.strip()).parent == REPO / "themisto" / "runtime" / "agent"


def test_kernel_environment_reports_what_the_kernel_imports(session, kernel_venv):
    env = kernel_environment()
    assert env["interpreter"] == kernel_venv
    pins = _pins()
    for name in ("numpy", "pandas", "scipy", "matplotlib", "seaborn", "scikit-learn", "lightgbm", "ipykernel",
                 "ipython", "psutil", "pyarrow", "skops"):
        assert env[name] == pins[name], name
    out = _stdout(session.execute("import platform, numpy, IPython\n"
                                  "print(platform.python_version(), numpy.__version__, IPython.__version__)"))
    assert out.split() == [env["python"], env["numpy"], env["ipython"]]


def test_host_keeps_numpy_2():
    assert int(numpy.__version__.split(".")[0]) >= 2
    assert not hasattr(numpy, "NaN")


def test_bad_kernel_python_is_named(fresh_choice, monkeypatch, tmp_path):
    monkeypatch.setenv("THEMISTO_KERNEL_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(ValueError, match="THEMISTO_KERNEL_PYTHON=.*no-such-python"):
        settings_module.settings()


def test_without_kernel_venv_the_host_interpreter_runs_with_a_warning(fresh_choice, monkeypatch, tmp_path):
    monkeypatch.delenv("THEMISTO_KERNEL_PYTHON", raising=False)
    monkeypatch.setattr(settings_module, "KERNEL_VENV", tmp_path / "absent")
    with pytest.warns(SandboxWarning, match="replay fidelity needs"):
        assert kernel_module.kernel_python() == sys.executable
    assert settings_module.settings().kernel_python_source == "host"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel_module.kernel_python()  # once per process, not once per session


@pytest.fixture(params=["tmp", "var-tmp"])
def private_dir(request, tmp_path):
    """A 0700 folder the kernel's unprivileged uid could not traverse: under /tmp (which the sandbox replaces by its
    own tmpfs) and under /var/tmp (which the sandbox shows read-only)."""
    if request.param == "tmp":
        base = tmp_path
    else:
        base = Path(tempfile.mkdtemp(prefix="themisto-test-", dir="/var/tmp"))
        request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    private = base / "private"
    private.mkdir(mode=0o700)
    return private


@needs_isolation(sandbox_available() and os.geteuid() == 0,
                 "the kernel's uid is dropped from root only under bubblewrap")
def test_env_var_interpreter_in_a_private_folder_is_bound_into_the_sandbox(fresh_choice, monkeypatch, private_dir,
                                                                            kernel_venv):
    # A venv that borrows the kernel environment's packages through a .pth file, somewhere the kernel's uid cannot
    # reach on the host: the session must bind it in.
    venv = private_dir / "venv"
    subprocess.run([kernel_venv, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([kernel_venv, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    own_site = subprocess.run([str(venv / "bin" / "python"), "-c", purelib], capture_output=True, text=True,
                              check=True).stdout.strip()
    Path(own_site, "kernel_env.pth").write_text(site + "\n")
    monkeypatch.setenv("THEMISTO_KERNEL_PYTHON", str(venv / "bin" / "python"))
    with KernelSession(limits=Limits(cell_timeout_s=60)) as kernel:
        assert kernel.sandboxed and kernel.kernel_uid is not None
        out = _stdout(kernel.execute("import os, sys, numpy; print(sys.executable, os.getuid(), numpy.__version__)"))
    executable, uid, numpy_version = out.split()
    assert executable == str(venv / "bin" / "python")
    assert int(uid) != 0
    assert numpy_version == _pins()["numpy"]
