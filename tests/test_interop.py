"""Interop with the tools users already ran: clip-retrieval output folders in, CLIP_benchmark result JSON out."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

from hardrank import DataError, MineConfig, SuiteOptions, Tables, evaluate, mine
from hardrank.config import build
from hardrank.inputs.clip_retrieval import ClipRetrievalFolder, VectorRows
from hardrank.jobs.cli import main
from hardrank.mining.inputs import build_problem
from hardrank.suites import load_suites


# -- writers: each format laid out as the tool that writes it does ------------------------------------
def write_clip_retrieval(folder: Path, samples: list[tuple[str, str, np.ndarray, np.ndarray]], parts: int = 3) -> Path:
    """clip-retrieval inference's output: per partition N (zero-padded to the width of the partition
    count) img_emb/img_emb_N.npy and text_emb/text_emb_N.npy (float16, L2-normalised, np.save) and
    metadata/metadata_N.parquet (a pandas DataFrame: image_path, caption, then the sample's metadata)."""
    width = int(math.log10(parts)) + 1
    for d in ("img_emb", "text_emb", "metadata"):
        (folder / d).mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(samples), parts + 1).astype(int)
    for n in range(parts):
        chunk = samples[bounds[n]:bounds[n + 1]]
        tag = str(n).zfill(width)
        unit = lambda v: (v / np.linalg.norm(v)).astype(np.float16)
        np.save(folder / "img_emb" / f"img_emb_{tag}.npy", np.stack([unit(s[2]) for s in chunk]))
        np.save(folder / "text_emb" / f"text_emb_{tag}.npy", np.stack([unit(s[3]) for s in chunk]))
        cols = {"image_path": [s[0] for s in chunk], "caption": [s[1] for s in chunk],
                "url": [f"http://x/{i}" for i in range(len(chunk))]}
        try:
            import pandas as pd

            pd.DataFrame(cols).to_parquet(folder / "metadata" / f"metadata_{tag}.parquet")
        except ImportError:
            pq.write_table(pa.table(cols), folder / "metadata" / f"metadata_{tag}.parquet")
    return folder


def write_byo(path: Path, rows: list[tuple[str, str, np.ndarray]]) -> Path:
    """The bring-your-own Parquet: kind, id, embedding (the float32 of the same fp16 vectors)."""
    unit = lambda v: (v / np.linalg.norm(v)).astype(np.float16).astype(np.float32)
    pq.write_table(pa.table({"kind": [r[0] for r in rows], "id": [r[1] for r in rows],
                             "embedding": [unit(r[2]).tolist() for r in rows]}), path)
    return path


def _suite_ids(suites: list[str], opts: SuiteOptions) -> tuple[list[str], list[str]]:
    tables = Tables.empty()
    load_suites(suites, tables, opts)
    return list(dict.fromkeys(tables.images.ids)), list(dict.fromkeys(tables.texts.ids))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    w = make_karpathy_world(root / "w", n_images=10, variants=("same_concept",), image_variants=("mix_0.9_s1",))
    ann = w["annotations"]
    sc = ann  # --data: RoCOCO's variant files and SugarCrepe's beside each other
    for stem in ("add_att", "swap_obj"):
        items = {str(i): {"filename": f"0000000{i:05d}.jpg", "caption": f"a {stem} thing {i}",
                          "negative_caption": f"a thing {stem} {i}"} for i in range(8)}
        (sc / f"{stem}.json").write_text(json.dumps(items))
    opts = dict(annotations=str(ann), image_variants=("mix_0.9",), seeds=(1,), data=str(sc))
    images, texts = _suite_ids(["rococo", "sugarcrepe"], SuiteOptions(**opts))
    rng = np.random.default_rng(0)
    vec = {("image", i): rng.normal(size=16) for i in images} | {("text", t): rng.normal(size=16) for t in texts}
    byo = write_byo(root / "emb.parquet", [(k, i, v) for (k, i), v in vec.items()])
    # clip-retrieval pairs an image with a caption per sample; an image with five captions is five
    # samples (its vector repeated), as over a COCO captions WebDataset; paths as its files reader writes
    n = max(len(images), len(texts))
    samples = [(f"/data/coco/{images[j % len(images)]}", texts[j % len(texts)],
                vec[("image", images[j % len(images)])], vec[("text", texts[j % len(texts)])]) for j in range(n)]
    cr = write_clip_retrieval(root / "cr", samples, parts=11)  # zero-padded part numbers: 00..10
    return {"w": w, "opts": opts, "byo": byo, "cr": cr, "root": root, "vec": vec}


