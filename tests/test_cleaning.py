"""Replay cleaning: only package installs are skipped, line numbers hold, and every change can be undone."""

import traceback

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from themisto.ingest.cleaning import Change, clean_for_replay, restore
from themisto.ingest.june_log import read_june_log

LOGS = ["bc147b33-fa74-4bff-9f48-c88809c5bdcd.log", "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"]


def _python(code: str) -> str:
    """What IPython would compile for this cell (magics and ! turned into calls)."""
    return TransformerManager().transform_cell(code)


def _compiles(code: str) -> bool:
    try:
        compile(_python(code), "<cell>", "exec")
    except SyntaxError:
        return False
    return True


@pytest.mark.parametrize("line", [
    "!pip install pandas", "!pip3 install -q seaborn scipy", "%pip install lightgbm", "! pip install x",
    "!python -m pip install x", "!python3.10 -m pip install x", "!{sys.executable} -m pip install x",
    "!conda install -y numpy", "%conda install numpy", "!mamba install x", "!pip uninstall -y numpy",
])
def test_installers_are_skipped(line):
    cleaned = clean_for_replay(f"import os\n{line}\nprint(1)")
    assert cleaned.changes == [Change(2, "package-install", line, "pass  # themisto-clean: package-install")]
    assert cleaned.code.split("\n")[0::2] == ["import os", "print(1)"]
    assert restore(cleaned) == cleaned.original


@pytest.mark.parametrize("code", [
    "!ls data", "!unzip -o data/task1/jetnet_logs.zip", "%matplotlib inline", "%%time\nx = 1", "!pip list",
    "%pip show pandas", "from mining_extension import check_logging \ncheck_logging(\"http://3.249.245.244:9999\")",
    "import pandas as pd", "s = '!pip install x'", "# !pip install x",
])
def test_everything_else_is_kept(code):
    cleaned = clean_for_replay(code)
    assert cleaned.code == code and not cleaned.changed


def test_line_numbers_and_blocks_hold():
    code = "x = 1\nif x:\n    !pip install a \\\n        b\ny = undefined_name\n"
    cleaned = clean_for_replay(code)
    assert [c.line for c in cleaned.changes] == [3, 4]
    assert len(cleaned.code.split("\n")) == len(code.split("\n"))
    assert _compiles(cleaned.code)  # the `if` block is not left empty
    with pytest.raises(NameError) as info:
        exec(compile(_python(cleaned.code), "<cell>", "exec"), {})
    assert traceback.extract_tb(info.tb)[-1].lineno == 5  # the traceback points at the original line
    assert restore(cleaned) == code


def test_shell_cells_are_cleaned_as_shell():
    code = "%%bash\npip install pandas\nls -l\nsudo pip install x"
    cleaned = clean_for_replay(code)
    assert cleaned.code == ("%%bash\n# themisto-clean: shell-package-install\nls -l\n"
                            "# themisto-clean: shell-package-install")
    assert restore(cleaned) == code


def test_restore_refuses_edited_code():
    cleaned = clean_for_replay("!pip install x\nprint(1)")
    cleaned.code = "print(2)\nprint(1)"
    with pytest.raises(ValueError, match="line 1: expected the marker"):
        restore(cleaned)


@pytest.mark.parametrize("code, replayed", [
    (r'df = pd.read_csv("C:\\Users\\<user>\\jupyter-notebook-hackathon\\jupyter-notebook-hackathon\\x.txt", sep=";")',
     'df = pd.read_csv("x.txt", sep=";")'),
    (r'path = "C:\\Users\\<user>\\jupyter-notebook-hackathon"', 'path = "."'),
    (r'with ZipFile(r"data\task1\jetnet_logs.zip") as z:', 'with ZipFile(r"data/task1/jetnet_logs.zip") as z:'),
    (r"z.extractall('data\\task1')", "z.extractall('data/task1')"),
    (r'open("out\\res.csv", "w")', 'open("out/res.csv", "w")'),
])
def test_windows_paths_into_the_checkout_become_posix(code, replayed):
    cleaned = clean_for_replay(f"import pandas as pd\n{code}")
    assert cleaned.code == f"import pandas as pd\n{replayed}"
    assert [(c.line, c.rule) for c in cleaned.changes] == [(2, "windows-path")] and restore(cleaned) == cleaned.original


@pytest.mark.parametrize("code", [
    r'print("1\\n")', r're.split(r"\s+\|", x)', r'open("data\task1\x.txt")',  # no path, or a tab Python reads
    r'open("D:\\other\\x.txt")', r'open(f"data\\{name}.txt")',  # outside the checkout; an f-string
])
def test_other_backslashes_are_kept(code):
    assert clean_for_replay(code).code == code


def test_restore_is_exact_for_odd_line_endings():
    code = "!pip install x\r\nprint(1)\r\n\n"
    assert restore(clean_for_replay(code)) == code


@pytest.mark.parametrize("name", LOGS)
def test_real_cells(june_dir, name):
    traj = read_june_log(june_dir / name)
    changed = 0
    for ex in traj.executions:
        cleaned = clean_for_replay(ex.code)
        assert restore(cleaned) == ex.code
        has_install = any(line.lstrip().startswith("!pip install") for line in ex.code.split("\n"))
        assert cleaned.changed == has_install, ex.code
        changed += cleaned.changed
        assert len(cleaned.code.split("\n")) == len(ex.code.split("\n"))
        if _compiles(ex.code):
            assert _compiles(cleaned.code), ex.code
        if ex.ename == "ModuleNotFoundError":
            # The failure the developer saw before installing stays visible: imports are never touched.
            assert not cleaned.changed and "import" in cleaned.code
    assert changed > 0
