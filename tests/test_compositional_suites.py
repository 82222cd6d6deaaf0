"""Winoground, MMVP-VLM, What's Up, SugarCrepe++ and the blind check: release layouts scored against each
benchmark's own rule (written here from its code, independently of hardrank's), bad input, several suites."""
from __future__ import annotations

import csv
import json
import shutil
import zlib
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardrank import evaluate
from hardrank.items import Tables
from hardrank.jobs.bench.standins import write_standins
from hardrank.jobs.cli import main
from hardrank.scoring.blind import bag_of_words, blind_summary, blind_unresolvable
from hardrank.scoring.metrics import choice_metrics, group_accuracy
from hardrank.suites import SuiteFormatError, SuiteOptions, load_suites
from hardrank.tasks import ChoiceTask, RowGroups

ALL = ("winoground", "mmvp_vlm", "whatsup", "sugarcrepe_pp", "sugarcrepe", "aro")


# -- a stand-in of every benchmark in its release layout, and embeddings with many exact ties ----------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("compositional")
    write_standins(root, scale=0.03, image_size=(24, 18), seed=1, suites=ALL)
    tables = Tables.empty()
    load_suites(list(ALL), tables, SuiteOptions(data=str(root), images=str(root)))
    rng = np.random.default_rng(7)
    pool = rng.normal(size=(5, 8)).astype(np.float32)  # 5 vectors: equal embeddings (exact ties) are common
    pool /= np.linalg.norm(pool, axis=1, keepdims=True)
    rows = [("image", i) for i in dict.fromkeys(tables.images.ids)] + [("text", t) for t in dict.fromkeys(
        tables.texts.ids)]
    vec = {r: pool[zlib.crc32(repr(r).encode()) % len(pool)] for r in rows}
    byo = root / "emb.parquet"
    pq.write_table(pa.table({"kind": [k for k, _ in rows], "id": [i for _, i in rows],
                             "embedding": [vec[r].tolist() for r in rows]}), byo)
    return {"root": root, "byo": byo, "vec": {k: v.astype(np.float64) for k, v in vec.items()}}


def _run(world, suites, tmp_path, **kw):
    rep = evaluate(embeddings=str(world["byo"]), suites=list(suites), data=str(world["root"]),
                   images=str(world["root"]), out=str(tmp_path / "res"), **kw)
    out = {}
    for r in rep.results:
        table = pq.read_table(tmp_path / "res" / r["checkpoint"] / f"{r['suite']}.parquet").to_pylist()
        out[r["suite"]] = (r, {(t["task"], t["query_id"]): t for t in table})
    return rep, out


def _s(world, image_id, text):
    """The cosine the benchmark's code computes, from the same vectors (float64)."""
    return float(world["vec"][("image", image_id)] @ world["vec"][("text", text)])


def _pct(xs):
    return 100.0 * sum(xs) / len(xs)


# -- Winoground ----------------------------------------------------------------------------------------------
def test_winoground_matches_its_scores_by_tag(world, tmp_path):
    _, out = _run(world, ["winoground"], tmp_path)
    r, rows = out["winoground"]
    lines = (world["root"] / "winoground" / "data" / "examples.jsonl").read_text().splitlines()
    text, image, group, by = {}, {}, {}, defaultdict(list)
    for ex in map(json.loads, lines):  # the dataset card's scoring: c<j>_i<k> = s(image k, caption j), strict >
        c0i0, c1i0 = _s(world, ex["image_0"], ex["caption_0"]), _s(world, ex["image_0"], ex["caption_1"])
        c0i1, c1i1 = _s(world, ex["image_1"], ex["caption_0"]), _s(world, ex["image_1"], ex["caption_1"])
        t, i = c0i0 > c1i0 and c1i1 > c0i1, c0i0 > c0i1 and c1i1 > c1i0
        text[ex["id"]], image[ex["id"]], group[ex["id"]] = t, i, t and i
        by[ex["collapsed_tag"]].append(ex["id"])
        by[f"tag={ex['tag']}"].append(ex["id"])
        by[f"num_main_preds={ex['num_main_preds']}"].append(ex["id"])
        for sec in filter(None, (x.strip() for x in ex["secondary_tag"].split(","))):
            by[f"secondary_tag={sec}"].append(ex["id"])
    m = r["metrics"]["winoground"]
    for key, ids in [("all", list(text)), *by.items()]:
        assert m[key]["text_score"] == pytest.approx(_pct([text[i] for i in ids])), key
        assert m[key]["image_score"] == pytest.approx(_pct([image[i] for i in ids])), key
        assert m[key]["group_score"] == pytest.approx(_pct([group[i] for i in ids])), key
        assert m[key]["items"] == len(ids)
    assert {k.split("=")[0] for k in m if "=" in k} == {"tag", "secondary_tag", "num_main_preds"}
    assert m["all"]["ties"] > 0  # ties were exercised (and count wrong, as `>`)
    assert {i: rows[("winoground", str(i))]["correct"] for i in group} == group  # per item, in the Parquet
    assert r["tie_rule"] == "grid2x2"
    assert m["all"]["blind"]["unresolvable_share"] == 100.0  # a 2x2 of images cannot be solved blind


