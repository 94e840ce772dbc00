"""Every real JuNE log under ../shared/data/june (six participants, both writers), read at run time, never copied:
counts checked against counts made here independently, damage named, repairs proven, several kernels joined,
damaged code never a target, and no personal data past ingest."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from _personal_finder import find_personal, leaks

from themisto.cli import main
from themisto.ingest.inputs import IngestInputError, read_inputs, read_participants
from themisto.ingest.notebook import code_cells, load_notebook
from themisto.ingest.trajectory import anonymize, read_jsonl

SEPARATOR = "[EVENT_SEPARATOR]"


@pytest.fixture(scope="module")
def ingested(june_dir, tmp_path_factory):
    """`themisto ingest ../shared/data/june --json`, as a user runs it: its report, the trajectories it wrote and
    the text of that file."""
    out = tmp_path_factory.mktemp("ingest") / "all.jsonl"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["ingest", str(june_dir), "-o", str(out), "--json"]) == 0
    return json.loads(printed.getvalue()), read_jsonl(out), out.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# A reader written here from the MANIFESTs' recipes, independent of themisto.ingest


def _inner_json(line: str) -> str | None:
    """The event's JSON text of a whole line of either writer (None for a line cut short)."""
    if line.startswith("'\"") and line.rstrip(" ").endswith('"' + SEPARATOR + "'"):  # cmd.exe
        body = line[2:line.rstrip(" ").rindex('"' + SEPARATOR)]
        out, i = [], 0
        while i < len(body):
            if body[i] == "\\":
                out.append(body[i:i + 2])
                i += 2
            else:
                out.append("'" if body[i] == '"' else body[i])
                i += 1
        return json.loads('"' + "".join(out) + '"')
    if line.startswith('"') and line.endswith('"' + SEPARATOR):  # sh: echo halved the backslashes
        body = line[1:-len('"' + SEPARATOR)]
        out, i = [], 0
        while i < len(body):
            j = i
            while j < len(body) and body[j] == "\\":
                j += 1
            if j < len(body) and body[j] == '"':
                out.append("\\" * max(j - i - 1, 0) + ('"' if j > i else "'"))
                i = j + 1
            elif j > i:
                out.append(body[i:j])
                i = j
            else:
                out.append(body[i])
                i += 1
        return "".join(out)
    return None


def _count(path: Path) -> dict:
    """Lines, events, executions and damaged lines of one log, by the pairing rules of the MANIFEST, counted here."""
    lines = [raw.decode("utf-8").rstrip("\r\n") for raw in path.read_bytes().split(b"\n")]
    lines = [(n, text) for n, text in enumerate(lines, start=1) if text.strip()]
    events, cut = [], []
    for number, text in lines:
        inner = _inner_json(text)
        if inner is None:
            cut.append(number)
            # What survived before the cut: the event's kind and its cell (both come before the code).
            found = {key: re.search(rf'\\*"{key}\\*":\\*"(\w+)', text) for key in ("event", "cell_index")}
            events.append((number, {key: m.group(1) if m else None for key, m in found.items()} | {"cut": True}))
        else:
            events.append((number, json.loads(inner)))
    # A line that parsed but lacks the last fields every other line of its kind carries.
    shapes: dict[str, Counter] = {}
    for _, ev in events:
        if not ev.get("cut"):
            shapes.setdefault(ev["event"], Counter())[tuple(ev)] += 1
    lost = [n for n, ev in events if not ev.get("cut")
            and len(ev) < len(shapes[ev["event"]].most_common(1)[0][0])]
    executions = 0
    pending: set[str] = set()
    last_finished: dict[str, tuple] = {}
    kinds = [ev for _, ev in events]
    i = 0
    while i < len(kinds):
        ev = kinds[i]
        nxt = kinds[i + 1] if i + 1 < len(kinds) else {}
        cell = ev.get("cell_index")
        i += 1
        if ev["event"] == "execute":
            executions += 1
            pending.add(cell)
        elif ev["event"] == "finished_execute" and not ev.get("cut"):
            outputs = ev.get("cell_output")
            followed = nxt.get("event") == "error" and nxt.get("cell_index") == cell
            previous, last_finished[cell] = last_finished.get(cell), (ev["cell_source"], outputs)
            if cell in pending:
                pending.discard(cell)
            elif followed or (previous != (ev["cell_source"], outputs) and "error" in (outputs or "")):
                executions += 1
            i += followed
        elif ev["event"] == "error":
            if cell in pending:
                pending.discard(cell)
            else:
                executions += 1
    return {"lines": len(lines), "events": sum(ev["event"] is not None for _, ev in events),
            "executions": executions, "cut": cut, "lost_fields": lost}


