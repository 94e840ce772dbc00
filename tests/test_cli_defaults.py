"""Defaults from one place (issue 42): every command-line option that sets a settings field has that field's default,
and the choices come from the vocabulary and the registries."""

import argparse
import dataclasses
import inspect
import subprocess
import sys

import pytest

from themisto.cli import build_parser, main
from themisto.cli.common import default_of
from themisto.generation.backends import BACKENDS, Sampling
from themisto.generation.backends.hf import TransformersBackend
from themisto.generation.backends.openai_api import OpenAIBackend
from themisto.generation.backends.vllm_offline import VLLMBackend
from themisto.generation.example_spec import ExampleSpec
from themisto.generation.probe_protocol import ProbeSettings
from themisto.generation.runs import RunSettings
from themisto.ingest.collect import CollectSettings
from themisto.ingest.collect_files import FileBounds
from themisto.ingest.ipython_corpus import CorpusSettings
from themisto.ingest.workspace import SIZES, write_workspace
from themisto.ingest.workspace import TASKS as WORKSPACE_TASKS
from themisto.release.parquet import BuildInputs
from themisto.release.tasks import TaskSettings
from themisto.release.values import ValueCaps
from themisto.replay.replay import ReplaySettings
from themisto.scoring.intervals import IntervalSettings
from themisto.scoring.records import ScoreSettings
from themisto.study.settings import StudySettings
from themisto.training.export import MIXES, ExportSettings
from themisto.vocabulary import CLUSTER_UNITS, CONTEXT_MODES, DEFAULT_CONTEXT_MODES, RUN_SPLITS, TASKS

MB = 2**20

