"""The newcomer's path: explained counts, measured ETAs, dry runs that build nothing, the report's every suite
type, store export round trips, human ids in mining, the NegCLIP export, the ARO order tagger."""
from __future__ import annotations

import ast
import csv
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, save_random_checkpoint, write_image, write_tiny_config

from hardrank import evaluate, plan
from hardrank.exports.store_ids import export_embeddings, list_stores
from hardrank.items import ImageRef, ItemTable
from hardrank.jobs.cli import main
from hardrank.jobs.progress import _LogLines, _Meter
from hardrank.jobs.report import build_report
from hardrank.scoring.counts import embed_line, item_counts


# -- progress: throughput measured after the first batch -------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_eta_comes_from_measured_throughput_not_the_first_batch():
    clock = _Clock()
    m = _Meter(total=1000, clock=clock)
    clock.t = 60.0        # the first batch carries a minute of start-up
    m.update(100)
    assert m.rate is None and m.text() == "measuring item/s, ETA after the second batch"
    for _ in range(4):    # then 100 items/s
        clock.t += 1.0
        m.update(100)
    assert m.rate == pytest.approx(100.0) and m.text() == "100 item/s, ETA 0:05"
    assert m.text(final=True) == "100 item/s, 0:04, done"
    # a bar created long before its stage starts (texts wait for images) does not count the wait
    out = io.StringIO()
    bar = _LogLines(500, "embed texts", out, interval=0.0, clock=clock)
    clock.t += 300.0
    bar.update(50)
    clock.t += 0.5
    bar.update(50)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[1] == "embed texts: 100/500 (20%) 100 item/s, ETA 0:04"
    assert lines[-1] == "embed texts: 100/500 (20%) 100 item/s, 0:00, done"



def test_throughput_counts_only_what_was_encoded():
    """A batch with failed images reaches the bar as its failures, then its encoded rows, microseconds
    apart: the failures advance the count, never the rate (it read 5,000,000 item/s here)."""
    from hardrank.embed import EmbedSink, EmbedStats

    class Ticking:  # 1 us passes on every reading
        def __init__(self):
            self.t = 0.0

        def __call__(self):
            self.t += 1e-6
            return self.t

    clock, out = Ticking(), io.StringIO()
    bar = _LogLines(16, "embed images", out, interval=1e9, clock=clock)
    table = ItemTable("image")
    table.add_many([ImageRef(f"/data/{i}.jpg") for i in range(16)])
    sink = EmbedSink(table, [f"k{i}" for i in range(16)], [], [], EmbedStats(total=16), flush_rows=1000,
                     max_failures=None, bar=bar)
    ok = np.array([False] * 3 + [True] * 5)
    sink.deliver({"rows": np.arange(8), "ok": ok, "error": ["truncated"] * 3 + [None] * 5, "emb": []})
    assert bar.meter.n == 8 and bar.meter.rate is None  # one encoded batch: no rate yet
    clock.t += 1.0
    sink.deliver({"rows": np.arange(8, 16), "ok": np.ones(8, bool), "error": [None] * 8, "emb": []})
    assert bar.meter.rate == pytest.approx(8.0, rel=1e-4)  # the second batch's 8 rows in 1 s
    bar.close()
    assert out.getvalue().splitlines()[-1] == "embed images: 16/16 (100%) 8 item/s, 0:01, done; 3 failed"
    assert sink.stats.encoded == 13 and len(sink.stats.failures) == 3
    m = _Meter(total=10)  # failures alone: no rate at all, whatever their timing
    m.skip(4)
    m.skip(6)
    assert m.rate is None and m.n == 10

