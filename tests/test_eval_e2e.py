"""End to end: checkpoints -> decode -> encode -> store -> kernels -> metrics == brute-force protocol."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import brute_force_rococo, make_karpathy_world, save_random_checkpoint, write_tiny_config

from hardrank import EmbeddingStore, EvalConfig, evaluate
from hardrank.config import build
from hardrank.suites import SuiteOptions
from hardrank.text import pre_caption


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("kworld")
    w = make_karpathy_world(root)
    cfg = write_tiny_config(root)
    w["cfg"] = cfg
    w["ckpts"] = [save_random_checkpoint(cfg, root / "a.safetensors", 0),
                  save_random_checkpoint(cfg, root / "epoch_2.pt", 1, fmt="pt")]
    return w


def _config(world, tmp_path, **kw):
    opts = SuiteOptions(annotations=str(world["annotations"]), images=str(world["images"]),
                        image_variants=("mix_0.9",), seeds=(1,))
    base = dict(model=str(world["cfg"]), checkpoints=tuple(map(str, world["ckpts"])), suites=("rococo",),
                out=str(tmp_path / "out"), store=str(tmp_path / "store"), suite_options=opts, batch_size=7)
    base.update(kw)
    return build(EvalConfig, base)


def test_eval_matches_brute_force_and_resumes(world, tmp_path):
    rep = evaluate(_config(world, tmp_path))
    assert len(rep.results) == 2
    st = rep.embed_stats
    assert st["image"]["encoded"] == 24 and st["image"]["from_store"] == 0
    # rerun: everything from the store, nothing encoded
    rep2 = evaluate(_config(world, tmp_path))
    assert rep2.embed_stats["image"]["encoded"] == 0 and rep2.embed_stats["text"]["encoded"] == 0
    assert rep2.embed_stats["image"]["from_store"] == 24
    assert rep2.results[0]["metrics"] == rep.results[0]["metrics"]

    res = json.loads((tmp_path / "out" / "a" / "rococo.json").read_text())
    assert res["suite"] == "rococo" and res["tie_rule"] == "index" and res["model_fingerprint"]
    assert res["counts"]["same_concept"]["i2t"] == {"queries": 12, "gallery": 61 + 60}
    assert res["counts"]["mix_0.9_s1"]["t2i"] == {"queries": 61, "gallery": 24}
    assert res["provenance"]["precision"] == "fp32"

    # brute force on the very embeddings in the store
    store = EmbeddingStore(tmp_path / "store", res["model_fingerprint"], dim=16, dtype="float32")
    from hardrank.items import Tables
    from hardrank.suites import load_suites

    tables = Tables.empty()
    load_suites(["rococo"], tables, _config(world, tmp_path).suite_options)
    img = dict(zip(tables.images.ids, store.read("image", tables.images.keys())))
    txt = dict(zip(tables.texts.entries, store.read("text", tables.texts.keys())))
    clean = world["clean"]
    same = json.loads((world["annotations"] / "same_concept.json").read_text())
    variants = {"same_concept": [same[i]["caption"][len(it["caption"]):] for i, it in enumerate(clean)]}
    ref = brute_force_rococo(img, txt, clean, variants, ["mix_0.9_s1"], pre_caption)
    for (view, d), m in ref.items():
        for k, v in m.items():
            assert rep.results[0]["metrics"][view][d][k] == pytest.approx(v, abs=1e-9), (view, d, k)
            assert res["metrics"][view][d][k] == pytest.approx(v, abs=1e-5)  # the JSON rounds to 6 places

    table = pq.read_table(tmp_path / "out" / "a" / "rococo.parquet")
    assert set(table.column("view").to_pylist()) == {"original", "same_concept", "mix_0.9_s1"}

    # bring your own embeddings: the same vectors give the same metrics
    rows = [("image", i, e.tolist()) for i, e in img.items()] + \
           [("text", raw, txt[pre_caption(raw)].tolist()) for it in clean for raw in it["caption"]] + \
           [("text", raw, txt[pre_caption(raw)].tolist()) for caps in variants["same_concept"] for raw in caps]
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"kind": [r[0] for r in rows], "id": [r[1] for r in rows],
                             "embedding": [r[2] for r in rows]}), path)
    rep3 = evaluate(_config(world, tmp_path, model=None, checkpoints=(None,), embeddings=str(path),
                            out=str(tmp_path / "byo")))
    byo, ours = rep3.results[0]["metrics"], rep.results[0]["metrics"]
    for view in ("original", "same_concept", "mix_0.9_s1"):
        for d in ours[view]:
            if isinstance(ours[view][d], dict):
                for k, v in ours[view][d].items():
                    if not isinstance(v, dict):
                        assert byo[view][d][k] == pytest.approx(v, abs=1e-9), (view, d, k)


def test_corrupt_images_are_recorded_skipped_and_limited(world, tmp_path):
    import shutil

    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    bad = images / world["clean"][4]["image"]
    bad.write_bytes(b"\xff\xd8\xff not a jpeg")
    (images / "mix_0.9_s1" / world["clean"][5]["image"]).unlink()
    cfg = _config(world, tmp_path, suite_options=SuiteOptions(annotations=str(world["annotations"]),
                  images=str(images), image_variants=("mix_0.9",), seeds=(1,)), checkpoints=(str(world["ckpts"][0]),))
    rep = evaluate(cfg)
    res = rep.results[0]
    assert res["failed_items"] == 2
    reasons = {f["source"].split("/images/")[-1]: f["reason"] for f in res["failures"]}
    assert any("missing" in r or "No such file" in r for r in reasons.values())
    assert res["counts"]["original"]["i2t"]["queries"] == 11          # the corrupt query image is skipped
    assert res["counts"]["skipped"]["t2i"]["queries"] == 5             # its 5 captions lose their positive
    from hardrank.errors import TooManyFailures

    with pytest.raises(TooManyFailures, match="max-failures 0"):
        evaluate(_config(world, tmp_path, out=str(tmp_path / "o2"), store=str(tmp_path / "s2"),
                         suite_options=cfg.suite_options, max_failures=0, checkpoints=(str(world["ckpts"][0]),)))
