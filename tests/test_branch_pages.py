"""The page check (delta="pages") against the exact full rehash (delta="hash") on the same candidates: identical
state verdicts, for ordinary cells and for candidates that try to hide a write from the page flags."""

import pytest

from themisto.runtime.branch import run_branches
from themisto.runtime.kernel import KernelSession
from themisto.runtime.snapshot import take_snapshot

pytestmark = pytest.mark.slow

SETUP = ("import ctypes, mmap, os\nimport numpy as np\nimport pandas as pd\n"
         "frame = pd.DataFrame({'n': np.arange(400_000), 'x': np.linspace(0, 1, 400_000),\n"
         "                      'c': pd.Categorical(np.arange(400_000) % 3)})\n"
         "series = frame['x'] * 2\nwide = np.arange(1_000_000, dtype=np.int64).reshape(1000, 1000)\n"
         "column = wide[:, 7]\nother = np.ones(1_000_000)\nsmall = np.arange(10)\nnames = ['a', 'b']\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p\n"
         "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,\n"
         "                      ctypes.c_long]\n"
         "libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
         "def pages_of(array, count=4):\n    return (array.ctypes.data + 4095) & ~4095, count * 4096\n")

ORDINARY = [
    "frame.shape",
    "frame.loc[3, 'x'] = 7.5",
    "frame['y'] = 1",
    "frame = frame.sort_values('x', ascending=False)",
    "frame.iloc[-1, 0] = 5",
    "series.sum()",
    "series[0] = series[0]",  # written with the same value: the pages are written, the content is not changed
    "wide[999, 999] = 0",
    "wide[0, 7] = -1",  # inside `column` too (a view)
    "column.sort()",
    "other *= 1.0",
    "other[::2] = 0.5",
    "small[0] = 9",
    "del frame",
    "names.append('c')",
    "wide = wide.T",
    "frame.columns = ['N', 'X', 'C']",
    "frame.index = frame.index + 1",
    "total = float(frame['x'].sum())",
]

HIDING = {
    # The write happens before a child is forked that shares the page (until it is ended).
    "grandchild": "other[500_000] = -3.0\npid = os.fork()\nif pid == 0:\n    import time\n    time.sleep(60)\n"
                  "    os._exit(0)",
    # Pages dropped and read again: the shared zero page stands where the data was.
    "dropped": "address, length = pages_of(other)\nlibc.madvise(ctypes.c_void_p(address), length, 4)\n"
               "float(other[:8192].sum())",
    # A fresh mapping over the buffer, then read: zero pages again.
    "remapped": "address, length = pages_of(wide)\n"
                "libc.mmap(address, length, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x10, -1, 0)\nint(wide.sum())",
    # Pages of one array moved onto another (both still shared with the kernel): refused.
    "moved": "address, length = pages_of(other)\nsource, _ = pages_of(frame['x'].to_numpy())\n"
             "moved = libc.mremap(source, length, length, 3, address)\nprint(moved, ctypes.get_errno())",
    # Written without Python: memmove into the buffer.
    "memmove": "ctypes.memmove(frame['n'].to_numpy().ctypes.data + 8 * 1000, b'\\xff' * 8, 8)",
    # The value written back: the content is unchanged, and both checks must say so.
    "restored": "keep = wide[5, 5]\nwide[5, 5] = 1\nwide[5, 5] = keep",
}


@pytest.fixture(scope="module")
def session():
    with KernelSession() as session:
        result = session.execute(SETUP)
        assert result.status == "ok", result.traceback
        yield session


def _verdicts(results):
    return [(r.status, r.ename, r.added, r.changed, r.deleted, r.state_hash_after) for r in results]


def test_ordinary_candidates_get_the_same_verdicts_both_ways(session):
    before = take_snapshot(session)
    paged = run_branches(session, ORDINARY, timeout_s=20, delta="pages")
    hashed = run_branches(session, ORDINARY, timeout_s=20, delta="hash")
    assert _verdicts(paged) == _verdicts(hashed)
    assert all(r.status == "ok" for r in paged), [(r.index, r.evalue) for r in paged if r.status != "ok"]
    assert take_snapshot(session).state_hash == before.state_hash
    by_code = dict(zip(ORDINARY, paged))
    assert by_code["frame.shape"].changed == {} and "frame" in by_code["frame.shape"].kept_by_pages
    assert list(by_code["frame.loc[3, 'x'] = 7.5"].changed) == ["frame"]
    assert list(by_code["wide[0, 7] = -1"].changed) == ["column", "wide"]
    assert by_code["series[0] = series[0]"].changed == {}
    assert all(not r.kept_by_pages for r in hashed)


@pytest.mark.parametrize("name", list(HIDING))
def test_a_candidate_cannot_hide_a_write_from_the_page_check(session, name):
    code = HIDING[name]
    [paged] = run_branches(session, [code], timeout_s=20, delta="pages")
    [hashed] = run_branches(session, [code], timeout_s=20, delta="hash")
    assert _verdicts([paged]) == _verdicts([hashed]), name
    assert paged.status == "ok", paged.evalue
    expected = {"grandchild": ["other"], "dropped": ["other"], "remapped": ["column", "wide"], "moved": [],
                "memmove": ["frame"], "restored": []}[name]
    assert sorted(n for n in paged.changed if n not in ("address", "length")) == expected
    if name == "moved":
        assert paged.outputs[0]["text"].split()[1] == "12"  # ENOMEM: no page moving in a branch


HOSTILE = [
    "import sys\nsys.exit()",
    "import os\nos._exit(1)",
    "%reset -f",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nother[7] = 0",
    "block = bytearray(8 * 2**30)",
    "get_ipython().user_ns['wide'][500, 500] = -1",  # written without binding or naming it in the code
    "import threading, time\nthreading.Thread(target=lambda: other.__setitem__(900_000, 1.5)).start()\ntime.sleep(0.2)",
    "frame.iloc[:, 1] = frame.iloc[:, 1].to_numpy()[::-1]",
    "undefined_name",
]


def test_hostile_candidates_get_the_same_verdicts_both_ways(session):
    paged = run_branches(session, HOSTILE, timeout_s=20, delta="pages", memory_bytes=2**30)
    hashed = run_branches(session, HOSTILE, timeout_s=20, delta="hash", memory_bytes=2**30)
    assert _verdicts(paged) == _verdicts(hashed)
    assert [r.status for r in paged] == ["error", "kernel_died", "ok", "ok", "error", "ok", "ok", "ok", "error"]
    assert list(paged[5].changed) == ["wide"] and list(paged[6].changed) == ["other"]