# -- MMVP-VLM ------------------------------------------------------------------------------------------------
def test_mmvp_vlm_matches_its_script(world, tmp_path):
    _, out = _run(world, ["mmvp_vlm"], tmp_path)
    r, rows = out["mmvp_vlm"]
    with (world["root"] / "MMVP_VLM" / "Questions.csv").open(newline="") as f:
        reader = csv.reader(f)
        next(reader)
        questions = list(reader)
    per, verdicts, ties = defaultdict(list), {}, 0
    for (q1, t1, s1), (q2, _, s2) in zip(questions[0::2], questions[1::2]):  # scripts/evaluate_vlm.py
        img1, img2 = f"{t1}/{q1}.jpg", f"{t1}/{q2}.jpg"
        preds = []
        for s in (s1, s2):
            text = "a photo of " + s
            logits = 100.0 * np.array([_s(world, img1, text), _s(world, img2, text)])
            probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            preds.append("img1" if probs[0] > 0.5 else "img2")
            ties += logits[0] == logits[1]
        gt = ["img1" if int(q) % 2 == 1 else "img2" for q in (q1, q2)]
        ok = preds == gt
        per[t1].append(ok)
        verdicts[f"{q1}-{q2}"] = ok
    m = r["metrics"]["mmvp_vlm"]
    for typ, oks in per.items():
        assert m[typ]["accuracy"] == pytest.approx(_pct(oks)), typ
    assert m["all"]["accuracy"] == pytest.approx(_pct(list(verdicts.values())))
    assert r["metrics"]["pattern_mean"]["all"]["accuracy"] == pytest.approx(np.mean([_pct(v) for v in per.values()]))
    assert ties > 0 and m["all"]["ties"] > 0
    assert {k: rows[("mmvp_vlm", k)]["correct"] for k in verdicts} == verdicts


# -- What's Up -----------------------------------------------------------------------------------------------
def test_whatsup_matches_its_code_accuracy_pair_and_set(world, tmp_path):
    _, out = _run(world, ["whatsup"], tmp_path)
    r, rows = out["whatsup"]
    d = world["root"] / "whatsup_vlms" / "data"
    m = r["metrics"]
    files = {"controlled_a": "controlled_images_dataset.json", "controlled_b": "controlled_clevr_dataset.json",
             "coco_one": "coco_qa_one_obj.json", "coco_two": "coco_qa_two_obj.json",
             "gqa_one": "vg_qa_one_obj.json", "gqa_two": "vg_qa_two_obj.json"}
    acc = {}
    for task, fname in files.items():
        data = json.loads((d / fname).read_text())
        correct = []
        for it in data:  # dataset_zoo/aro_datasets.py: np.argmax over the options, correct iff 0
            if task.startswith("controlled"):
                image, options = it["image_path"], it["caption_options"]
            else:
                image = f"{str(it[0]).zfill(12)}.jpg" if task.startswith("coco") else f"{it[0]}.jpg"
                options = it[1:]
            correct.append(int(np.argmax([_s(world, image, o) for o in options])) == 0)
        acc[task] = _pct(correct)
        assert m[task]["all"]["accuracy"] == pytest.approx(acc[task]), task
        assert [rows[(task, f"{task}/{i}")]["correct"] for i in range(len(data))] == correct
        if task.startswith("controlled"):  # its pair / set bookkeeping: a dict per object pair
            other = ("on", "under") if task == "controlled_a" else ("in-front", "behind")
            ev = {}
            for it, ok in zip(data, correct):
                name = it["image_path"].split("/")[-1]
                key = (name.split("_")[0], name.split("_")[-1][:-5])
                ev.setdefault(key, {p: 0 for p in ("left", "right", *other)})[name.split("_")[1]] = ok
            pair = sum(bool(c["left"] and c["right"]) + bool(c[other[0]] and c[other[1]]) for c in ev.values())
            whole = sum(sum(c.values()) == 4 for c in ev.values())
            assert m[task]["all"]["pair_accuracy"] == pytest.approx(pair * 100 / (len(data) / 2))
            assert m[task]["all"]["set_accuracy"] == pytest.approx(whole * 100 / (len(data) / 4))
    for ds, (a, b) in {"whatsup": ("controlled_a", "controlled_b"), "coco_spatial": ("coco_one", "coco_two"),
                       "gqa_spatial": ("gqa_one", "gqa_two")}.items():
        assert m[ds]["all"]["accuracy"] == pytest.approx((acc[a] + acc[b]) / 2)
    assert sum(m[t]["all"]["ties"] for t in files) > 0  # ties exercised: a tie goes to the first (correct) option
    assert r["tie_rule"] == "first_ties_win"


