"""A corpus of IPython histories written by hand for the tests (nothing of the real corpus): repositories whose
sessions plant credentials of many kinds, e-mail addresses and home-folder paths, beside corrupt and hostile
databases, in the layout `themisto.ingest.ipython_corpus` reads."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

# Owners, people and credentials that must never reach a release (none of them real).
OWNERS = ("plantedowneralpha", "plantedownerbeta", "plantedownergamma")
PLANTED = {
    "aws_key": "AKIAZQ3PLANTED7TEST1",
    "github": "ghp_PLANTEDplantedPLANTEDplanted01234567",
    "slack_webhook": "https://hooks.slack.com/services/T0PLANTED/B0PLANTED/PLANTEDplantedPLANTED1",
    "password": "Planted-Hunter2-Secret!",
    "url_password": "plantedurlpass99",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJlcGxhbnRlZDEyMzQ1Njc4OTA",
    "private_key_body": "MIIEplantedPRIVATEkeyBODYplantedPRIVATEkeyBODY",
    "email": "jane.plantedperson@university.edu",
    "home_user": "janeplantedhome",
    "windows_user": "Jane Plantedwin",
    "file_email": "filewriter.planted@company.net",
    "file_key": "AKIAZQ3PLANTEDFILE99",
}

SESSION = [
    "import json",
    "import csv",
    "aws_key = '" + PLANTED["aws_key"] + "'",
    "token = '" + PLANTED["github"] + "'",
    "hook = '" + PLANTED["slack_webhook"] + "'",
    "password = '" + PLANTED["password"] + "'",
    "db = 'postgresql://admin:" + PLANTED["url_password"] + "@db.internal/x'",
    "jwt = '" + PLANTED["jwt"] + "'",
    "key = '''-----BEGIN RSA PRIVATE KEY-----\n" + PLANTED["private_key_body"] + "\n-----END RSA PRIVATE KEY-----'''",
    "contact = '" + PLANTED["email"] + "'",
    "home = '/home/" + PLANTED["home_user"] + "/projects/data.csv'",
    "win = r'C:\\Users\\" + PLANTED["windows_user"] + "\\Documents\\x.txt'",
    "print(contact, home, win)",
    "rows = list(csv.reader(open('data/values.csv')))",
    "len(rows)",
    "text = open('notes.txt').read()",
    "print(text)",
    "total = sum(int(r[1]) for r in rows[1:])",
    "total",
    "print(aws_key[:4], token[:4])",
]


def write_history(path: Path, sessions: dict[int, list[str]]) -> None:
    """A history database of IPython's schema, written here by hand: {session number: its inputs}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE sessions (session integer primary key autoincrement, start timestamp, "
                      "end timestamp, num_cmds integer, remark text);"
                      "CREATE TABLE history (session integer, line integer, source text, source_raw text, "
                      "PRIMARY KEY (session, line));"
                      "CREATE TABLE output_history (session integer, line integer, output text, "
                      "PRIMARY KEY (session, line));")
    for number, inputs in sessions.items():
        con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                    (number, f"2021-03-0{number} 10:00:00.000000", None, len(inputs), ""))
        con.executemany("INSERT INTO history VALUES (?, ?, ?, ?)",
                        [(number, i + 1, code, code) for i, code in enumerate(inputs)])
    con.commit()
    con.close()


def _repo(root: Path, owner: str, name: str, tree: list[list], licence: str | None = None) -> Path:
    folder = root / "repos" / f"{owner}+{name}"
    folder.mkdir(parents=True)
    (folder / "repo.json").write_text(json.dumps({
        "repo": f"{owner}/{name}", "commit": "0" * 40, "licence": licence, "tree": tree,
        "kept": [], "omitted": [{"path": "data/big.csv", "bytes": 10**9, "why": "over the size cap"}]}))
    return folder


