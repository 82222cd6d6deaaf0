"""--caption-protocol (blip: BLIP's pre_caption, raw: as written) and --recall-k: suites, results, export."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, write_wds_shards

from hardrank import SuiteOptions, Tables, evaluate
from hardrank.config import EvalConfig, build
from hardrank.errors import UsageError
from hardrank.jobs.cli import main
from hardrank.suites import load_suites
from hardrank.text import pre_caption


@pytest.fixture(scope="module")
def kworld(tmp_path_factory):
    root = tmp_path_factory.mktemp("captions")
    w = make_karpathy_world(root / "w", n_images=8, variants=("same_concept",), image_variants=())
    tables = Tables.empty()
    load_suites(["karpathy"], tables, SuiteOptions(annotations=str(w["annotations"])))
    rng = np.random.default_rng(0)
    rows = [("image", i) for i in dict.fromkeys(tables.images.ids)] + [("text", t) for t in dict.fromkeys(
        tables.texts.ids)]
    vecs = rng.normal(size=(len(rows), 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    byo = root / "emb.parquet"
    pq.write_table(pa.table({"kind": [k for k, _ in rows], "id": [i for _, i in rows],
                             "embedding": vecs.tolist()}), byo)
    return {**w, "byo": byo, "root": root}


def _texts(suite: str, **opts) -> tuple[list[str], list[str], dict]:
    tables = Tables.empty()
    (s,) = load_suites([suite], tables, build(SuiteOptions, opts))
    return list(tables.texts.entries), list(tables.texts.ids), s.meta


@pytest.mark.parametrize("suite", ["karpathy", "rococo"])
def test_blip_is_the_default_and_raw_feeds_captions_as_written(kworld, suite):
    ann = str(kworld["annotations"])
    blip, ids, meta = _texts(suite, annotations=ann)
    assert meta["caption_protocol"] == "blip" and blip == list(dict.fromkeys(pre_caption(i) for i in ids))
    assert _texts(suite, annotations=ann, caption_protocol="blip")[0] == blip
    raw, raw_ids, meta = _texts(suite, annotations=ann, caption_protocol="raw")
    assert meta["caption_protocol"] == "raw" and raw == list(dict.fromkeys(raw_ids))
    assert raw != blip and "A dog and a dog number 0." in raw  # case and the full stop kept
    if suite == "rococo":
        assert any(" or " in t and t.endswith(".") for t in raw)  # the perturbed captions too


def test_wds_suite_takes_the_protocol(kworld, tmp_path):
    shards = write_wds_shards(kworld["clean"], kworld["images"], tmp_path / "shards")
    blip, _, meta_b = _texts("wds", images=shards)
    raw, _, meta_r = _texts("wds", images=shards, caption_protocol="raw")
    assert (meta_b["caption_protocol"], meta_r["caption_protocol"]) == ("blip", "raw")
    caps = [c for item in kworld["clean"] for c in item["caption"]]
    assert raw == list(dict.fromkeys(caps)) and blip == list(dict.fromkeys(pre_caption(c) for c in caps))


def test_results_record_the_protocol_and_the_requested_recall_ks(kworld, tmp_path):
    rep = evaluate(embeddings=str(kworld["byo"]), suites=["karpathy"], annotations=str(kworld["annotations"]),
                   out=str(tmp_path / "res"), caption_protocol="raw", recall_k=[50, 5])
    (r,) = rep.results
    assert r["caption_protocol"] == "raw" and r["suite_meta"]["caption_protocol"] == "raw"
    assert r["provenance"]["config"]["recall_k"] == (1, 5, 50)  # R@1 always: every table's headline
    o = r["metrics"]["original"]
    assert set(k for k in o["i2t"] if k.startswith("R@")) == {"R@1", "R@5", "R@50"}
    assert o["t2i"]["R@50"] == 100.0  # 8 images: every caption's image is within 50
    assert "rsum" not in o and set(o["mean"]) == {"R@1", "R@5", "R@50"}  # rsum is R@1+5+10 only
    written = json.loads((tmp_path / "res" / r["checkpoint"] / "karpathy.json").read_text())
    assert written["caption_protocol"] == "raw"
    default = evaluate(embeddings=str(kworld["byo"]), suites=["karpathy"], annotations=str(kworld["annotations"]),
                       out=str(tmp_path / "res2")).results[0]
    assert default["caption_protocol"] == "blip" and "rsum" in default["metrics"]["original"]
    assert set(k for k in default["metrics"]["original"]["t2i"] if k.startswith("R@")) == {"R@1", "R@5", "R@10"}


def test_export_states_the_caption_protocol_and_every_recall_k(kworld, tmp_path):
    for proto in ("raw", "blip"):
        evaluate(embeddings=str(kworld["byo"]), suites=["karpathy"], annotations=str(kworld["annotations"]),
                 out=str(tmp_path / proto), caption_protocol=proto, recall_k=[1, 5, 10, 50])
        assert main(["export", str(tmp_path / proto), "--format", "clip_benchmark", "--out",
                     str(tmp_path / f"cb_{proto}")]) == 0
        (rec,) = [json.loads(p.read_text()) for p in (tmp_path / f"cb_{proto}").glob("*.json")]
        assert rec["caption_protocol"] == proto and rec["language"] == "en"
        assert {"image_retrieval_recall@50", "text_retrieval_recall@50", "text_retrieval_recall@10"} <= set(
            rec["metrics"])


def test_export_of_a_result_from_before_the_option_says_blip(tmp_path):
    from hardrank.exports.clip_benchmark import clip_benchmark_records

    old = {"suite": "karpathy", "task_type": "ranking", "model": "ViT-B-32", "suite_meta": {},
           "metrics": {"original": {"i2t": {"R@1": 50.0, "R@5": 90.0, "R@10": 100.0}}}}
    (rec,), _ = clip_benchmark_records(old, "ckpt")
    assert rec["caption_protocol"] == "blip"
    assert rec["metrics"] == {"text_retrieval_recall@1": 0.5, "text_retrieval_recall@5": 0.9,
                              "text_retrieval_recall@10": 1.0}


def test_bad_values_are_usage_errors():
    with pytest.raises(UsageError, match=r"caption_protocol \(--caption-protocol\) must be one of \['blip', 'raw'\]"):
        SuiteOptions(caption_protocol="lower")
    for bad in ([0], [], [1, "5"], [True]):
        with pytest.raises(UsageError, match=r"recall_k|'recall_k'"):
            build(EvalConfig, {"suites": ["karpathy"], "out": "x", "recall_k": bad})


def test_cli_flags(kworld, tmp_path, capsys):
    assert main(["eval", "--suite", "karpathy", "--annotations", str(kworld["annotations"]), "--embeddings",
                 str(kworld["byo"]), "--out", str(tmp_path / "o"), "--caption-protocol", "raw",
                 "--recall-k", "1", "20", "--quiet"]) == 0
    (res,) = [json.loads(p.read_text()) for p in (tmp_path / "o").rglob("karpathy.json")]
    assert res["caption_protocol"] == "raw" and "R@20" in res["metrics"]["original"]["i2t"]
    assert main(["eval", "--suite", "karpathy", "--annotations", "x", "--embeddings", "y", "--out", "z",
                 "--recall-k", "0"]) == 2
    assert "--recall-k" in capsys.readouterr().err