def test_whatsup_pairs_follow_the_reference_on_replaced_and_missing_rows():
    # rows: key (a, b) with left/right/on/under; a second "left" row replaces the first; key (c, d) lacks "under"
    paths = ["a_left_of_b.jpeg", "a_right_of_b.jpeg", "a_on_b.jpeg", "a_under_b.jpeg", "a_left_of_b.jpeg",
             "c_left_of_d.jpeg", "c_right_of_d.jpeg", "c_on_d.jpeg"]
    from hardrank.suites.whatsup import _pair_sets

    meta = {}
    g = _pair_sets("controlled_a", [f"data/controlled_images/{p}" for p in paths], meta)
    ok = np.array([False, True, True, True, True, True, True, True])  # the replaced first row is wrong: ignored
    assert meta["replaced_rows"]["controlled_a"] == 1 and g["pair"].labels[0] is None
    # pairs: (a,b) left-right, (a,b) on-under, (c,d) left-right -> 3 correct over 8 / 2 = 4 pairs
    assert group_accuracy(ok, g["pair"].labels, 2) == pytest.approx(75.0)
    assert group_accuracy(ok, g["set"].labels, 4) == pytest.approx(50.0)  # (a, b) whole; (c, d) lacks a row


# -- SugarCrepe++ --------------------------------------------------------------------------------------------
def test_sugarcrepe_pp_matches_its_itt_and_tot(world, tmp_path):
    _, out = _run(world, ["sugarcrepe_pp"], tmp_path)
    r, rows = out["sugarcrepe_pp"]
    m = r["metrics"]
    pooled_itt, pooled_tot = [], []
    for f in sorted((world["root"] / "scpp" / "data").glob("*.json")):
        itt, p1s, p2s, tot = [], [], [], []
        for it in json.loads(f.read_text()):  # VLMs/test_*.py (ITT) and evaluate_ulms.py (TOT)
            img = it["filename"]
            cos_p1, cos_p2 = _s(world, img, it["caption"]), _s(world, img, it["caption2"])
            cos_neg = _s(world, img, it["negative_caption"])
            t = {k: world["vec"][("text", it[k])] for k in ("caption", "caption2", "negative_caption")}
            p1p2, p1n, p2n = t["caption"] @ t["caption2"], t["caption"] @ t["negative_caption"], \
                t["caption2"] @ t["negative_caption"]
            itt.append(cos_p1 > cos_neg and cos_p2 > cos_neg)
            p1s.append(cos_p1 > cos_neg)
            p2s.append(cos_p2 > cos_neg)
            tot.append(p1p2 > p2n and p1p2 > p1n)
            assert rows[(f.stem, f"{f.stem}/{it['id']}")]["correct"] == itt[-1]
            assert rows[(f"{f.stem}_tot", f"{f.stem}/{it['id']}")]["correct"] == tot[-1]
        a = m[f.stem]["all"]
        assert (a["accuracy"], a["p1_accuracy"], a["p2_accuracy"]) == pytest.approx((_pct(itt), _pct(p1s), _pct(p2s)))
        assert m[f"{f.stem}_tot"]["all"]["accuracy"] == pytest.approx(_pct(tot))
        pooled_itt += itt
        pooled_tot += tot
    assert m["itt"]["all"]["accuracy"] == pytest.approx(_pct(pooled_itt))
    assert m["tot"]["all"]["accuracy"] == pytest.approx(_pct(pooled_tot))
    assert sum(m[k]["all"]["ties"] for k in m if "members" not in m[k]) > 0
    from hardrank.jobs.report.tables import main_metric

    assert main_metric(r) == ("itt accuracy", pytest.approx(_pct(pooled_itt)))  # the headline is ITT, not a mix


