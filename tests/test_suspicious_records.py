"""A prediction whose branch saw it touch the machinery carries `suspicious` in its record and in the aggregate."""

from themisto.runtime.branch import BranchResult
from themisto.scoring.judging import judge
from themisto.scoring.records import ExampleRecord, PredictionRecord, ScoreSettings
from themisto.scoring.scorer import aggregate


def _record(index: int) -> PredictionRecord:
    return PredictionRecord(id="t/1", index=index, prediction="x = 1", exact_match=1.0, rouge_l=1.0, chrf=1.0)


def test_a_forged_match_is_recorded_suspicious_and_counted():
    reference = BranchResult(index=0, status="ok", outputs=[], added={"x": "a" * 32}, state_hash_after="s")
    forged = BranchResult(index=1, status="ok", outputs=[], added={"x": "a" * 32}, state_hash_after="s",
                          suspicious=["gc.get_objects", "patched json.dumps"])
    clean = BranchResult(index=2, status="ok", outputs=[], added={"x": "a" * 32}, state_hash_after="s")
    given = [_record(0), _record(1)]
    records = [judge(given[0], reference, forged, ScoreSettings()), judge(given[1], reference, clean, ScoreSettings())]
    assert given == [_record(0), _record(1)]  # a judged record is a new one: the given records stay as they were
    assert records[0].functional_match and records[0].suspicious == ["gc.get_objects", "patched json.dumps"]
    assert records[1].functional_match and records[1].suspicious == []
    example = ExampleRecord(id="t/1", predictions=2, status="scored", correct=2, pass_at_k={"pass@1": 1.0})
    scores, notes = aggregate([example], records, ScoreSettings(), executed=True)
    assert scores["suspicious_predictions"] == 1
    assert any("t/1#0" in note for note in notes)
    assert PredictionRecord.from_dict({**records[0].__dict__}).suspicious == records[0].suspicious
