"""The `probe` context mode without a model: its protocol, its template, the opt-in, and the probing baselines run
through the whole path (a release trajectory replayed once in a real kernel, each probe in a branch of its example's
pre-cell state, the transcript on the generation line, resume, re-scoring without probing again)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from _probe_release import KERNEL

from themisto.cli import main
from themisto.gate import ExecutionRefused
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.probe_protocol import (TOOL_SCHEMA, ProbeSettings, ProbeSettingsError, Transcript, find_probe,
                                                probe_rule, tool_call_code, without_probes)
from themisto.generation.prompts import PROMPT_TEMPLATES, render_prompt, template_sha256
from themisto.generation.run_folder import RunFolderError, read_generations, read_run_json
from themisto.generation.runs import RunSettings, generate_run
from themisto.release.folder import open_release
from themisto.vocabulary import PROBE_CONTEXT, STATIC_CONTEXT_MODES


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]


def _timeless(record: dict) -> dict:
    """A line without its probes' times (they differ from run to run)."""
    if not record["probes"]:
        return record
    probes = [{k: v for k, v in p.items() if not k.endswith("_s")} for p in record["probes"]["probes"]]
    return {**record, "probes": {**record["probes"], "probes": probes, "probe_s": None}}


def _rows(release: Path, task: str) -> dict[str, dict]:
    return {row["id"]: row for row in open_release(release).rows(task, "test")}


# ---------------------------------------------------------------------------------------------------------------
# the protocol and the template


def test_a_probe_block_is_read_and_anything_else_is_an_answer():
    assert find_probe("I will look.\n~~~~probe\nframe.dtypes\nlen(words)\n~~~~\nthen answer") == \
        "frame.dtypes\nlen(words)"
    assert find_probe("```probe\nsorted(scores)") == "sorted(scores)"  # cut by the token limit: runs to the end
    assert find_probe("<think>```probe\nx\n```</think>```python\nx = 1\n```") is None
    assert find_probe("```python\n# ```probe is not a tag here\nx = 1\n```") is None
    assert without_probes("```probe\nx\n```\n```python\ny = 2\n```") == "```python\ny = 2\n```"
    assert tool_call_code('{"code": "len(words)"}') == "len(words)" and tool_call_code({"code": 3}) is None
    assert tool_call_code("not json") is None


def test_the_probe_prompt_is_the_variables_prompt_with_the_rule_before_the_instruction(probe_release):
    release, _ = probe_release
    row = next(iter(_rows(release, "next_cell").values()))
    variables = render_prompt(row, "next_cell", "variables").messages[1]["content"]
    settings = ProbeSettings(max_probes=3, output_chars=500, timeout_s=2.5)
    probe = render_prompt(row, "next_cell", PROBE_CONTEXT, probe=settings).messages[1]["content"]
    rule = probe_rule(settings)
    head, instruction = variables.rsplit("\n\n", 1)
    assert probe == f"{head}\n\n{rule}\n\n{instruction}"
    assert "up to 3 probes" in rule and "500 characters and 2.5 seconds" in rule and "```probe" in rule
    assert "run_probe" in probe_rule(ProbeSettings(protocol="native"))
    # Every text of the protocol is in the template, so its sha256 changes with any of them.
    template = PROMPT_TEMPLATES[("next_cell", PROBE_CONTEXT)]
    assert "{probe_rule}" in template and json.dumps(TOOL_SCHEMA, sort_keys=True) in template
    assert template_sha256("next_cell", PROBE_CONTEXT) != template_sha256("next_cell", "variables")


def test_probe_settings_out_of_range_are_refused():
    for bad in ({"max_probes": -1}, {"output_chars": 10}, {"timeout_s": 0}, {"protocol": "smoke"}):
        with pytest.raises(ProbeSettingsError):
            ProbeSettings(**bad)


def test_probe_is_no_default_mode_and_no_export_mode():
    assert PROBE_CONTEXT not in STATIC_CONTEXT_MODES
    from themisto.training.export import ExportError, ExportSettings

    with pytest.raises(ExportError):
        ExportSettings(contexts=(PROBE_CONTEXT,))