# (command, option's dest) -> (the settings dataclass, or the backend class or function, whose default it is; the
# field or keyword; how the option's value becomes the field's, where it is not the value itself).
SETTINGS = {
    ("ingest", "min_inputs"): (CorpusSettings, "min_inputs", None),
    ("ingest", "max_steps"): (CorpusSettings, "max_steps", None),
    ("ingest", "sessions_per_developer"): (CorpusSettings, "sessions_per_developer", None),
    ("replay", "min_inputs"): (CorpusSettings, "min_inputs", None),
    ("replay", "max_steps"): (CorpusSettings, "max_steps", None),
    ("replay", "sessions_per_developer"): (CorpusSettings, "sessions_per_developer", None),
    ("build", "min_inputs"): (CorpusSettings, "min_inputs", None),
    ("build", "max_steps"): (CorpusSettings, "max_steps", None),
    ("build", "sessions_per_developer"): (CorpusSettings, "sessions_per_developer", None),
    ("ingest", "kernel_environment"): (CorpusSettings, "environment", None),
    ("replay", "kernel_environment"): (CorpusSettings, "environment", None),
    ("build", "kernel_environment"): (CorpusSettings, "environment", None),
    ("score", "task"): (ScoreSettings, "task", None),
    ("score", "k"): (ScoreSettings, "k", tuple),
    ("score", "prediction_timeout"): (ScoreSettings, "timeout_s", None),
    ("score", "max_reference_s"): (ScoreSettings, "max_reference_s", None),
    ("score", "continuation_cells"): (ScoreSettings, "continuation_cells", None),
    ("score", "restore"): (ScoreSettings, "restore", None),
    ("score", "cluster"): (IntervalSettings, "cluster", None),
    ("generate", "n"): (Sampling, "n", None),
    ("generate", "temperature"): (Sampling, "temperature", None),
    ("generate", "top_p"): (Sampling, "top_p", None),
    ("generate", "seed"): (Sampling, "seed", None),
    ("generate", "max_new_tokens"): (Sampling, "max_new_tokens", None),
    ("generate", "limit"): (ExampleSpec, "limit", None),
    ("generate", "max_prompt_tokens"): (ExampleSpec, "max_prompt_tokens", None),
    ("generate", "split"): (ExampleSpec, "split", None),
    ("generate", "context"): (ExampleSpec, "contexts", tuple),
    ("generate", "batch_size"): (RunSettings, "batch_size", None),
    ("generate", "probes"): (ProbeSettings, "max_probes", None),
    ("generate", "probe_chars"): (ProbeSettings, "output_chars", None),
    ("generate", "probe_timeout"): (ProbeSettings, "timeout_s", None),
    ("generate", "probe_protocol"): (ProbeSettings, "protocol", None),
    ("generate", "device"): (TransformersBackend, "device", None),
    ("generate", "dtype"): (TransformersBackend, "dtype", None),
    ("generate", "batching"): (TransformersBackend, "batching", None),
    ("generate", "concurrency"): (OpenAIBackend, "concurrency", None),
    ("generate", "max_retries"): (OpenAIBackend, "max_retries", None),
    ("generate", "request_timeout"): (OpenAIBackend, "timeout_s", None),
    ("generate", "tensor_parallel_size"): (VLLMBackend, "tensor_parallel_size", None),
    ("sft-export", "split"): (ExportSettings, "split", None),
    ("sft-export", "task"): (ExportSettings, "tasks", tuple),
    ("sft-export", "context"): (ExportSettings, "contexts", tuple),
    ("sft-export", "mix"): (ExportSettings, "mix", None),
    ("sft-export", "mix_seed"): (ExportSettings, "seed", None),
    ("sft-export", "max_prompt_tokens"): (ExportSettings, "max_prompt_tokens", None),
    ("build", "workspace_seed"): (BuildInputs, "workspace_seed", None),
    ("build", "cell_timeout"): (BuildInputs, "cell_timeout_s", None),
    ("build", "split_seed"): (TaskSettings, "seed", None),
    ("build", "test_fraction"): (TaskSettings, "test_fraction", None),
    ("build", "max_value_mb"): (ValueCaps, "value_bytes", lambda mb: int(mb * MB)),
    ("build", "max_values_mb"): (ValueCaps, "release_bytes", lambda mb: int(mb * MB)),
    # Literals in the CLI: the workspace's module imports pandas, which building the parser must not.
    ("workspace", "workspace_seed"): (write_workspace, "seed", None),
    ("workspace", "size"): (write_workspace, "size", None),
    ("replay", "workspace_seed"): (write_workspace, "seed", None),
    ("replay", "size"): (write_workspace, "size", None),
    ("collect", "base_url"): (CollectSettings, "base_url", None),
    ("collect", "timeout"): (CollectSettings, "timeout_s", None),
    ("collect", "max_file_mb"): (FileBounds, "file_bytes", lambda mb: int(mb * MB)),
    ("collect", "max_repo_mb"): (FileBounds, "repository_bytes", lambda mb: int(mb * MB)),
    ("study", "preset"): (StudySettings, "preset", None),
    ("study", "execute"): (StudySettings, "execute", None),
    ("study", "generate_only"): (StudySettings, "generate_only", None),
    ("study", "score_only"): (StudySettings, "score_only", None),
}
# Flags that turn a setting off: absent, the setting keeps its (true) default.
NEGATED = {
    ("sft-export", "no_verify"): (ExportSettings, "verify"),
    ("replay", "no_snapshots"): (ReplaySettings, "snapshots"),
    ("replay", "no_values"): (ReplaySettings, "values"),
    ("build", "no_values"): (BuildInputs, "values"),
}
# Defaults that are no settings field, each with why.
NOT_SETTINGS = {
    ("study", "plan"): "what the command does (print the plan), not a setting of the study",
    ("study", "prepare_only"): "what the command does (write study.json and rows.json), not a setting of the study",
}

ACTIONS_WITHOUT_A_VALUE = (argparse._HelpAction, argparse._SubParsersAction)


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if not isinstance(a, ACTIONS_WITHOUT_A_VALUE)
            and a.default is not argparse.SUPPRESS}


