"""Crossmodal-3600 multilingual retrieval: captions.jsonl per language, one result each, one encode pass."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import save_random_checkpoint, write_image, write_tiny_config

from hardrank import SuiteOptions, Tables, evaluate
from hardrank.config import build
from hardrank.errors import DataError, UsageError
from hardrank.inputs import registry
from hardrank.jobs.cli import main
from hardrank.suites import load_suites
from hardrank.text import pre_caption

KEYS = ["000411001ff7dd4f", "0005e2e5a4d6a1b2", "00085a8c4b5f3e21", "000b2c4f77d9e0aa"]
# per image: en (two captions, the second with BLIP-stripped punctuation), de, zh (full-width punctuation)
CAPTIONS = {
    "en": [[f"A Red bus number {i}.", f"Bus #{i}: parked (by a tree)!"] for i in range(4)],
    "de": [[f"Ein roter Bus Nummer {i}."] for i in range(4)],
    "zh": [[f"一辆红色的公共汽车，编号{i}。", f"公交车{i}号"] for i in range(4)],
}


def _line(i: int, langs=("en", "de", "zh"), **override) -> dict:
    item = {"image/key": KEYS[i], "image/locale": "en"}
    for lang in langs:
        caps = CAPTIONS[lang][i]
        item[lang] = {"caption": caps, "caption/tokenized": caps, "caption/tokenized/lowercase": [c.lower()
                                                                                                  for c in caps]}
    item.update(override)
    return item


def _write(root, lines) -> str:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "captions.jsonl"
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def xm(tmp_path_factory):
    """XM3600's layout: captions.jsonl and images/<image/key>.jpg (the fourth image lacks German)."""
    root = tmp_path_factory.mktemp("xm3600") / "xm3600"
    ann = _write(root, [_line(0), _line(1), _line(2), _line(3, langs=("en", "zh"))])
    rng = np.random.default_rng(0)
    for k in KEYS:
        write_image(root / "images" / f"{k}.jpg", rng)
    return root, ann


def _load(**opts):
    tables = Tables.empty()
    return load_suites(["xm3600"], tables, build(SuiteOptions, opts)), tables


def test_one_suite_per_language_sharing_the_images(xm):
    root, ann = xm
    suites, tables = _load(annotations=ann)
    assert [s.name for s in suites] == ["xm3600-en", "xm3600-de", "xm3600-zh"]  # file order
    assert len(tables.images) == 4  # every language ranks the same 4 image rows: decoded and encoded once
    en, de, zh = suites
    assert en.meta["language"] == "en" and en.meta["caption_protocol"] == "raw"  # the suite's default
    assert (en.meta["images"], en.meta["captions"]) == (4, 8)
    assert (de.meta["images"], de.meta["captions"], de.meta["images_without_language"]) == (3, 3, 1)
    assert set(en.meta["languages_in_file"]) == {"en", "de", "zh"}
    i2t = zh.ranking[0]
    assert [tables.texts.entries[r] for r in i2t.gallery_items[:2]] == CAPTIONS["zh"][0]  # as written
    assert i2t.query_ids == [f"{k}.jpg" for k in KEYS]
    assert tables.images.entries[0].uri == str(root / "images" / f"{KEYS[0]}.jpg")
    t2i = de.ranking[1]
    assert [t2i.gallery_ids[p] for p in t2i.pos_idx] == [f"{k}.jpg" for k in KEYS[:3]]


def test_language_choice_protocol_and_first_caption(xm):
    _, ann = xm
    suites, tables = _load(annotations=ann, languages=("zh", "en"), caption_protocol="blip",
                           captions_per_image="first")
    assert [s.name for s in suites] == ["xm3600-zh", "xm3600-en"]
    en = suites[1]
    texts = [tables.texts.entries[r] for r in en.ranking[0].gallery_items]
    assert texts == [pre_caption(CAPTIONS["en"][i][0]) for i in range(4)]  # BLIP's on request, first only
    assert en.meta["caption_protocol"] == "blip" and en.meta["captions_per_image"] == "first"


