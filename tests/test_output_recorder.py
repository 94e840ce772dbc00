"""One output recorder for kernel cells and branch children: every output counts against the cap (display updates
and errors too), an oversized error is cut and flagged, never emptied, and both paths give the same outputs."""

import json

import pytest

from themisto.runtime.agent import OUTPUT_CAP_MARKER
from themisto.runtime.collector import OutputCollector


def _marker(recorder) -> str:
    return OUTPUT_CAP_MARKER.format(total=recorder.total, cap=recorder.cap)


def test_display_updates_count_against_the_cap():
    collector = OutputCollector(1000)
    collector.add("display_data", {"data": {"text/plain": "small"}, "metadata": {}, "transient": {"display_id": "d"}})
    collector.add("update_display_data", {"data": {"text/plain": "y" * 5000}, "metadata": {},
                                          "transient": {"display_id": "d"}})
    outputs = collector.finish()
    assert collector.truncated and collector.kept <= 1000
    assert outputs[0]["data"] == {"text/plain": "small"} and outputs[-1]["text"] == _marker(collector)


def test_errors_count_against_the_cap_and_a_long_message_is_cut_not_emptied():
    collector = OutputCollector(2000)
    collector.add("stream", {"name": "stdout", "text": "a" * 1500})
    collector.add("error", {"ename": "ValueError", "evalue": "v" * 100_000, "traceback": ["tb"] * 500})
    outputs = collector.finish()
    error = outputs[1]
    assert collector.truncated and error["ename"] == "ValueError"
    assert 0 < len(error["evalue"]) <= 1024 and len(error["traceback"]) == 41
    assert outputs[-1]["text"] == _marker(collector)


def test_an_error_message_too_large_to_decode_keeps_its_name_and_head():
    raw = json.dumps({"traceback": ["x" * 100], "ename": "MemoryError", "evalue": "é" * 3_000_000}).encode()
    collector = OutputCollector(2**20)
    collector.add_oversized("error", raw)
    error = collector.finish()[0]
    assert collector.truncated and error["ename"] == "MemoryError"
    assert error["evalue"] and set(error["evalue"]) == {"é"} and len(error["evalue"].encode()) <= 2**20


def test_clear_output_wait_applies_at_the_next_output_only():
    collector = OutputCollector(1000)
    collector.add("stream", {"name": "stdout", "text": "old\n"})
    collector.add("clear_output", {"wait": True})
    assert collector.outputs  # still shown until something replaces it
    collector.add("stream", {"name": "stdout", "text": "new\n"})
    assert collector.finish() == [{"output_type": "stream", "name": "stdout", "text": "new\n"}]


# Two-byte characters (a display that fits by characters but not by bytes), a display update past the cap, and a
# clear_output(wait=True) that nothing follows (the output stays); then an error past the cap.
_CELLS = ["from IPython.display import clear_output, display\nprint('é' * 300)\nclear_output(wait=True)\n"
          "print('ü' * 400)\ndisplay('ä' * 150)\nhandle = display('first', display_id=True)\n"
          "handle.update('z' * 300)\nprint('tail')\nclear_output(wait=True)",
          "print('ö' * 400)\nraise ValueError('ö' * 2000)"]


@pytest.mark.slow
@pytest.mark.parametrize("number", [0, 1])
def test_a_kernel_cell_and_a_branch_record_the_same_outputs(number):
    from themisto.runtime.branch import run_branches
    from themisto.runtime.kernel import KernelSession, Limits

    with KernelSession(limits=Limits(output_bytes=1000)) as session:
        [branched] = run_branches(session, [_CELLS[number]], timeout_s=20, output_bytes=1000)
        cell = session.execute(_CELLS[number])

    def shown(outputs):  # tracebacks name the cell's own line numbers and file, which differ
        return [{k: v for k, v in o.items() if k not in ("traceback", "execution_count")} for o in outputs]

    assert cell.truncated and branched.truncated
    assert shown(cell.outputs) == shown(branched.outputs)
    assert cell.outputs[-1]["text"].startswith("\n[themisto: output truncated")
    if number == 1:
        error = [o for o in cell.outputs if o["output_type"] == "error"][0]
        assert error["ename"] == "ValueError" and error["evalue"].startswith("ööö")