# -- counts name their duplicates ------------------------------------------------------------------
def test_counts_name_duplicates_and_unreadable_images(tmp_path):
    rng = np.random.default_rng(0)
    write_image(tmp_path / "a.jpg", rng)
    (tmp_path / "copy_of_a.jpg").write_bytes((tmp_path / "a.jpg").read_bytes())
    write_image(tmp_path / "b.jpg", rng)
    t = ItemTable("image")
    t.add_many([ImageRef(str(tmp_path / n)) for n in ("a.jpg", "copy_of_a.jpg", "b.jpg", "missing.jpg")])
    assert item_counts(t) == {"rows": 4, "unreadable": 1, "distinct": 2, "duplicates": 1}

    class Stats:
        encoded, failed, seconds = 1, 1, 0.25

    assert embed_line("image", Stats, t, 3) == (
        "images: 4 images = 2 distinct + 1 duplicates (same content under another name, embedded once); "
        "1 from the store, 1 encoded x 3 checkpoint(s), 1 failed (0.2s)")

    class Mixed:  # one checkpoint evaluated before, one new: the line names each
        encoded, failed, seconds = 2, 1, 0.25
        per_checkpoint = [{"from_store": 2, "encoded": 0}, {"from_store": 0, "encoded": 2}]

    assert embed_line("image", Mixed, t, 2, labels=["step0700", "step0800"]).endswith(
        "; per checkpoint, from the store + encoded: step0700 2 + 0, step0800 0 + 2; 1 failed (0.2s)")


# -- dry runs build nothing ------------------------------------------------------------------------
def test_dry_run_reports_a_missing_toy_world_instead_of_building_it(tmp_path, capsys):
    from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL

    world = tmp_path / "world"
    p = plan(model=str(TOY_MODEL), checkpoints=[str(TOY_CHECKPOINTS / "toy-clip_step0700.safetensors")],
             suites=["toy"], data=str(world), out=str(tmp_path / "out"), store=str(tmp_path / "store"))
    assert p["would_build"]["toy world"] == str(world) and p["suites"] == {}
    assert main(["demo", "--out", str(tmp_path / "demo"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"the toy world is not built yet: a real run first builds it in {tmp_path / 'demo' / 'toy_world'}" in out
    assert "its world would be built in" in out
    assert not world.exists() and not (tmp_path / "demo").exists() and not (tmp_path / "store").exists()


# -- the report shows every suite type; checkpoints without a step are listed beside the steps ------
def _result(root, label, suite, task_type, metrics, **extra):
    d = root / label
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{suite}.json").write_text(json.dumps({"suite": suite, "checkpoint": label, "task_type": task_type,
                                                 "metrics": metrics, **extra}))


def test_report_mask_suites_and_unstepped_checkpoints(tmp_path):
    res = tmp_path / "res"
    for step, g in ((100, 30.0), (20, 20.0)):
        _result(res, f"run_step{step:04d}", "amodal", "mask",
                {"visible": {"gIoU": g, "cIoU": g - 5}, "amodal": {"gIoU": g + 10, "cIoU": g + 4}},
                baseline="clip-regions")
        _result(res, f"run_step{step:04d}", "hp", "choice",
                {"replace": {"all": {"augmented_accuracy": g + 40, "original_accuracy": g + 50}}})
    _result(res, "noisy", "amodal", "mask", {"visible": {"gIoU": 57.5, "cIoU": 60.0},
                                             "amodal": {"gIoU": 69.5, "cIoU": 70.25}}, predictions="preds/noisy")
    paths = build_report(res)
    rows = list(csv.DictReader(paths["csv"].open()))
    assert list(rows[0])[:8] == ["checkpoint", "step", "step_unit", "order", "suite", "task_type", "main_metric",
                                 "main"]
    assert [(r["checkpoint"], r["step"], r["step_unit"], r["order"], r["suite"]) for r in rows] == [
        ("run_step0020", "20", "step", "0", "hp"), ("run_step0020", "20", "step", "0", "amodal"),
        ("run_step0100", "100", "step", "1", "hp"), ("run_step0100", "100", "step", "1", "amodal"),
        ("noisy", "", "", "2", "amodal")]        # choice before mask suites; the unstepped checkpoint last
    noisy = rows[-1]
    assert (noisy["main_metric"], float(noisy["main"])) == ("amodal gIoU", 69.5)
    assert float(noisy["visible cIoU"]) == 60.0 and float(noisy["amodal cIoU"]) == 70.25
    page = paths["html"].read_text()
    assert "<h2>Mask suite: amodal</h2>" in page and "baseline clip-regions" in page
    assert '<td class="num best">69.50</td>' in page and "No step in the name of noisy" in page
    assert "<th>step</th>" in page and page.count('<img class="plot"') == 2  # vs step + heatmap (no ranking)
    md = paths["md"].read_text()
    assert "| checkpoint | step | hp | amodal |" in md and "| noisy | - | - | **69.50** |" in md