# ---------------------------------------------------------------------------------------------------------------
# the opt-in


def test_the_probe_mode_needs_both_switches(probe_release, tmp_path, monkeypatch, capsys):
    release, workspace = probe_release
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("none", PROBE_CONTEXT)), backend="baseline",
                           model="probe-previous-cell")
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(ExecutionRefused, match="HF_ALLOW_CODE_EVAL"):
        generate_run(open_release(release), tmp_path / "run", settings, progress=False, execute_probes=True, workspace=workspace)
    code = main(["generate", "--release", str(release), "--task", "next_cell", "--context", PROBE_CONTEXT,
                 "--backend", "baseline", "--model", "probe-previous-cell", "-o", str(tmp_path / "cli")])
    assert code == 2 and "--execute-probes" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cli").exists()


def test_without_the_explicit_option_nothing_runs(probe_release, tmp_path, allow_execution):
    release, workspace = probe_release
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,)), backend="baseline",
                           model="probe-previous-cell")
    with pytest.raises(ExecutionRefused, match="explicit option"):
        generate_run(open_release(release), tmp_path / "run", settings, progress=False, workspace=workspace)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------------
# one server of pre-step states


@pytest.mark.slow
def test_scoring_probing_and_the_inspect_probe_tool_take_their_states_from_the_one_server(probe_release, tmp_path,
                                                                                          allow_execution,
                                                                                          monkeypatch):
    from themisto.gate import permit
    from themisto.harness.probe_tool import ServedState
    from themisto.release import states
    from themisto.scoring import scorer as sc

    release, workspace = probe_release
    info = open_release(release)
    served, real = [], states.pre_step_states

    def spy(release, kernel_id, steps, workspace, **options):
        served.append((kernel_id, sorted(set(steps)), options.get("restore", False)))
        return real(release, kernel_id, steps, workspace, **options)

    monkeypatch.setattr(states, "pre_step_states", spy)
    rows, ids = info.task_rows("next_cell"), [f"{KERNEL}/5", f"{KERNEL}/9"]
    scored = sc.score([rows[i]["target"] for i in ids], [rows[i]["target"] for i in ids], ids=ids,
                      settings=sc.ScoreSettings(continuation_cells=0), execute=True, release=info,
                      workspace=workspace, workers=1)
    assert [(e.status, r.outcome) for e, r in zip(scored.examples, scored.predictions)] == [("scored", "ok")] * 2
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,), limit=1,
                                       probe=ProbeSettings(max_probes=1)), backend="baseline", model="probe-previous-cell")
    generate_run(info, tmp_path / "run", settings, progress=False, execute_probes=True, workspace=workspace)
    assert _lines(tmp_path / "run")[0]["probes"]["used"] == 1
    tool = ServedState(permit(execute=True), info, KERNEL, 6, ProbeSettings(protocol="native"), workspace)
    tool.start()
    try:
        assert tool.failure is None and tool.probe("print(words)").output.strip() == "['a', 'b', 'c']"
    finally:
        tool.close()
    # Scoring and the probe mode replay (restoring is the scorer's option, never the probe mode's); the tool, a kernel
    # per sample, restores where the release's values allow.
    assert [(kernel, restore) for kernel, _, restore in served] == [(KERNEL, False), (KERNEL, False), (KERNEL, True)]
    assert served[0][1] == [5, 9] and len(served[1][1]) == 1 and served[2][1] == [6]


# ---------------------------------------------------------------------------------------------------------------
# the probing baselines, end to end


@pytest.fixture(scope="module")
def baseline_run(probe_release, tmp_path_factory):
    """`probe-previous-cell` on every next_cell example, in none, variables and probe (HF_ALLOW_CODE_EVAL=1)."""
    from themisto.settings import settings as env_settings

    release, workspace = probe_release
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_ALLOW_CODE_EVAL", "1")
    env_settings.cache_clear()
    try:
        run = tmp_path_factory.mktemp("probe-runs") / "baseline"
        settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("none", "variables", PROBE_CONTEXT),
                                           probe=ProbeSettings(max_probes=2)),
                               backend="baseline", model="probe-previous-cell")
        report = generate_run(open_release(release), run, settings, progress=False, execute_probes=True, workspace=workspace)
        yield release, workspace, run, settings, report
    finally:
        mp.undo()
        env_settings.cache_clear()


