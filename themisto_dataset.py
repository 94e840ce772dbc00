"""The Themisto dataset's schema: one `datasets.Features` per config, declared here once.

The release (Parquet per config and split, written by `themisto.release.parquet`) and the card's YAML
(`dataset_card.md`, rendered into the release's README.md) both follow these declarations; tests check that
they agree. datasets 5.x no longer runs loading scripts, so a release loads as plain Parquet through the
card's `configs:` section: `datasets.load_dataset(folder_or_hub_id, "next_cell")`.
"""

from __future__ import annotations

import datasets

from themisto.modes import STATIC_CONTEXT_MODES
from themisto.vocabulary import SPLITS, TASKS  # SPLITS: read by the release as themisto_dataset.SPLITS


def prompts_config(task: str) -> str:
    """The config of a task's text track: its rows' fixed prompts, one column per mode (`prompt_column`)."""
    return f"{task}_prompts"


def prompt_column(mode: str) -> str:
    """The column of a `<task>_prompts` config that holds the prompt of one context mode with a fixed prompt."""
    return f"prompt_{mode}"


# Each task is a config; `trajectories` holds every replayed step they were drawn from. A release whose replay stored
# the variables' values has `values` too, and one built with the prompt renderer a `<task>_prompts` config per task
# (OPTIONAL_CONFIGS: written only where there is something to write).
CONFIGS: tuple[str, ...] = ("trajectories", *TASKS)
PROMPTS_CONFIGS: tuple[str, ...] = tuple(prompts_config(task) for task in TASKS)
OPTIONAL_CONFIGS: tuple[str, ...] = ("values", *PROMPTS_CONFIGS)
DEFAULT_CONFIG = TASKS[0]

_STR = datasets.Value("string")
_INT32 = datasets.Value("int32")
_INT64 = datasets.Value("int64")
_FLOAT64 = datasets.Value("float64")
_BOOL = datasets.Value("bool")

# One user variable after a step, as `themisto.runtime.snapshot.VariableInfo` records it; the paper's release
# calls the same facts "runtime variables (name -> size, repr)" and "hash".
VARIABLE = {
    "name": _STR,
    "type": _STR,
    "size": _INT64,  # bytes
    "repr": _STR,  # bounded
    "hash": _STR,  # content hash, or "unhashable:<reason>"
    "shape": datasets.List(_INT64),
    "dtype": _STR,
    "len": _INT64,
    "columns": datasets.List(_STR),
    "repr_error": _STR,
    # false: run-specific (computed from the clock or the system's entropy: themisto.release.run_specific), left out of
    # the state hash and of the scorer's check; null where the build did not mark
    "stable": _BOOL,
}

# What a snapshot could not measure about one variable.
SNAPSHOT_FAILURE = {"name": _STR, "reason": _STR}

# What a restore needs besides the `values` rows the variables' hashes point to: the variables whose value is not
# there (and why), the module bindings (`pd` -> pandas) and the groups of names bound to one object. Null where
# the replay stored no values.
STORED_VALUES = {
    "unstored": datasets.List({"name": _STR, "reason": _STR}),
    "modules": datasets.List({"name": _STR, "module": _STR}),
    "aliases": datasets.List(datasets.List(_STR)),
}

# Where a trajectory from the wild came from (`themisto.ingest.ipython_corpus`), naming no one: the repository as a
# hashed id, the history file's path in it, the session, its date, the repository's licence (the licence file's
# family; null: none), the kernel environment that replayed it, how many of its inputs matched the notebook it was
# given, its inputs, and where and why it was cut before replay. Null for JuNE trajectories.
PROVENANCE = {
    "kind": _STR,
    "repository": _STR,
    "commit": _STR,
    "path": _STR,
    "session": _INT64,
    "date": _STR,
    "licence": _STR,
    "environment": _STR,
    "notebook_inputs_matched": _INT32,
    "inputs": _INT32,
    "cut_cause": _STR,
    "cut_at": _INT32,
}

# What rebuilding any of a trajectory's pre-cell states needs besides its rows (`themisto.release.workspaces`), the same
# on each of its rows: the input files it replayed over (`workspace_kind`: look_alike, repository, given or empty;
# `workspace`: its subfolder of the build's workspace, "" for all of it; `files_sha256`: the content hash of those
# files, null for look-alike inputs, which the build's recipe makes again), the folder its kernel started in
# (`start_dir`, relative to its files; null: their top), its kernel environment, how long a cell its log did not time
# may run (`cell_timeout_s`; null: the replay's default), and the modules its log shows missing until an install.
REBUILD = {
    "workspace_kind": _STR,
    "workspace": _STR,
    "files_sha256": _STR,
    "start_dir": _STR,
    "environment": _STR,
    "cell_timeout_s": _FLOAT64,
    "hidden_modules": datasets.List(_STR),
    "state_hashes": _STR,  # the hashing scheme of the release's state hashes (themisto.runtime.agent.hashing)
}

