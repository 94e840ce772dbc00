"""A kernel under the sandbox sees its workspace and home at the same paths in every run (kernel_setup.WORK_MOUNT,
HOME_MOUNT), so values made from the working folder hash the same in the build's replay and in any rebuild of that
state; and a branch of a kernel started in a folder inside its workspace still reads that folder's siblings."""

from _isolation import needs_isolation

from themisto.runtime.branch import run_branches
from themisto.runtime.kernel import KernelSession, Limits
from themisto.runtime.kernel_setup import HOME_MOUNT, WORK_MOUNT
from themisto.runtime.sandbox import sandbox_available
from themisto.runtime.snapshot import take_snapshot

_CELL = ("import os, pathlib\n"
         "here = os.getcwd()\n"
         "home = os.path.expanduser('~')\n"
         "root = pathlib.Path().resolve()\n"
         "path = os.path.dirname(os.path.abspath('__file__'))\n"
         "rows = open('../data/rows.csv').read()\n")


@needs_isolation(sandbox_available(), "bubblewrap is missing or cannot create namespaces here")
def test_two_kernels_see_one_working_folder_and_a_branch_reads_beside_it(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("a,b\n1,2\n")
    seen = []
    for _ in range(2):
        with KernelSession(tmp_path, Limits(cell_timeout_s=30), start_dir="notebooks") as kernel:
            assert kernel.execute(_CELL).status == "ok"
            snapshot = take_snapshot(kernel)
            [branch] = run_branches(kernel, ["print(open('../data/rows.csv').read().split()[1])"])
            assert branch.status == "ok", (branch.ename, branch.evalue)
            assert branch.outputs[0]["text"] == "1,2\n"
            result = kernel.execute("print(here, home, root)")
            seen.append((result.outputs[0]["text"], snapshot.hashes(), snapshot.state_hash))
    assert seen[0][0] == f"{WORK_MOUNT}/notebooks {HOME_MOUNT} {WORK_MOUNT}/notebooks\n"
    assert seen[0][1] == seen[1][1] and seen[0][2] == seen[1][2]
    assert str(tmp_path) not in seen[0][0]