def test_every_real_log_is_read_and_its_counts_agree_with_a_count_made_here(ingested, june_dir):
    report, _, _ = ingested
    logs = sorted(june_dir.rglob("*.log"))
    assert len(logs) == 22
    assert sorted(report["files"]) == sorted(p.relative_to(june_dir).as_posix() for p in logs)
    for path in logs:
        mine, theirs = _count(path), report["files"][path.relative_to(june_dir).as_posix()]
        name = path.name
        assert (theirs["lines"], theirs["events"], theirs["executions"]) == (
            mine["lines"], mine["events"], mine["executions"]), name
        damaged = {d["line"]: d for d in theirs["damaged"]}
        assert all("cut_line" in damaged[n]["kinds"] for n in mine["cut"]), name
        assert all("lost_fields" in damaged[n]["kinds"] for n in mine["lost_fields"]), name
        writer = "cmd" if path.read_bytes().startswith(b"'\"") else "sh"
        assert theirs["writer"] == writer
        if writer == "sh":  # sh loses nothing; cmd.exe may have eaten text from lines that still parse
            assert theirs["damaged"] == [] and theirs["repaired"] == theirs["unrepaired"] == 0
        assert theirs["skipped"] == []
    totals = Counter()
    for figures in report["files"].values():
        totals.update(cut=sum("cut_line" in d["kinds"] for d in figures["damaged"]), repaired=figures["repaired"],
                      unrepaired=figures["unrepaired"])
    # The MANIFEST's damage: 5 cut lines of student_1 and 4 of student_5; the two student_7 logs show none.
    assert totals["cut"] == 9 and totals["repaired"] > 0 and totals["unrepaired"] > 0
    for name in ("bc147b33-fa74-4bff-9f48-c88809c5bdcd.log", "388ef554-e3e7-4410-89ac-d6ad4aeaec6c.log"):
        assert report["files"][name]["damaged"] == []


def _participant_codes(trajectories, participant: str) -> set[str]:
    return {ex.code for t in trajectories if t.participant == anonymize(participant) for ex in t.executions}


@pytest.mark.parametrize("participant", ["student_0", "student_3", "student_4"])
def test_sh_sources_with_quotes_and_backslashes_equal_the_final_notebooks(ingested, june_dir, participant):
    """sh's echo halved every backslash; decoded, each final cell that holds a backslash and a quote is the code
    of one of the participant's logged executions, character for character."""
    _, trajectories, _ = ingested
    codes = _participant_codes(trajectories, participant)
    tricky = [text for nb in sorted((june_dir / "participants" / participant).glob("final-task*.ipynb"))
              for _, text in code_cells(load_notebook(nb)) if "\\" in text and ('"' in text or "'" in text)]
    assert tricky
    assert [text for text in tricky if text not in codes] == []


def _file(report, june_dir, participant, kernel):
    name = next(n for n in report["files"] if n.startswith(f"participants/{participant}/{kernel}"))
    return name, report["files"][name]


def _executions_from(trajectories, name):
    return {int(ex.origin.rsplit(":", 1)[1]): ex for t in trajectories for ex in t.executions
            if ex.origin.rsplit(":", 1)[0] == name}


def test_cut_lines_are_named_and_their_code_is_never_passed_off(ingested, june_dir):
    report, trajectories, _ = ingested
    name, figures = _file(report, june_dir, "student_5", "dbe93969")
    raw = (june_dir / name).read_bytes().split(b"\n")
    cut = [d for d in figures["damaged"] if "cut_line" in d["kinds"]]
    assert [d["line"] for d in cut] == [n for n, line in enumerate(raw, 1)
                                        if line and not line.rstrip(b"\r").rstrip(b" ").endswith(b"]'")]
    executions = _executions_from(trajectories, name)
    for d in cut:
        ex = executions[d["line"]]  # the cut `execute` line still opened its execution, in its place
        assert (d["event"], d["repaired_from"]) == ("execute", None)
        assert ex.code_state == "damaged" and ex.status == "unknown" and ex.ename is None
        assert ex.code  # what survived is kept, marked, not dropped


