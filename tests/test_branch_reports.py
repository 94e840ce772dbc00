"""The host trusts no branch report: a malformed one is that candidate's `error`, flagged, never a crash."""

import pytest

from themisto.runtime.agent.integrity import read_alarms
from themisto.runtime.branch import _from_agent

GOOD = {"status": "ok", "ename": None, "evalue": None, "duration_s": 0.1, "truncated": False,
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "hi\n"}],
        "added": {"x": "ab" * 16}, "changed": {}, "deleted": {}, "state_hash_after": "cd" * 16, "unverified": [],
        "suspicious": []}


def test_a_well_formed_report_is_read_as_is():
    result = _from_agent(dict(GOOD), 3, 2**20)
    assert (result.index, result.status, result.added, result.suspicious) == (3, "ok", {"x": "ab" * 16}, [])


@pytest.mark.parametrize("change", [
    {"status": None}, {"status": "great"}, {"outputs": "text"}, {"outputs": [{"output_type": "stream"}]},
    {"outputs": [{"output_type": "error", "ename": "E", "evalue": "v", "traceback": [1]}]},
    {"added": {"x": 5}}, {"changed": ["x"]}, {"evalue": ["not", "a", "string"]}, {"duration_s": "slow"},
    {"outputs": [{"output_type": "stream", "name": "stdout", "text": "x" * (3 * 2**20)}]},
], ids=lambda change: ",".join(change))
def test_a_malformed_report_is_an_error_of_its_candidate(change):
    result = _from_agent({**GOOD, **change}, 0, 2**20)
    assert (result.status, result.ename) == ("error", "MalformedReport")
    assert "malformed report" in result.suspicious


@pytest.mark.parametrize("raw", [None, [], "ok", 7])
def test_a_report_that_is_not_an_object_is_an_error(raw):
    assert _from_agent(raw, 1, 2**20).status == "error"


def test_alarms_are_distinct_bounded_lines():
    assert read_alarms(b"\ngc.get_objects\n\ngc.get_objects\nos.kill\n") == ["gc.get_objects", "os.kill"]
    assert len(read_alarms(b"\n".join(b"e%d" % i for i in range(100)))) == 32
    assert read_alarms(b"\x00\x01junk")[0].startswith("'")  # unprintable garbage is shown escaped


def test_library_habits_are_not_suspicious():
    import builtins

    from themisto.runtime.agent.integrity import Integrity, classify

    # pandas asks gc for an object's referents; only the cell's own code doing so is suspicious.
    assert classify("gc.get_referents", ([],)) is None
    assert classify("gc.get_objects", ()) == "gc.get_objects"
    picture = Integrity([], [])
    builtins.__pybind11_internals_probe__ = object()  # what importing scipy (pybind11) does
    try:
        assert picture.changes() == []
        original = builtins.len
        builtins.len = lambda value: 0
        try:
            assert picture.changes() == ["patched builtins.len"]
        finally:
            builtins.len = original
    finally:
        del builtins.__pybind11_internals_probe__


@pytest.mark.parametrize("answer", [{"status": "ok", "data": {"text/plain": "not json"}}, {"status": "ok"},
                                    {"status": "ok", "data": None}])
def test_a_malformed_agent_answer_is_an_agent_error(answer):
    # In the replay fallback a prediction runs in the kernel itself and may have patched the agent.
    from themisto.runtime.snapshot import AgentError, agent_answer

    with pytest.raises(AgentError, match="malformed"):
        agent_answer(answer, "snapshot")

