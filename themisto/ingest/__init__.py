"""Ingest: raw development logs in, `Trajectory` records out, damage named and personal data masked.

`inputs.read_inputs` is the one door: files or folders (read recursively) of JuNE event logs (`june_log`, in the
line formats of `june_format`; what cmd.exe did to them in `cmd_shell`; proven repairs in `repair`), the JuNE table
(`june_table`) or notebooks (`notebook`, through nbformat), paired into trajectories (`june`, `trajectory`): the
cells a developer executed, in order, with their logged outcomes and the file and sha256 they came from. A
participant's kernels on one notebook form one trajectory with a restart where each next kernel took over
(`kernels` states the rule and why). User names in paths, IP and e-mail addresses are masked where the data
enters (`personal`); every file is read within bounds (`limits`). IPython's own records of a kernel's inputs are
read as sessions (`ipython_history`: the history database, opened as data; `ipython_log`: `%logstart` logs), their
texts scrubbed of credentials (`secrets`, through detect-secrets) and personal data. `output_size` is the JuNE
extension's size rule; `cleaning` is the explicit, reversible cleaning replay applies; `workspace` writes seeded
look-alike inputs for the tasks' missing data files. A corpus of IPython histories is fetched again from public
repositories by `collect` (through `git_fetch`, taking what `collect_files` allows) from a pointer list (`pointers`)
or a list of repositories, skipping the opt-out list (`removals`); `licences` names a repository's licence by SPDX id.
Imports nothing heavy: standard library only (nbformat is loaded when a notebook is read, detect-secrets when a text
is scanned, askalono when a licence is named).
"""