# -- store export: human ids, and the same metrics read back as bring-your-own embeddings ----------
@pytest.fixture(scope="module")
def kworld(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer_world")
    w = make_karpathy_world(root, n_images=8)
    w["cfg"] = write_tiny_config(root)
    w["ckpt"] = save_random_checkpoint(w["cfg"], root / "m.safetensors", 0)
    # an ARO VG-Relation file: two crops of one image, to name regions (PATH@crop:x,y,w,h)
    im = w["clean"][0]["image"]
    rel = [{"image_path": im, "bbox_x": bx, "bbox_y": 0, "bbox_w": 20, "bbox_h": 20, "relation_name": "on",
            "true_caption": f"the dog is on the mat {i}", "false_caption": f"the mat is on the dog {i}"}
           for i, bx in enumerate((0, 15))]
    (w["annotations"] / "visual_genome_relation.json").write_text(json.dumps(rel))  # --data: RoCOCO's and ARO's
    return w


def test_store_export_round_trips_through_bring_your_own_embeddings(kworld, tmp_path, capsys):
    w = kworld
    base = dict(suites=["rococo", "aro"], annotations=str(w["annotations"]), images=str(w["images"]),
                data=str(w["annotations"]), image_variants=["mix_0.9"], store=str(tmp_path / "store"))
    model = evaluate(model=str(w["cfg"]), checkpoints=[str(w["ckpt"])], out=str(tmp_path / "a"), **base)
    out = tmp_path / "emb.parquet"
    s = export_embeddings(model=str(w["cfg"]), checkpoints=[str(w["ckpt"])], out=out, **base)
    t = pq.read_table(out)
    assert t.column_names == ["kind", "id", "embedding", "key"] and str(t.schema.field("embedding").type).startswith(
        "fixed_size_list")
    ids = set(t.column("id").to_pylist())
    im = w["clean"][0]["image"]
    assert {im, f"mix_0.9_s1/{im}", f"{im}@crop:0,0,20,20", f"{im}@crop:15,0,20,20"} <= ids
    assert w["clean"][1]["caption"][0] in ids and "the dog is on the mat 0" in ids
    assert "A dog or a dog number 0." in ids  # a RoCOCO perturbed caption, as written
    byo = evaluate(embeddings=str(out), out=str(tmp_path / "b"), **base)
    assert [r["metrics"] for r in byo.results] == [r["metrics"] for r in model.results]
    assert [r["suite"] for r in byo.results] == ["rococo", "aro"]
    # the same through the CLI, by fingerprint folder; and `store list` names the checkpoint
    folder = tmp_path / "store" / s["fingerprint"]
    assert main(["store", "export", str(folder), "--suite", "rococo", "--annotations", str(w["annotations"]),
                 "--images", str(w["images"]), "--image-variants", "mix_0.9",
                 "--out", str(tmp_path / "e2.parquet")]) == 0
    assert "images" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "e2.parquet").num_rows < t.num_rows  # rococo only
    assert list_stores(tmp_path / "store")[0]["checkpoint"] == str(w["ckpt"])
    # a store without these embeddings: named, with the fix
    assert main(["store", "export", "--model", str(w["cfg"]), "--checkpoint", str(w["ckpt"]), "--suite", "rococo",
                 "--annotations", str(w["annotations"]), "--images", str(w["images"]), "--store",
                 str(tmp_path / "empty"), "--out", str(tmp_path / "x.parquet")]) == 3
    assert "run `hardrank eval` with the same model" in capsys.readouterr().err



