"""Replay: a trajectory in, `Step`s out — every logged cell re-run in a sandboxed kernel with a snapshot after it.

`replay` runs a trajectory (and rebuilds the state before a step from its kernel life); `steps_file` replays many
into one resumable steps file, whose header holds the recipe of the inputs (`workspace_recipe`) and the settings;
`fidelity` says how faithful the replay was to the log.
"""
