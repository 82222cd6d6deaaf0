"""ImageNet-C variants in retrieval, on the toy world: gallery distractors (t2i views) and queries (i2t@<variant>)."""
import numpy as np
import pytest

import hardrank
from hardrank.formats.karpathy import read_karpathy
from hardrank.formats.variants import is_corruption_variant, variant_hint
from hardrank.items import Tables
from hardrank.perturb import perturb_images
from hardrank.store.embedding_store import EmbeddingStore
from hardrank.suites import SuiteOptions, load_suites
from hardrank.text import pre_caption
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world

VARIANTS = ("gaussian_noise_5", "contrast_5")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small toy world (64 px images) with two corruption variants beside its images, seed 1."""
    w = build_world(tmp_path_factory.mktemp("w") / "world", WorldConfig(n_train=0, n_test=16, n_inpaint=4))
    perturb_images(method="corrupt:gaussian_noise,contrast", severity=(5,), seed=1, images=str(w / "images"),
                   annotations=str(w / "karpathy_test.json"), out=str(w / "images"))
    return w


def test_the_suites_know_the_corruption_names():
    assert is_corruption_variant("gaussian_noise_3_s0") and is_corruption_variant("elastic_transform_5")
    assert not any(map(is_corruption_variant, ("mix_0.9_s1", "patch_0.9", "fog_6_s1", "adv_0.1_s1", "fog_s1")))
    assert variant_hint("fog_2_s7") == "hardrank perturb images --method corrupt:fog --severity 2 --seed 7 ..."
    assert variant_hint("mix_0.9_s1") == "hardrank perturb images --method mix --lam 0.9 --seed 1 ..."


def test_toy_rococo_scores_corrupted_images_as_queries_and_distractors(world, tmp_path):
    ckpt = sorted(TOY_CHECKPOINTS.glob("*.safetensors"))[-1]
    rep = hardrank.evaluate(suites=["toy-rococo"], data=str(world), image_variants=list(VARIANTS),
                            model=str(TOY_MODEL), checkpoints=[str(ckpt)], out=str(tmp_path / "out"),
                            store=str(tmp_path / "store"), device="cpu", batch_size=64, decode_threads=2)
    n = 16
    assert rep.embed_stats["image"]["encoded"] == 3 * n  # each variant image encoded once for both of its roles
    res = rep.results[0]
    m, counts = res["metrics"], res["counts"]
    names = [f"{v}_s1" for v in VARIANTS]
    for v in names:
        assert counts["original"][f"i2t@{v}"]["queries"] == n
        assert counts[v]["t2i"]["gallery"] == 2 * n
    assert "i2t@mix_0.9_s1" not in m["original"]  # RoCOCO's own variants stay gallery-only (not asked for here)

    # brute force on the store's embeddings: the variant images against the clean captions, index tie rule
    store = EmbeddingStore(tmp_path / "store", res["model_fingerprint"], dim=64, dtype="float32")  # toy-clip
    tables = Tables.empty()
    load_suites(["toy-rococo"], tables, SuiteOptions(data=str(world), image_variants=VARIANTS))
    img = dict(zip(tables.images.ids, store.read("image", tables.images.keys())))
    txt = dict(zip(tables.texts.entries, store.read("text", tables.texts.keys())))
    clean = read_karpathy(world / "karpathy_test.json")
    caps = [pre_caption(c) for _, cs in clean for c in cs]
    owner = np.repeat(np.arange(len(clean)), [len(cs) for _, cs in clean])
    T = np.stack([txt[c] for c in caps])
    for v in names:
        Q = np.stack([img[f"{v}/{im}"] for im, _ in clean])
        S = Q @ T.T
        ranks = []
        for q in range(len(clean)):
            order = np.argsort(-S[q], kind="stable")
            ranks.append(int(np.nonzero(owner[order] == q)[0][0]))
        for k in (1, 5, 10):
            assert m["original"][f"i2t@{v}"][f"R@{k}"] == pytest.approx(100 * np.mean(np.array(ranks) < k), abs=1e-9)
    # and the gallery side: the clean captions against the clean images plus one variant's (RoCOCO's views)
    images = np.stack([img[im] for im, _ in clean] + [img[f"{names[0]}/{im}"] for im, _ in clean])
    S = T @ images.T
    ranks = [int(np.nonzero(np.argsort(-S[q], kind="stable") == owner[q])[0][0]) for q in range(len(caps))]
    assert m[names[0]]["t2i"]["R@1"] == pytest.approx(100 * np.mean(np.array(ranks) < 1), abs=1e-9)
    # noise at severity 5 makes the images harder to retrieve by than the clean ones, for a trained checkpoint
    assert m["original"]["i2t@gaussian_noise_5_s1"]["R@1"] <= m["original"]["i2t"]["R@1"]
    assert "i2t@contrast_5_s1 R@1" in hardrank.scoring.results.summary_row(res)


def test_karpathy_suite_takes_image_variants_and_names_the_missing_folder(world):
    opts = SuiteOptions(annotations=str(world / "karpathy_test.json"), images=str(world / "images"),
                        image_variants=("fog_2",), seeds=(1,))
    tables = Tables.empty()
    (suite,) = load_suites(["karpathy"], tables, opts)
    assert [t.name for t in suite.ranking] == ["i2t", "t2i", "i2t@fog_2_s1"]
    assert "corrupt:fog --severity 2 --seed 1" in str(suite.image_errors[0])
    q = suite.ranking[2]
    assert q.query_ids[0].startswith("fog_2_s1/") and q.gallery_ids == suite.ranking[0].gallery_ids
    assert np.array_equal(q.query_items, suite.ranking[1].gallery_items[16:32])  # the t2i group's rows, shared


def test_wds_suite_reads_corruption_shards_as_queries(tmp_path):
    import webdataset as wds
    from PIL import Image

    rng = np.random.default_rng(0)
    src = tmp_path / "shards"
    src.mkdir()
    with wds.TarWriter(str(src / "00000.tar")) as w:
        for i in range(4):
            w.write({"__key__": f"{i:04d}", "jpg": Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)),
                     "txt": f"caption {i}"})
    perturb_images(method="corrupt:pixelate", severity=(4,), seed=2, images=str(src / "00000.tar"), out=str(src))
    tables = Tables.empty()
    (suite,) = load_suites(["wds"], tables, SuiteOptions(images=str(src / "00000.tar"), image_variants=("pixelate_4",),
                                                         seeds=(2,)))
    assert [t.name for t in suite.ranking] == ["i2t", "t2i", "i2t@pixelate_4_s2"]
    q = suite.ranking[2]
    assert all("pixelate_4_s2/00000.tar" in tables.images.entries[r].uri for r in q.query_items)
