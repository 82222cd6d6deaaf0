"""The store's key index against its slow twin (a dict of first occurrences), and the store on top of it."""
from __future__ import annotations

import hashlib
import os
import random
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from hardrank.store import key_index
from hardrank.store.embedding_store import EmbeddingStore, _digest
from hardrank.store.idkeys import IdIndex
from hardrank.store.key_index import KeyIndex, hash_keys


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
    bulk = KeyIndex.build(blocks[:5])
    bulk.extend(blocks[5:12])  # several blocks sorted as one run, then merged
    bulk.extend([])
    bulk.extend(blocks[12:])
    _check(bulk, blocks, absent)


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


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_store_shards_hold_no_file_descriptor(tmp_path):
    st = EmbeddingStore(tmp_path, "fp", dim=2, dtype="float32")
    for i in range(40):
        st.write("text", [f"k{i}"], np.ones((1, 2)))
    before = _open_fds()
    again = EmbeddingStore(tmp_path, "fp", dim=2, dtype="float32")
    assert again.count("text") == 40 and _open_fds() - before < 5  # 40 shards mapped, not 40 files open
    assert again.read("text", ["k39"]).tolist() == [[1, 1]]


# -- the --key-by id records (hardrank.store.idkeys.IdIndex): the same key index, over record shards --------------
def _id_twin(shards):
    first = {}
    for records in shards:
        for i, k in records:
            first.setdefault(i, k)
    return first


def _write_records(index: IdIndex, records) -> None:
    for i, k in records:
        index.add(i, k)
    index.commit()


@pytest.mark.parametrize("seed", [0, 1])
def test_id_index_equals_a_dict_of_first_records(tmp_path, seed, monkeypatch):
    """Records committed by two writers (each its own fingerprint folders), read back by a third: every
    lookup equals the dict of first records; duplicates across shards, shared hash prefixes, ids absent."""
    if seed:  # every id hashed alike: each lookup compares strings
        monkeypatch.setattr(key_index, "hash_keys",
                            lambda keys: np.zeros(len(key_index.as_string_array(keys)), np.uint64))
    rng = random.Random(seed)
    ids = [f"d{rng.getrandbits(64):016x}" for _ in range(300)] + ["", "€", "d" + "0" * 32]
    shards = []
    a, b = IdIndex(tmp_path, ["fpA"]), IdIndex(tmp_path, ["fpB", "fpC"])
    for n in range(12):
        picked = rng.sample(ids, rng.randint(0, 40))
        records = [(i, f"h{rng.getrandbits(32):08x}") for i in picked]
        _write_records(a if n % 2 else b, records)
        shards.append(records)
    # each writer committed only records it did not hold: the twin is the first record written
    reader = IdIndex(tmp_path, readonly=True)
    first = _id_twin(_committed(reader, tmp_path))
    queries = ids + ["absent", "d" + "f" * 32]
    assert reader.lookup(queries) == [first.get(q) for q in queries]
    assert [reader.get(q) for q in queries[:20]] == [first.get(q) for q in queries[:20]]
    assert len(reader) == len(first)
    a.refresh()  # sees b's shards too (read after its own: an identity recorded differently by the two
    # writers, which identities that include size and mtime never are, resolves to a's record there)
    told = {}
    for records in _committed(reader, tmp_path):
        for i, k in records:
            told.setdefault(i, set()).add(k)
    got = a.lookup(queries)
    assert [g in told.get(q, {None}) for q, g in zip(queries, got)] == [True] * len(queries)
    assert [g for q, g in zip(queries, got) if len(told.get(q, ())) < 2] == \
        [first.get(q) for q in queries if len(told.get(q, ())) < 2]
    # the first record of an identity is the one kept: a later, different record changes no lookup
    known = next(q for q in ids if first.get(q))
    _write_records(a, [(known, "hother")])
    assert IdIndex(tmp_path, readonly=True).get(known) == first[known]


def _committed(reader: IdIndex, root):
    """The records of every shard under root, in the order IdIndex reads them (by name; one copy each)."""
    seen, out = set(), []
    for p in sorted(root.glob("*/ids/ids-*.arrow"), key=lambda q: (q.name, str(q))):
        if p.name in seen:
            continue
        seen.add(p.name)
        t = ipc.open_file(p).read_all()
        out.append(list(zip(t.column("id_key").to_pylist(), t.column("key").to_pylist())))
    return out


def test_id_index_pending_records_commit_once_and_copy_into_each_folder(tmp_path):
    ix = IdIndex(tmp_path, ["m1", "m2"])
    assert ix.lookup([]) == [] and ix.get("x") is None and len(ix) == 0
    ix.add("x", "h1")
    ix.add("x", "h2")  # the first record of a batch wins too
    assert ix.get("x") == "h1" and len(ix) == 0  # pending: looked up, not yet written
    ix.commit()
    assert len(ix) == 1 and ix.get("x") == "h1"
    names = [sorted(p.name for p in (tmp_path / m / "ids").iterdir()) for m in ("m1", "m2")]
    assert names[0] == names[1] and len(names[0]) == 1
    ix.add("x", "h1")
    ix.commit()  # nothing new: no shard written
    assert len(list((tmp_path / "m1" / "ids").iterdir())) == 1
    dry = IdIndex(tmp_path, ["m3"], readonly=True)
    dry.add("y", "h3")
    dry.commit()
    assert dry.get("y") == "h3" and not (tmp_path / "m3").exists()
    assert IdIndex(tmp_path / "absent").lookup(["x"]) == [None]


def test_id_index_skips_an_unreadable_shard_and_holds_no_file_open(tmp_path, caplog):
    ix = IdIndex(tmp_path, ["m"])
    for n in range(30):
        _write_records(ix, [(f"i{n}", f"h{n}")])
    (tmp_path / "m" / "ids" / "ids-00000000000000000000-broken.arrow").write_bytes(b"not arrow")
    before = _open_fds() if os.path.isdir("/proc/self/fd") else 0
    again = IdIndex(tmp_path, readonly=True)
    if before:
        assert _open_fds() - before < 5
    assert "ids-00000000000000000000-broken.arrow" in caplog.text and "read again" in caplog.text
    assert again.lookup([f"i{n}" for n in range(30)]) == [f"h{n}" for n in range(30)]
    assert again._index.nbytes == 8 * 30  # the store's key index: 8 bytes a record
