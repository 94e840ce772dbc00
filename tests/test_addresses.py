"""Memory addresses inside values (`themisto.runtime.agent.addresses`): a value holding its process's addresses hashes
and stores the same in every process, while values that differ in anything else still hash apart."""

import hashlib
import json
import pickle
import subprocess
from pathlib import Path

import pytest

from themisto.runtime.agent.addresses import (ADDRESS_MARK, STORED_ADDRESS, is_address, pickle_without_addresses,
                                              stored_text)
from themisto.runtime.agent.hashing import content_hash
from themisto.settings import settings

REPO_ROOT = Path(__file__).resolve().parents[1]

# Run in the kernels' environment (scikit-learn, skops): what one fresh process computes of values holding addresses.
_SCRIPT = r"""
import hashlib, json, pickle, sys
sys.path.insert(0, sys.argv[1])
from sklearn.feature_extraction.text import TfidfVectorizer
from themisto.runtime.agent.formats import skops, tagged_json
from themisto.runtime.agent.formats.base import Caps, Writing
from themisto.runtime.agent.hashing import content_hash

class Holder:
    def __init__(self):
        self.key = id(self)
        self.text = repr(object())

vectorizer = TfidfVectorizer().fit(["alpha beta gamma", "beta gamma delta"])
holder = Holder()
values = {"vectorizer": vectorizer, "holder": holder, "ids": {"k": id(vectorizer), "n": [1, 2**40]},
          "reprs": [repr(object()), "0x1f"], "set": {id(holder), 3}}
stored, read_back = skops.write(vectorizer, Writing(Caps(), lambda v: "", None))
print(json.dumps({
    "hashes": {name: content_hash(value) for name, value in values.items()},
    "raw": hashlib.sha256(pickle.dumps(vectorizer)).hexdigest(),
    "skops": hashlib.sha256(stored).hexdigest(),
    "read_back": content_hash(read_back()),
    "json": tagged_json.encode(values["ids"], lambda v: "", [10_000]),
}))
"""


@pytest.fixture(scope="module")
def two_processes():
    python = settings().kernel_python
    runs = [subprocess.run([python, "-c", _SCRIPT, str(REPO_ROOT)], capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    return [json.loads(run.stdout) for run in runs]


def test_values_holding_addresses_hash_and_store_the_same_in_two_processes(two_processes):
    first, second = two_processes
    # The raw pickles differ (the vectorizer keeps id(self.stop_words)): the rule is what makes the hashes agree.
    assert first["raw"] != second["raw"]
    assert first["hashes"] == second["hashes"]
    assert first["skops"] == second["skops"]  # the stored model: the same bytes from both builds
    assert first["read_back"] == first["hashes"]["vectorizer"]  # read back, it hashes as the one stored: exact
    assert first["json"] == second["json"] and first["json"]["k"] == STORED_ADDRESS and first["json"]["n"] == [1, 2**40]


def test_only_address_shaped_ints_and_texts_are_marked():
    assert is_address(0x7f22_4605_bbe0) and is_address(0x55d0_0000_1230)
    # The mmap area starts up to 2^40 below the top (2^44 with the most random bits): 6 of 300 interpreters here
    # put id(None) at 0x7efc…-0x7eff…, and the sample's vectorizer hashed otherwise in those.
    assert is_address(0x7efc_9a45_bbe0) and is_address(0x7000_0000_0008)
    assert not is_address(0x7f22_4605_bbe1)  # not aligned
    assert not is_address(2**40) and not is_address(1_700_000_000_000) and not is_address(12345)
    # Two numbers that are not addresses keep their own hashes; two addresses are one value.
    assert content_hash(2**40) != content_hash(2**41)
    assert content_hash([0x7f00_0000_1000]) == content_hash([0x7f11_2222_3330])
    assert content_hash("<x at 0x7f2245842610>") == content_hash("<x at 0x7fa2e30aa610>")
    assert content_hash("<x at 0x7f2245842610>") != content_hash("<y at 0x7fa2e30aa610>")
    assert stored_text("<x at 0x7f2245842610>") == f"<x at 0x{STORED_ADDRESS:x}>"


def test_bytes_that_only_look_like_an_address_inside_a_buffer_are_left_alone():
    looks = b"\x8a\x06" + (0x7f22_4605_bbe0).to_bytes(6, "little")
    data = pickle.dumps(looks * 3, protocol=4)
    assert pickle_without_addresses(data) == data
    real = pickle.dumps([0x7f22_4605_bbe0, 5], protocol=4)
    assert ADDRESS_MARK in pickle_without_addresses(real)
    assert hashlib.sha256(pickle_without_addresses(real)).digest() == hashlib.sha256(
        pickle_without_addresses(pickle.dumps([0x7f99_0000_0010, 5], protocol=4))).digest()


class _Holder:
    """An object holding a set, hashed by its pickle."""

    def __init__(self, members: set):
        self.members = members


def test_an_object_holding_a_set_hashes_the_same_after_the_set_is_read_back_from_a_pickle():
    # A set's order follows its history: 1032 and 5 kept from a set once 2048 wide iterate 5, 1032; read back from
    # a pickle (a small table) they iterate 1032, 5. The same members, the same hash.
    wide = set(range(2048))
    wide.difference_update(set(range(2048)) - {5, 1032})
    read_back = pickle.loads(pickle.dumps(wide))
    assert list(wide) != list(read_back) and wide == read_back
    assert content_hash(_Holder(wide)) == content_hash(_Holder(read_back))
    assert content_hash(_Holder(frozenset(wide))) == content_hash(_Holder(frozenset(read_back)))
    assert content_hash(_Holder({5, 1032})) != content_hash(_Holder({5, 1033}))
    assert content_hash(_Holder({"a", 1})) != content_hash(_Holder({"a", 2}))  # mixed kinds: sorted by digests
    assert content_hash(_Holder({5})) != content_hash(_Holder(frozenset({5})))
