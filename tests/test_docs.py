"""The documentation cannot drift from the code: every relative link and repository path that README.md,
dataset_card.md and docs/ name exists; every `themisto` command they show parses; their Python examples and the
README's tour run against a small release; the README stays short and undated; docs/measurements.md's current
figures each name a dated entry; the benches' entries and docs/results.md's writer do what they say; the architecture
page's module table is the modules' docstrings."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess

import pytest
from _docs import (REPO, anchors, commands, fenced_blocks, link_problems, named_paths, pages, path_problems,
                   slug)

from themisto.cli import build_parser, main

DOCS_PAGES = ["architecture", "data", "replay", "values", "release", "model-runs", "probes", "scoring",
              "leaderboard", "fine-tuning", "scaling-out", "safety", "measurements", "results", "index"]


def test_every_page_the_readme_promises_is_there():
    assert [p for p in DOCS_PAGES if not (REPO / "docs" / f"{p}.md").is_file()] == []


def _module_table():
    spec = importlib.util.spec_from_file_location("module_table", REPO / "scripts" / "module_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_table_is_what_the_docstrings_say(tmp_path):
    module_table = _module_table()
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert module_table.with_table(page, REPO / "themisto") == page, \
        "docs/architecture.md's module table is not the modules' docstrings: run python scripts/module_table.py"
    # a module's row is its docstring's first paragraph, in its stage's place; one without a docstring is refused
    package = tmp_path / "themisto"
    (package / "replay").mkdir(parents=True)
    (package / "replay" / "steps.py").write_text('"""Steps | in order,\n   one a line.\n\nThe rest."""\n')
    (package / "gate.py").write_text('"""The one door."""\n')
    (package / "ingest").mkdir()
    (package / "ingest" / "__init__.py").write_text('"""Ingest."""\n')
    rows = module_table.module_rows(package, ["ingest", "replay"])
    assert rows == [("themisto/ingest/__init__.py", "Ingest."),
                    ("themisto/replay/steps.py", "Steps | in order, one a line."), ("themisto/gate.py", "The one door.")]
    assert "| `themisto/replay/steps.py` | Steps \\| in order, one a line. |" in module_table.table(rows)
    (package / "replay" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"without a docstring: \['themisto/replay/bare.py'\]"):
        module_table.module_rows(package, ["ingest", "replay"])


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_repository_path_exists(page):
    problems = link_problems(page) + path_problems(page)
    assert not problems, "\n".join(map(str, problems))


def test_the_checker_finds_a_planted_broken_link_anchor_and_path(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, with words\n")
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [other](other.md), [its section](other.md#a-code-heading-with-words), "
                    "[here](#title), [the web](https://example.org/x.md) and `themisto/gate.py`.\n\n"
                    "```bash\npython bench/probes.py --record\n```\n")
    assert link_problems(page, REPO) == [] and path_problems(page, REPO) == []
    page.write_text(page.read_text() + "\nA [broken link](missing.md), [a lost anchor](other.md#nowhere),\n"
                    "`themisto/no_such_module.py`, and in a block:\n\n```bash\npython bench/no_such_bench.py\n```\n")
    links = [str(p) for p in link_problems(page, REPO)]
    paths = [str(p) for p in path_problems(page, REPO)]
    assert links == [f"{page}:9: link to missing.md: no such file",
                     f"{page}:9: link to other.md#nowhere: no heading #nowhere in other.md"]
    assert paths == [f"{page}:10: names themisto/no_such_module.py: not in the repository",
                     f"{page}:13: names bench/no_such_bench.py: not in the repository"]


def test_paths_are_found_in_spans_and_blocks_but_not_outputs_or_other_projects():
    text = ("`out/june/results.md`, `RUN/results.json`, `themisto/replay/`, `tests/test_docs.py::test_x`, "
            "`python bench/scale.py --rounds 2`, `packages/tasks/src/eval.ts`, `data/sample/*.log`, `README.md`\n"
            "```text\nthemisto build -o out/sample  # scripts/main_job.sh\n```\n")
    assert [p for _, p in named_paths(text)] == ["themisto/replay/", "tests/test_docs.py", "bench/scale.py",
                                                 "data/sample/*.log", "README.md", "scripts/main_job.sh"]
    assert slug("The Hub's `eval.yaml` registry") == "the-hubs-evalyaml-registry"


def _shown_commands():
    for page in pages()[:1] + pages()[2:]:  # the card's commands are the release's, checked with the release
        for line, block in fenced_blocks(page, "bash"):
            for argv in commands(block):
                yield pytest.param(argv, id=f"{page.name}:{line}:{' '.join(argv[:2])}")


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.mark.parametrize("argv", list(_shown_commands()))
def test_every_themisto_command_shown_parses(argv, parser):
    try:
        args = parser.parse_args([os.path.expandvars(a) for a in argv])
    except SystemExit as exc:  # --help exits 0; a refusal 2, its message on stderr
        assert exc.code == 0, f"themisto {' '.join(argv)}: refused by the command line"
    else:
        assert callable(args.run)


def test_a_longer_fence_holds_blocks_of_a_shorter_one(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("````text\n```python\nx = 1\n```\n````\n\n```python\ny = 2\n```\n")
    assert [body for _, body in fenced_blocks(page, "text")] == ["```python\nx = 1\n```\n"]
    assert [body for _, body in fenced_blocks(page, "python")] == ["y = 2\n"]


def test_the_commands_are_found_in_blocks():
    block = ("GGUF=x.gguf\nHF_ALLOW_CODE_EVAL=1 .venv/bin/themisto score RUN/ --execute  # a comment's words\n"
             "themisto generate --release R \\\n    --task next_cell -o OUT && echo done\n"
             "bash scripts/install.sh && themisto check R\n")
    assert commands(block) == [["score", "RUN/", "--execute"],
                               ["generate", "--release", "R", "--task", "next_cell", "-o", "OUT"], ["check", "R"]]


@pytest.fixture
def docs_cwd(small_release, tmp_path, monkeypatch):
    """A working folder where the examples' `out/sample` is the small release and `metrics/` is the project's."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sample").symlink_to(small_release)
    (tmp_path / "metrics").symlink_to(REPO / "metrics")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _python_examples():
    for page in pages()[:1] + pages()[2:]:
        for line, block in fenced_blocks(page, "python"):
            yield pytest.param(block, id=f"{page.name}:{line}")


