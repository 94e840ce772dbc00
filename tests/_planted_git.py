"""Bare git repositories written by hand for the collector's tests (nothing of the real corpus), served over file://:
one whose history database was committed and then deleted, beside its data files, a planted credential, a symlink
pointing out of the repository and an oversized file; one with no licence; one of an owner who opted out, holding a
`%logstart` log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from _planted_corpus import PLANTED, write_history

OWNERS = ("plantedowneralpha", "plantedownerbeta", "plantedownergamma")
REPOS = (f"{OWNERS[0]}/analysis", f"{OWNERS[1]}/notes", f"{OWNERS[2]}/course")
BIG_BYTES = 9_000  # over the tests' 4 KB file cap
FILE_CAP = 4_096
MIT = ("MIT License\n\nCopyright (c) 2021 Planted Person\n\nPermission is hereby granted, free of charge, to any "
       "person "
       "obtaining a copy\nof this software and associated documentation files (the \"Software\"), to deal\nin the "
       "Software without restriction, including without limitation the rights\nto use, copy, modify, merge, publish, "
       "distribute, sublicense, and/or sell\ncopies of the Software, and to permit persons to whom the Software is\n"
       "furnished to do so, subject to the following conditions:\n\nThe above copyright notice and this permission "
       "notice shall be included in all\ncopies or substantial portions of the Software.\n\nTHE SOFTWARE IS PROVIDED "
       "\"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR\nIMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF "
       "MERCHANTABILITY,\nFITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE\nAUTHORS OR "
       "COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER\nLIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT "
       "OR OTHERWISE, ARISING FROM,\nOUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE\n"
       "SOFTWARE.\n")
# The analysis session: reads a kept file, a symlink out of the repository and an oversized file (each cut the
# replay there), and assigns a credential.
ANALYSIS = ["import csv", "token = '" + PLANTED["github"] + "'", "rows = list(csv.reader(open('data/values.csv')))",
            "len(rows)", "total = sum(int(r[1]) for r in rows[1:])", "print(total)", "total * 2",
            "names = [r[0] for r in rows[1:]]", "print(names)", "counts = {n: 0 for n in names}", "len(counts)",
            "linked = open('data/linked.csv').read()", "big = open('data/big.csv').read()"]
NOTES = ["x = 1", "y = x + 1", "print(x, y)", "z = [x, y] * 3", "len(z)", "print(sum(z))", "w = sorted(z)",
         "w[:3]", "s = set(w)", "print(len(s))"]
COURSE_LOG = "# IPython log file\n\n" + "".join(f"# Mon, 01 Mar 2021 10:{i:02d}:00\nv{i} = {i} * 2\n"
                                                for i in range(11))
_ENV = {"GIT_AUTHOR_NAME": "planted", "GIT_AUTHOR_EMAIL": "planted@example.invalid", "GIT_COMMITTER_NAME": "planted",
        "GIT_COMMITTER_EMAIL": "planted@example.invalid", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_ENV}, capture_output=True, text=True,
                          check=True, timeout=60)
    return done.stdout.strip()


def _publish(work: Path, base: Path, repo: str) -> None:
    bare = base / repo
    bare.parent.mkdir(parents=True, exist_ok=True)
    _git(base, "init", "--quiet", "--bare", "--initial-branch=main", str(bare))
    _git(work, "push", "--quiet", str(bare), "HEAD:main")


def plant_git(root: Path) -> tuple[str, dict[str, str]]:
    """Write the bare repositories under `root/git/` and return (the base URL, each repository's commit that holds
    its session file)."""
    base, commits = root / "git", {}
    base.mkdir(parents=True)
    for repo in REPOS:
        work = root / "work" / repo
        work.mkdir(parents=True)
        _git(work, "init", "--quiet", "--initial-branch=main")
    analysis = root / "work" / REPOS[0]
    write_history(analysis / ".ipython" / "profile_default" / "history.sqlite", {1: ANALYSIS})
    (analysis / "data").mkdir()
    (analysis / "data" / "values.csv").write_text("name,count\na,1\nb,2\nc,3\n")
    (analysis / "data" / "big.csv").write_text("name,count\n" + "x,1\n" * (BIG_BYTES // 4))
    (analysis / "data" / "linked.csv").symlink_to("../../../../../etc/hostname")
    (analysis / "notes.txt").write_text(f"key {PLANTED['file_key']}\n")
    (analysis / "LICENSE").write_text(MIT)
    _git(analysis, "add", "-A")
    _git(analysis, "commit", "--quiet", "-m", "work")
    commits[REPOS[0]] = _git(analysis, "rev-parse", "HEAD")
    _git(analysis, "rm", "--quiet", ".ipython/profile_default/history.sqlite")
    _git(analysis, "commit", "--quiet", "-m", "remove the history")
    notes = root / "work" / REPOS[1]
    write_history(notes / "history.sqlite", {1: NOTES, 2: ["a = 1"]})
    course = root / "work" / REPOS[2]
    (course / ".logs").mkdir()
    (course / ".logs" / "week1.py").write_text(COURSE_LOG)
    (course / "LICENSE").write_text(MIT)
    for work in (notes, course):
        _git(work, "add", "-A")
        _git(work, "commit", "--quiet", "-m", "work")
    commits[REPOS[1]] = _git(notes, "rev-parse", "HEAD")
    commits[REPOS[2]] = _git(course, "rev-parse", "HEAD")
    for repo in REPOS:
        _publish(root / "work" / repo, base, repo)
    return base.as_uri(), commits
