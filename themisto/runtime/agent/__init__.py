"""Code that runs inside the kernel: runtime snapshots of the user namespace and branch execution of candidate cells.

The host reaches it through silent user expressions (`themisto.runtime.snapshot`, `themisto.runtime.branch`), so
reading it never touches In/Out or the execution count. Module level imports only the standard library; importing
it changes no user variable. Branches run each candidate in a forked grandchild of the kernel that shares the
kernel's memory copy-on-write, captures its own output, and reports back; the kernel itself only waits, kills and
reaps.

The package is split by concern: `namespace` (what every module shares: the shell, the user's names, bounded reprs),
`hashing` and `leaves`, `describe`, `snapshots`, `values` (the store of one kernel life), `formats` (the safe
formats, one module each, shared with the host), `sources` (a function's or class's defining source), `restore` (a
namespace rebuilt from stored values), `skops_names` (skops's table of trusted names, computed by the host),
`workdir` (the work-folder guards), `recorder` and `capture` (a cell's outputs), `integrity`, `delta`, `pages` and
`walls` (what guards a branch), `executions` (the count of cells run, which says when the kernel's hashes of its
state still hold), `branching` and `candidate` (the kernel's side of a branch call and of one candidate's life),
`ahead` (a probe conversation's branches, forked ahead of their code and ended after their answer), `handoff` (the
wire between the kernel and a branch's processes: the go, the monitor's messages) and `branch_child` (the monitor's
and the candidate's side).
The modules share only public names (a name with an underscore stays in its module). Every module imports only the
standard library; this `__init__` gathers the names the host calls through user expressions
(`themisto.runtime.snapshot.AGENT`).
"""

from themisto.runtime.agent.ahead import probe, probe_ahead, probe_settle
from themisto.runtime.agent.branching import branch, process_count, set_data_limit
from themisto.runtime.agent.describe import describe, memory_usage, size_of
from themisto.runtime.agent.hashing import content_hash, state_hash
from themisto.runtime.agent.namespace import (HASH_CHARS, IPYTHON_NAMES, OUTPUT_CAP_MARKER, REPR_CHARS, UNHASHABLE,
                                              requested, user_variables)
from themisto.runtime.agent.restore import finish_restore, restore
from themisto.runtime.agent.snapshots import Reply, reply, snapshot, snapshot_and_store
from themisto.runtime.agent.workdir import WorkdirGuard

__all__ = ["HASH_CHARS", "IPYTHON_NAMES", "OUTPUT_CAP_MARKER", "REPR_CHARS", "UNHASHABLE", "Reply", "WorkdirGuard",
           "branch", "content_hash", "describe", "finish_restore", "memory_usage", "probe", "probe_ahead", "probe_settle",
           "process_count", "reply", "requested", "restore", "set_data_limit", "size_of", "snapshot", "snapshot_and_store", "state_hash", "user_variables"]