def test_a_lost_text_line_is_repaired_only_from_a_proven_full_text(ingested, june_dir):
    """cmd.exe took `>` for a redirection: the line parses but lost `> …` up to the next space. The participant's
    final notebook holds the cell whole, and cmd.exe's rule applied to it gives back exactly the logged line."""
    report, trajectories, _ = ingested
    name, figures = _file(report, june_dir, "student_1", "81607d1b")
    executions = _executions_from(trajectories, name)
    final = [text for _, text in code_cells(load_notebook(june_dir / "participants/student_1/final-task1.ipynb"))]
    repaired = [ex for ex in executions.values() if ex.code_state == "repaired"]
    assert repaired and all(ex.code in final for ex in repaired)
    lost = [d for d in figures["damaged"] if d["kinds"] == ["lost_text"] and d["repaired_from"]]
    assert lost and all(d["repaired_from"].startswith("participants/student_1/final-task1.ipynb (cell ") for d in lost)
    for d in lost:
        logged = json.loads(_inner_json((june_dir / name).read_bytes().split(b"\n")[d["line"] - 1]
                                        .decode("utf-8").rstrip("\r\n")))["cell_source"]
        if d["line"] in executions and d["event"] == "execute":
            ex = executions[d["line"]]
            assert ex.code != logged and len(ex.code) > len(logged) and ex.repaired_from == d["repaired_from"]
            assert any(op in ex.code[len(logged) - len(logged.lstrip()):] for op in "<>^")
    # On these logs no other event of a cell ever holds the exposed text whole (cmd.exe eats it the same way
    # wherever it is logged): the final notebook proves every repair.
    assert all(ex.repaired_from.startswith("participants/student_1/final-task1.ipynb") for ex in repaired)


def test_damaged_code_is_never_a_target_and_is_marked_in_history(ingested):
    """Task rows from the real trajectories (the logged outcome standing in for the replay): no step whose code
    stays damaged is a target of either task, and every history that shows one marks it."""
    from themisto.release.tasks import TaskSettings, build_tasks

    _, trajectories, _ = ingested
    rows = []
    for traj in trajectories:
        for i, ex in enumerate(traj.executions):
            rows.append({"kernel_id": traj.id, "step": i, "cell_id": ex.cell_id, "notebook": traj.notebook,
                         "task": traj.task, "participant": traj.participant, "code": ex.code,
                         "restarted_before": any(e.kind == "restart" and e.before == i for e in traj.events),
                         "status": "ok" if ex.status == "ok" else "error", "ename": ex.ename, "evalue": None,
                         "output": "x" * (1 + len(ex.outputs)), "output_types": ex.output_types,
                         "variables": [], "memory_bytes": None, "state_hash": None, "code_state": ex.code_state})
    damaged = {(r["kernel_id"], r["step"]) for r in rows if r["code_state"] == "damaged"}
    assert len(damaged) >= 30
    tasks = build_tasks(rows, TaskSettings(seed=0, output_sample_size=None))
    targets = [r for task in ("next_cell", "output_prediction") for split in tasks.rows[task].values() for r in split]
    assert targets and not [r["id"] for r in targets if (r["kernel_id"], r["step"]) in damaged]
    assert tasks.reports["next_cell"].removed["damaged_code"] > 0
    shown = [cell for r in targets for cell in r["history"] if (r["kernel_id"], cell["step"]) in damaged]
    assert shown and all(cell["code_state"] == "damaged" for cell in shown)


