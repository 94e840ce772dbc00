"""Where a session from the wild stood and what it lacks, found before replay: file uses classified by call context,
the start folder chosen where the reads resolve, absent inputs cut by the static checks; and a build that keeps
nothing says why."""

import json
import re
import sys

import pytest

from _planted_corpus import BILLS, NEVER_HELD, START_OWNER, plant_start_corpus

from themisto.ingest.file_uses import IMPORT, MAKES, READ, UNKNOWN, WRITE, file_uses
from themisto.ingest.session_checks import RepositoryFiles, first_blocker
from themisto.ingest.start_folder import checked_session, choose_start

MODULES = frozenset(sys.stdlib_module_names) | {"pandas", "numpy"}


def _kinds(codes):
    return [[(u.kind, u.path, u.cwd) for u in uses if u.kind != IMPORT] for uses in file_uses(codes)]


def test_a_literal_is_a_read_a_write_or_unknown_by_the_call_it_is_passed_to():
    codes = ["df = pd.read_csv('data/a.csv')", "j = json.load(open('c.json'))", "pickle.dump(j, open('o.pkl', 'wb'))",
             "df.to_csv('b.csv')", "name = 'n.xlsx'", "pd.read_excel(name)", "print('see result.csv')",
             "np.load(os.path.join('arrays', 'x.npy'))", "shutil.copy('src.csv', 'dst.csv')",
             "f = h5py.File('h.h5', 'a')", "def load():\n    return pd.read_csv('later.csv')",
             "try:\n    pd.read_csv('cache.csv')\nexcept OSError:\n    pass", "Path('p.csv').write_text(text)",
             "Path('q.csv').open()", "%%writefile -a cells.txt\nline"]
    assert _kinds(codes) == [
        [(READ, "data/a.csv", "")], [(READ, "c.json", "")], [(WRITE, "o.pkl", "")], [(WRITE, "b.csv", "")],
        [(UNKNOWN, "n.xlsx", "")], [(READ, "n.xlsx", "")], [(UNKNOWN, "see result.csv", "")],
        [(READ, "arrays/x.npy", "")], [(READ, "src.csv", ""), (WRITE, "dst.csv", "")], [(WRITE, "h.h5", "")],
        [(UNKNOWN, "later.csv", "")], [(UNKNOWN, "cache.csv", "")], [(WRITE, "p.csv", "")], [(READ, "q.csv", "")],
        [(WRITE, "cells.txt", "")]]


def test_shell_commands_scripts_and_computed_writes_may_make_files_and_cd_moves_the_folder():
    codes = ["!ls data.csv", "!unzip raw.zip", "df.to_csv(out_path)", "df.to_numpy()", "%run prepare.py",
             "%cd data", "pd.read_csv('x.csv')", "cd ../other", "pd.read_csv('y.csv')", "%cd $folder",
             "pd.read_csv('z.csv')", "zipfile.ZipFile(name).extractall()", "s.str.extract('(a)')"]
    makes = [any(u.kind == MAKES for u in uses) for uses in file_uses(codes)]
    assert makes == [False, True, True, False, True, False, False, False, False, False, False, True, False]
    reads = [(u.path, u.cwd) for uses in file_uses(codes) for u in uses if u.kind == READ]
    assert reads == [("x.csv", "data"), ("y.csv", "data/../other"), ("z.csv", None)]


FILES = RepositoryFiles(listed=frozenset({"notebooks/bills.ipynb", "data/bills.csv", "data/big.csv", "README.md"}),
                        kept=frozenset({"notebooks/bills.ipynb", "data/bills.csv"}), start="notebooks")


def test_a_read_of_a_file_the_repository_never_held_cuts_unless_the_session_wrote_or_may_have_made_it():
    never = ["import pandas as pd", "x = 1", "df = pd.read_csv('mine.csv')"]
    assert (first_blocker(never, MODULES, FILES).index, first_blocker(never, MODULES, FILES).cause) == \
        (2, "input_absent")
    # A name only (no reader) does not cut; neither does a read of what the session wrote, or after a shell command.
    assert first_blocker(["import pandas as pd", "name = 'mine.csv'", "print(name)"], MODULES, FILES) is None
    assert first_blocker(["import pandas as pd", "pd.DataFrame().to_csv('mine.csv')", "pd.read_csv('mine.csv')"],
                         MODULES, FILES) is None
    assert first_blocker(["import pandas as pd", "!tar xf archive.tar", "pd.read_csv('mine.csv')"], MODULES,
                         FILES) is None
    # A read of a path on the developer's machine cuts; a guarded read does not.
    assert first_blocker(["x = open('/home/someone/data.txt').read()"], MODULES, FILES).cause == "input_absent"
    assert first_blocker(["try:\n    open('mine.txt')\nexcept OSError:\n    pass"], MODULES, FILES) is None
    # Past the first 5,000 files the tree is not the whole repository: an unlisted file may be held.
    partial = RepositoryFiles(FILES.listed, FILES.kept, FILES.start, complete=False)
    assert first_blocker(never, MODULES, partial) is None
    # A read that resolves nowhere from the start but names a file kept elsewhere cuts.
    assert first_blocker(["import pandas as pd", "pd.read_csv('bills.csv')"], MODULES, FILES).index == 1
    # The old rule stands: a file listed but not kept cuts wherever it is named.
    assert first_blocker(["path = '../data/big.csv'"], MODULES, FILES).cause == "input_absent"