@pytest.mark.parametrize("block", list(_python_examples()))
def test_every_python_example_runs(block, docs_cwd, capsys):
    exec(compile(block, "<example>", "exec"), {"__name__": "__example__"})
    assert capsys.readouterr().out.strip()  # every example shows something


def test_the_readme_tour_runs_against_a_small_release(docs_cwd, capsys):
    """The tour's commands, in order, on the small release (its build is the fixture; the fine-tuning export needs
    a train split the small release has not, so it is only parsed, above)."""
    tour = next(block for _, block in fenced_blocks(REPO / "README.md", "bash") if "themisto submit" in block)
    ran = []
    for argv in commands(tour):
        if argv[0] in ("build", "sft-export"):
            continue
        assert main(argv) == 0, (argv, capsys.readouterr().err)
        ran.append(argv[0])
    assert ran == ["generate", "score", "submit"]
    assert (docs_cwd / "out" / "runs" / "previous-cell" / "results.md").is_file()
    assert list((docs_cwd / "out" / "submissions").rglob("generations.jsonl"))


def test_the_readme_is_short_undated_and_keeps_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert re.findall(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|load [0-9]", text) == []
    assert "HF_ALLOW_CODE_EVAL=1 bash scripts/main_job.sh --execute\n" in text
    assert "bash scripts/install.sh && .venv/bin/python -m pytest\n" in text


def test_every_current_figure_names_a_dated_entry_of_the_record():
    page = REPO / "docs" / "measurements.md"
    text = page.read_text(encoding="utf-8")
    current = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in current.splitlines() if line.startswith("| ") and not line.startswith("| target")
            and not line.startswith("| ---")]
    record = text.split("## The record", 1)[1]
    entries = re.findall(r"^### (\d{4}-\d{2}-\d{2}): .+$", record, re.M)
    assert len(rows) >= 7 and entries
    assert entries == sorted(entries, reverse=True), "the record is newest first"
    dated = {slug(h) for h in re.findall(r"^### (\d{4}-\d{2}-\d{2}: .+)$", record, re.M)}
    for row in rows:
        links = re.findall(r"\]\(#([^)]+)\)", row.split(" | ")[-1])
        assert links and all(link in dated for link in links), row
    for target in ("branch overhead", "replay against the cells' own time", "restore", "probe overhead",
                   "generation", "main-job time", "suite time"):
        assert any(row.startswith(f"| {target}") for row in rows), target
    assert "## The record" in text and anchors(page) >= dated