# -- the blind check -----------------------------------------------------------------------------------------
def _task(rule, texts, left_modality="image"):
    n, b = len(texts), len(texts[0])
    flat = [t for row in texts for t in row]
    task = ChoiceTask(name="t", rule=rule, left_modality=left_modality, right_modality="text",
                      left=np.zeros((n, 1), int), right=np.arange(len(flat)).reshape(n, b),
                      ids=[str(i) for i in range(n)])
    return task, flat


@pytest.mark.parametrize("rule, rows, expected", [
    ("first_strict", [["a dog on a mat", "a cat", "a mat on a dog"], ["A dog, on a mat.", "a dog on a cat", "x"],
                      ["x y", "y z", "Y X"]], [True, False, True]),
    ("first_ties_win", [["the red car", "car the red", "red the car"], ["the red car", "car the red", "a car"]],
     [True, False]),
    ("triplet", [["a b", "b a c", "b a"], ["a b", "c a", "c d"], ["a b", "b c", "c b"]], [True, False, True]),
    ("two_positives", [["a b", "c d", "d c"], ["a b", "a c", "b d"]], [True, False]),
    ("grid2x2", [["a b", "b a"], ["a b", "c d"]], [True, True]),
    ("pair_t2i", [["a b", "c d"]], [True]),
])
def test_blind_rows_by_rule(rule, rows, expected):
    task, texts = _task(rule, rows)
    assert blind_unresolvable(task, texts).tolist() == expected
    assert bag_of_words("A dog, on a mat.") == bag_of_words("a mat on a DOG")


def test_blind_does_not_apply_to_text_only_tasks():
    task, texts = _task("text_triplet", [["a b", "b a", "c"]], left_modality="text")
    assert blind_unresolvable(task, texts) is None
    s = blind_summary("first_ties_win", np.array([True, False, True]), np.array([True, True, False]))
    assert s == {"items_unresolvable": 2, "unresolvable_share": pytest.approx(200 / 3),
                 "accuracy_resolvable": 100.0, "accuracy_unresolvable": 50.0, "bow_accuracy_unresolvable": 100.0}


def test_blind_split_beside_accuracy_on_sugarcrepe_and_aro(world, tmp_path):
    _, out = _run(world, ["sugarcrepe", "aro"], tmp_path)
    for suite, folder in (("sugarcrepe", world["root"] / "sugar-crepe" / "data"), ("aro", world["root"])):
        r, rows = out[suite]
        tasks = [k for k, v in r["metrics"].items() if "members" not in v and "over" not in v]
        assert r["suite_meta"]["blind"]["definition"].startswith("a row is unresolvable")
        for task in tasks:
            if suite == "sugarcrepe":
                items = list(json.loads((folder / f"{task}.json").read_text()).items())
                pairs = [(f"{task}/{k}", it["caption"], it["negative_caption"]) for k, it in items]
            else:
                name = {"vg_relation": "visual_genome_relation", "vg_attribution": "visual_genome_attribution"}[task]
                pairs = [(f"{task}/{i}", it["true_caption"], it["false_caption"])
                         for i, it in enumerate(json.loads((folder / f"{name}.json").read_text()))]
            same = {i: sorted(a.lower().split()) == sorted(b.lower().split()) for i, a, b in pairs}
            b = r["metrics"][task]["all"]["blind"]
            assert b["items_unresolvable"] == sum(same.values()), task
            assert r["suite_meta"]["blind"]["tasks"][task]["unresolvable"] == sum(same.values())
            for part, want in (("accuracy_unresolvable", True), ("accuracy_resolvable", False)):
                oks = [rows[(task, i)]["correct"] for i, s in same.items() if s == want]
                assert (b[part] is None if not oks else b[part] == pytest.approx(_pct(oks))), (task, part)
            if sum(same.values()):
                assert b["bow_accuracy_unresolvable"] == 0.0  # a tie is wrong under first_strict
        # the swap files reuse the caption's words: every row unresolvable for a bag-of-words scorer
        if suite == "sugarcrepe":
            assert r["metrics"]["swap_att"]["all"]["blind"]["unresolvable_share"] == 100.0
            assert r["metrics"]["add_att"]["all"]["blind"]["unresolvable_share"] == 0.0
            assert "blind" in r["metrics"]["overall"]["all"]  # pooled beside the micro accuracy


