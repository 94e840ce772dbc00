"""Themisto in Inspect (themisto/harness): the registered tasks run with Inspect's mock model provider (no network) on
a release replayed in a real kernel, their scores are Themisto's, execution and the probe tool go through the
project's doors, and the log `inspect eval` writes is re-scored by `themisto score LOG.eval` to the figures of a run
folder with the same predictions. A hostile log is refused by name.

Inspect's mock model counts tokens with tiktoken's o200k_base (a download) when an output carries no usage, so the
scripted outputs here carry their usage: nothing reaches a network."""

from __future__ import annotations

import json
import zipfile

import pytest

RAW = "```python\nx = half + 1\n```"


def _mock(outputs):
    from inspect_ai.model import ModelUsage, get_model

    def with_usage(output):
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output

    return get_model("mockllm/model", custom_outputs=(with_usage(o) for o in outputs))


def _answers(text=RAW):
    from inspect_ai.model import ModelOutput

    while True:
        yield ModelOutput.from_content("mockllm", text)


def _eval(tmp_path, task_args, outputs, limit):
    from inspect_ai import eval as inspect_eval
    from inspect_ai.log import read_eval_log

    from themisto.harness.tasks import next_cell

    # The task by its object: its registered name is `themisto/next_cell` only where the package is installed (the
    # entry point), not when a checkout is merely on sys.path.
    [log] = inspect_eval(next_cell, task_args=task_args, model=_mock(outputs), limit=limit,
                         display="none", log_dir=str(tmp_path / "logs"), max_samples=2)
    assert log.status == "success", log.error
    return read_eval_log(log.location)  # what a user reads back: the file, not the object in memory


@pytest.fixture(scope="module")
def text_log(probe_release, tmp_path_factory):
    release, _ = probe_release
    return _eval(tmp_path_factory.mktemp("inspect"), {"release": str(release), "context": "variables"},
                 _answers(), limit=4)


def test_inspect_eval_scores_with_themisto_metrics_and_renders_the_runs_prompts(text_log, probe_release):
    from themisto.generation.release_rows import load_task_rows
    from themisto.release.folder import open_release
    from themisto.generation.prompts import approx_tokens, render_prompt

    scores = {s.name: s for s in text_log.results.scores}
    assert list(scores) == ["exact_match", "rouge_l", "chrf"]
    for score in scores.values():
        assert {"mean", "stderr"} <= set(score.metrics) and score.scored_samples == 4
    info = open_release(probe_release[0])
    rows = {r["id"]: r for r in load_task_rows(info, "next_cell", ("variables",))}
    for sample in text_log.samples:
        prompt = render_prompt(rows[sample.id], "next_cell", "variables", count_tokens=approx_tokens)
        assert [(m.role, m.text) for m in sample.input] == [(m["role"], m["content"]) for m in prompt.messages]
        assert sample.target == rows[sample.id]["target"]
        assert sample.metadata["kept"] == prompt.kept.to_dict()
        assert sample.scores["themisto"].answer == "x = half + 1"
    # The mean Inspect reports is the mean of Themisto's per-sample scores.
    per_sample = [s.scores["themisto"].value["chrf"] for s in text_log.samples]
    assert scores["chrf"].metrics["mean"].value == pytest.approx(sum(per_sample) / len(per_sample))