# What `probe-previous-cell` asks at some steps (the known variables its previous cell names), with at most 2 probes.
ASKED = {5: ["words"], 6: ["words", "total"], 9: ["half", "scores"], 10: ["frame", "half"], 12: ["x", "half"]}


def test_the_probing_baseline_probes_the_live_state_and_answers_as_previous_cell(baseline_run):
    release, _, run, _, report = baseline_run
    rows = _rows(release, "next_cell")
    lines = _lines(run)
    assert report.counts == {"generations": 3 * len(rows), "ok": 3 * len(rows)}
    by = {(r["id"], r["context"]): r for r in lines}
    for example_id, row in rows.items():
        none, probe = by[(example_id, "none")], by[(example_id, PROBE_CONTEXT)]
        assert none["probes"] is None and by[(example_id, "variables")]["probes"] is None
        assert probe["prediction"] == none["prediction"]  # the probes change nothing of what it answers
        transcript = probe["probes"]
        assert Transcript.problem(transcript) is None and transcript["protocol"] == "text"
        assert transcript["used"] == len(transcript["probes"]) <= transcript["allowed"] == 2
        assert transcript["stop"] == ("max_probes" if transcript["used"] == 2 else "answered")
        assert transcript["turns"] == transcript["used"] + 1
        for probe_run in transcript["probes"]:
            assert probe_run["status"] == "ok" and probe_run["changed_state"] is False
            assert probe_run["raw"] == f"```probe\n{probe_run['code']}\n```"
            assert probe_run["wall_s"] >= probe_run["duration_s"] > 0
    for step, asked in ASKED.items():
        assert [p["code"] for p in by[(f"{KERNEL}/{step}", PROBE_CONTEXT)]["probes"]["probes"]] == asked


def test_each_probe_sees_its_own_step_s_state(baseline_run):
    _, _, run, _, _ = baseline_run
    shown = {(r["id"], p["code"]): p["output"] for r in _lines(run) if r["probes"] for p in r["probes"]["probes"]}
    # `words` gains 'c' at step 4, `frame` its column m at step 9: each probe saw its own example's pre-cell state.
    assert shown[(f"{KERNEL}/5", "words")] == "['a', 'b', 'c']"
    assert shown[(f"{KERNEL}/9", "half")] == "22" and shown[(f"{KERNEL}/9", "scores")] == "{'a': 1, 'b': 1}"
    assert "m" not in shown[(f"{KERNEL}/9", "half")] and shown[(f"{KERNEL}/10", "frame")].split("\n")[0].split() == [
        "n", "m"]


def test_run_json_records_the_probe_settings_tool_and_rule(baseline_run):
    _, _, run, settings, _ = baseline_run
    meta = read_run_json(run)
    probe = settings.spec.probe
    assert meta["probe"] == {**probe.to_dict(), "tool": TOOL_SCHEMA, "rule": probe_rule(probe)}
    assert meta["templates"][PROBE_CONTEXT]["sha256"] == template_sha256("next_cell", PROBE_CONTEXT)


def test_a_probe_run_resumes_per_example_and_refuses_other_probe_settings(baseline_run, tmp_path,
                                                                          allow_execution):
    import shutil

    release, workspace, run, settings, _ = baseline_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = (copy / "generations.jsonl").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not (json.loads(line)["context"] == PROBE_CONTEXT
                                           and json.loads(line)["id"].endswith(("/9", "/11")))]
    (copy / "generations.jsonl").write_text("".join(kept))
    report = generate_run(open_release(release), copy, settings, progress=False, execute_probes=True, workspace=workspace)
    assert report.written == 2
    assert sorted(map(_timeless, _lines(copy)), key=lambda r: (r["id"], r["context"])) == sorted(
        map(_timeless, _lines(run)), key=lambda r: (r["id"], r["context"]))
    other = replace(settings, spec=replace(settings.spec, probe=ProbeSettings(max_probes=3)))
    with pytest.raises(RunFolderError, match="probe"):
        generate_run(open_release(release), copy, other, progress=False, execute_probes=True, workspace=workspace)


