import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from hardrank.items import ImageRef, ItemTable, text_key
from hardrank.store.embedding_store import EmbeddingStore, embedding_schema
from hardrank.text import pre_caption


@pytest.mark.parametrize("raw, expected", [
    ("A man riding a horse.", "a man riding a horse"),
    ("  Two  dogs!!  (playing) ", "two dogs playing"),
    ('He said "hi": ok; fine~ #1 *star*', "he said hi ok fine 1 star"),
    ("Line with newline\n", "line with newline"),
    ("A man's hat, on a bench-top", "a man's hat, on a bench-top"),  # , ' - are kept
    (" ".join(f"w{i}" for i in range(40)), " ".join(f"w{i}" for i in range(30))),
])
def test_pre_caption_matches_reference_rules(raw, expected):
    assert pre_caption(raw) == expected


def test_schema_is_pinned():
    s = embedding_schema(4, "float16")
    assert s.names == ["key", "embedding"]
    assert s.field("embedding").type == pa.list_(pa.field("item", pa.float16(), nullable=False), 4)
    assert isinstance(s.field("embedding").type, pa.FixedSizeListType)
    assert s.metadata[b"hardrank_schema"] == b"1"
    with pytest.raises(ValueError, match="store dtype must be one of"):
        embedding_schema(4, "int8")


def test_store_roundtrip_dedup_and_reopen(tmp_path):
    rng = np.random.default_rng(0)
    st = EmbeddingStore(tmp_path, "fp1", dim=8, dtype="float32")
    e = rng.standard_normal((5, 8)).astype(np.float32)
    assert st.write("text", ["a", "b", "c", "b", "d"], e) is not None
    assert st.count("text") == 4  # duplicate key dropped
    assert st.write("text", ["a", "b"], e[:2]) is None  # nothing new: no shard
    np.testing.assert_array_equal(st.read("text", ["d", "a", "c"]), e[[4, 0, 2]])
    st2 = EmbeddingStore(tmp_path, "fp1", dim=8, dtype="float32")  # reopen: memory-mapped shards
    np.testing.assert_array_equal(st2.read("text", ["b", "a"]), e[[1, 0]])
    assert st2.contains("text", ["a", "zz"]).tolist() == [True, False]
    with pytest.raises(KeyError, match="not in store"):
        st2.read("text", ["zz"])
    shards = list((tmp_path / "fp1" / "text").glob("shard-*.arrow"))
    assert len(shards) == 1
    tab = ipc.open_file(pa.memory_map(str(shards[0]))).read_all()
    assert tab.schema.equals(embedding_schema(8, "float32"))


def test_store_ignores_half_written_tmp_and_rejects_dim_change(tmp_path):
    st = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float16")
    st.write("image", ["k"], np.ones((1, 4), np.float16))
    # a killed writer leaves only a dot-tmp file, which readers never look at
    (tmp_path / "fp" / "image" / ".shard-x.arrow.tmp").write_bytes(b"garbage")
    assert EmbeddingStore(tmp_path, "fp", dim=4, dtype="float16").count("image") == 1
    with pytest.raises(ValueError, match="store holds dim=4"):
        EmbeddingStore(tmp_path, "fp", dim=8, dtype="float16")


def test_item_table_dedups_and_keys_by_content(tmp_path):
    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    a.write_bytes(b"same-bytes")
    b.write_bytes(b"same-bytes")
    t = ItemTable("image")
    rows = t.add_many([ImageRef(str(a)), ImageRef(str(b)), ImageRef(str(a)), ImageRef(str(a), (0, 0, 2, 2)),
                       ImageRef(str(tmp_path / "missing.jpg"))])
    assert rows.tolist() == [0, 1, 0, 2, 3]
    keys = t.keys()
    assert keys[0] == keys[1]                  # same bytes, same key
    assert keys[2] == keys[0] + "@crop:0,0,2,2"  # derived variant keyed by recipe
    assert keys[3] == "" and 3 in t.failed and "missing.jpg" in t.failed[3]
    tt = ItemTable("text")
    tt.add_many(["x", "y", "x"])
    assert tt.keys() == [text_key("x"), text_key("y")]


@pytest.mark.parametrize("n", [0, 1, 2, 63, 64, 65, 129, 1000])
@pytest.mark.parametrize("threads", [1, 3, 8])
def test_map_rows_keeps_row_order_and_hands_threads_chunks_of_rows(n, threads):
    import threading

    from hardrank.items import map_rows
    calls: dict[int, set] = {}

    def fn(r):
        calls.setdefault(threading.get_ident(), set()).add(r)
        return r * r

    assert map_rows(fn, iter(range(n)), threads) == [r * r for r in range(n)]
    if threads == 1:
        assert len(calls) <= 1  # no pool at all
    # rows come in runs per task: a future per row (ThreadPoolExecutor.map ignores chunksize) cost more
    # than hashing a small image; a short list still spreads over the threads
    assert len(calls) <= max(1, min(threads, n))