# -- bring-your-own evaluation: no image file, parquet and clip-retrieval folder alike ---------------
def test_clip_retrieval_folder_scores_like_the_parquet_without_image_files(world, tmp_path):
    opts = {**world["opts"], "suites": ["rococo", "sugarcrepe"]}
    assert not Path("val2014").exists()  # no image file anywhere the ids could resolve to
    by_file = evaluate(embeddings=str(world["byo"]), out=str(tmp_path / "a"), **opts)
    by_folder = evaluate(embeddings=str(world["cr"]), out=str(tmp_path / "b"), **opts)
    assert [r["metrics"] for r in by_folder.results] == [r["metrics"] for r in by_file.results]
    with_images = evaluate(embeddings=str(world["byo"]), images=str(world["w"]["images"]), out=str(tmp_path / "c"),
                           **{**opts, "suites": ["rococo"]})
    assert with_images.results[0]["metrics"] == by_file.results[0]["metrics"]  # --images changes nothing
    assert by_folder.results[0]["model_fingerprint"].startswith("clip-retrieval-")
    assert {"mix_0.9_s1", "same_concept"} <= set(by_folder.results[0]["metrics"])  # altered images never read


def test_a_model_run_still_needs_the_images_and_says_so_first(world, tmp_path):
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    run = dict(model=str(cfg), checkpoints=[str(ckpt)], suites=["rococo"], annotations=world["opts"]["annotations"],
               image_variants=["mix_0.9"], store=str(tmp_path / "s"))
    with pytest.raises(ValueError, match="needs --images DIR"):
        evaluate(out=str(tmp_path / "o"), **run)
    with pytest.raises(FileNotFoundError, match="altered images .*patch_0.9_s1 do not exist"):
        evaluate(out=str(tmp_path / "o"), images=str(world["w"]["images"]), **{**run, "image_variants": ["patch_0.9"]})
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").rglob("shard-*"))  # nothing encoded


def test_clip_retrieval_folder_errors_name_the_file_and_the_fix(world, tmp_path):
    import shutil

    cr = tmp_path / "cr"
    shutil.copytree(world["cr"], cr)
    folder = ClipRetrievalFolder(cr)
    assert folder.kinds == ("image", "text") and [p.number for p in folder.parts] == list(range(11))
    assert folder.ids("image")[0].startswith("/data/coco/val2014/")
    (cr / "metadata" / "metadata_03.parquet").rename(tmp_path / "m3.parquet")
    with pytest.raises(DataError, match=r"part 3 has .*img_emb_03.npy.* lacks \['metadata/metadata_3.parquet'\]"):
        ClipRetrievalFolder(cr)
    pq.write_table(pq.read_table(tmp_path / "m3.parquet").slice(0, 1), cr / "metadata" / "metadata_03.parquet")
    with pytest.raises(DataError, match=r"img_emb_03.npy: \d+ rows, but metadata_03.parquet has 1"):
        ClipRetrievalFolder(cr)
    pq.write_table(pq.read_table(tmp_path / "m3.parquet").drop(["caption"]), cr / "metadata" / "metadata_03.parquet")
    with pytest.raises(DataError, match="metadata_03.parquet: no column 'caption'"):
        ClipRetrievalFolder(cr)
    shutil.copy(tmp_path / "m3.parquet", cr / "metadata" / "metadata_03.parquet")
    first = folder.ids("image")[0]
    for f in (cr / "metadata").glob("*.parquet"):  # every sample of one image renamed: its id is missing
        t = pq.read_table(f)
        paths = ["elsewhere.jpg" if p == first else p for p in t.column("image_path").to_pylist()]
        pq.write_table(t.set_column(0, "image_path", pa.array(paths)), f)
    gone = first.removeprefix("/data/coco/")
    with pytest.raises(DataError, match=rf"image id\(s\) needed by the suites are not in its metadata, e.g. .*{gone}"):
        evaluate(embeddings=str(cr), out=str(tmp_path / "o"), suites=["rococo"], **world["opts"])