def plant_corpus(root: Path) -> Path:
    """Write the planted corpus under `root` and return it: one good repository (a session of 20 inputs that plants
    every credential and person, reads its files and matches its notebook; a short session), a repository with the
    same session copied and a session that imports a package no environment has, and a repository of corrupt and
    hostile databases."""
    good = _repo(root, OWNERS[0], "analysis", [["analysis/data/values.csv", 30], ["analysis/notes.txt", 80],
                                               ["analysis/work.ipynb", 500], ["data/big.csv", 10**9]], "LICENSE:MIT")
    files = good / "files" / "analysis"
    (files / "data").mkdir(parents=True)
    (files / "data" / "values.csv").write_text("name,count\na,1\nb,2\nc,3\n")
    (files / "notes.txt").write_text(f"owner mail {PLANTED['file_email']} key {PLANTED['file_key']}\n")
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": code}
        for i, code in enumerate(SESSION[13:])]}
    (files / "work.ipynb").write_text(json.dumps(notebook))
    write_history(good / "history" / ".ipython__profile_default__history.sqlite",
             {1: SESSION, 2: ["x = 1", "x + 1", "print(x)"]})
    copy = _repo(root, OWNERS[1], "fork", [])
    write_history(copy / "history" / "history.sqlite",
             {1: SESSION, 2: ["import json", "import planted_missing_package_xyz"] + [f"y{i} = {i}" for i in range(20)]})
    hostile = _repo(root, OWNERS[2], "broken", [])
    (hostile / "history").mkdir()
    (hostile / "history" / "corrupt.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    (hostile / "history" / "random.sqlite").write_bytes(bytes((i * 7919) % 251 for i in range(8192)))
    view = hostile / "history" / "view.sqlite"
    con = sqlite3.connect(view)
    con.executescript("CREATE TABLE sessions (session integer, start text, end text, num_cmds integer, remark text);"
                      "CREATE TABLE real_history (session integer, line integer, source text, source_raw text);"
                      "CREATE VIEW history AS SELECT * FROM real_history;")
    con.close()
    other = hostile / "history" / "other.sqlite"
    con = sqlite3.connect(other)
    con.executescript("CREATE TABLE accounts (id integer, name text);")
    con.close()
    return root


# Sessions for where a session stands and what it lacks (`themisto.ingest.start_folder`): owners made up, as above.
START_OWNER = "plantedownerdelta"
# Matched to notebooks/bills.ipynb, it reads a file kept at data/bills.csv: it must start in data/.
BILLS = [
    "import csv",
    "rows = list(csv.reader(open('bills.csv')))",
    "header, body = rows[0], rows[1:]",
    "print(header)",
    "amounts = [float(r[1]) for r in body]",
    "total = sum(amounts)",
    "print(round(total, 2))",
    "monthly = {r[0]: float(r[1]) for r in body}",
    "max(monthly, key=monthly.get)",
    "len(body)",
    "print(sorted(amounts)[-1])",
]
# Ten inputs that need nothing, then a read of a file its repository never held (it lay on its developer's machine).
NEVER_HELD = [f"v{i} = {i} * 3\nprint(v{i})" for i in range(10)] + [
    "notes = open('field_notes_2019.csv').read()", "print(len(notes))"]
# Its first input reads a file whose name is computed (no check can see it): only the replay finds it absent.
COMPUTED = ["text = open('field_' + 'notes.txt').read()"] + [f"print(len(text) + {i})" for i in range(9)]
# Its second input reads a file its repository never held: the checks leave it out.
EARLY = ["import csv", "rows = list(csv.reader(open('survey_2019.csv')))"] + [f"print(len(rows) + {i})"
                                                                               for i in range(10)]
SESSIONS = {"bills": BILLS, "never_held": NEVER_HELD, "computed": COMPUTED, "early": EARLY}


def _notebook(path: Path, cells: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [], "source": code}
        for i, code in enumerate(cells)]}))


def plant_start_corpus(root: Path, names: tuple[str, ...]) -> Path:
    """Write under `root` a corpus of one repository (of its own made-up owner) per name of `SESSIONS`, each with
    that one session: "bills" is matched to `notebooks/bills.ipynb` and reads `bills.csv`, kept in `data/`; the others
    keep no file."""
    for number, name in enumerate(names):
        tree = [["README.md", 20]] + ([["notebooks/bills.ipynb", 400], ["data/bills.csv", 60]] if name == "bills"
                                     else [])
        repo = _repo(root, f"{START_OWNER}{number}", name, tree, "LICENSE:MIT")
        if name == "bills":
            (repo / "files" / "data").mkdir(parents=True)
            (repo / "files" / "data" / "bills.csv").write_text("month,amount\njan,41.5\nfeb,38.25\nmar,44.0\n")
            _notebook(repo / "files" / "notebooks" / "bills.ipynb", BILLS[1:6])
        write_history(repo / "history" / "history.sqlite", {1: SESSIONS[name]})
    return root
