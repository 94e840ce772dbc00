"""The bounded reader of untrusted JSON, JSON lines and YAML: each bound refuses with the file, the line and the
bound's name, deep nesting never reaches Python's recursive decoder, and YAML aliases never expand."""

from __future__ import annotations

import json
import os
import pickle
import random
import threading

import pytest

from themisto.bounded import (BoundError, Bounds, check_json_text, iter_json_lines, loads_json, loads_yaml, read_json,
                              read_text, read_yaml)
from themisto.errors import InputError


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


_NASTY = ['"', "\\", "[", "]", "{", "}", ",", ":", "\\\"", "\\\\", "é", "\n", "x"]


def _random_value(rng: random.Random, depth: int):
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([1, None, True, "".join(rng.choices(_NASTY, k=rng.randrange(6)))])
    children = [_random_value(rng, depth - 1) for _ in range(rng.randrange(4))]
    if rng.random() < 0.5:
        return children
    return {"".join(rng.choices(_NASTY, k=3)) + str(i): c for i, c in enumerate(children)}


def test_depth_is_measured_exactly_whatever_the_strings_hold():
    # Brackets, quotes and backslashes inside strings (and keys) must not count, escaped quotes must not end a string.
    rng = random.Random(7)
    for _ in range(400):
        value = _random_value(rng, rng.randrange(1, 12))
        text, depth = json.dumps(value, ensure_ascii=rng.random() < 0.5), _depth(value)
        assert loads_json(text, Bounds(depth=max(depth, 0)), path="v.json") == value
        if depth > 0:
            with pytest.raises(BoundError) as refused:
                loads_json(text, Bounds(depth=depth - 1), path="v.json")
            assert refused.value.bound == "depth"