def test_the_start_folder_is_where_the_reads_resolve_and_the_notebooks_folder_breaks_ties():
    files = RepositoryFiles(FILES.listed | {"notebooks/helpers.py"}, FILES.kept | {"notebooks/helpers.py"})
    reads = file_uses(["import csv", "rows = list(csv.reader(open('bills.csv')))"])
    assert choose_start(reads, files, preferred="notebooks", modules=MODULES) == "data"
    assert choose_start(file_uses(["x = 1", "print(x)"]), files, preferred="notebooks") == "notebooks"
    assert choose_start(file_uses(["x = 1"]), files) == ""
    # The session's own module beside its notebook counts as much as a read: a tie, which the notebook's folder wins.
    both = file_uses(["import helpers", "rows = open('bills.csv').read()"])
    assert choose_start(both, files, preferred="notebooks", modules=MODULES) == "notebooks"
    start, blocker = checked_session(BILLS, MODULES, files, "notebooks")
    assert (start, blocker) == ("data", None)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`themisto build` of a planted corpus of two sessions, the bills one and the never-held one (20 short steps)."""
    from themisto.cli import main

    root = tmp_path_factory.mktemp("start")
    corpus = plant_start_corpus(root / "corpus", ("bills", "never_held"))
    code = main(["build", str(corpus), "--min-inputs", "5", "--test-fraction", "1.0", "--no-values",
                 "--steps-out", str(root / "steps.jsonl"), "-o", str(root / "release")])
    steps = [json.loads(line) for line in (root / "steps.jsonl").read_text().splitlines()[1:]]
    report = json.loads((root / "release" / "themisto_build.json").read_text()) if code == 0 else None
    return code, steps, report


def test_a_session_reading_data_beside_its_notebooks_folder_replays_from_there(built):
    code, steps, report = built
    assert code == 0
    bills = [s for s in steps if s["kernel_id"] == steps[0]["kernel_id"]]
    if bills[0]["code"] != BILLS[0]:
        bills = [s for s in steps if s["kernel_id"] != steps[0]["kernel_id"]]
    assert [s["code"] for s in bills] == BILLS
    assert not [s for s in bills if s.get("ename")], "a step of the bills session failed in replay"
    assert "123.75" in json.dumps(bills)  # the total of data/bills.csv, read from data/
    corpus = report["source"]["corpora"][0]
    assert corpus["matched_notebook"] == 1 and corpus["trajectories"] == 2


def test_a_read_of_a_file_the_repository_never_held_is_cut_there_before_replay(built):
    code, steps, report = built
    assert report["source"]["corpora"][0]["cut"] == {"input_absent": 1}
    never = [s["code"] for s in steps if s["code"].startswith("v") or s["code"] in NEVER_HELD]
    assert never == NEVER_HELD[:NEVER_HELD.index("notes = open('field_notes_2019.csv').read()")]
    assert not [s for s in steps if s.get("ename") == "FileNotFoundError"]
    assert report["source"]["health"]["trajectories_cut"] == {}


def test_a_build_that_keeps_nothing_says_what_cut_what(tmp_path, capsys):
    from themisto.cli import main

    # The checks leave the only session out: it reads a file its repository never held at its second input.
    corpus = plant_start_corpus(tmp_path / "early", ("early",))
    assert main(["build", str(corpus), "--min-inputs", "5", "-o", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert "themisto build: error: no trajectory rows: nothing to build tasks from: " in err
    assert "gave 0 of its 1 sessions long enough; left_out: input_absent 1" in err
    assert not (tmp_path / "r1").exists()
    # Replay health cuts the only session to nothing: its first input read a file by a computed name.
    corpus = plant_start_corpus(tmp_path / "computed", ("computed",))
    assert main(["build", str(corpus), "--min-inputs", "5", "--no-values", "--steps-out", str(tmp_path / "s.jsonl"),
                 "-o", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "replay health: trajectories_cut: input_absent 1" in err
    assert re.search(r"trajectory ih-\w+: replay health cut it at step 0 \(input_absent\)", err)
    assert START_OWNER not in err


def test_an_expression_nested_past_the_readers_depth_is_left_unread_not_a_crash():
    deep = "pd.read_csv(" + "'a' / " * 1500 + "'x.csv')"
    assert file_uses([deep, "pd.read_csv('y.csv')"])[0] == []
    assert first_blocker(["import pandas as pd", deep], MODULES, FILES) is None