def _field_default(owner, name: str):
    if dataclasses.is_dataclass(owner):
        fields = {f.name: f for f in dataclasses.fields(owner)}
        assert name in fields, f"{owner.__name__} has no field {name}"
        return default_of(owner, name)
    return inspect.signature(owner).parameters[name].default


def test_every_option_that_sets_a_field_has_the_fields_default():
    commands = _subcommands()
    wrong = []
    for (command, dest), (owner, name, convert) in SETTINGS.items():
        action = _options(commands[command])[dest]
        value = action.default if convert is None else convert(action.default)
        if value != _field_default(owner, name) or type(value) is not type(_field_default(owner, name)):
            wrong.append(f"themisto {command} {action.option_strings[-1]}: default {action.default!r}, "
                         f"{getattr(owner, '__name__', owner)}.{name} is {_field_default(owner, name)!r}")
    for (command, dest), (owner, name) in NEGATED.items():
        action = _options(commands[command])[dest]
        if action.default is not False or _field_default(owner, name) is not True:
            wrong.append(f"themisto {command} {action.option_strings[-1]}: off by default, {owner.__name__}.{name} on")
    assert not wrong, "\n".join(wrong)


def test_every_default_is_accounted_for():
    # A new option with a default is either a settings field's (listed above, so checked) or says why it is not.
    unlisted = [f"themisto {command} {action.option_strings[-1] if action.option_strings else dest}: "
                f"default {action.default!r}"
                for command, parser in _subcommands().items() for dest, action in _options(parser).items()
                if action.default not in (None, False) and (command, dest) not in SETTINGS
                and (command, dest) not in NOT_SETTINGS]
    assert not unlisted, "options with a default that no settings field holds:\n" + "\n".join(unlisted)


def test_the_studys_options_override_its_settings_by_name():
    from themisto.cli.study import _OVERRIDES

    names = {f.name for f in dataclasses.fields(StudySettings)}
    options = _options(_subcommands()["study"])
    assert set(_OVERRIDES) <= names
    # None: not given, so the preset's (or the settings') value stands.
    assert {dest: options[dest].default for dest in _OVERRIDES} == dict.fromkeys(_OVERRIDES)


def test_choices_come_from_the_vocabulary_and_the_registries():
    commands = _subcommands()
    choices = {(command, dest): tuple(action.choices) for command, parser in commands.items()
               for dest, action in _options(parser).items() if action.choices is not None}
    assert choices[("score", "task")] == TASKS
    assert choices[("score", "cluster")] == CLUSTER_UNITS
    assert choices[("generate", "backend")] == BACKENDS
    assert choices[("generate", "context")] == CONTEXT_MODES
    assert choices[("generate", "split")] == RUN_SPLITS
    assert choices[("sft-export", "mix")] == MIXES
    assert choices[("replay", "size")] == choices[("workspace", "size")] == SIZES
    assert choices[("workspace", "task")] == (*WORKSPACE_TASKS, "all")
    assert tuple(_options(commands["generate"])["context"].default) == DEFAULT_CONTEXT_MODES


def test_score_help_shows_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--task {next_cell,output_prediction}" in shown
    assert "--cluster {trajectory,participant}" in shown
    assert "--config" not in shown  # the deprecated alias works but is not advertised


def test_config_is_a_deprecated_alias_of_task(capsys):
    args = build_parser().parse_args(["score", "--config", "output_prediction"])
    assert args.task == "output_prediction"
    assert capsys.readouterr().err == "themisto score: --config is deprecated; use --task\n"
    assert build_parser().parse_args(["score", "--task", "output_prediction"]).task == "output_prediction"
    assert build_parser().parse_args(["score"]).task == ScoreSettings.task
    assert capsys.readouterr().err == ""


def test_building_the_parser_loads_nothing_heavy():
    code = ("import sys, themisto.cli; themisto.cli.build_parser(); "
            "print(sorted(m for m in ('numpy', 'pandas', 'pyarrow', 'torch', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