def test_vector_rows_is_a_lazy_normalised_array(world):
    v = ClipRetrievalFolder(world["cr"]).vectors("image")
    full = np.asarray(v)
    assert full.dtype == np.float32 and np.allclose(np.linalg.norm(full, axis=1), 1, atol=1e-6)
    np.testing.assert_array_equal(v[5:17][3:4], full[8:9])                 # views of views, across parts
    idx = np.array([[len(full) - 1, 0], [7, 7]])
    np.testing.assert_array_equal(v[idx], full[idx])
    np.testing.assert_array_equal(np.asarray(v.select([4, 2, 9])[1:]), full[[2, 9]])
    import pickle

    np.testing.assert_array_equal(np.asarray(pickle.loads(pickle.dumps(v[10:20]))), full[10:20])


def test_vector_rows_normalise_any_finite_magnitude_and_name_a_zero_row(world, tmp_path):
    """float32 parts (clip-retrieval writes float16; float32 is allowed): a row x 1e20, whose float32 norm
    overflows, and one x 1e-25, whose squares underflow, read as their directions; a zero row is named."""
    import shutil

    cr = tmp_path / "cr"
    shutil.copytree(world["cr"], cr)
    part = cr / "img_emb" / "img_emb_00.npy"
    x = np.load(part).astype(np.float32)
    want = np.asarray(ClipRetrievalFolder(world["cr"]).vectors("image"))
    x[0] *= np.float32(1e20)
    x[1] *= np.float32(1e-25)
    np.save(part, x)
    got = np.asarray(ClipRetrievalFolder(cr).vectors("image"))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
    np.testing.assert_array_equal(got[2:], want[2:])
    x[1] = 0
    np.save(part, x)
    with pytest.raises(DataError, match=r"img_emb_00.npy: row 1 has an all-zero embedding"):
        np.asarray(ClipRetrievalFolder(cr).vectors("image"))


# -- mining from a clip-retrieval folder -------------------------------------------------------------
def _mined(out: Path) -> dict:
    return pq.read_table(sorted((out / "negatives").glob("part-*.parquet"))).to_pydict()


