"""Runtime: sandboxed kernels, snapshots of their state, and branches that run a candidate in that exact state.

Takes code and gives `CellResult`s and `Snapshot`s. `launcher` and `sandbox` set the limits and isolation, `kernel`
owns one kernel's life (its layout, process and request runner with the watchdog: `kernel_setup`, `kernel_process`,
`kernel_requests`), `agent` is the stdlib-only package the kernel imports to describe its namespace, store its
values in the safe formats (`agent.formats`, shared with the host) and fork branches, `snapshot` and `branch` are the
host's side of it (the agent's calls travel as data, never as source), `rebuild` runs again the cells that made a
state, `outputs` turns Jupyter outputs into one comparable text.

This `__init__` stays empty: the kernel imports `themisto.runtime.agent` and `themisto.runtime.launcher` through it.
"""
