"""The value formats are one package, one module per format with its writer, reader and check side by side: a format
added in one module (tests/_toy_format.py) is written by the kernel's store, checked by the release and restored,
and each tag table and trust list is declared in one module only. In-process and cheap: no kernel is started."""

from __future__ import annotations

import fractions
import hashlib
import re
import types
from pathlib import Path

import pytest

import _toy_format as toy
from themisto.release.values import ReleaseValues, ValueFormatError, check_row, decode
from themisto.runtime.agent import formats
from themisto.runtime.agent.formats.base import Caps
from themisto.runtime.agent.hashing import content_hash
from themisto.runtime.agent.restore import restore
from themisto.runtime.agent.values import ValueStore

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def with_toy(monkeypatch):
    monkeypatch.setattr(formats, "REGISTRY", [*formats.REGISTRY, toy.FORMAT])


def _store(folder: Path, named: dict) -> dict:
    return ValueStore().store_all({name: (value, content_hash(value)) for name, value in named.items()}, str(folder),
                                  Caps())


def test_without_its_format_a_fraction_is_not_stored(tmp_path):
    stored = _store(tmp_path, {"share": fractions.Fraction(3, 4)})
    assert stored["written"] == []
    assert stored["unstored"] == {"share": "a fractions.Fraction: no safe format stores it"}


def test_a_format_added_in_one_module_is_written_checked_and_restored(with_toy, tmp_path):
    share, ratios = fractions.Fraction(-3, 4), {"a": fractions.Fraction(1, 3), "n": 2}
    folder = tmp_path / "values"
    stored = _store(folder, {"share": share, "ratios": ratios})
    assert stored["unstored"] == {}
    written = {record["hash"]: record for record in stored["written"]}
    assert {(r["format"], r["exact"]) for r in written.values()} == {("fraction", True), ("json", True)}
    assert len(written) == 3  # the dict's fraction is stored on its own, named by its hash from the dict's document
    assert (folder / (content_hash(share) + ".fraction")).read_bytes() == b"-3/4"

    # checked as the release checks a values row, and decoded from the rows
    rows = {}
    for digest, record in written.items():
        data = (folder / formats.file_name(digest, record["format"])).read_bytes()
        rows[digest] = {"hash": digest, "format": record["format"], "exact": True, "data": data,
                        "sha256": hashlib.sha256(data).hexdigest()}
        check_row(rows[digest])
    assert decode(rows[content_hash(ratios)], rows) == ratios
    assert ReleaseValues(rows).refs(content_hash(ratios)) == [content_hash(ratios["a"])]
    forged = dict(rows[content_hash(share)], data=b"3/0")
    forged["sha256"] = hashlib.sha256(forged["data"]).hexdigest()
    with pytest.raises(ValueFormatError, match="not a fraction's text"):
        check_row(forged)

    # restored into a namespace by the kernel's restore, the dict's fraction resolved through its own format
    shell = types.SimpleNamespace(user_ns={"old": 1})
    plan = {"values": {"share": content_hash(share), "ratios": content_hash(ratios)},
            "files": {digest: record["format"] for digest, record in written.items()}, "modules": {"fr": "fractions"},
            "aliases": []}
    assert '"failures": {}' in restore(str(folder), plan, shell)
    assert shell.user_ns == {"share": share, "ratios": ratios, "fr": fractions}
    assert type(shell.user_ns["ratios"]["a"]) is fractions.Fraction


def test_an_unknown_format_is_refused_with_the_known_ones(with_toy):
    row = {"hash": "0" * 32, "format": "pickle", "data": b"x", "sha256": hashlib.sha256(b"x").hexdigest()}
    with pytest.raises(ValueFormatError, match=r"known: fraction, json, npy, npz, parquet, skops\)"):
        check_row(row)


# Each table a format declares, by one of its entries: found in its own module and nowhere else in the package.
_DECLARED_ONCE = {
    "builtin_tags.py": ['Tag("date"', 'Tag("re.Match"', "(tuple, set, frozenset)"],  # tagged JSON's tags
    "library_tags.py": ['Tag("Timedelta"', 'Tag("groupby"'],
    "tags.py": ['Tag("ref"'],
    "definitions.py": ['"source", "import"'],  # a definition's tags
    "skops.py": ['"complex128"', '"TreeNode"', '"builtins.NoneType"'],  # the trust list, the loaders, the builtins
    "npz.py": ['"_has_sorted_indices"', '"indptr", "row"'],  # the sparse flags and arrays
    "parquet.py": ['("frame", "series", "index")', "__themisto_series__"],  # its kinds, a series' column
}


@pytest.mark.parametrize("module", sorted(_DECLARED_ONCE))
def test_each_tag_table_and_trust_list_is_declared_in_one_module(module):
    sources = {path: path.read_text(encoding="utf-8") for path in (REPO / "themisto").rglob("*.py")}
    for entry in _DECLARED_ONCE[module]:
        found = sorted(path.name for path, text in sources.items() if re.search(re.escape(entry), text))
        assert found == [module], f"{entry} is declared in {found}, not only in formats/{module}"