def test_a_bench_prints_and_records_its_entry_newest_first(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "bench"))
    page = tmp_path / "measurements.md"
    page.write_text(f"# M\n\n## The record\n\n{_common.RECORD_MARKER}\n\n### 2026-01-01: old\n\n- old\n")
    machine = {"cpu": "Some CPU", "cores": 2, "native_bf16": False}
    for day, value in (("2026-01-02", 1.5), ("2026-01-03", 2.5)):
        text = _common.entry("probes", {"overhead_ms": value, "rows": [{"a": 1}]}, changed="the fork moved",
                             argv=["bench/probes.py", "--think-ms", "250", "--record", "--changed", "x"],
                             today=day, machine=machine, loads=(0.5, 0.7))
        _common.record(text, page)
    assert text.splitlines()[:4] == [
        "### 2026-01-03: probes", "",
        f"- **Command**: `python bench/probes.py --think-ms 250` (commit {text.split('(commit ')[1].split(')')[0]})",
        "- **Host**: Some CPU, 2 cores, native bf16: no"]
    assert "- **Load**: 0.5 at the start, 0.7 at the end (1-minute average)" in text
    assert '  - overhead_ms: 2.5\n  - rows: [{"a": 1}]\n- **What changed**: the fork moved' in text
    assert re.findall(r"^### (\S+):", page.read_text(), re.M) == ["2026-01-03", "2026-01-02", "2026-01-01"]
    (tmp_path / "bare.md").write_text("# no marker\n")
    with pytest.raises(SystemExit, match="no record marker"):
        _common.record(text, tmp_path / "bare.md")


def test_june_release_writes_the_results_page_between_its_markers(small_release, tmp_path):
    """The results step of scripts/june_release.sh (from RUNS= to its end), run over scored runs of a small release:
    the card and the page get the summary and every run's tables; the page's text outside its markers stays."""
    from test_run_scores import write_run

    from themisto.generation.baselines import baseline_prediction, baselines_for
    from themisto.scoring.run_scores import score_run

    out, release = tmp_path / "june", tmp_path / "release"
    shutil.copytree(small_release, release)
    limit = 7
    for task in ("next_cell", "output_prediction"):
        name = baselines_for(task)[0]
        folder = write_run(out / "runs" / f"baselines-{task}", release, task, lambda row, c, s, n=name, t=task:
                           baseline_prediction(n, row, t), contexts=("none",))
        score_run(folder)
        (folder / "by-participant").mkdir()  # the script's second scoring, by participant: the same files here
        for file in ("results.json", "results.md"):
            shutil.copy(folder / file, folder / "by-participant" / file)
        shutil.copytree(folder, out / "runs" / f"smollm2-{task}-{limit}")  # the model's runs: the same, scored
    page = tmp_path / "results.md"
    page.write_text("# Results\n\nkept before\n\n<!-- results: begin -->\nold tables\n<!-- results: end -->\n\nkept "
                    "after\n")
    script = (REPO / "scripts" / "june_release.sh").read_text(encoding="utf-8")
    tail = script[script.index("RUNS=("):]
    env = {**os.environ, "PYTHONPATH": str(REPO), "THEMISTO_RESULTS_PAGE": str(page)}
    prelude = (f"set -euo pipefail; cd {REPO}; OUT={out}; RELEASE={release}; LIMIT={limit}; DTYPE=int8; "
               "say() { echo \"$*\" >&2; }\n")
    done = subprocess.run(["bash", "-c", prelude + tail], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    written = page.read_text(encoding="utf-8")
    assert written.startswith("# Results\n\nkept before\n\n<!-- results: begin -->\nWritten by `scripts/june_release"
                              ".sh` (THEMISTO_JUNE_LIMIT=7, THEMISTO_JUNE_DTYPE=int8; commit ")
    assert written.endswith("<!-- results: end -->\n\nkept after\n") and "old tables" not in written
    assert "### In short (intervals over trajectories)" in written and "best baseline · previous-cell" in written
    assert "### smollm2-output_prediction-7 (intervals over participants)" in written
    assert "| exact_match | model · none |" in written
    card = (release / "README.md").read_text(encoding="utf-8")
    assert "### baselines-next_cell (intervals over trajectories)" in card
    assert (out / "results.md").read_text(encoding="utf-8").strip() in written