TRAJECTORIES = datasets.Features({
    "kernel_id": _STR,
    "step": _INT32,
    "cell_id": _STR,
    "notebook": _STR,
    "task": _STR,
    "participant": _STR,  # the developer: a JuNE participant or a repository's owner, pseudonymised
    "source": _STR,  # june-log | june-table | notebook | ipython-history | ipython-log
    "provenance": PROVENANCE,
    "code": _STR,
    "replayed_code": _STR,
    "restarted_before": _BOOL,
    "status": _STR,
    "ename": _STR,
    "evalue": _STR,
    "output": _STR,
    "output_types": datasets.List(_STR),
    "execution_time": _FLOAT64,
    "memory_bytes": _INT64,
    "state_hash": _STR,
    "variables": datasets.List(VARIABLE),
    "snapshot_failures": datasets.List(SNAPSHOT_FAILURE),
    "kernel_restarted": _BOOL,
    "rebuilt_steps": _INT32,
    "logged_status": _STR,
    "logged_ename": _STR,
    "logged_evalue": _STR,
    "logged_output_types": datasets.List(_STR),
    "code_state": _STR,  # as_logged | repaired | damaged (themisto.vocabulary.CODE_STATES)
    "stored_values": STORED_VALUES,
    # Why the replay's environment failed this step (themisto.replay.health.ENVIRONMENT_CAUSES); null: it did not.
    "replay_cause": _STR,
    "rebuild": REBUILD,
})

# One stored value (themisto.release.values): content-addressed by the variables' `hash`, shared by every step that
# holds it, in one of the safe formats (json, npy, npz, parquet, skops), its bytes in `data`.
VALUES = datasets.Features({
    "hash": _STR,
    "type": _STR,
    "format": _STR,
    "exact": _BOOL,  # read back in the kernels' environment, it hashes the same: a restore can use it
    "bytes": _INT64,
    "sha256": _STR,  # of `data`
    "data": datasets.Value("binary"),
})

# One prior cell in a task row's history window.
HISTORY_CELL = {
    "step": _INT32,
    "cell_id": _STR,
    "code": _STR,
    "output": _STR,
    "output_truncated": _BOOL,
    "status": _STR,
    "restarted_before": _BOOL,
    "code_state": _STR,  # "damaged": the log lost part of this cell's code; what is shown is not all it ran
}

# Fields every task row shares: the ids the metric needs to rebuild the exact state, the prompt's history,
# and the runtime snapshot before the target step.
_TASK_COMMON = {
    "id": _STR,
    "kernel_id": _STR,
    "step": _INT32,
    "notebook": _STR,
    "task": _STR,
    "source": _STR,  # the trajectory's source (`trajectories`' `source`): scores can be read per source
    "history": datasets.List(HISTORY_CELL),
    "restarted_before": _BOOL,
    "variables_before": datasets.List(VARIABLE),
    "memory_bytes_before": _INT64,
    "state_hash_before": _STR,
}

NEXT_CELL = datasets.Features({
    **_TASK_COMMON,
    "target": _STR,  # the code of the next executed cell
})

OUTPUT_PREDICTION = datasets.Features({
    **_TASK_COMMON,
    "cell_id": _STR,
    "code": _STR,  # the cell whose output is predicted
    "target": _STR,  # its output text
    "status": _STR,
    "ename": _STR,
    "output_types": datasets.List(_STR),
    "sample_band": _STR,  # shortest | middle | longest (the paper's sample of 200), or "all"
})

# The text track (themisto.release.text_track): per task row, the user message of each context mode whose prompt is
# fixed before the model runs (every mode but probe: `themisto.modes.STATIC_CONTEXT_MODES`), rendered by the one
# renderer under a budget in characters; the system message is eval.yaml's. Inspect's Hub loader reads these columns.
PROMPTS = datasets.Features({
    "id": _STR,  # the task row's id
    "kernel_id": _STR,
    "step": _INT32,
    "target": _STR,  # the task row's target
    **{prompt_column(mode): _STR for mode in STATIC_CONTEXT_MODES},
})

FEATURES: dict[str, datasets.Features] = {
    "trajectories": TRAJECTORIES,
    "next_cell": NEXT_CELL,
    "output_prediction": OUTPUT_PREDICTION,
    "values": VALUES,
    **{config: PROMPTS for config in PROMPTS_CONFIGS},
}

CONFIG_DESCRIPTIONS: dict[str, str] = {
    "trajectories": "one row per replayed step: code, output, status, execution time, memory, variables, state hash",
    "next_cell": "predict the code of the next executed cell from the history and the runtime state",
    "output_prediction": "predict the output text of a given cell from the history and the runtime state",
    "values": "the variables' values after each step, in safe formats, by content hash (trajectories' `hash`)",
    **{prompts_config(task): f"the text track of `{task}`: each row's prompt per context mode with a fixed prompt, "
                             "as plain text, and its target" for task in TASKS},
}


def features_for(config: str) -> datasets.Features:
    """The Features of one config; an unknown name raises ValueError listing the known ones."""
    try:
        return FEATURES[config]
    except KeyError:
        raise ValueError(f"unknown config {config!r} (expected one of {', '.join((*CONFIGS, *OPTIONAL_CONFIGS))})") \
            from None


def features_yaml(config: str) -> list:
    """The config's Features as the card's `dataset_info.features` YAML list."""
    return datasets.DatasetInfo(features=features_for(config))._to_yaml_dict()["features"]


def field_names(config: str) -> list[str]:
    """Every field name of a config, nested struct fields included (`history.code`), in declaration order."""
    names: list[str] = []

    def walk(prefix: str, feature) -> None:
        if isinstance(feature, datasets.List):
            feature = feature.feature
        if isinstance(feature, dict):
            for key, sub in feature.items():
                names.append(f"{prefix}{key}")
                walk(f"{prefix}{key}.", sub)

    walk("", dict(features_for(config)))
    return names