@pytest.mark.parametrize("direction", ["i2i", "t2t"])
def test_mining_a_clip_retrieval_folder_equals_the_same_vectors_as_parquet(tmp_path, direction):
    rng = np.random.default_rng(1)
    n = 120
    samples = [(f"/data/imgs/{i:04d}.jpg", f"caption number {i}", rng.normal(size=12), rng.normal(size=12))
               for i in range(n)]
    cr = write_clip_retrieval(tmp_path / "cr", samples, parts=4)
    byo = write_byo(tmp_path / "e.parquet", [("image", s[0], s[2]) for s in samples]
                    + [("text", s[1], s[3]) for s in samples])
    common = ["--direction", direction, "-k", "4", "--quiet", "--no-dup-filter"]
    assert main(["mine", "--corpus", str(cr), "--queries", str(cr), "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["mine", "--corpus", str(byo), "--queries", str(byo), "--out", str(tmp_path / "b"), *common]) == 0
    a, b = _mined(tmp_path / "a"), _mined(tmp_path / "b")
    for col in ("query_id", "rank", "negative_id", "score", "query_key", "negative_key"):
        assert a[col] == b[col], col
    assert len(a["query_id"]) == 4 * n


def _problem_peak(tmp_path: Path, n: int, d: int):
    rng = np.random.default_rng(2)
    img = rng.normal(size=(n, d))
    samples = [(f"shard/{i:05d}.jpg", f"a photo {i}", img[i], img[i] + 0.3 * rng.normal(size=d)) for i in range(n)]
    cr = write_clip_retrieval(tmp_path / f"cr{d}", samples, parts=3)
    cfg = build(MineConfig, dict(corpus=str(cr), queries=str(cr), out=str(tmp_path / f"o{d}"), direction="t2i", k=5,
                                 budget_mb=1))
    tracemalloc.start()
    problem = build_problem(cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return cfg, problem, peak


def test_mining_pairs_each_caption_with_its_own_image_and_stays_lazy(tmp_path):
    n = 2000
    _, small, peak_small = _problem_peak(tmp_path, n, 8)
    cfg, problem, peak = _problem_peak(tmp_path, n, 512)
    assert isinstance(problem.xb, VectorRows) and isinstance(problem.xq, VectorRows)  # nothing loaded whole
    assert isinstance(problem.pos_emb, VectorRows)
    assert peak - peak_small < 0.1 * n * 512 * 4  # memory holds ids and keys, never the (n, d) vectors
    s = mine(cfg)  # 2000 x 512 fp32 = 4 MB > --budget-mb 1: the exact pass streams the parts in tiles
    assert s["counts"]["queries"] == n and s["search"]["method"] == "exact" and s["search"]["tile_rows"] < n
    t = _mined(tmp_path / "o512")
    own = {f"a photo {i}": f"shard/{i:05d}.jpg" for i in range(n)}
    assert all(own[q] != neg for q, neg in zip(t["query_id"], t["negative_id"]))  # the pair's image excluded
    assert len(t["query_id"]) == 5 * n


def test_mining_ray_shards_read_clip_retrieval_slices(tmp_path):
    """The Ray path hands each actor a slice view: picklable, read by the actor."""
    from hardrank.executors.ray_search import _slice

    rng = np.random.default_rng(3)
    samples = [(f"{i}.jpg", f"c {i}", rng.normal(size=8), rng.normal(size=8)) for i in range(50)]
    v = ClipRetrievalFolder(write_clip_retrieval(tmp_path / "cr", samples, parts=2)).vectors("image")
    part = _slice(v, 20, 35)
    np.testing.assert_array_equal(np.asarray(part), np.asarray(v)[20:35])


# -- CLIP_benchmark result JSON ------------------------------------------------------------------------
def test_export_clip_benchmark_maps_names_directions_and_fractions(world, tmp_path):
    opts = {**world["opts"], "suites": ["rococo", "sugarcrepe"]}
    rep = evaluate(embeddings=str(world["byo"]), out=str(tmp_path / "res"), **opts)
    out = tmp_path / "cb"
    assert main(["export", str(tmp_path / "res"), "--format", "clip_benchmark", "--out", str(out)]) == 0
    files = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    label = rep.results[0]["checkpoint"]
    rococo = files[f"rococo_{label}_precomputed_en_zeroshot_retrieval.json"]
    assert set(rococo) == {"dataset", "model", "pretrained", "task", "metrics", "language", "caption_protocol"}
    assert rococo["caption_protocol"] == "blip"  # the default: BLIP's pre_caption, stated for comparability
    m = rep.results[0]["metrics"]
    assert rococo["metrics"]["image_retrieval_recall@5"] == pytest.approx(m["original"]["t2i"]["R@5"] / 100)  # t->i
    assert rococo["metrics"]["text_retrieval_recall@1"] == pytest.approx(m["original"]["i2t"]["R@1"] / 100)   # i->t
    mix = files[f"rococo_mix_0.9_s1_{label}_precomputed_en_zeroshot_retrieval.json"]["metrics"]
    assert set(mix) == {"image_retrieval_recall@1", "image_retrieval_recall@5", "image_retrieval_recall@10",
                        "image_retrieval_false_rate"}
    sc = files[f"sugar_crepe_add_att_{label}_precomputed_en_image_caption_selection.json"]
    acc = rep.results[1]["metrics"]["add_att"]["all"]["accuracy"] / 100
    assert sc["dataset"] == "sugar_crepe/add_att" and sc["metrics"] == {"acc": pytest.approx(acc),
                                                                        "text_acc": pytest.approx(acc),
                                                                        "image_acc": 1.0}
    assert all(0 <= v <= 1 for f in files.values() for v in f["metrics"].values())
    if importlib.util.find_spec("clip_benchmark") is None:
        pytest.skip("clip_benchmark not installed: its reader is not run (the format is checked above)")
    csv_path = tmp_path / "benchmark.csv"
    res = subprocess.run([sys.executable, "-m", "clip_benchmark.cli", "build", *map(str, sorted(out.glob("*.json"))),
                          "--output", str(csv_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {r["dataset"]: r for r in csv.DictReader(csv_path.open())}
    assert set(rows) == {f["dataset"] for f in files.values()}
    assert rows["rococo"]["model_fullname"] == f"precomputed {label}"
    assert float(rows["sugar_crepe/add_att"]["acc"]) == pytest.approx(acc)
    assert float(rows["rococo"]["image_retrieval_recall@5"]) == pytest.approx(m["original"]["t2i"]["R@5"] / 100)


def test_export_skips_mask_suites_and_names_them(tmp_path, capsys):
    golden = Path(__file__).parent / "golden"
    res = tmp_path / "res"
    for name in ("toy-clip_step0700__toy-hard-positives.json", "noisy__amodal.json"):
        ckpt, suite = name[:-5].split("__")
        (res / ckpt).mkdir(parents=True, exist_ok=True)
        (res / ckpt / f"{suite}.json").write_text((golden / name).read_text())
    assert main(["export", str(res), "--format", "clip_benchmark", "--out", str(tmp_path / "cb")]) == 0
    cap = capsys.readouterr()
    assert "skipped" in cap.err
    assert "amodal.json: task type 'mask' (amodal) has no CLIP_benchmark counterpart" in cap.err
    hp = json.loads((tmp_path / "cb" / "toy-hard-positives_toy_swap_toy-clip_step0700_toy-clip_en_"
                                       "image_caption_selection.json").read_text())["metrics"]
    assert hp == {"acc": 0.91666667, "text_acc": 0.91666667, "image_acc": 1.0, "augmented_acc": 0.88333333,
                  "brittleness": 0.03333333}


def test_clip_retrieval_folder_on_s3_mines_and_scores_like_the_local_one(world, tmp_path, s3):
    """A clip-retrieval output folder uploaded to a local S3 server, as --corpus/--queries and --embeddings."""
    for f in sorted(Path(world["cr"]).rglob("*")):
        if f.is_file():
            s3.put_file(str(f), f"bucket/cr/{f.relative_to(world['cr']).as_posix()}")
    common = ["--direction", "t2i", "-k", "3", "--quiet"]
    assert main(["mine", "--corpus", str(world["cr"]), "--queries", str(world["cr"]), "--out", str(tmp_path / "a"),
                 *common]) == 0
    assert main(["mine", "--corpus", "s3://bucket/cr", "--queries", "s3://bucket/cr/", "--out", str(tmp_path / "b"),
                 *common]) == 0
    a, b = _mined(tmp_path / "a"), _mined(tmp_path / "b")
    assert a == b and len(a["query_id"]) > 0
    opts = {**world["opts"], "suites": ["rococo"]}
    local = evaluate(embeddings=str(world["cr"]), out=str(tmp_path / "l"), **opts)
    remote = evaluate(embeddings="s3://bucket/cr", out=str(tmp_path / "r"), **opts)
    assert remote.results[0]["metrics"] == local.results[0]["metrics"]


def test_export_file_names_stay_in_out_whatever_a_result_names_its_model(tmp_path):
    """The fields come from result files (a user's): a model named ``..`` filled into ``{model}/...`` named the
    folder above --out; each field is one name part (separators and a value of dots alone become ``_``)."""
    golden = Path(__file__).parent / "golden" / "toy-clip_step0700__toy-hard-positives.json"
    res = tmp_path / "res" / "ckpt"
    res.mkdir(parents=True)
    result = json.loads(golden.read_text())
    result["provenance"]["architecture"] = ".."
    (res / "toy-hard-positives.json").write_text(json.dumps(result))
    out = tmp_path / "deep" / "cb"
    assert main(["export", str(tmp_path / "res"), "--format", "clip_benchmark", "--out", str(out), "--output",
                 "{model}/{dataset}.json"]) == 0
    written = [p for p in tmp_path.rglob("*.json") if not p.is_relative_to(tmp_path / "res")]
    assert written and all(p.is_relative_to(out) for p in written), written
    assert {p.parent.name for p in written} == {"__"}