def test_bad_input_names_the_file_line_and_fix(xm, tmp_path):
    _, ann = xm
    with pytest.raises(UsageError, match=r"language\(s\) \['fr'\] not in .*captions.jsonl; it has \['de', 'en', "
                                         r"'zh'\]"):
        _load(annotations=ann, languages=("en", "fr"))
    empty = _write(tmp_path / "a", [_line(0), _line(1, de={"caption": []})])
    with pytest.raises(DataError, match=r"line 2 \(image 0005e2e5a4d6a1b2\), language 'de': .*'caption' = \[\]"):
        _load(annotations=empty)
    _load(annotations=empty, languages=("en",))  # a language not asked for is not read
    nocap = _write(tmp_path / "b", [_line(0, de={"caption/tokenized": ["x"]})])
    with pytest.raises(DataError, match=r"line 1 .* language 'de': .*keys \['caption/tokenized'\]"):
        _load(annotations=nocap)
    nokey = _write(tmp_path / "c", [{"en": {"caption": ["a"]}}])
    with pytest.raises(DataError, match=r"line 1 has no 'image/key'"):
        _load(annotations=nokey)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "captions.jsonl").write_text(json.dumps(_line(0)) + "\n{not json\n")
    with pytest.raises(DataError, match=r"line 2 is not valid JSON"):
        _load(annotations=str(tmp_path / "d"))  # a folder holding captions.jsonl
    with pytest.raises(UsageError, match=r"captions_per_image"):
        build(SuiteOptions, {"captions_per_image": "two"})


def _byo(xm, tmp_path):
    """Embeddings where every German caption sits on its image and every English one on the next image."""
    root, _ = xm
    rng = np.random.default_rng(1)
    img = {k: rng.normal(size=8) for k in KEYS}
    rows = [("image", f"{k}.jpg", img[k]) for k in KEYS]
    for i, k in enumerate(KEYS):
        rows += [("text", c, img[k] + 0.01 * rng.normal(size=8)) for c in CAPTIONS["de"][i]]
        rows += [("text", c, img[KEYS[(i + 1) % 4]]) for c in CAPTIONS["en"][i]]
        rows += [("text", c, rng.normal(size=8)) for c in CAPTIONS["zh"][i]]
    unit = [(v / np.linalg.norm(v)).astype(np.float32).tolist() for _, _, v in rows]
    path = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"kind": [r[0] for r in rows], "id": [r[1] for r in rows], "embedding": unit}), path)
    return path


def test_eval_writes_one_result_per_language_and_exports_them(xm, tmp_path):
    _, ann = xm
    rep = evaluate(embeddings=str(_byo(xm, tmp_path)), suites=["xm3600"], annotations=ann,
                   out=str(tmp_path / "res"), languages=["de", "en"])
    by = {r["suite"]: r for r in rep.results}
    assert set(by) == {"xm3600-de", "xm3600-en"}
    de, en = by["xm3600-de"], by["xm3600-en"]
    assert (de["language"], en["language"]) == ("de", "en") and de["caption_protocol"] == "raw"
    assert de["metrics"]["original"]["t2i"]["R@1"] == 100.0 and de["metrics"]["original"]["i2t"]["R@1"] == 100.0
    assert en["metrics"]["original"]["t2i"]["R@1"] == 0.0  # every English caption points at the next image
    assert de["counts"]["original"]["t2i"] == {"queries": 3, "gallery": 3}
    label = de["checkpoint"]
    assert (tmp_path / "res" / label / "xm3600-de.json").is_file()
    assert main(["export", str(tmp_path / "res"), "--format", "clip_benchmark", "--out", str(tmp_path / "cb")]) == 0
    recs = {p.name: json.loads(p.read_text()) for p in (tmp_path / "cb").glob("*.json")}
    assert set(recs) == {f"crossmodal3600_{label}_precomputed_{lang}_zeroshot_retrieval.json" for lang in ("de", "en")}
    rec = recs[f"crossmodal3600_{label}_precomputed_de_zeroshot_retrieval.json"]
    assert rec["dataset"] == "crossmodal3600" and rec["language"] == "de" and rec["caption_protocol"] == "raw"
    assert rec["metrics"]["image_retrieval_recall@1"] == 1.0


