"""Tagged JSON keeps its stored form: each tag's document, written by hand here as the format wrote it before its tags
became one table, is what `write` gives today and reads back as the same value; every tag of the table has one. A
tag is one entry of the table: a toy tag added to it is written, checked, read back and counted as built-in, and
gone once removed. In-process and cheap: no kernel is started."""

from __future__ import annotations

import collections
import datetime
import fractions
import math
import re

import numpy as np
import pandas as pd
import pytest

from themisto.runtime.agent import formats
from themisto.runtime.agent.formats import tagged_json
from themisto.runtime.agent.formats.base import Caps, Malformed, ValueFormatError, Writing
from themisto.runtime.agent.formats.tags import Tag

_REF = "ab" * 16


def _stored(value):
    return _REF


def _write(value) -> bytes:
    return tagged_json.FORMAT.write(value, Writing(Caps(), _stored))[0]


def _document(type_name: str, value: str) -> bytes:
    return ('{"themisto_value":1,"type":"%s","value":%s}' % (type_name, value)).encode("ascii")


_UTC2 = datetime.timezone(datetime.timedelta(hours=2))
# (the value, its type's name, its encoded value as the format wrote it before the table), one or more per tag.
_PINNED = [
    ([None, True, 1, 2.5, -0.0, "x", {"k": [1]}], "builtins.list", '[null,true,1,2.5,-0.0,"x",{"k":[1]}]'),
    ((1, (2,)), "builtins.tuple", '{"$":"tuple","items":[1,{"$":"tuple","items":[2]}]}'),
    ({3}, "builtins.set", '{"$":"set","items":[3]}'),
    (frozenset({4}), "builtins.frozenset", '{"$":"frozenset","items":[4]}'),
    ({1: "a", "$": 2}, "builtins.dict", '{"$":"dict","items":[[1,"a"],["$",2]]}'),
    (collections.OrderedDict([("a", 1)]), "collections.OrderedDict", '{"$":"OrderedDict","items":[["a",1]]}'),
    (collections.Counter("aab"), "collections.Counter", '{"$":"Counter","items":[["a",2],["b",1]]}'),
    (collections.defaultdict(list, {"a": [1]}), "collections.defaultdict",
     '{"$":"defaultdict","items":[["a",[1]]],"factory":"list"}'),
    (collections.defaultdict(None), "collections.defaultdict", '{"$":"defaultdict","items":[],"factory":null}'),
    (b"\x00\xff", "builtins.bytes", '{"$":"bytes","b64":"AP8="}'),
    (bytearray(b"ab"), "builtins.bytearray", '{"$":"bytearray","b64":"YWI="}'),
    (float("-inf"), "builtins.float", '{"$":"float","bits":"000000000000f0ff"}'),
    (2 ** 12001, "builtins.int", '{"$":"int","hex":"0x2%s"}' % ("0" * 3000)),
    (complex(1, float("inf")), "builtins.complex",
     '{"$":"complex","real":1.0,"imag":{"$":"float","bits":"000000000000f07f"}}'),
    (range(2, 9, 3), "builtins.range", '{"$":"range","start":2,"stop":9,"step":3}'),
    (datetime.datetime(2023, 5, 1, 12, 30, tzinfo=datetime.timezone.utc), "datetime.datetime",
     '{"$":"datetime","iso":"2023-05-01T12:30:00+00:00","fold":0}'),
    (datetime.time(1, 2, 3, fold=1), "datetime.time", '{"$":"time","iso":"01:02:03","fold":1}'),
    (datetime.date(2023, 5, 1), "datetime.date", '{"$":"date","iso":"2023-05-01"}'),
    (datetime.timedelta(days=-1, seconds=5, microseconds=7), "datetime.timedelta",
     '{"$":"timedelta","days":-1,"seconds":5,"microseconds":7}'),
    (re.compile(rb"a+", re.I), "re.Pattern", '{"$":"re.Pattern","pattern":{"$":"bytes","b64":"YSs="},"flags":2}'),
    (re.search(r"(\w+)@(\w+)", "mail a@b and c@d"), "re.Match",
     r'{"$":"re.Match","pattern":"(\\w+)@(\\w+)","flags":32,"string":"mail a@b and c@d","pos":0,"endpos":16,'
     r'"regs":[[5,8],[5,6],[7,8]]}'),
    (np.float32(2.5), "numpy.float32", '{"$":"numpy","dtype":"<f4","hex":"00002040"}'),
    (np.int64(-3), "numpy.int64", '{"$":"numpy","dtype":"<i8","hex":"fdffffffffffffff"}'),
    (np.array([[1, "a"], [None, 2.5]], dtype=object), "numpy.ndarray",
     '{"$":"ndarray","shape":[2,2],"items":[1,"a",null,2.5]}'),
    (pd.Timestamp("2023-05-01 10:00").as_unit("s"), "pandas._libs.tslibs.timestamps.Timestamp",
     '{"$":"Timestamp","value":1682935200,"unit":"s"}'),
    (pd.Timestamp("2023-05-01 10:00", tz=_UTC2).as_unit("s"), "pandas._libs.tslibs.timestamps.Timestamp",
     '{"$":"Timestamp","value":1682928000,"unit":"s","utcoffset_s":7200.0}'),
    (pd.Timedelta(seconds=90), "pandas._libs.tslibs.timedeltas.Timedelta",
     '{"$":"Timedelta","value":90000000000,"unit":"ns"}'),
    (pd.NaT, "pandas._libs.tslibs.nattype.NaTType", '{"$":"NaT"}'),
    ([np.arange(3)], "builtins.list", '[{"$":"ref","hash":"%s"}]' % _REF),
]
_FRAME = pd.DataFrame({"c": ["x", "y", "x"], "n": [1, 2, 3]})
_OPTIONS = '"options":{"as_index":true,"sort":%s,"group_keys":true,"observed":false,"dropna":true}'
_GROUPBYS = [  # what they group is stored on its own: the frame comes back through `resolve`
    (lambda: _FRAME.groupby("c")["n"], "pandas.core.groupby.generic.SeriesGroupBy",
     '{"$":"groupby","frame":false,"obj":{"$":"ref","hash":"%s"},"by_columns":false,"keys":[{"name":"c","vector":'
     '{"$":"ndarray","shape":[3],"items":["x","y","x"]}}],"key_list":false,%s,"selection":null}'
     % (_REF, _OPTIONS % "true"), lambda: _FRAME["n"]),
    (lambda: _FRAME.groupby("c", sort=False)[["n"]], "pandas.core.groupby.generic.DataFrameGroupBy",
     '{"$":"groupby","frame":true,"obj":{"$":"ref","hash":"%s"},"by_columns":true,"keys":[{"name":"c"}],'
     '"key_list":false,%s,"selection":["n"]}' % (_REF, _OPTIONS % "false"), lambda: _FRAME),
]