def test_the_log_scores_as_a_run_folder_with_the_same_predictions(text_log, probe_release, tmp_path, capsys):
    from themisto.cli import main
    from themisto.generation.run_folder import Generation
    from themisto.generation.example_spec import ExampleSpec
    from themisto.generation.runs import RunSettings, generate_run
    from themisto.release.folder import open_release
    from themisto.scoring.run_scores import score_run

    release, _ = probe_release

    class Same:
        """A backend that answers every prompt with the mock model's reply."""

        def generate(self, prompts, sampling):
            return [[Generation(RAW, "ok", None, 10, 5)] for _ in prompts]

        def describe(self):
            return {"name": "same"}

    ids = [s.id for s in text_log.samples]
    settings = RunSettings(ExampleSpec(tasks=("next_cell",), contexts=("variables",)), backend="openai",
                           model="same")
    handle = open_release(release)
    generate_run(handle, tmp_path / "run", settings, backend=Same(), progress=False)
    folder = score_run(tmp_path / "run", release=handle)
    log = tmp_path / "copy.eval"
    log.write_bytes(open(text_log.location, "rb").read())
    assert main(["score", str(log), "--release", str(release), "--json"]) == 0
    from_log = json.loads(capsys.readouterr().out)
    assert (tmp_path / "copy.run" / "generations.jsonl").is_file()
    # The run folder scored every test example; the log the 4 Inspect ran: compare on the log's examples.
    run_lines = [json.loads(line) for line in (tmp_path / "run" / "generations.jsonl").read_text().splitlines()]
    kept = [line for line in run_lines if line["id"] in ids]
    (tmp_path / "run4").mkdir()
    (tmp_path / "run4" / "run.json").write_text((tmp_path / "run" / "run.json").read_text())
    (tmp_path / "run4" / "generations.jsonl").write_text("".join(json.dumps(line) + "\n" for line in kept))
    folder = score_run(tmp_path / "run4", release=handle)
    assert from_log["scores"] == folder["scores"] and from_log["baselines"] == folder["baselines"]
    assert from_log["paired"] == folder["paired"] and from_log["run"]["model"] == "mockllm/model"
    inspect_chrf = {s.name: s for s in text_log.results.scores}["chrf"].metrics["mean"].value
    assert [s["mean"] for s in folder["scores"] if s["metric"] == "chrf" and s["subset"] == "all"] == [
        pytest.approx(inspect_chrf)]


def test_execute_adds_the_execution_metrics(probe_release, tmp_path, allow_execution):
    release, workspace = probe_release
    log = _eval(tmp_path, {"release": str(release), "context": "variables", "execute": True,
                           "workspace": str(workspace)}, _answers(), limit=1)
    scores = {s.name: s for s in log.results.scores}
    assert list(scores) == ["continuation_match", "functional_match", "exec_ok", "output_match", "state_match",
                            "exact_match", "rouge_l", "chrf"]
    for sample in log.samples:
        # `x = half + 1` before `half` exists (the first test step) fails: a NameError, judged, not unscored.
        assert sample.scores["themisto"].metadata["example_status"] == "scored"
        assert sample.scores["themisto"].value["exec_ok"] == 0.0
    assert scores["exec_ok"].scored_samples == 1


def test_execute_without_the_opt_in_is_refused_before_anything_runs(probe_release, monkeypatch):
    from themisto.gate import ExecutionRefused
    from themisto.harness.tasks import next_cell
    from themisto.settings import settings

    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    settings.cache_clear()
    with pytest.raises(ExecutionRefused, match="HF_ALLOW_CODE_EVAL"):
        next_cell(release=str(probe_release[0]), execute=True)
    with pytest.raises(ExecutionRefused):
        next_cell(release=str(probe_release[0]), context="probe", execute_probes=False)