def test_model_run_encodes_each_image_once_for_all_languages(xm, tmp_path):
    _, ann = xm
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "a.safetensors", 0)
    rep = evaluate(model=str(cfg), checkpoints=[str(ckpt)], suites=["xm3600"], annotations=ann,
                   out=str(tmp_path / "out"), store=str(tmp_path / "store"), device="cpu")
    assert sorted(r["suite"] for r in rep.results) == ["xm3600-de", "xm3600-en", "xm3600-zh"]
    assert rep.embed_stats["image"]["encoded"] == 4  # 4 images, 3 languages: one pass
    assert rep.embed_stats["text"]["encoded"] == 8 + 3 + 8


def test_cli_language_flag(xm, tmp_path):
    _, ann = xm
    emb = _byo(xm, tmp_path)
    assert main(["eval", "--suite", "xm3600", "--annotations", ann, "--language", "zh", "de", "--embeddings",
                 str(emb), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "o").rglob("*.json")) == ["xm3600-de.json", "xm3600-zh.json"]
    assert main(["eval", "--suite", "xm3600", "--annotations", ann, "--language", "xx", "--embeddings", str(emb),
                 "--out", str(tmp_path / "o2"), "--quiet"]) == 2


def test_the_table_shows_one_row_per_language(xm, tmp_path, capsys):
    """The terminal table had one row per checkpoint, without the language, holding the last language's numbers
    (the JSON files were right): now one row per (checkpoint, language), the language in its label."""
    _, ann = xm
    assert main(["eval", "--suite", "xm3600", "--annotations", ann, "--language", "en", "de", "--embeddings",
                 str(_byo(xm, tmp_path)), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["checkpoint", "i2t", "R@1"]
    rows = {line.split()[1]: line.split()[2:] for line in lines[1:] if line.startswith("emb ")}  # not the legend
    assert set(rows) == {"xm3600-en", "xm3600-de"}
    assert rows["xm3600-de"] == ["100.0", "100.0"] and rows["xm3600-en"][1] == "0.0"  # i2t R@1, t2i R@1


def test_a_byte_order_mark_is_not_json(tmp_path):
    """A captions.jsonl re-saved by a Windows editor starts with U+FEFF: read as the file it is."""
    ann = tmp_path / "captions.jsonl"
    ann.write_text("\ufeff" + "".join(json.dumps(_line(i), ensure_ascii=False) + "\n" for i in range(2)),
                   encoding="utf-8")
    (suite, *_), tables = _load(annotations=str(ann), images=str(tmp_path), languages=["en"])
    assert suite.ranking[0].query_ids == [f"{k}.jpg" for k in KEYS[:2]]
    assert registry.open_input(str(ann)).kind == "xm3600"


def test_input_kind_reads_every_language_as_written(xm):
    root, ann = xm
    src = registry.open_input(ann)
    assert src.kind == "xm3600" and src.paired
    text, image = src.items["text"], src.items["image"]
    assert image.ids == [f"{k}.jpg" for k in KEYS] and image.entries[0].uri == str(root / "images" / f"{KEYS[0]}.jpg")
    assert text.ids[:5] == CAPTIONS["en"][0] + CAPTIONS["de"][0] + CAPTIONS["zh"][0] and text.entries == text.ids
    assert text.group.tolist()[:5] == [0] * 5 and len(text.ids) == 8 + 3 + 8