def _same(read, value) -> None:
    assert type(read) is type(value)
    if isinstance(value, re.Match):
        assert (read.re, read.string, read.regs) == (value.re, value.string, value.regs)
    elif isinstance(value, np.ndarray):
        assert read.shape == value.shape and read.tolist() == value.tolist()
    elif isinstance(value, collections.defaultdict):
        assert (read.default_factory, read) == (value.default_factory, value)
    elif isinstance(value, complex):
        assert (math.copysign(1, read.real), read.real, read.imag) == (1, value.real, value.imag)
    else:
        assert read == value or pd.isna(read) and pd.isna(value), (read, value)


@pytest.mark.parametrize("value, type_name, encoded", _PINNED, ids=[text[:24] for _, _, text in _PINNED])
def test_each_tag_is_written_as_before_and_reads_back_the_same(value, type_name, encoded):
    stored = _document(type_name, encoded)
    assert _write(value) == stored
    tagged_json.FORMAT.check(stored, 1 << 20)
    resolved = {_REF: np.arange(3)}
    read = tagged_json.FORMAT.read(stored, resolved.__getitem__)
    if type_name == "builtins.list" and "ref" in encoded:
        assert type(read[0]) is np.ndarray and read[0].tolist() == [0, 1, 2]
    else:
        _same(read, value)


@pytest.mark.parametrize("make, type_name, encoded, grouped", _GROUPBYS, ids=["series", "frame"])
def test_a_groupby_is_written_as_before_and_regroups_the_same(make, type_name, encoded, grouped):
    stored = _document(type_name, encoded)
    assert _write(make()) == stored
    read = tagged_json.FORMAT.read(stored, {_REF: grouped()}.__getitem__)
    pd.testing.assert_frame_equal(pd.DataFrame(read.sum()), pd.DataFrame(make().sum()))


