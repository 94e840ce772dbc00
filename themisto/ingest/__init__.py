"""Ingest: raw development logs in, `Trajectory` records out.

Takes JuNE event logs (`june`, `june_format`), the JuNE table, or notebooks (`notebook`) and gives trajectories
(`trajectory`): the cells a developer executed, in order, with their logged outcomes. `cleaning` is the explicit,
reversible cleaning replay applies; `workspace` writes seeded look-alike inputs for the tasks' missing data files.
Imports nothing heavy: standard library only.
"""