def test_the_issues_array_nested_100000_deep_is_refused_not_a_recursion_error(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # 200 KB, far under every size bound
    with pytest.raises(BoundError) as refused:
        read_json(path)
    assert str(refused.value) == f"{path}:1: nested deeper than 64 levels (bound: depth)"
    assert isinstance(refused.value, InputError) and refused.value.line == 1


def test_a_whole_document_names_the_line_where_it_gets_too_deep(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{\n "a": "[[[[[[",\n "b":\n' + "[" * 70 + "]" * 70 + "\n}\n")
    with pytest.raises(BoundError, match=r"doc.json:4: nested deeper than 64 levels \(bound: depth\)"):
        read_json(path)


def test_deep_nesting_that_never_repeats_an_opener_is_refused():
    # [[],[[],[[],…]]]: no two openers in a row survive in the raw text, only peeling shows the depth.
    text = "1"
    for _ in range(200):
        text = f"[[],{text}]"
    with pytest.raises(BoundError, match="bound: depth"):
        loads_json(text, path="x")
    assert _depth(loads_json(text, Bounds(depth=201), path="x")) == 201


def test_items_are_bounded_over_the_whole_file(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(list(range(300))) + "\n" for _ in range(10)))
    assert len(list(iter_json_lines(path, Bounds(items=3100)))) == 10
    with pytest.raises(BoundError) as refused:
        list(iter_json_lines(path, Bounds(items=2000)))
    assert refused.value.bound == "items" and refused.value.line == 7  # 6 lines of 301 items fit in 2,000
    # Commas inside strings are not items (long code in a prediction).
    assert check_json_text(json.dumps({"p": "a, b" * 10_000}), Bounds(items=10), path="x") <= 3


def test_a_file_of_millions_of_short_lines_is_refused_before_any_is_parsed(tmp_path):
    path = tmp_path / "g.jsonl"
    with path.open("wb") as fh:
        fh.write(b"not json at all\n" + b"{}\n" * 2_000_000)
    with pytest.raises(BoundError) as refused:
        next(iter_json_lines(path))  # line 1 is not JSON: had it been parsed, that would be the refusal
    assert refused.value.bound == "lines"
    assert str(refused.value) == f"{path}:1000001: 2,000,001 lines, more than 1,000,000 (bound: lines)"


def test_line_and_file_sizes_are_bounded(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"a": 1}\n' + json.dumps({"p": "x" * 2000}) + "\n")
    with pytest.raises(BoundError, match=r"g.jsonl:2: longer than 1,000 bytes \(bound: line_bytes\)"):
        list(iter_json_lines(path, Bounds(line_bytes=1000)))
    with pytest.raises(BoundError, match=r"g.jsonl: 2,\d{3} bytes, more than 100 \(bound: file_bytes\)"):
        list(iter_json_lines(path, Bounds(file_bytes=100)))
    with pytest.raises(BoundError, match="bound: file_bytes"):
        read_text(path, Bounds(file_bytes=100))
    exact = tmp_path / "exact.jsonl"
    exact.write_text('"' + "x" * 998 + '"\n')  # 1,000 bytes and its newline
    assert [line.value for line in iter_json_lines(exact, Bounds(line_bytes=1000))] == ["x" * 998]


def test_malformed_lines_name_their_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n{"a": \xff}\n')
    with pytest.raises(BoundError, match=r":2: blank line"):
        list(iter_json_lines(path))
    with pytest.raises(BoundError, match=r":4: not UTF-8"):
        list(iter_json_lines(path, skip_blank=True))
    path.write_text('{"a": 1}\n{"a": 2\n')
    with pytest.raises(BoundError, match=r":2: not JSON \(Expecting ',' delimiter, column 8\)$"):
        list(iter_json_lines(path))
    path.write_text('{"a": 1}\n' + "9" * 5000 + "\n")  # past Python's 4,300-digit integer limit: a ValueError
    with pytest.raises(BoundError, match=r":2: not JSON"):
        list(iter_json_lines(path))


def test_a_torn_last_line_is_parsed_or_reported(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert [(line.number, line.value, line.ended) for line in iter_json_lines(path)] == [(1, {"a": 1}, True),
                                                                                        (2, {"a": 2}, False)]
    path.write_text('{"a": 1}\n{"a": ')
    with pytest.raises(BoundError, match=r":2: not JSON .*; no newline ends it: the file is cut"):
        list(iter_json_lines(path))
    assert [(line.number, line.value, line.ended) for line in iter_json_lines(path, torn_tail="report")] == [
        (1, {"a": 1}, True), (2, None, False)]


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "generations.jsonl"
    os.mkfifo(fifo)
    done = []
    reader = threading.Thread(target=lambda: done.append(pytest.raises(BoundError, read_json, fifo)), daemon=True)
    reader.start()
    reader.join(10)
    assert done and "not a regular file" in str(done[0].value)  # refused, not blocked waiting for a writer
    with pytest.raises(BoundError, match="not a regular file"):
        read_json(tmp_path)
    with pytest.raises(BoundError, match="no such file"):
        read_json(tmp_path / "missing.json")


def test_the_error_pickles_whole():
    error = BoundError("run.json", 3, "nested deeper than 64 levels", "depth")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.path, copy.line, copy.bound) == (str(error), "run.json", 3, "depth")


BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_yaml_anchors_and_aliases_are_refused(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("name: Themisto\n" + BILLION_LAUGHS)
    with pytest.raises(BoundError, match=r"eval.yaml:2: an anchor or alias"):
        read_yaml(path)
    with pytest.raises(BoundError, match=r"card:5: an anchor or alias"):
        loads_yaml("x: 1\ny: *a\n", path="card", first_line=4)
    with pytest.raises(BoundError, match="anchor or alias"):
        loads_yaml("base: &base {k: 1}\nother:\n  <<: *base\n", path="card")


def test_yaml_depth_items_and_bad_text_are_refused():
    deep = "[" * 5000 + "]" * 5000  # PyYAML's composer recurses: this would be a RecursionError
    with pytest.raises(BoundError, match=r":1: nested deeper than 64 levels \(bound: depth\)"):
        loads_yaml(deep, path="card")
    assert loads_yaml("a: [1, [2, {b: 3}]]\n", Bounds(depth=4), path="card") == {"a": [1, [2, {"b": 3}]]}
    with pytest.raises(BoundError, match="bound: depth"):
        loads_yaml("a: [1, [2, {b: 3}]]\n", Bounds(depth=3), path="card")
    with pytest.raises(BoundError, match=r"more than 10 items in the file \(bound: items\)"):
        loads_yaml("[" + ", ".join(["1"] * 20) + "]", Bounds(items=10), path="card")
    with pytest.raises(BoundError, match=r"card:3: not YAML"):
        loads_yaml("a: 1\nb: 2\n  c: [\n", path="card")
    with pytest.raises(BoundError, match="not YAML"):  # the safe loader builds no Python objects
        loads_yaml("!!python/object/apply:os.system ['true']\n", path="card")
