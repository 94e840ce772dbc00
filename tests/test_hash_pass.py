"""One pass over a namespace hashes each frame once (a frame bound to two names, or held in a dict as well), with
the same hashes as hashing each value on its own; and which builtin structures need the type-tagged encoder."""

import numpy as np
import pandas as pd

from themisto.runtime.agent import delta, hashing
from themisto.runtime.agent.delta import Before, hash_after, hash_before


def _namespace():
    frame = pd.DataFrame({"name": ["a", "b", "c"] * 100, "tags": [["x", "y"], ["z"], []] * 100, "n": range(300)})
    array = np.arange(200_000, dtype=np.float64)
    return {"train": frame, "same": frame, "data": {"train": frame, "values": array}, "array": array,
            "other": frame.copy()}


def test_a_pass_hashes_each_frame_once_with_the_same_hashes(monkeypatch):
    variables = _namespace()
    alone = {name: hashing.content_hash(value) for name, value in variables.items()}  # no pass: each on its own
    assert alone["train"] == alone["same"] == alone["other"] and alone["data"] != alone["train"]
    hashed = []
    real = hashing.content_digest

    def counted(value, sink=None):
        hashed.append(id(value))
        return real(value, sink)

    # Every way in: content_hash, and the footprint the page check takes (delta's own reference).
    monkeypatch.setattr(hashing, "content_digest", counted)
    monkeypatch.setattr(delta, "content_digest", counted)
    for prints in (False, True):
        hashed.clear()
        before = hash_before(variables, lambda value: None, prints=prints)
        assert before.hashes == alone
        assert hashed.count(id(variables["train"])) == 1 and hashed.count(id(variables["other"])) == 1
        assert hashed.count(id(variables["array"])) == 1
    hashed.clear()
    after, kept = hash_after(variables, Before(dict(alone)), lambda value: None, full=True, end=lambda: True)
    assert after == alone and kept == []
    assert hashed.count(id(variables["train"])) == 1
    assert hashing._MEMO is None  # the pass is over: a later hash looks at the value again


def test_a_frame_changed_between_passes_is_hashed_again():
    frame = pd.DataFrame({"n": range(10)})
    first = hash_before({"frame": frame, "kept": {"f": frame}}, lambda value: None, prints=False).hashes
    frame.loc[3, "n"] = -1
    second = hash_before({"frame": frame, "kept": {"f": frame}}, lambda value: None, prints=False).hashes
    assert first["frame"] != second["frame"] and first["kept"] != second["kept"]


class _Thing:
    pass


def test_which_structures_need_the_type_tagged_encoder():
    shared = [1, "a"]
    cycle = [1]
    cycle.append(cycle)
    cases = {
        "flat": ([1, 2.5, "s", None, b"x"], False),
        "nested lists and dicts": ({"a": [1, (2, 3)], 4: {"b": [None]}}, False),
        "shared member": ([shared, shared, (shared,)], False),
        "cycle": (cycle, False),
        "a set deep down": ({"a": [[1, {2}]]}, True),
        "a frozenset key": ({frozenset([1]): 2}, True),
        "an object in a tuple": ([(1, _Thing())], True),
        "a set at the top": ({1, 2}, True),
        "not a container": ("text", False),
        "empty": ([], False),
    }
    for name, (value, expected) in cases.items():
        assert hashing.holds_set_or_object(value) is expected, name
