"""The input registry: every kind listed, each layout detected as its kind, a new kind served to mine and eval."""
from __future__ import annotations

import json
import pkgutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, write_image

import hardrank.inputs.kinds
from hardrank import DataError, EmbeddingStore, MineConfig, evaluate
from hardrank.config import build
from hardrank.inputs import registry, write_shard
from hardrank.inputs.kind import Embeddings, InputKind, InputOptions
from hardrank.jobs.cli import main
from hardrank.mining.inputs import build_problem

ORDER = ["wds", "store", "clip_retrieval", "folder", "karpathy", "xm3600", "embeddings", "parquet"]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_the_registry_lists_every_kind_module_once_in_detection_order():
    assert [k.name for k in registry.kinds()] == ORDER
    modules = [m.name for m in pkgutil.iter_modules(hardrank.inputs.kinds.__path__)]
    listed = [k for k in registry.kinds()]
    for name in modules:  # a kind module that is not registered would be dead code
        kind = __import__(f"hardrank.inputs.kinds.{name}", fromlist=["KIND"]).KIND
        assert kind in listed, f"hardrank.inputs.kinds.{name} is not in the registry"
    assert len(modules) == len(listed)
    for k in listed:
        assert k.describe and k.yields in ("items", "embeddings"), k.name
        assert k.remote or k.suffixes or k.markers, f"{k.name}: a URL could never reach it"
    assert [k.name for k in registry.kinds("embeddings")] == ["store", "clip_retrieval", "embeddings"]
    # help and messages are built from the kinds, so a new kind shows up in them
    assert all(k.describe in registry.describe() for k in listed)
    assert [line.split()[0] for line in registry.help_text().splitlines()] == ORDER


# -- one sample layout per kind -----------------------------------------------------------------------
def _shards(root: Path) -> str:
    png = root / "x.png"
    write_image(png, np.random.default_rng(0))
    write_shard(str(root / "shards" / "00000.tar"), [("000000001", {"png": png.read_bytes(), "txt": b"a cat"})])
    return str(root / "shards" / "{00000..00000}.tar")


def _store(root: Path) -> str:
    st = EmbeddingStore(root / "store", "fp", dim=4, dtype="float32")
    st.write("text", ["t1", "t2"], _unit(np.random.default_rng(0).standard_normal((2, 4))))
    write_image(root / "store" / "fp" / "stray.png", np.random.default_rng(1))  # still a store, not an image folder
    return str(root / "store" / "fp")


def _clip_retrieval(root: Path) -> str:
    f = root / "cr"
    for d in ("img_emb", "text_emb", "metadata"):
        (f / d).mkdir(parents=True)
    v = _unit(np.random.default_rng(0).standard_normal((2, 4))).astype(np.float16)
    np.save(f / "img_emb" / "img_emb_0.npy", v)
    np.save(f / "text_emb" / "text_emb_0.npy", v)
    pq.write_table(pa.table({"image_path": ["a.jpg", "b.jpg"], "caption": ["a", "b"]}),
                   f / "metadata" / "metadata_0.parquet")  # a Parquet inside: still not a listing
    return str(f)


def _folder(root: Path) -> str:
    write_image(root / "imgs" / "sub" / "a.jpg", np.random.default_rng(0))
    return str(root / "imgs")


def _karpathy(root: Path) -> str:
    (root / "k.json").write_text(json.dumps([{"image": "a.jpg", "caption": ["a cat"]}]))
    return str(root / "k.json")


def _xm3600(root: Path) -> str:
    (root / "captions.jsonl").write_text(json.dumps({"image/key": "a", "en": {"caption": ["a cat"]},
                                                     "de": {"caption": ["eine Katze"]}}) + "\n")
    return str(root / "captions.jsonl")


def _embeddings(root: Path) -> str:
    pq.write_table(pa.table({"kind": ["text"], "id": ["a cat"], "embedding": [[1.0, 0.0]], "path": ["x"]}),
                   root / "e.parquet")  # a 'path' column too: the embedding columns decide
    return str(root / "e.parquet")


def _listing(root: Path) -> str:
    pq.write_table(pa.table({"id": ["1"], "text": ["a cat"]}), root / "l.parquet")
    return str(root / "l.parquet")