def test_student_0s_kernels_on_one_notebook_form_one_trajectory(ingested, june_dir):
    _, trajectories, _ = ingested
    student_0 = [t for t in trajectories if t.participant == anonymize("student_0")]
    task1 = [t for t in student_0 if t.notebook == "task1.ipynb"]
    assert len(task1) == 1 and len(student_0) == 2  # the task-2 kernel is a trajectory of its own
    (traj,) = task1
    kernel_files = {p.stem: p for p in (june_dir / "participants/student_0").glob("*.log")}
    firsts = {}
    for kernel, path in kernel_files.items():
        first = json.loads(_inner_json(path.read_bytes().split(b"\n")[0].decode("utf-8").rstrip("\r\n")))
        if first["notebook_name"] == "task1.ipynb":
            firsts[kernel] = first["time"]
    order = sorted(firsts, key=firsts.get)
    assert len(order) == 8 and [s.kernel_id for s in traj.sources] == order and traj.id == order[0]
    # One restart where each next kernel took over, placed before that kernel's first execution.
    takeovers = [e for e in traj.events if e.kernel_id]
    assert [e.kernel_id for e in takeovers] == order[1:]
    origins = [ex.origin.rsplit(":", 1)[0] for ex in traj.executions]
    for event in takeovers:
        assert origins[event.before].endswith(f"{event.kernel_id}.log")
        assert origins[event.before - 1] != origins[event.before]
    assert origins == sorted(origins, key=lambda o: order.index(Path(o).stem))  # kernels never interleave


def test_the_two_logs_beside_the_participants_folder_are_given_to_student_7(june_dir, tmp_path):
    mapping = tmp_path / "participants.json"
    logs = sorted(june_dir.glob("*.log"))
    mapping.write_text(json.dumps({p.stem: "student_7" for p in logs}), encoding="utf-8")
    got = read_inputs(logs, participants=read_participants(mapping))
    assert {t.participant for t in got.trajectories} == {anonymize("student_7")}
    assert {t.id for t in got.trajectories} == {p.stem for p in logs}  # two notebooks: two trajectories
    for traj, path in zip(sorted(got.trajectories, key=lambda t: t.id), sorted(logs, key=lambda p: p.stem)):
        assert [(s.file, s.sha256) for s in traj.sources] == [(path.name, hashlib.sha256(path.read_bytes()).hexdigest())]
    # A mapping that contradicts a participant's folder is refused, naming the kernel.
    inside = next((june_dir / "participants/student_3").glob("671c08d4*.log"))
    mapping.write_text(json.dumps({inside.stem: "student_9"}), encoding="utf-8")
    with pytest.raises(IngestInputError, match=rf"kernel {inside.stem} is student_3's by its folder but student_9's"):
        read_inputs([inside], participants=read_participants(mapping))


# ---------------------------------------------------------------------------------------------------------------
# Personal data: found here in the raw files, then looked for in what ingest wrote


def test_no_name_or_address_in_the_logs_survives_ingest(ingested, june_dir, tmp_path):
    _, _, written = ingested
    notebooks = sorted(june_dir.rglob("*.ipynb"))
    found = find_personal([*sorted(june_dir.rglob("*.log")), *notebooks])
    assert len(found.names) >= 3 and len(found.ips) >= 5  # the finder finds what the MANIFEST says is there
    # The final notebooks read as trajectories of their own too (their code, errors and names).
    out = tmp_path / "notebooks.jsonl"
    assert main(["ingest", *map(str, notebooks), "-o", str(out)]) == 0
    assert leaks(written, found, "the logs' trajectories") == []
    assert leaks(out.read_text(encoding="utf-8"), found, "the notebooks' trajectories") == []


def test_without_o_ingest_prints_the_same_report_and_writes_nothing(june_dir, tmp_path, monkeypatch):
    """`themisto ingest PATH --json` as the README shows it: the report of a run with -o, and no file anywhere."""
    log = sorted((june_dir / "participants/student_1").glob("*.log"))[0]
    monkeypatch.chdir(tmp_path)
    printed = []
    for extra in ([], ["-o", str(tmp_path / "out" / "t.jsonl")]):
        (tmp_path / "out").mkdir(exist_ok=True)
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            assert main(["ingest", str(log), "--json", *extra]) == 0
        printed.append(json.loads(buffer.getvalue()))
        if not extra:
            assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]  # nothing written, not even a .partial
    assert printed[0] == printed[1] and printed[0]["files"][log.name]["executions"] > 0