def test_a_transcript_that_lies_is_refused_with_its_line(baseline_run, tmp_path):
    import shutil

    _, _, run, _, _ = baseline_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    lines = _lines(copy)
    index = next(i for i, r in enumerate(lines) if r["probes"] and r["probes"]["used"])
    lines[index]["probes"]["used"] += 1  # says it ran a probe it does not list
    (copy / "generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(RunFolderError, match=rf"generations.jsonl:{index + 1}: .*`probes`"):
        read_generations(copy, read_run_json(copy))
    for bad in ([], {"protocol": "text"}, {**lines[index]["probes"], "stop": "bored"}):
        assert Transcript.problem(bad) is not None


def test_probe_last_repr_answers_with_what_the_live_kernel_showed(probe_release, tmp_path, allow_execution):
    release, workspace = probe_release
    settings = RunSettings(ExampleSpec(tasks=("output_prediction",), contexts=("none", PROBE_CONTEXT)),
                           backend="baseline", model="probe-last-repr")
    generate_run(open_release(release), tmp_path / "run", settings, progress=False, execute_probes=True, workspace=workspace)
    rows = _rows(release, "output_prediction")
    probed = [r for r in _lines(tmp_path / "run") if r["context"] == PROBE_CONTEXT]
    assert len(probed) == len(rows)
    for record in probed:
        probes = record["probes"]["probes"]
        assert record["prediction"] == (probes[-1]["output"] if probes else "")
    frame = next(r for r in probed if r["probes"]["probes"] and r["probes"]["probes"][0]["code"] == "frame")
    assert "n" in frame["prediction"] and frame["probes"]["probes"][0]["changed_state"] is False


def test_scores_count_the_probes_and_pair_probe_with_none_and_variables_without_probing_again(baseline_run,
                                                                                               tmp_path):
    import shutil

    from themisto.scoring.run_scores import score_run

    _, _, run, _, _ = baseline_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    # No opt-in here: scoring reads the transcripts and runs nothing of the model's.
    results = score_run(copy)
    lines = [r for r in _lines(copy) if r["context"] == PROBE_CONTEXT]
    used = [r["probes"]["used"] for r in lines]
    [probing] = results["probing"]
    assert probing["generations"] == len(lines) and probing["used"]["mean"] == round(sum(used) / len(used), 4)
    assert probing["used"]["distribution"] == {str(k): used.count(k) for k in sorted(set(used))}
    assert probing["stops"] == {stop: sum(r["probes"]["stop"] == stop for r in lines)
                                for stop in {r["probes"]["stop"] for r in lines}}
    versus = {(e["versus"], e["examples"]) for e in results["paired"] if e["context"] == PROBE_CONTEXT}
    assert versus == {("none", "all"), ("none", "both_generated"), ("variables", "all"),
                      ("variables", "both_generated")}
    assert all(e["versus"] == "none" for e in results["paired"] if e["context"] == "variables")
    # By probes used: the groups' means, weighted by their examples, give back the mode's own score.
    overall = next(s for s in results["scores"] if (s["context"], s["metric"], s["subset"]) ==
                   (PROBE_CONTEXT, "chrf", "all"))
    groups = [e for e in probing["by_probes"] if e["metric"] == "chrf"]
    assert sorted(e["probes"] for e in groups) == sorted(set(used)) and sum(e["n"] for e in groups) == len(lines)
    assert sum(e["mean"] * e["n"] for e in groups) / len(lines) == pytest.approx(overall["mean"], abs=1e-3)
    markdown = (copy / "results.md").read_text()
    assert f"Probe mode `{PROBE_CONTEXT}`" in markdown and f"{PROBE_CONTEXT} − variables, all" in markdown