def test_every_tag_of_the_table_has_a_pinned_document():
    texts = [text for _, _, text in _PINNED] + [text for _, _, text, _ in _GROUPBYS]
    pinned = set(re.findall(r'"\$":"([^"]+)"', "".join(texts)))
    assert pinned == {tag.name for tag in tagged_json.TABLE}
    assert tagged_json.plain_tags() == {tag.name for tag in tagged_json.TABLE if not tag.needs} == {
        "tuple", "set", "frozenset", "dict", "OrderedDict", "Counter", "defaultdict", "bytes", "bytearray", "float",
        "int", "complex", "range", "datetime", "time", "date", "timedelta", "re.Pattern", "re.Match"}


def test_a_plain_document_reads_back_without_its_libraries_and_a_library_one_does_not():
    assert tagged_json.plain(_document("builtins.tuple", '{"$":"tuple","items":[1,{"$":"bytes","b64":"YWI="}]}')) \
        == (True, (1, b"ab"))
    assert tagged_json.plain(_document("numpy.int64", '{"$":"numpy","dtype":"<i8","hex":"fdffffffffffffff"}')) == \
        (False, None)


def test_a_document_no_writer_wrote_is_refused():
    with pytest.raises(ValueFormatError, match="an unknown tag 'fraction'"):
        tagged_json.FORMAT.check(_document("x", '{"$":"fraction","text":"3/4"}'), 1 << 20)
    with pytest.raises(Malformed, match="an unknown tag 'fraction'"):
        tagged_json.FORMAT.read(_document("x", '{"$":"fraction","text":"3/4"}'), _stored)
    with pytest.raises(Malformed, match=r"a malformed 'range' value \(KeyError"):
        tagged_json.FORMAT.read(_document("x", '{"$":"range","start":1}'), _stored)
    with pytest.raises(Malformed, match="a Timedelta in the unit 'h'"):
        tagged_json.FORMAT.read(_document("x", '{"$":"Timedelta","value":1,"unit":"h"}'), _stored)


_TOY = Tag("fraction", kinds=(fractions.Fraction,),
           encode=lambda value, encoding: {"$": "fraction", "text": f"{value.numerator}/{value.denominator}"},
           decode=lambda data, decoding: fractions.Fraction(str(data["text"])))


def test_a_tag_is_one_entry_of_the_table(monkeypatch):
    toy_document = _document("builtins.list", '[{"$":"fraction","text":"-3/4"},{"$":"tuple","items":[1]}]')
    with monkeypatch.context() as patched:
        patched.setattr(tagged_json, "TABLE", (*tagged_json.TABLE, _TOY))
        assert _write([fractions.Fraction(-3, 4), (1,)]) == toy_document
        tagged_json.FORMAT.check(toy_document, 1 << 20)
        assert tagged_json.FORMAT.read(toy_document, _stored) == [fractions.Fraction(-3, 4), (1,)]
        assert "fraction" in tagged_json.plain_tags()  # it needs nothing beyond the standard library
        assert formats.holding(fractions.Fraction(1, 3)) is tagged_json.FORMAT  # its module is the format's too
        assert tagged_json.plain(toy_document) == (True, [fractions.Fraction(-3, 4), (1,)])
        patched.setattr(tagged_json, "TABLE", (*tagged_json.TABLE, Tag("tuple", kinds=(fractions.Fraction,),
                                                                       encode=_TOY.encode, decode=_TOY.decode)))
        with pytest.raises(ValueError, match="names a tag or a type twice"):
            _write(fractions.Fraction(1, 2))
    # removed: a fraction is a value stored on its own again, and its tag is unknown
    assert _write([fractions.Fraction(-3, 4)]) == _document("builtins.list", '[{"$":"ref","hash":"%s"}]' % _REF)
    with pytest.raises(ValueFormatError, match="an unknown tag 'fraction'"):
        tagged_json.FORMAT.check(toy_document, 1 << 20)
    assert "fraction" not in tagged_json.plain_tags() and formats.holding(fractions.Fraction(1, 3)) is None