def test_store_list_shows_checkpoints_relative_here_and_says_when_they_are_gone(kworld, tmp_path, monkeypatch,
                                                                                 capsys):
    import shutil

    from hardrank import EmbedOptions, EmbedPipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpts").mkdir()
    shutil.copy(kworld["ckpt"], tmp_path / "ckpts" / "step1.safetensors")
    pipe = EmbedPipeline.from_checkpoints(str(kworld["cfg"]), ["ckpts/step1.safetensors"],
                                          EmbedOptions(store="store", device="cpu"))
    assert len(pipe.stores) == 1  # the folder and its manifest, as any run makes them
    (row,) = list_stores("store")
    assert row["checkpoint"] == str(tmp_path / "ckpts" / "step1.safetensors")  # recorded absolute
    assert row["checkpoint_exists"] is True
    assert main(["store", "list", "store"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith("  checkpoint ckpts/step1.safetensors")  # relative to this folder
    (tmp_path / "ckpts" / "step1.safetensors").unlink()
    assert main(["store", "list", "store"]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith("  checkpoint ckpts/step1.safetensors (no longer exists)")
    assert main(["store", "list", "store", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["checkpoint_exists"] is False
    monkeypatch.chdir(kworld["annotations"])  # from another folder: the absolute path
    assert main(["store", "list", str(tmp_path / "store")]) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(
        f"  checkpoint {tmp_path / 'ckpts' / 'step1.safetensors'} (no longer exists)")


def test_store_export_writes_what_the_store_holds_and_lists_the_rest(kworld, tmp_path, capsys):
    """An image that fails to decode is never stored, so no eval can fill the gap: the export writes the
    rest and lists what is missing (it refused with exit 3, advising that eval)."""
    w = make_karpathy_world(tmp_path / "w", n_images=4, image_variants=())
    broken = w["clean"][1]["image"]
    (w["images"] / broken).write_bytes(b"these bytes are no image")  # readable, not decodable
    common = ["--model", str(kworld["cfg"]), "--checkpoint", str(kworld["ckpt"]), "--suite", "karpathy",
              "--annotations", str(w["annotations"]), "--images", str(w["images"]), "--store", str(tmp_path / "s")]
    assert main(["eval", *common, "--out", str(tmp_path / "res"), "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "emb.parquet"
    assert main(["store", "export", *common, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (f"not in the store, so not exported: 1 images, 0 texts, e.g. ['{broken}']; all listed in "
                        f"{tmp_path / 'emb.missing.jsonl'}")
    assert "an image that failed to decode is never stored" in lines[2]
    t = pq.read_table(out).to_pydict()
    assert t["kind"].count("image") == 3 and broken not in t["id"]
    assert t["kind"].count("text") == sum(len(set(it["caption"])) for it in w["clean"])  # every caption
    assert [json.loads(x) for x in (tmp_path / "emb.missing.jsonl").read_text().splitlines()] == [
        {"kind": "image", "id": broken}]
    meta = json.loads(pq.read_schema(out).metadata[b"hardrank_export"])
    assert meta["missing"] == {"image": 1, "text": 0}
    # the image fixed and embedded: a full export, and the stale list is gone
    write_image(w["images"] / broken, np.random.default_rng(5))
    assert main(["eval", *common, "--out", str(tmp_path / "res2"), "--quiet"]) == 0
    s = export_embeddings(model=str(kworld["cfg"]), checkpoints=[str(kworld["ckpt"])], suites=["karpathy"],
                          annotations=str(w["annotations"]), images=str(w["images"]), store=str(tmp_path / "s"),
                          out=out)
    assert s["counts"]["image"] == {"rows": 4, "unreadable": 0, "missing": 0} and s["missing_list"] is None
    assert not (tmp_path / "emb.missing.jsonl").exists()

# -- mining: human ids, keys, the NegCLIP table ----------------------------------------------------
def test_mining_ids_share_one_root_and_the_negclip_table_is_loadable(kworld, tmp_path, capsys):
    w = kworld
    ann = w["annotations"] / "coco_karpathy_test.json"
    out = tmp_path / "mined"
    tsv = tmp_path / "negclip.tsv"
    assert main(["mine", "--model", str(w["cfg"]), "--checkpoint", str(w["ckpt"]), "--store", str(tmp_path / "s"),
                 "--queries", str(ann), "--images", str(w["images"]), "--corpus", str(w["images"] / "val2014"),
                 "--direction", "t2i", "-k", "3", "--no-dup-filter",  # a random tiny model: images all alike
                 "--out", str(out), "--export-training", str(tsv), "--quiet"]) == 0
    # stdout: a few lines a person reads, and where the summary is (its ~40 lines of JSON stay in the file)
    lines = capsys.readouterr().out.splitlines()
    n_q = sum(len(set(it["caption"])) for it in kworld["clean"])
    assert lines[0] == f"{n_q} text queries x 8 image corpus items: {3 * n_q} negatives (k 3), 0 queries short of k"
    assert lines[1] == "dropped: 0 near duplicates of a positive, 0 above --max-sim, 0 below --min-sim"
    assert re.fullmatch(r"search: exact \(kernels\.topk, fp32\); 1 block\(s\) computed, 0 reused; \d+\.\ds", lines[2])
    assert lines[3] == (f"recall@3 of the written negatives 1.000 on {n_q} sampled queries, against mining with "
                        f"exact search (target 0.95: met)")
    assert re.fullmatch(r"memory: peak anonymous [\d,]+ MiB \(aim: start-up [\d,]+ \+ vectors \d+ \+ ids \d+ \+ "
                        r"budget 1,024 \+ 10% \(>= 64\) = [\d,]+ MiB: met\); file-backed peak [\d,]+ MiB "
                        r"\(start-up [\d,]+: libraries; the rest: mapped corpus and index pages, reclaimable\)",
                        lines[4]), lines[4]
    assert lines[5:] == [f"negatives  {out / 'negatives' / 'part-*.parquet'}", f"training   {tsv} ({n_q} rows)",
                         f"summary    {out / 'summary.json'}"]
    t = pq.read_table(out / "negatives" / "part-000000.parquet").to_pydict()
    assert all(n.startswith("val2014/COCO_val2014_") for n in t["negative_id"])  # relative to --images
    assert all(k.startswith("i") for k in t["negative_key"]) and all(k.startswith("t") for k in t["query_key"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["inputs"]["ids"]["image_root"] == str(w["images"])
    rows = list(csv.DictReader(tsv.open(), delimiter="\t"))
    assert list(rows[0]) == ["filepath", "title", "neg_caption", "neg_image"]
    n_pairs = sum(len(it["caption"]) for it in w["clean"])
    assert summary["training"]["rows"] + summary["training"]["dropped_without_negatives"] == n_pairs - 1  # a dup
    for r in rows:  # what NegCLIP's CsvDataset does with a row: every list non-empty, every index a row
        caps, imgs = ast.literal_eval(r["neg_caption"]), ast.literal_eval(r["neg_image"])
        assert caps and imgs and all(0 <= j < len(rows) for j in imgs)
        assert len(caps) <= 3 and len(imgs) <= 3  # one caption per negative image, not its 5-6 (k x 5 a row)
        assert all(rows[j]["filepath"] != r["filepath"] for j in imgs)         # never the row's own image
        assert r["title"] not in caps
        assert r["filepath"].startswith(str(w["images"]))
    # a bad name fails before any work, naming the formats
    assert main(["mine", "--model", str(w["cfg"]), "--checkpoint", str(w["ckpt"]), "--store", str(tmp_path / "s"),
                 "--queries", str(ann), "--images", str(w["images"]), "--corpus", str(w["images"] / "val2014"),
                 "--out", str(tmp_path / "m2"), "--export-training", str(tmp_path / "t.txt"), "--quiet"]) == 2
    assert not (tmp_path / "m2" / "negatives" / "part-000000.parquet").exists()


def test_mining_from_an_exported_file_names_captions_by_their_text(tmp_path):
    import pyarrow as pa

    rng = np.random.default_rng(1)
    caps = [f"caption number {i}" for i in range(12)]
    emb = rng.standard_normal((12, 8)).astype(np.float32)
    pq.write_table(pa.table({"kind": ["text"] * 12, "id": caps, "embedding": emb.tolist()}), tmp_path / "e.parquet")
    out = tmp_path / "t2t"
    assert main(["mine", "--corpus", str(tmp_path / "e.parquet"), "--queries", str(tmp_path / "e.parquet"),
                 "--direction", "t2t", "-k", "2", "--out", str(out), "--export-training", str(tmp_path / "t.jsonl"),
                 "--quiet"]) == 0
    t = pq.read_table(out / "negatives" / "part-000000.parquet").to_pydict()
    assert set(t["query_id"]) == set(caps) and set(t["negative_id"]) <= set(caps)
    assert all(q != n for q, n in zip(t["query_id"], t["negative_id"]))
    line = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert line["query"] == caps[0] and len(line["negatives"]) == 2 and len(line["scores"]) == 2


# -- ARO order tasks: spaCy's tags when installed, else the word lists, recorded ---------------------
class _Tok:
    def __init__(self, text, tag):
        self.text, self.tag_ = text, tag


class _FakeNLP:
    """Stands in for spacy.load("en_core_web_sm"): Penn tags from a fixed table."""

    TAGS = {"dog": "NN", "grass": "NN", "green": "JJ", "big": "JJ", "runs": "VBZ", "on": "IN", "the": "DT",
            "a": "DT"}

    def pipe(self, texts, batch_size=256):
        for t in texts:
            yield [_Tok(w, self.TAGS.get(w.lower(), "NN")) for w in t.split()]


def test_order_tasks_use_spacy_tags_when_installed(tmp_path, monkeypatch):
    from hardrank.items import Tables
    from hardrank.suites import SUITES, SuiteOptions, aro

    cap = "a big dog runs on the green grass"
    tagger = aro.OrderTagger(nlp=_FakeNLP(), name="spacy (test stand-in)")
    for seed in range(5):
        shuffled = aro.order_perturbations(cap, np.random.default_rng(seed), tagger)[0].split()
        assert [shuffled[i] for i in (0, 3, 4, 5)] == ["a", "runs", "on", "the"]  # not nouns/adjectives: kept
        assert {shuffled[2], shuffled[7]} == {"dog", "grass"} and {shuffled[1], shuffled[6]} == {"big", "green"}
    write_image(tmp_path / "imgs" / "0.jpg", np.random.default_rng(0))
    (tmp_path / "coco_karpathy_test.json").write_text(json.dumps([{"image": "0.jpg", "caption": [cap]}]))
    opts = SuiteOptions(annotations=str(tmp_path), images=str(tmp_path / "imgs"))
    monkeypatch.setattr(aro, "order_tagger", lambda: tagger)
    assert SUITES["coco_order"](Tables.empty(), opts).meta["pos_tagger"] == "spacy (test stand-in)"
    monkeypatch.setattr(aro, "order_tagger", lambda: aro.WORD_LISTS)
    meta = SUITES["coco_order"](Tables.empty(), opts).meta
    assert meta["pos_tagger"].startswith("word lists") and meta["trigram_tokenizer"].startswith("regex")


# -- small batches: no fixed cost per batch --------------------------------------------------------
def test_openmp_threads_sleep_between_regions_unless_the_user_chose():
    """Importing hardrank sets libgomp's wait policy before torch loads it: spinning threads made each
    small op cost a scheduler time slice on busy cores (--batch-size 8 ran 7x slower than the default)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def spin_count(**extra) -> int:
        proc = subprocess.run([sys.executable, "-c", "import hardrank, torch; torch.ones(4096).sum()"],
                              env={**env, "OMP_DISPLAY_ENV": "VERBOSE", **extra}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = re.search(r"GOMP_SPINCOUNT = '(\d+)'", proc.stderr)
        if found is None:
            pytest.skip("torch's OpenMP runtime here is not libgomp")
        return int(found.group(1))

    assert spin_count() == 0                           # PASSIVE: sleep at once
    assert spin_count(OMP_WAIT_POLICY="ACTIVE") > 0    # the user's choice stands


def test_small_batches_build_stages_and_commit_shards_once_per_run(kworld, tmp_path, monkeypatch):
    """--batch-size 1: every batch is encoded by K checkpoints, but the decoder, the encoder stage and
    each store's shard are made once per modality, not once per batch."""
    from hardrank import EmbedOptions, EmbedPipeline, Tables
    from hardrank.encoding import decode, job
    from hardrank.store import EmbeddingStore
    from hardrank.suites import SuiteOptions, load_suites

    w = kworld
    calls: Counter = Counter()

    def counted(cls, name):
        real = getattr(cls, name)

        def spy(self, *a, **k):
            calls[f"{cls.__name__}.{name}"] += 1
            return real(self, *a, **k)
        monkeypatch.setattr(cls, name, spy)

    for cls, name in ((EmbeddingStore, "write"), (EmbeddingStore, "write_manifest"), (job.DecodeStage, "__init__"),
                      (job.EncodeStage, "__init__"), (job.EncodeStage, "__call__"),
                      (decode.PillowDecoder, "__init__")):
        counted(cls, name)
    second = save_random_checkpoint(w["cfg"], tmp_path / "m2.safetensors", 1)
    tables = Tables.empty()
    load_suites(["karpathy"], tables, SuiteOptions(annotations=str(w["annotations"]), images=str(w["images"])))
    pipe = EmbedPipeline.from_checkpoints(str(w["cfg"]), [str(w["ckpt"]), str(second)],
                                          EmbedOptions(store=str(tmp_path / "store"), batch_size=1, device="cpu"))
    st = pipe.run(tables)
    n_images, n_texts = st["image"].encoded, st["text"].encoded
    assert n_images == 8 and n_texts == 40
    assert calls["EncodeStage.__call__"] == n_images + n_texts                  # one batch per item
    assert calls["EncodeStage.__init__"] == calls["DecodeStage.__init__"] == 2  # once per modality
    assert calls["PillowDecoder.__init__"] == 1
    assert calls["EmbeddingStore.write"] == 2 * 2                               # 2 stores x 2 modalities
    # per store: when created, when the run takes its lock, after each of its 2 shards
    assert calls["EmbeddingStore.write_manifest"] == 2 * (1 + 1 + 2)


# -- mining says what it is about to do, and for how long -----------------------------------------
def test_mining_prints_its_plan_and_an_estimate_before_the_search(tmp_path, monkeypatch):
    from hardrank.config import MineOptions
    from hardrank.mining import MineProblem, mine_arrays
    from hardrank.mining import run as mine_run

    rng = np.random.default_rng(3)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [f"caption {i}" for i in range(600)]
    prob = MineProblem(xq=x, xb=x, query_ids=ids, corpus_ids=ids, modality="text", direction="t2t",
                       exclude_ptr=np.arange(601), exclude_idx=np.arange(600))
    said: list[str] = []
    opts = MineOptions(k=2, block_size=256, dup_threshold=None)
    monkeypatch.setattr(mine_run, "_ESTIMATE_PAIRS", 600 * 600 + 1)  # just above this search: no estimate
    mine_arrays(prob, opts, tmp_path / "small", echo=said.append)
    assert said[0] == ("plan: 600 text queries x 600 text corpus items (8-d), top 2 each by exact search "
                       "(kernels.topk, the corpus streamed in tiles); 3 block(s) of up to 256 queries")
    assert said[1] == "why: auto: 600 x 600 x 8 multiply-adds take seconds"
    assert not any(s.startswith("estimated") for s in said)
    said.clear()
    monkeypatch.setattr(mine_run, "_ESTIMATE_PAIRS", 600 * 600)  # as large as the threshold: timed first
    (tmp_path / "big" / "negatives").mkdir(parents=True)
    s = mine_arrays(prob, opts, tmp_path / "big", echo=said.append)
    assert said[0].startswith("plan: 600 text queries x 600 text corpus items")
    # a model of the pass over the corpus (no queries searched and thrown away to time it)
    assert re.fullmatch(r"estimated search time \d+:\d\d \(a pass over the corpus per block of queries, at the "
                        r"exact kernel's measured rate\)", said[2])
    assert re.fullmatch(r"block 1/3: 256 queries \(1/3 this run, \d+\.\ds, [\d,]+ queries/s, ETA \d+:\d\d\)", said[3])
    assert re.fullmatch(r"block 3/3: 88 queries \(3/3 this run, \d+\.\ds, [\d,]+ queries/s\)", said[5])
    assert set(s["timings"]) >= {"search", "total"} and "estimate" not in s["timings"]
    assert s["counts"]["negatives"] == 1200
    said.clear()
    (tmp_path / "big" / "negatives" / "part-000001.parquet").unlink()  # a resumed run plans what is left
    mine_arrays(prob, opts, tmp_path / "big", echo=said.append)
    assert said[0].endswith("3 block(s) of up to 256 queries (2 done, 1 to run)")
    assert not any(s.startswith("estimated") for s in said)  # 256 x 600 pairs: under the threshold
