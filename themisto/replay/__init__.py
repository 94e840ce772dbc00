"""Replay: a trajectory in, `Step`s out — every logged cell re-run in a sandboxed kernel with a snapshot after it.

`replay` runs trajectories (resumable, written as it goes); `fidelity` says how faithful the replay was to the log.
"""
