"""Full-size RoCOCO on the real annotation files: engine metrics == a naive argsort protocol."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardrank import evaluate
from hardrank.formats.karpathy import read_karpathy, read_rococo_variant
from hardrank.formats.variants import TEXT_VARIANTS
from hardrank.suites import SuiteOptions
from hardrank.text import pre_caption

pytestmark = pytest.mark.slow
D = 8


def _quantised(rng, n):
    # 4 entries of +-1 in 8 dims: norm exactly 2, so normalised scores are exact multiples of 1/4
    # whatever the summation order -> many exact ties that every implementation sees alike
    x = np.zeros((n, D), dtype=np.float32)
    cols = np.argsort(rng.random((n, D)), axis=1)[:, :4]
    np.put_along_axis(x, cols, rng.choice([-1.0, 1.0], size=(n, 4)).astype(np.float32), axis=1)
    return x


@pytest.fixture(scope="module")
def real_world(rococo_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rococo_real")
    rng = np.random.default_rng(0)
    clean = read_karpathy(rococo_dir / "coco_karpathy_test.json")
    variants = {v: read_rococo_variant(rococo_dir / f"{v}.json", clean) for v in TEXT_VARIANTS}
    images = [im for im, _ in clean]
    img_variants = ["mix_0.9_s1", "patch_0.9_s1"]
    for v in img_variants:
        (tmp / "images" / v).mkdir(parents=True)
    _ids, _kinds = [], []
    img = {im: e for im, e in zip(images, _quantised(rng, len(images)))}
    for v in img_variants:
        alt = _quantised(rng, len(images))
        for j, im in enumerate(images):
            # plant exact ties: every 7th altered image is identical to its original
            img[f"{v}/{im}"] = img[im].copy() if j % 7 == 0 else alt[j]
    raw_texts = list(dict.fromkeys([c for _, caps in clean for c in caps] +
                                   [c for per in variants.values() for caps in per for c in caps]))
    # the protocol encodes normalised captions, so raw captions that normalise alike embed alike
    norm = list(dict.fromkeys(pre_caption(c) for c in raw_texts))
    base = dict(zip(norm, _quantised(rng, len(norm))))
    # plant exact ties: some perturbed captions embed exactly like their original
    for per in variants.values():
        for (_, caps), pert in zip(clean[::11], per[::11]):
            base[pre_caption(pert[0])] = base[pre_caption(caps[0])].copy()
    txt = {c: base[pre_caption(c)] for c in raw_texts}
    rows = [("image", k, e) for k, e in img.items()] + [("text", k, e) for k, e in txt.items()]
    path = tmp / "emb.parquet"
    pq.write_table(pa.table({"kind": [r[0] for r in rows], "id": [r[1] for r in rows],
                             "embedding": [r[2].tolist() for r in rows]}), path)
    report = evaluate(suites=("rococo",), out=str(tmp / "out"), store=str(tmp / "store"),
                      suite_options=SuiteOptions(annotations=str(rococo_dir), images=str(tmp / "images"),
                                                 image_variants=("mix_0.9", "patch_0.9"), seeds=(1,)),
                      embeddings=str(path), device="cpu")
    outcomes = pq.read_table(tmp / "out" / "emb" / "rococo.parquet").to_pandas()
    unit = lambda e: e / np.linalg.norm(e)
    return dict(clean=clean, variants=variants, img={k: unit(v) for k, v in img.items()},
                txt={k: unit(v) for k, v in txt.items()}, result=report.results[0], outcomes=outcomes,
                img_variants=img_variants)


def test_counts_of_every_view(real_world):
    c = real_world["result"]["counts"]
    assert c["original"]["i2t"] == {"queries": 5000, "gallery": 25010}
    assert c["original"]["t2i"] == {"queries": 25010, "gallery": 5000}
    for v in TEXT_VARIANTS:
        assert c[v]["i2t"] == {"queries": 5000, "gallery": 50010}
    for v in real_world["img_variants"]:
        assert c[v]["t2i"] == {"queries": 25010, "gallery": 10000}


def _argsort_rank(scores, positives):
    order = np.argsort(-scores, kind="stable")   # stable: equal scores keep gallery order (index rule)
    where = np.nonzero(np.isin(order, positives))[0]
    return int(where.min()), int(order[0])


def test_i2t_ranks_equal_naive_argsort(real_world):
    w = real_world
    clean = w["clean"]
    originals = [c for _, caps in clean for c in caps]
    owner = np.repeat(np.arange(len(clean)), [len(c) for _, c in clean])
    out = w["outcomes"]
    rng = np.random.default_rng(1)
    six = [i for i, (_, caps) in enumerate(clean) if len(caps) == 6]
    picked = set(rng.choice(len(clean), 150, replace=False).tolist())
    sample = sorted(picked | set(six) | set(list(range(0, 5000, 11))[:40]))
    # the engine's text embeddings use normalised captions: identical normalised texts share one row
    G0 = np.stack([w["txt"][c] for c in originals])
    for view in ["original", *TEXT_VARIANTS]:
        extra = [] if view == "original" else [c for caps in w["variants"][view] for c in caps]
        G = np.concatenate([G0, np.stack([w["txt"][c] for c in extra])]) if extra else G0
        got = out[(out.task == "i2t") & (out.view == view)].set_index("query_id")
        for q in sample:
            im = clean[q][0]
            s = (G @ w["img"][im]).astype(np.float32)
            rank, top1 = _argsort_rank(s, np.nonzero(owner == q)[0])
            assert got.loc[im, "rank"] == rank, (view, q)
            if view != "original":
                assert (got.loc[im, "top1_group"] != "original") == (top1 >= len(originals)) or rank == 0, (view, q)
        # whole-view R@K from the per-query ranks equals the JSON metrics
        ranks = got["rank"].to_numpy()
        for k in (1, 5, 10):
            assert w["result"]["metrics"][view]["i2t"][f"R@{k}"] == pytest.approx(100 * np.mean(ranks < k))


def test_t2i_ranks_equal_naive_argsort(real_world):
    w = real_world
    clean = w["clean"]
    images = [im for im, _ in clean]
    originals = [c for _, caps in clean for c in caps]
    owner = np.repeat(np.arange(len(clean)), [len(c) for _, c in clean])
    out = w["outcomes"]
    rng = np.random.default_rng(2)
    sample = rng.choice(len(originals), 300, replace=False)
    I0 = np.stack([w["img"][im] for im in images])
    for view in ["original", *w["img_variants"]]:
        G = I0 if view == "original" else np.concatenate([I0, np.stack([w["img"][f"{view}/{im}"] for im in images])])
        got = out[(out.task == "t2i") & (out.view == view)].reset_index(drop=True)
        tie_seen = False
        for q in sample:
            s = (G @ w["txt"][originals[q]]).astype(np.float32)
            rank, top1 = _argsort_rank(s, [owner[q]])
            assert got.loc[q, "rank"] == rank, (view, q)
            if view != "original":
                assert (got.loc[q, "top1_group"] != "original") == (top1 >= len(images)), (view, q)
                tie_seen |= bool(s[owner[q] + len(images)] == s[owner[q]])
        if view != "original":
            assert tie_seen  # the planted duplicates really produced exact ties
            fr = 100 * np.mean(got["top1_group"] != "original")
            assert w["result"]["metrics"][view]["t2i"]["false_rate"] == pytest.approx(fr)