LAYOUTS = {"wds": _shards, "store": _store, "clip_retrieval": _clip_retrieval, "folder": _folder,
           "karpathy": _karpathy, "xm3600": _xm3600, "embeddings": _embeddings, "parquet": _listing}


@pytest.mark.parametrize("name", ORDER)
def test_each_layout_is_detected_as_its_kind_and_opens(tmp_path, name):
    spec = LAYOUTS[name](tmp_path)
    kind, path = registry.find(spec)
    assert kind is not None and kind.name == name and path == spec
    src = registry.open_input(spec, InputOptions())
    assert src.kind == name and src.items
    assert (src.embeddings is not None) == (kind.yields == "embeddings")


def test_what_no_kind_reads_is_named_with_every_kind(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert registry.find(str(tmp_path / "notes.txt")) == (None, str(tmp_path / "notes.txt"))
    with pytest.raises(DataError, match=r"unrecognised input \(suffix '.txt'\)") as e:
        registry.open_input(str(tmp_path / "notes.txt"))
    assert all(k.describe in str(e.value) for k in registry.kinds())
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        registry.open_input(str(tmp_path / "missing.json"))
    (tmp_path / "empty").mkdir()  # a folder without images: the folder kind's problem, and what else it could be
    with pytest.raises(DataError, match=r"folder holds no images .*A corpus or query set is WebDataset"):
        registry.open_input(str(tmp_path / "empty"))


def test_eval_embeddings_take_only_kinds_holding_embeddings_by_id(tmp_path):
    for bad, message in ((str(tmp_path / "nope.parquet"), "embeddings file .*nope.parquet does not exist; pass a "
                          "clip-retrieval output folder"),
                         (_folder(tmp_path), r"embeddings file .*imgs is a folder, but none of: a clip-retrieval"),
                         (_store(tmp_path), r"store export .*--out FILE.parquet` and pass that file"),
                         (_karpathy(tmp_path), r"k.json: not a readable Parquet file")):
        with pytest.raises(DataError, match=message):
            registry.open_embeddings(bad).for_tables(None)
    emb = registry.open_embeddings(_embeddings(tmp_path))
    assert emb.modalities == ("text",) and emb.ids("text") == ["a cat"]
    assert emb.content_id.startswith("embeddings-")


def test_register_places_a_kind_and_refuses_clashes(monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "_KINDS", list(registry.kinds()))

    class Marked(InputKind):
        name, describe, markers = "marked", "a folder holding MARK", ("MARK",)

        def detect(self, path):
            return (Path(path) / "MARK").is_file()

    folder = Path(_folder(tmp_path))
    (folder / "MARK").write_text("")
    assert registry.find(str(folder))[0].name == "folder"
    registry.register(Marked(), before="folder")
    assert [k.name for k in registry.kinds()].index("marked") == ORDER.index("folder")
    assert registry.find(str(folder))[0].name == "marked"
    with pytest.raises(ValueError, match="registered already"):
        registry.register(Marked())
    with pytest.raises(ValueError, match="no input kind 'nothing'"):
        registry.register(type("Other", (Marked,), {"name": "other"})(), before="nothing")


# -- a kind added in a test: a .npy of vectors and a .ids.tsv of "kind<TAB>id" lines beside it ---------
class _NpyEmbeddings(Embeddings):
    def __init__(self, path: str):
        vectors = np.load(path)
        rows = [line.split("\t", 1) for line in Path(path).with_suffix(".ids.tsv").read_text().splitlines()]
        self.dir, self.fingerprint = path, "npy-test"
        self._ids = {m: [i for k, i in rows if k == m] for m in ("image", "text")}
        self._vec = {m: _unit(vectors[[k == m for k, _ in rows]]) for m in ("image", "text")}
        self.modalities = tuple(m for m in ("image", "text") if self._ids[m])

    def ids(self, modality):
        return self._ids[modality]

    def vectors(self, modality):
        return self._vec[modality]


class _Npy(InputKind):
    name, describe, yields, suffixes = "npy", "a .npy of vectors with a .ids.tsv beside it", "embeddings", (".npy",)

    def detect(self, path):
        return Path(path).suffix == ".npy" and Path(path).with_suffix(".ids.tsv").is_file()

    def embeddings(self, path):
        return _NpyEmbeddings(path)


@pytest.fixture
def npy_kind(monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", list(registry.kinds()))
    return registry.register(_Npy())


def _write_both(root: Path, rows: list[tuple[str, str]], vectors: np.ndarray) -> tuple[Path, Path]:
    """The same float32 vectors as the registered .npy format and as the embeddings Parquet."""
    vectors = _unit(vectors)
    np.save(root / "v.npy", vectors)
    (root / "v.ids.tsv").write_text("".join(f"{k}\t{i}\n" for k, i in rows))
    pq.write_table(pa.table({"kind": [k for k, _ in rows], "id": [i for _, i in rows],
                             "embedding": pa.array(list(vectors), pa.list_(pa.float32()))}), root / "v.parquet")
    return root / "v.npy", root / "v.parquet"


def _negatives(out: Path) -> dict:
    return pq.read_table(sorted((out / "negatives").glob("part-*.parquet"))).to_pydict()


def test_a_kind_registered_in_a_test_serves_mine_and_eval(tmp_path, npy_kind):
    world = make_karpathy_world(tmp_path / "w", n_images=5)
    caps = list(dict.fromkeys(c for it in world["clean"] for c in it["caption"]))
    rows = [("image", it["image"]) for it in world["clean"]] + [("text", c) for c in caps]
    npy, parquet = _write_both(tmp_path, rows, np.random.default_rng(4).standard_normal((len(rows), 16)))
    assert registry.find(str(npy))[0] is npy_kind and "npy" in registry.help_text()

    common = ["--direction", "t2t", "-k", "3", "--quiet", "--no-dup-filter"]
    assert main(["mine", "--corpus", str(npy), "--queries", str(npy), "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["mine", "--corpus", str(parquet), "--queries", str(parquet), "--out", str(tmp_path / "b"),
                 *common]) == 0
    a, b = _negatives(tmp_path / "a"), _negatives(tmp_path / "b")
    np.testing.assert_allclose(a.pop("score"), b.pop("score"), rtol=1e-6)
    assert a == b and len(a["query_id"]) == 3 * len(caps)
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["inputs"]["corpus"]["kind"] == "npy"

    opts = dict(suites=["karpathy"], annotations=str(world["annotations"] / "coco_karpathy_test.json"))
    got = evaluate(embeddings=str(npy), out=str(tmp_path / "e1"), **opts)
    ref = evaluate(embeddings=str(parquet), out=str(tmp_path / "e2"), **opts)
    assert got.results[0]["metrics"] == ref.results[0]["metrics"]
    assert got.results[0]["checkpoint"] == "v" and got.results[0]["model_fingerprint"] == "npy-test"


def test_without_the_kind_neither_command_reads_the_format(tmp_path):
    npy, _ = _write_both(tmp_path, [("text", "a cat"), ("text", "a dog")], np.eye(2))
    assert registry.find(str(npy))[0] is None
    with pytest.raises(DataError, match="unrecognised input"):
        registry.open_input(str(npy))
    with pytest.raises(DataError, match="not a readable Parquet file"):
        registry.open_embeddings(str(npy))


def test_an_embeddings_file_corpus_can_be_handed_to_shard_actors(tmp_path):
    """mine --executor ray --shards asks for a lazy corpus; an embeddings file gives its rows as they are."""
    rows = [("text", f"caption {i}") for i in range(9)]
    _, parquet = _write_both(tmp_path, rows, np.random.default_rng(5).standard_normal((9, 8)))
    cfg = build(MineConfig, dict(corpus=str(parquet), queries=str(parquet), out=str(tmp_path / "o"), direction="t2t"))
    lazy, eager = build_problem(cfg, lazy_corpus=True), build_problem(cfg)
    np.testing.assert_array_equal(np.asarray(lazy.xb), np.asarray(eager.xb))
    as_list = [(ids.to_pylist() if hasattr(ids, "to_pylist") else list(ids))  # Arrow ids (a catalog) or a list
               for ids in (lazy.corpus_ids, eager.corpus_ids)]
    assert as_list[0] == as_list[1] == [i for _, i in rows]
