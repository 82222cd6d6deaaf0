"""The store's key index against its slow twin (a dict of first occurrences), and the store on top of it."""
from __future__ import annotations

import hashlib
import random
import shutil

import numpy as np
import pyarrow as pa
import pytest

from hardrank import key_index
from hardrank.key_index import KeyIndex, hash_keys
from hardrank.store import EmbeddingStore, _digest


def _twin(blocks):
    first = {}
    for b, keys in enumerate(blocks):
        for r, k in enumerate(keys):
            first.setdefault(k, (b, r))
    return first


def _random_key(rng: random.Random) -> str:
    length = rng.choice([0, 1, 7, 8, 9, 15, 16, 17, 33, 40, 63, 64, 65])  # around the 8-byte words
    return "".join(rng.choice("ab€\0x") for _ in range(length))            # multi-byte UTF-8, NUL


def _blocks(seed: int, n_blocks: int = 23):
    rng = random.Random(seed)
    sizes = [0, 1, 2, 7, 8, 9, 31] + [rng.randint(0, 60) for _ in range(n_blocks - 7)]
    return [[_random_key(rng) for _ in range(n)] for n in sizes]


def _check(idx: KeyIndex, blocks, extra=()):
    first = _twin(blocks)
    queries = [k for b in blocks for k in b] + list(extra)
    block, row = idx.locate(queries)
    got = list(zip(block.tolist(), row.tolist()))
    assert got == [first.get(k, (-1, -1)) for k in queries]
    assert idx.contains(queries).tolist() == [k in first for k in queries]
    assert len(idx) == len(first) and idx.rows == sum(map(len, blocks))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_locate_equals_first_occurrence_dict(seed):
    blocks = _blocks(seed)
    absent = ["never", "x" * 65, ""] if not any("" in b for b in blocks) else ["never", "x" * 65]
    _check(KeyIndex.build(blocks), blocks, absent)
    grown = KeyIndex()
    for b in blocks:  # one block at a time: the runs merge as they grow
        grown.add(b)
    _check(grown, blocks, absent)
    assert grown.num_runs <= 1 + int(np.log2(max(2, grown.rows)))
    half = KeyIndex.build(blocks[:9])
    for b in blocks[9:]:
        half.add(pa.array(b, pa.large_string()))  # either Arrow string width
    _check(half, blocks, absent)


def test_shared_hash_prefixes_are_told_apart_by_the_strings(monkeypatch):
    """Every key hashed alike: each lookup walks the candidates and compares strings."""
    monkeypatch.setattr(key_index, "hash_keys", lambda keys: np.zeros(len(key_index.as_string_array(keys)),
                                                                       np.uint64))
    blocks = _blocks(5, n_blocks=9)
    idx = KeyIndex.build(blocks[:4])
    for b in blocks[4:]:
        idx.add(b)
    _check(idx, blocks, ["absent"])


def test_empty_index_and_empty_queries():
    idx = KeyIndex()
    assert idx.locate(["a"])[0].tolist() == [-1] and idx.locate([])[0].shape == (0,)
    assert len(idx) == 0 and idx.nbytes == 0
    idx.add([])
    assert idx.contains(["a"]).tolist() == [False]


def test_hash_is_per_key_whatever_the_batch():
    keys = ["", "a", "ab" * 20, "€" * 9, "t" + "0" * 32]
    h = hash_keys(keys)
    assert [int(hash_keys([k])[0]) for k in keys] == h.tolist()
    assert len(set(h.tolist())) == len(keys)
    assert hash_keys(pa.array(keys, pa.large_string())).tolist() == h.tolist()


def test_eight_bytes_a_row():
    keys = ["t" + hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest() for i in range(5000)]
    idx = KeyIndex.build([keys[:3000], keys[3000:]])
    assert idx.nbytes == 8 * 5000 and len(idx) == 5000


def test_shard_checksum_unchanged_by_arrow_keys():
    """Shards written before the key index keep verifying: the checksum of an Arrow key column is
    the one of the str list it was computed from."""
    keys = ["a", "", "€uro", "t" * 40]
    emb = np.arange(8, dtype=np.float32).reshape(4, 2)
    old = hashlib.blake2b(digest_size=16)
    old.update(b"4|2|<f4|")
    old.update("\0".join(keys).encode("utf-8"))
    old.update(emb)
    assert _digest(keys, emb) == _digest(pa.array(keys), emb) == "blake2b:" + old.hexdigest()
    assert _digest([], np.zeros((0, 2), np.float32)) == _digest(pa.array([], pa.string()), np.zeros((0, 2), np.float32))


def test_store_with_a_copied_shard_counts_each_key_once(tmp_path):
    st = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")
    rng = np.random.default_rng(0)
    st.write("text", ["a", "b", "c"], rng.normal(size=(3, 4)))
    st.write("text", ["c", "d"], rng.normal(size=(2, 4)))  # c dropped: already stored
    first = sorted((tmp_path / "fp" / "text").glob("shard-*.arrow"))[0]
    shutil.copy(first, first.with_name("shard-99999999999999999999-copy.arrow"))  # the same rows again, last
    again = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")
    assert again.count("text") == 4 and again.keys("text") == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(again.read("text", ["d", "a"]), st.read("text", ["d", "a"]))
    assert again.contains("text", ["a", "z"]).tolist() == [True, False]
    st.refresh()  # the copy seen by a store already open: still 4 keys
    assert st.count("text") == 4 and st.key_index["text"].num_blocks == 3


def test_opening_a_store_maps_its_vectors_instead_of_copying_them(tmp_path):
    """fp16 vectors stay in the memory-mapped shard (pyarrow's to_numpy would copy them to the heap)."""
    st = EmbeddingStore(tmp_path, "fp", dim=3, dtype="float16")
    st.write("image", ["i1", "i2"], np.ones((2, 3)))
    again = EmbeddingStore(tmp_path, "fp", dim=3, dtype="float16")
    (shard,) = again._shards["image"]
    assert shard.emb.dtype == np.float16 and not shard.emb.flags.writeable and not shard.emb.flags.owndata
    assert again.read("image", ["i2"]).tolist() == [[1, 1, 1]]
