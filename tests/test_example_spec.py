"""One example spec (themisto.generation.example_spec) for every front end: a bad limit, split or mode is refused
with the option as the front end that was given it spells it (`themisto generate --limit`, Inspect's `-T limit=`),
the Inspect tasks' defaults are the spec's, and `themisto generate` and the Inspect tasks leave the probes the same
room in a probe conversation's first prompt. Nothing here starts a kernel or loads a model."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from operator import attrgetter

import pytest

from themisto.cli import main
from themisto.generation.example_spec import DEFAULT_SPEC, ExampleSpec, ExampleSpecError
from themisto.generation.probe_protocol import ProbeSettings
from themisto.release.folder import open_release
from themisto.vocabulary import BASELINE_CONTEXT, CONTEXT_MODES, PROBE_CONTEXT, TASKS

# A bad value of each checked field, and how the command line and Inspect name it.
BAD = [("limit", 0, "--limit 0", "-T limit=0"),
       ("max_prompt_tokens", 0, "--max-prompt-tokens 0", "-T max_prompt_tokens=0"),
       ("split", "dev", "--split", "-T split=dev"),
       ("context", "verbose", "--context", "-T context=verbose"),
       # the probe and delta modes' settings, refused by their own classes, spelled by each front end too
       ("probes", 99, "--probes 99: must be between 0 and 64", "-T probes=99"),
       ("probe_chars", 10, "--probe-chars 10: a probe's output must be", "-T probe_chars=10"),
       ("probe_timeout", 0.01, "--probe-timeout 0.01: a probe's time must be", "-T probe_timeout=0.01"),
       ("delta_cells", 0, "--delta-cells 0: must be a whole number", "-T delta_cells=0")]
# the Inspect tasks' parameters beside the spec's
HARNESS_OWN = {"release", "execute", "workspace", "sources", "execute_probes"}


def _inspect_tasks():
    """Every task `themisto.harness.tasks` registers: the two full tasks and one per (task, context mode)."""
    from themisto.harness import tasks
    from themisto.release.eval_yaml import task_id

    return [tasks.next_cell, tasks.output_prediction] + [getattr(tasks, task_id(t, c)) for t in TASKS
                                                         for c in CONTEXT_MODES]


@pytest.mark.parametrize("name, value, cli, _", BAD, ids=[b[0] for b in BAD])
def test_generate_refuses_a_bad_value_by_its_option(name, value, cli, _, tmp_path, capsys):
    option = "--" + name.replace("_", "-")
    args = ["generate", "--release", str(tmp_path / "release"), "--task", "next_cell", "--backend", "baseline",
            "--model", "previous-cell", option, str(value), "-o", str(tmp_path / "run")]
    try:
        code = main(args)
    except SystemExit as exited:  # argparse's own refusal of a value outside an option's choices
        code = exited.code
    assert code == 2 and cli in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_command_refuses_with_the_message_and_a_nonzero_exit(tmp_path):
    done = subprocess.run([sys.executable, "-m", "themisto.cli", "generate", "--release", str(tmp_path), "--task",
                           "next_cell", "--backend", "baseline", "--model", "previous-cell", "--limit", "0", "-o",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "themisto generate: error: --limit 0: must be at least 1" in done.stderr


@pytest.mark.parametrize("name, value, _, spelled", BAD, ids=[b[0] for b in BAD])
def test_an_inspect_task_refuses_a_bad_value_by_its_t_parameter(name, value, _, spelled):
    from themisto.harness.samples import HarnessError

    for made in _inspect_tasks()[:3]:  # both full tasks and a task of one mode (its mode is its own)
        if name == "context" and "context" not in inspect.signature(made).parameters:
            continue
        with pytest.raises(HarnessError) as refused:
            made(release="no-such-release", **{name: value})
        assert str(refused.value).startswith(f"{spelled}: ")


def test_sft_export_and_the_study_refuse_by_their_own_options(tmp_path, capsys):
    from themisto.study.settings import StudyError, with_preset

    assert main(["sft-export", "--release", str(tmp_path), "--split", "dev", "-o", str(tmp_path / "out")]) == 2
    assert "themisto sft-export: error: --split dev: expected one of" in capsys.readouterr().err
    with pytest.raises(StudyError, match="^--test-limit 0: must be at least 1"):
        with_preset("custom", {"release": "r", "model": "m", "test_limit": 0})
    with pytest.raises(StudyError, match="^--tasks next_cell next_cell: tasks must be distinct"):
        with_preset("custom", {"release": "r", "model": "m", "tasks": ("next_cell", "next_cell")})


def test_the_spec_is_checked_once_and_its_spelling_is_no_part_of_it():
    from themisto.harness.samples import INSPECT_OPTIONS

    with pytest.raises(ExampleSpecError, match="^--task next_cell output_prediction: give one task"):
        ExampleSpec().task
    with pytest.raises(ExampleSpecError, match=r"^--limit True: must be at least 1"):
        ExampleSpec(limit=True)
    assert ExampleSpec(spelling=INSPECT_OPTIONS) == DEFAULT_SPEC


def test_every_inspect_task_takes_its_defaults_from_the_spec_and_each_t_name_sets_its_field(monkeypatch):
    from inspect_ai import Task

    from themisto.harness import tasks
    from themisto.harness.samples import SPEC_PARAMETERS

    assert {path.split(".")[0] for path in SPEC_PARAMETERS.values()} <= {f.name for f in dataclasses.fields(ExampleSpec)}
    for made in _inspect_tasks():
        parameters = inspect.signature(made).parameters
        own = set(SPEC_PARAMETERS) - ({"context"} if "context" not in parameters else set())
        assert set(parameters) - HARNESS_OWN == own, made.__name__
        for name in own - {"context"}:
            assert parameters[name].default == attrgetter(SPEC_PARAMETERS[name])(DEFAULT_SPEC), (made.__name__, name)
        # An Inspect task runs in one mode: the paired effects' control unless given (or named by the task).
        assert "context" not in parameters or parameters["context"].default == BASELINE_CONTEXT
    given = {"context": "variables", "split": "train", "limit": 3, "max_prompt_tokens": 900, "probes": 2,
             "probe_chars": 500, "probe_timeout": 2.5, "delta_cells": 4}
    assert set(given) == set(SPEC_PARAMETERS)
    seen = []
    monkeypatch.setattr(tasks, "themisto_task", lambda settings, workspace=None: seen.append(settings) or Task())
    tasks.next_cell(release="r", **given)
    [settings] = seen
    for name, value in given.items():
        field = attrgetter(SPEC_PARAMETERS[name])(settings.spec)
        assert field == ((value,) if name == "context" else value), name


# ---------------------------------------------------------------------------------------------------------------
# The probe reserve: one rule for generate and the Inspect tasks

# small_release's probe prompts take 700-1,400 tokens; one probe of 100 characters reserves about 310 of the budget,
# less than half of it: the rule's own arithmetic decides what the first prompt keeps, not its cap.
BUDGET = 1_100
PROBE = ProbeSettings(max_probes=1, output_chars=100, protocol="native")
LIMIT = 4


class _Answers:
    """A backend with no tokenizer (the budget counted as the Inspect tasks count it) that answers at once."""

    def generate(self, prompts, sampling):
        from themisto.generation.run_folder import Generation

        return [[Generation("```python\nx = 1\n```", "ok", None, 1, 1)] for _ in prompts]

    def describe(self):
        return {"name": "answers"}

    def native_tools_problem(self):
        return None


def _generated_first_prompts(release, out, monkeypatch) -> dict[str, dict]:
    """`themisto generate`'s probe-mode records of the first LIMIT examples, each step served without a kernel (the
    model answers without probing, so no probe runs)."""
    from themisto.generation import probing
    from themisto.generation.runs import RunSettings, generate_run

    def serve_states(permit, info, rows, settings, workspace):
        for row in rows:
            yield probing.ServedStep(row["kernel_id"], int(row["step"]), [row])

    monkeypatch.setattr(probing, "serve_states", serve_states)
    monkeypatch.setattr(probing, "probe_workspace", lambda info, workspace, tmp: tmp)
    spec = ExampleSpec(tasks=("next_cell",), contexts=(PROBE_CONTEXT,), limit=LIMIT, max_prompt_tokens=BUDGET,
                       probe=PROBE)
    generate_run(open_release(release), out, RunSettings(spec, backend="openai", model="answers"), backend=_Answers(),
                 progress=False, execute_probes=True)
    lines = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    return {line["id"]: line for line in lines}


def test_generate_and_the_inspect_task_leave_the_probes_the_same_room(small_release, tmp_path, monkeypatch,
                                                                     allow_execution):
    from themisto.generation.backends import Sampling
    from themisto.generation.prompts import approx_tokens, render_prompt
    from themisto.generation.release_rows import load_task_rows
    from themisto.harness.samples import task_samples
    from themisto.harness.tasks import next_cell

    # The Inspect task's own path from its -T parameters to its samples, short of the Task (no model is asked).
    monkeypatch.setattr("themisto.harness.tasks.themisto_task", lambda settings, workspace=None: settings)
    settings = next_cell.__wrapped__(release=str(small_release), context=PROBE_CONTEXT, limit=LIMIT,
                                     max_prompt_tokens=BUDGET, probes=PROBE.max_probes,
                                     probe_chars=PROBE.output_chars)
    assert settings.spec.probe == PROBE
    _, samples = task_samples(settings)
    generated = _generated_first_prompts(small_release, tmp_path / "run", monkeypatch)
    assert [s.id for s in samples] == list(generated)
    for sample in samples:
        line = generated[sample.id]
        skipped = line["status"] == "skipped"
        assert (line["kept"], skipped) == (sample.metadata["kept"], bool(sample.metadata["skipped"]))
    # Not vacuous: without the reserve some of these prompts would have kept more, and the reserve is the rule's own
    # arithmetic here, not its cap of half the budget.
    rows = load_task_rows(open_release(small_release), "next_cell", (PROBE_CONTEXT,), limit=LIMIT)
    whole = {row["id"]: render_prompt(row, "next_cell", PROBE_CONTEXT, count_tokens=approx_tokens,
                                      max_prompt_tokens=BUDGET, probe=settings.spec.probe) for row in rows}
    assert any(p.kept.to_dict() != generated[i]["kept"] for i, p in whole.items())
    assert settings.spec.first_probe_budget(Sampling().max_new_tokens, approx_tokens) > BUDGET // 2