# -- several suites in one command: one that cannot load does not stop the others ------------------------------
def test_one_broken_suite_is_recorded_and_the_others_run(world, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(world["root"], root, ignore=shutil.ignore_patterns("*.jpg", "*.png", "*.jpeg"))
    (root / "MMVP_VLM" / "Questions.csv").write_text("id,type,statement\n1,Color,a red car\n")
    rep = evaluate(embeddings=str(world["byo"]), suites=["mmvp_vlm", "winoground", "whatsup"], data=str(root),
                   out=str(tmp_path / "res"))
    assert [r["suite"] for r in rep.results] == ["winoground", "whatsup"]
    assert list(rep.failed_suites) == ["mmvp_vlm"] and "header" in str(rep.failed_suites["mmvp_vlm"])
    code = main(["eval", "--embeddings", str(world["byo"]), "--suite", "mmvp_vlm", "winoground", "--data", str(root),
                 "--out", str(tmp_path / "res2"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 3 and "suite mmvp_vlm" in err and "Questions.csv: header" in err
    assert (tmp_path / "res2" / "emb" / "winoground.json").is_file()
    assert not (tmp_path / "res2" / "emb" / "mmvp_vlm.json").exists()
    (root / "winoground" / "data" / "examples.jsonl").write_text("{}\n")  # every suite broken: the first error
    with pytest.raises(SuiteFormatError, match="header"):
        evaluate(embeddings=str(world["byo"]), suites=["mmvp_vlm", "winoground"], data=str(root),
                 out=str(tmp_path / "res3"))


def test_a_failed_suite_leaves_no_rows_in_the_tables(world, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(world["root"] / "whatsup_vlms", root / "whatsup_vlms")
    f = root / "whatsup_vlms" / "data" / "vg_qa_two_obj.json"
    f.write_text(json.dumps(json.loads(f.read_text())[:3] + [{"image": 1}]))  # the last file read: after the others
    tables, failures = Tables.empty(), {}
    assert load_suites(["whatsup"], tables, SuiteOptions(data=str(root)), failures=failures) == []
    assert len(tables.images) == len(tables.texts) == 0 and "vg_qa_two_obj.json: item 3" in str(failures["whatsup"])


# -- bad input: one clear line naming the file and the line / item ------------------------------------------
def _copy(world, tmp_path, sub):
    dst = tmp_path / "d"
    shutil.copytree(world["root"] / sub, dst / sub)
    return dst


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines[:2] + ["{not json"] + lines[3:], r"examples\.jsonl: line 3 is not valid JSON"),
    (lambda lines: [json.dumps({**{k.replace("caption_0", "caption_a"): v for k, v in json.loads(lines[0]).items()}})]
     + lines[1:], r"line 1 lacks key\(s\) \['caption_0'\]; it has .*another version"),
    (lambda lines: lines[:1] + [json.dumps({**json.loads(lines[1]), "num_main_preds": "1"})] + lines[2:],
     r"line 2 key 'num_main_preds' is '1' \(str\), expected int"),
])
def test_winoground_bad_lines(world, tmp_path, edit, message):
    d = _copy(world, tmp_path, "winoground")
    f = d / "winoground" / "data" / "examples.jsonl"
    f.write_text("\n".join(edit(f.read_text().splitlines())) + "\n")
    with pytest.raises(SuiteFormatError, match=message):
        load_suites(["winoground"], Tables.empty(), SuiteOptions(data=str(d)))


def test_winoground_images_not_extracted(world, tmp_path):
    d = _copy(world, tmp_path, "winoground")
    shutil.rmtree(d / "winoground" / "data" / "images")
    (d / "winoground" / "data" / "images.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    with pytest.raises(FileNotFoundError, match=r"no images/ folder .*item 0 names image 'ex_0_img_0'.*unzip"):
        load_suites(["winoground"], Tables.empty(), SuiteOptions(data=str(d / "winoground")))


@pytest.mark.parametrize("rows, message", [
    ([["Question ID", "Type", "Statement", "Options"], ["1", "Color", "a", "b"]],
     r"Questions\.csv: header .* expected \['Question ID', 'Type', 'Statement'\]: a file of another version"),
    ([["Question ID", "Type", "Statement"], ["1", "Color", "a"], ["2", "Color"]], r"line 3 has 2 field\(s\)"),
    ([["Question ID", "Type", "Statement"], ["1", "Color", "a"], ["two", "Color", "b"]],
     r"line 3: Question ID 'two' is not an integer"),
    ([["Question ID", "Type", "Statement"], ["2", "Color", "a"], ["3", "Color", "b"]],
     r"lines 2-3 hold Question IDs 2, 3; a pair is an odd ID then an even one"),
    ([["Question ID", "Type", "Statement"], ["1", "Color", "a"], ["2", "Text", "b"]], r"lines 2-3: the pair's Types"),
    ([["Question ID", "Type", "Statement"], ["1", "Color", "a"]], r"line 2 \(Question ID 1\) has no pair"),
])
def test_mmvp_bad_rows(world, tmp_path, rows, message):
    d = _copy(world, tmp_path, "MMVP_VLM")
    with (d / "MMVP_VLM" / "Questions.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    with pytest.raises(SuiteFormatError, match=message):
        load_suites(["mmvp_vlm"], Tables.empty(), SuiteOptions(data=str(d)))


@pytest.mark.parametrize("fname, edit, message", [
    ("coco_qa_one_obj.json", lambda d: d[:1] + [{"image_id": 1, "caption": "a"}] + d[2:],
     r"coco_qa_one_obj\.json: item 1 is .* expected \[image id, correct caption, wrong caption\]"),
    ("controlled_images_dataset.json", lambda d: [{"image": d[0]["image_path"]}] + d[1:],
     r"controlled_images_dataset\.json: item 0 lacks key\(s\) \['image_path', 'caption_options'\]"),
    ("controlled_clevr_dataset.json", lambda d: {"0": d[0]}, r"expected a JSON list .* got a dict"),
])
def test_whatsup_bad_items(world, tmp_path, fname, edit, message):
    d = _copy(world, tmp_path, "whatsup_vlms")
    f = d / "whatsup_vlms" / "data" / fname
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))
    with pytest.raises(SuiteFormatError, match=message):
        load_suites(["whatsup"], Tables.empty(), SuiteOptions(data=str(d)))


def test_sugarcrepe_pp_refuses_sugarcrepe_files(world, tmp_path):
    d = tmp_path / "scpp"
    shutil.copytree(world["root"] / "scpp", d)
    shutil.copy(world["root"] / "sugar-crepe" / "data" / "swap_obj.json", d / "data" / "swap_obj.json")
    with pytest.raises(SuiteFormatError, match=r"swap_obj\.json: a JSON object .* looks like a SugarCrepe file"):
        load_suites(["sugarcrepe_pp"], Tables.empty(), SuiteOptions(data=str(d)))
    items = json.loads((world["root"] / "scpp" / "data" / "swap_obj.json").read_text())
    (d / "data" / "swap_obj.json").write_text(json.dumps([{k: v for k, v in it.items() if k != "caption2"}
                                                          for it in items]))
    with pytest.raises(SuiteFormatError, match=r"item 0 has no 'caption2' .* a SugarCrepe item, not SugarCrepe\+\+"):
        load_suites(["sugarcrepe_pp"], Tables.empty(), SuiteOptions(data=str(d)))


# -- a model run: a missing image is recorded by its path (which carries the item's image id) and skipped ------
def test_missing_image_is_recorded_and_the_row_dropped(world, tmp_path):
    from helpers import save_random_checkpoint, write_tiny_config

    d = _copy(world, tmp_path, "winoground")
    (d / "winoground" / "data" / "images" / "ex_1_img_0.png").unlink()
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "m.safetensors", seed=0)
    rep = evaluate(model=str(cfg), checkpoints=[str(ckpt)], suites=["winoground"], data=str(d),
                   out=str(tmp_path / "res"), store=str(tmp_path / "store"), batch_size=8)
    (r,) = rep.results
    assert r["failed_items"] == 1 and "ex_1_img_0.png" in r["failures"][0]["source"]
    assert r["counts"]["winoground"]["skipped"] == {"unreadable": 1}
    n = len((world["root"] / "winoground" / "data" / "examples.jsonl").read_text().splitlines())
    assert r["metrics"]["winoground"]["all"]["items"] == n - 1


# -- the task model's new pieces ------------------------------------------------------------------------------
def test_pair_t2i_gives_a_tie_to_the_second_image():
    t = ChoiceTask(name="p", rule="pair_t2i", left_modality="image", right_modality="text",
                   left=np.zeros((3, 2), int), right=np.zeros((3, 2), int), ids=["a", "b", "c"])
    # s[:, image, text]
    s = np.array([[[0.9, 0.1], [0.2, 0.5]],     # both right
                  [[0.5, 0.3], [0.5, 0.3]],     # statement 0 ties (-> image 1: wrong); statement 1 ties (right)
                  [[0.4, 0.6], [0.2, 0.6]]])    # statement 1 ties: goes to image 1, its own: right
    m, v = choice_metrics(t, s)
    assert v["correct"].tolist() == [True, False, True] and m["all"]["ties"] == 2
    assert m["all"]["statement_accuracy"] == pytest.approx(500 / 6)


def test_drop_keeps_facets_groups_and_blind_aligned():
    t = ChoiceTask(name="w", rule="grid2x2", left_modality="image", right_modality="text",
                   left=np.arange(6).reshape(3, 2), right=np.arange(6).reshape(3, 2), ids=["0", "1", "2"],
                   subset=["A", "B", "A"], facets={"tag": [("x",), (), ("y", "z")]},
                   groups={"pair": RowGroups(["p", "p", None], 2)}, blind=np.array([True, False, True]))
    bad = np.zeros((3, 2), bool)
    bad[1, 0] = True
    d = t.drop(bad, np.zeros((3, 2), bool))
    assert d.ids == ["0", "2"] and d.facets == {"tag": [("x",), ("y", "z")]} and d.groups["pair"].labels == ["p", None]
    assert d.blind.tolist() == [True, True] and d.skipped == {"unreadable": 1}
    with pytest.raises(ValueError, match=r"per-row lists of lengths \{'facet tag': 2\}"):
        ChoiceTask(name="w", rule="grid2x2", left_modality="image", right_modality="text", left=t.left,
                   right=t.right, ids=t.ids, facets={"tag": [("x",), ()]}).validate()


def test_one_data_folder_serves_every_release_layout(world, tmp_path):
    """Each loader finds its release under its own folder name, and ARO its images in DATA/images when the shared
    --images (the COCO folder here) lacks them; an --images that holds them is still used."""
    root = world["root"]
    tables = Tables.empty()
    suites = load_suites(list(ALL), tables, SuiteOptions(data=str(root), images=str(root)))
    assert [s.name for s in suites] == list(ALL)
    aro = next(s for s in suites if s.name == "aro")
    first = tables.images.entries[aro.choice[0].left[0, 0]].uri
    assert first.startswith(str(root / "images")) and (root / "images").is_dir()
    other = tmp_path / "vg"
    shutil.copytree(root / "images", other)
    t2 = Tables.empty()
    (aro2,) = load_suites(["aro"], t2, SuiteOptions(data=str(root), images=str(other)))
    assert t2.images.entries[aro2.choice[0].left[0, 0]].uri.startswith(str(other))


def test_sugarcrepe_and_sugarcrepe_pp_files_of_one_name_side_by_side(world, tmp_path):
    # both releases name their files replace_att.json ...: each suite looks in its own repository's folder first
    shutil.copytree(world["root"] / "sugar-crepe" / "data", tmp_path / "data")  # SugarCrepe's repo root: --data
    shutil.copytree(world["root"] / "scpp", tmp_path / "scpp")
    sc, pp = load_suites(["sugarcrepe", "sugarcrepe_pp"], Tables.empty(), SuiteOptions(data=str(tmp_path)))
    assert sc.meta["files_missing"] == [] and pp.meta["folder"] == str(tmp_path / "scpp" / "data")