def test_probe_mode_records_each_tool_call_in_the_transcript(probe_release, tmp_path, allow_execution):
    from inspect_ai.event import ToolEvent
    from inspect_ai.model import ModelOutput

    from themisto.harness.log_run import run_folder_from_log
    from themisto.generation.run_folder import read_run

    def scripted():
        while True:
            yield ModelOutput.for_tool_call("mockllm", "run_probe", {"code": "print(sorted(globals())[-3:])"})
            yield ModelOutput.from_content("mockllm", RAW)

    release, workspace = probe_release
    log = _eval(tmp_path, {"release": str(release), "context": "probe", "execute_probes": True,
                           "workspace": str(workspace), "limit": 1}, scripted(), limit=1)
    for sample in log.samples:
        [call] = [e for e in sample.events if isinstance(e, ToolEvent)]
        assert call.function == "run_probe" and call.error is None
        assert call.result.startswith("Probe 1 (ran") and "3 probes left." in call.result
        transcript = sample.store["themisto_probes"]
        assert transcript["used"] == 1 and transcript["probes"][0]["changed_state"] is False
        assert [m.role for m in sample.messages] == ["system", "user", "assistant", "tool", "assistant"]
    run = read_run(run_folder_from_log(log.location, tmp_path / "run"))
    assert all(g.probes["used"] == 1 and g.prediction == "x = half + 1" for g in run.generations.values())


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_hostile_log_is_refused_naming_the_member(tmp_path, monkeypatch):
    from themisto.bounded import Bounds
    from themisto.generation.run_folder import RunFolderError
    from themisto.harness import log_run

    header = {"status": "success", "eval": {"model": "m", "metadata": {"themisto": {
        "task": "next_cell", "context": "none", "release": {"path": "r", "content_hash": "0" * 64}}}}}
    (tmp_path / "not.eval").write_text("plain text")
    with pytest.raises(RunFolderError, match="not an Inspect .eval log"):
        log_run.run_folder_from_log(tmp_path / "not.eval")
    bomb = _zip(tmp_path / "bomb.eval", {"header.json": json.dumps(header).encode(),
                                         "samples/a_epoch_1.json": b" " * 5_000 + b"{}"})
    monkeypatch.setattr(log_run, "SAMPLE_BOUNDS", Bounds(file_bytes=4_096))
    with pytest.raises(RunFolderError, match=r"bomb.eval:samples/a_epoch_1.json: larger than 4,096 bytes"):
        log_run.run_folder_from_log(bomb)
    deep = _zip(tmp_path / "deep.eval", {"header.json": json.dumps(header).encode(),
                                         "samples/a_epoch_1.json": b"[" * 1_000 + b"]" * 1_000})
    with pytest.raises(RunFolderError, match=r"deep.eval:samples/a_epoch_1.json:1: nested deeper than 64 levels"):
        log_run.run_folder_from_log(deep)
    other = _zip(tmp_path / "other.eval", {"header.json": json.dumps({"eval": {"metadata": {}}}).encode()})
    with pytest.raises(RunFolderError, match="not a log of a Themisto task"):
        log_run.run_folder_from_log(other)
    lying = dict(header, eval={**header["eval"], "config": {"epochs": 1}})
    twice = json.dumps({"id": "a", "epoch": 1, "output": {"completion": "x"}}).encode()
    bad = _zip(tmp_path / "bad.eval", {"header.json": json.dumps(lying).encode(), "samples/a_epoch_1.json": twice,
                                       "samples/b_epoch_1.json": twice})
    with pytest.raises(RunFolderError, match=r"example a \(context none, sample 0\) was already given on line 1"):
        log_run.run_folder_from_log(bad)
    assert not (tmp_path / "bad.run").exists()  # nothing half-written


def test_a_sample_whose_state_was_not_served_is_unscored_not_wrong():
    import math

    from themisto.harness.scorer import score_value
    from themisto.scoring.records import ExampleRecord, PredictionRecord

    record = PredictionRecord(id="k/3", index=0, prediction="x", exact_match=0.0, rouge_l=0.5, chrf=0.25,
                              outcome="refused", exec_ok=False, functional_match=False)
    refused = score_value(ExampleRecord(id="k/3", predictions=1, status="refused"), record, "next_cell", True)
    assert all(math.isnan(refused[m]) for m in ("exec_ok", "functional_match", "continuation_match"))
    assert (refused["rouge_l"], refused["chrf"]) == (0.5, 0.25)
    judged = score_value(ExampleRecord(id="k/3", predictions=1, status="scored"), record, "next_cell", True)
    assert (judged["exec_ok"], judged["functional_match"]) == (0.0, 0.0)
    assert math.isnan(judged["continuation_match"])  # not judged for this example: no value, as in a run folder
