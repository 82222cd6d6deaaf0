"""Choice suites (SugarCrepe, ARO, hard positives, InpaintCOCO): loaders on published formats, errors, metrics."""
import io
import json
import os
import zlib
from collections import defaultdict

import numpy as np
import pytest

from hardrank.items import Tables, decode_image
from hardrank.scoring.choice_macro import ChoiceAggregate, aggregate_accuracy, suite_aggregates
from hardrank.scoring.metrics import choice_metrics
from hardrank.suites import SUITES, SuiteFormatError, SuiteOptions, load_suites
from hardrank.suites.aro import ARO_SYMMETRIC_RELATIONS, order_perturbations
from hardrank.suites.sugarcrepe import SUGARCREPE_CATEGORIES, SUGARCREPE_FILES
from hardrank.tasks import ChoiceTask, Suite
from hardrank.text import pre_caption


# -- helpers ---------------------------------------------------------------------------------------
def _jpeg(path, color=(200, 30, 30), size=(8, 8)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, format="JPEG")
    return path


def _jpeg_bytes(size, color=(10, 120, 200)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG")
    return buf.getvalue()


def _json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def _vec(key) -> np.ndarray:
    """Deterministic small-integer embedding per content key: (3,) in {-1, 0, 1}, so ties are common."""
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
    return rng.integers(-1, 2, size=3).astype(np.float64)


def _scores(tables: Tables, task: ChoiceTask) -> np.ndarray:
    """(n, A, B) row dot products, the numpy twin of kernels.choice_scores."""
    img = np.stack([_vec(("img", os.path.basename(e.uri), e.crop)) for e in tables.images.entries])
    txt = np.stack([_vec(("txt", t)) for t in tables.texts.entries])
    emb = {"image": img, "text": txt}
    return np.einsum("nad,nbd->nab", emb[task.left_modality][task.left], emb[task.right_modality][task.right])


def _score_suite(tables, suite):
    """What engine/evaluate.py's choice path computes (plus the choice_macro hook)."""
    metrics, verdicts = {}, {}
    for task in suite.choice:
        metrics[task.name], verdicts[task.name] = choice_metrics(task, _scores(tables, task))
    for avg, members in suite.view_average.items():
        if all(m in metrics for m in members):
            metrics[avg] = {"all": {"accuracy": float(np.mean([metrics[m]["all"]["accuracy"] for m in members]))}}
    metrics.update(suite_aggregates(suite, verdicts))
    return metrics, verdicts


# -- SugarCrepe ------------------------------------------------------------------------------------
def _sugarcrepe(tmp_path, stems=tuple(SUGARCREPE_FILES), n=7, seed=0):
    rng = np.random.default_rng(seed)
    images = tmp_path / "val2017"
    names = [f"{i:012d}.jpg" for i in range(5)]
    for i, nm in enumerate(names):
        _jpeg(images / nm, (40 * i, 20, 200 - 30 * i))
    words = ["a dog", "a cat", "two dogs", "a red car", "a blue car", "the man", "a tree"]
    for stem in stems:
        items = {str(k): {"filename": names[rng.integers(len(names))], "caption": words[rng.integers(len(words))],
                          "negative_caption": words[rng.integers(len(words))]} for k in range(n + len(stem) % 3)}
        _json(tmp_path / "data" / f"{stem}.json", items)
    return SuiteOptions(data=str(tmp_path), images=str(images))


def test_sugarcrepe_loads_files_found_and_reports_them(tmp_path):
    opts = _sugarcrepe(tmp_path, stems=("add_att", "add_obj", "swap_obj"))
    tables = Tables.empty()
    (suite,) = load_suites(["sugarcrepe"], tables, opts)
    assert [t.name for t in suite.choice] == ["add_att", "add_obj", "swap_obj"]
    assert suite.meta["files_missing"] == ["replace_att", "replace_obj", "replace_rel", "swap_att"]
    assert suite.view_average == {"add": ["add_att", "add_obj"]}  # swap is incomplete: no category average
    t = suite.choice[0]
    assert t.rule == "first_strict" and t.left.shape == (len(t.ids), 1) and t.right.shape == (len(t.ids), 2)
    raw = json.loads((tmp_path / "data" / "add_att.json").read_text())
    assert [tables.texts.entries[j] for j in t.right[0]] == [raw["0"]["caption"], raw["0"]["negative_caption"]]
    assert t.ids[0] == "add_att/0"
    assert len(tables.images) == 5  # shared COCO images are one row each
    assert {a["name"] for a in suite.meta["aggregates"]} == {"overall", "overall_file_mean"}
    assert suite.meta["count_mismatch"]["add_att"][1] == 692
    coco_root = SuiteOptions(data=opts.data, images=str(tmp_path))  # holds val2017/
    again = Tables.empty()
    SUITES["sugarcrepe"](again, coco_root)
    assert [e.uri for e in again.images.entries] == [e.uri for e in tables.images.entries]


def test_sugarcrepe_matches_brute_force_on_random_embeddings(tmp_path):
    opts = _sugarcrepe(tmp_path, n=11, seed=3)
    tables = Tables.empty()
    suite = SUITES["sugarcrepe"](tables, opts)
    metrics, _ = _score_suite(tables, suite)
    # brute force: plain loops over the JSON files
    per_file, pooled = {}, []
    for stem in SUGARCREPE_FILES:
        data = json.loads((tmp_path / "data" / f"{stem}.json").read_text())
        ok = []
        for _, it in data.items():
            im = _vec(("img", it["filename"], None))
            s_pos = sum(a * b for a, b in zip(im, _vec(("txt", it["caption"]))))
            s_neg = sum(a * b for a, b in zip(im, _vec(("txt", it["negative_caption"]))))
            ok.append(s_pos > s_neg)
        per_file[stem] = 100.0 * sum(ok) / len(ok)
        pooled += ok
    assert any(t for t in (metrics[s]["all"]["ties"] for s in SUGARCREPE_FILES))  # ties were exercised
    for stem, acc in per_file.items():
        assert metrics[stem]["all"]["accuracy"] == pytest.approx(acc)
    for cat, members in SUGARCREPE_CATEGORIES.items():
        assert metrics[cat]["all"]["accuracy"] == pytest.approx(np.mean([per_file[m] for m in members]))
    assert metrics["overall"]["all"]["accuracy"] == pytest.approx(100.0 * sum(pooled) / len(pooled))
    assert metrics["overall"]["all"]["items"] == len(pooled)
    assert metrics["overall_file_mean"]["all"]["accuracy"] == pytest.approx(np.mean(list(per_file.values())))


def test_sugarcrepe_malformed_files_name_file_and_item(tmp_path):
    opts = SuiteOptions(data=str(tmp_path), images=str(tmp_path))
    f = _json(tmp_path / "add_att.json", [{"filename": "a.jpg", "caption": "x", "negative_caption": "y"}])
    with pytest.raises(SuiteFormatError, match=r"add_att\.json: expected a JSON object keyed"):
        SUITES["sugarcrepe"](Tables.empty(), opts)
    _json(f, {"0": {"filename": "a.jpg", "caption": "x", "negative_caption": "y"},
              "1": {"filename": "a.jpg", "caption": "x"}})
    with pytest.raises(SuiteFormatError, match=r"add_att\.json: item 1 lacks key\(s\) \['negative_caption'\]"):
        SUITES["sugarcrepe"](Tables.empty(), opts)
    _json(f, {"0": {"filename": "a.jpg", "caption": 3, "negative_caption": "y"}})
    with pytest.raises(SuiteFormatError, match=r"add_att\.json: item 0 key 'caption' is a int"):
        SUITES["sugarcrepe"](Tables.empty(), opts)
    f.unlink()
    with pytest.raises(FileNotFoundError, match="none of the SugarCrepe files"):
        SUITES["sugarcrepe"](Tables.empty(), opts)
    _json(f, {"0": {"filename": "a.jpg", "caption": "x", "negative_caption": "y"}})
    suite = SUITES["sugarcrepe"](Tables.empty(), SuiteOptions(data=str(tmp_path)))  # ids only: no image is read
    with pytest.raises(ValueError, match="needs --images"):  # before a model reads any
        suite.check_images()


def test_sugarcrepe_unreadable_image_is_recorded_and_dropped(tmp_path):
    images = tmp_path / "img"
    _jpeg(images / "ok.jpg")
    _json(tmp_path / "swap_att.json", {"0": {"filename": "ok.jpg", "caption": "a", "negative_caption": "b"},
                                       "1": {"filename": "gone.jpg", "caption": "c", "negative_caption": "d"}})
    tables = Tables.empty()
    suite = SUITES["sugarcrepe"](tables, SuiteOptions(data=str(tmp_path), images=str(images)))
    keys = tables.images.keys(threads=1)
    assert keys[1] == "" and "gone.jpg" in tables.images.failed[1]
    bad = np.zeros(len(tables.images), bool)
    bad[list(tables.images.failed)] = True
    t = suite.choice[0].drop(bad[suite.choice[0].left], np.zeros_like(suite.choice[0].right, bool))
    assert t.ids == ["swap_att/0"] and t.skipped == {"unreadable": 1}


# -- ARO: VG-Relation / VG-Attribution -------------------------------------------------------------
def _vg(tmp_path, seed=0):
    rng = np.random.default_rng(seed)
    for i in range(4):
        _jpeg(tmp_path / "images" / f"{i}.jpg", (60 * i, 90, 30), size=(16, 12))
    rels = ["on", "behind", "holding", "next to", "with", "sitting on"]  # next to / with are symmetric
    caps = ["the cup is on the table", "the table is on the cup", "the dog is behind the man",
            "the man is behind the dog"]
    rel_items = [{"image_id": str(i), "image_path": f"{i % 4}.jpg", "bbox_x": int(i % 3), "bbox_y": 1, "bbox_w": 8,
                  "bbox_h": 6 + i % 2, "relation_name": rels[rng.integers(len(rels))],
                  "true_caption": caps[rng.integers(4)], "false_caption": caps[rng.integers(4)]} for i in range(40)]
    pairs = [["white", "black"]] * 30 + [["small", "large"]] * 25 + [["red", "wooden"]] * 6
    att_caps = ["the white dog and the black cat", "the black dog and the white cat", "a small car", "a large car"]
    att_items = [{"image_id": str(i), "image_path": f"{i % 4}.jpg", "bbox_x": 0, "bbox_y": int(i % 4), "bbox_w": 10,
                  "bbox_h": 5, "attributes": a, "true_caption": att_caps[rng.integers(4)],
                  "false_caption": att_caps[rng.integers(4)]} for i, a in enumerate(pairs)]
    _json(tmp_path / "visual_genome_relation.json", rel_items)
    _json(tmp_path / "visual_genome_attribution.json", att_items)
    return rel_items, att_items


def test_aro_vg_loader_crops_and_labels(tmp_path):
    rel, att = _vg(tmp_path)
    tables = Tables.empty()
    suite = SUITES["aro"](tables, SuiteOptions(data=str(tmp_path)))
    r, a = suite.choice
    assert (r.name, a.name, r.rule) == ("vg_relation", "vg_attribution", "first_strict")
    ref = tables.images.entries[r.left[3, 0]]
    assert ref.uri == os.fspath(tmp_path / "images" / rel[3]["image_path"])
    assert ref.crop == (rel[3]["bbox_x"], 1.0, 8.0, rel[3]["bbox_h"])
    assert decode_image(ref).size == (8, rel[3]["bbox_h"])
    assert [tables.texts.entries[j] for j in r.right[3]] == [rel[3]["true_caption"], rel[3]["false_caption"]]
    assert r.subset[3] == rel[3]["relation_name"] and a.subset[0] == "white_black"
    assert suite.meta["files_missing"] == []


def test_aro_macro_accuracy_matches_brute_force(tmp_path):
    rel, att = _vg(tmp_path, seed=5)
    tables = Tables.empty()
    suite = SUITES["aro"](tables, SuiteOptions(data=str(tmp_path)))
    metrics, _ = _score_suite(tables, suite)

    def correct(it):  # the reference: argmax over [false, true] must be 1 (np.argmax gives ties to index 0)
        im = _vec(("img", it["image_path"], (float(it["bbox_x"]), float(it["bbox_y"]), float(it["bbox_w"]),
                                             float(it["bbox_h"]))))
        s = [sum(x * y for x, y in zip(im, _vec(("txt", it[k])))) for k in ("false_caption", "true_caption")]
        return int(np.argmax(s)) == 1

    by_rel = defaultdict(list)
    for it in rel:
        by_rel[it["relation_name"]].append(correct(it))
    macro = np.mean([100.0 * np.mean(v) for r, v in by_rel.items() if r not in ARO_SYMMETRIC_RELATIONS])
    assert metrics["vg_relation_macro"]["all"]["accuracy"] == pytest.approx(macro)
    assert metrics["vg_relation_macro"]["all"]["groups_excluded"] == len({"next to", "with"} & set(by_rel))
    assert metrics["vg_relation"]["all"]["accuracy"] == pytest.approx(100.0 * np.mean(sum(by_rel.values(), [])))
    by_att = defaultdict(list)
    for it in att:
        by_att[f"{it['attributes'][0]}_{it['attributes'][1]}"].append(correct(it))
    macro = np.mean([100.0 * np.mean(v) for v in by_att.values() if len(v) >= 25])
    assert metrics["vg_attribution_macro"]["all"]["accuracy"] == pytest.approx(macro)
    assert metrics["vg_attribution_macro"]["all"]["groups"] == 2
    assert metrics["vg_attribution_macro"]["all"]["groups_too_small"] == 1
    assert metrics["vg_relation"]["all"]["ties"] + metrics["vg_attribution"]["all"]["ties"] > 0


@pytest.mark.parametrize("edit, message", [
    (lambda it: it.pop("bbox_h"), r"item 1 lacks bbox key\(s\) \['bbox_h'\]"),
    (lambda it: it.update(bbox_w="8"), r"item 1 key 'bbox_w' is '8' \(str\), expected a number"),
    (lambda it: it.update(bbox_w=0), r"item 1 has an empty crop box"),
    (lambda it: it.pop("relation_name"), r"item 1 lacks key\(s\) \['relation_name'\]"),
    (lambda it: it.update(true_caption=None), r"item 1 key 'true_caption' is a NoneType"),
])
def test_aro_malformed_items_name_file_and_index(tmp_path, edit, message):
    rel, _ = _vg(tmp_path)
    edit(rel[1])
    _json(tmp_path / "visual_genome_relation.json", rel)
    with pytest.raises(SuiteFormatError, match=r"visual_genome_relation\.json: " + message):
        SUITES["aro"](Tables.empty(), SuiteOptions(data=str(tmp_path)))


def test_aro_attribution_format_errors(tmp_path):
    _, att = _vg(tmp_path)
    att[2]["attributes"] = "white black"
    _json(tmp_path / "visual_genome_attribution.json", att)
    msg = r"attribution\.json: item 2 'attributes' is 'white black', expected a list"
    with pytest.raises(SuiteFormatError, match=msg):
        SUITES["aro"](Tables.empty(), SuiteOptions(data=str(tmp_path)))
    _json(tmp_path / "visual_genome_attribution.json", {"0": att[0]})
    with pytest.raises(SuiteFormatError, match=r"attribution\.json: expected a JSON list of test cases, got a dict"):
        SUITES["aro"](Tables.empty(), SuiteOptions(data=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="neither visual_genome_relation.json"):
        SUITES["aro"](Tables.empty(), SuiteOptions(data=str(tmp_path / "nowhere")))


def test_aro_macro_hand_worked_with_ties():
    # relation: on [right, wrong(tie)], behind [right], next to (symmetric) [wrong, wrong]
    task = ChoiceTask(name="vg_relation", rule="first_strict", left_modality="image", right_modality="text",
                      left=np.zeros((5, 1), int), right=np.zeros((5, 2), int), ids=list("abcde"),
                      subset=["on", "on", "behind", "next to", "next to"])
    s = np.array([[[0.9, 0.1]], [[0.4, 0.4]], [[0.3, 0.2]], [[0.1, 0.5]], [[0.2, 0.3]]])  # (true, false)
    m, v = choice_metrics(task, s)
    assert v["correct"].tolist() == [True, False, True, False, False]
    assert m["all"]["accuracy"] == 40.0 and m["all"]["ties"] == 1 and m["on"]["accuracy"] == 50.0
    agg = ChoiceAggregate("vg_relation_macro", ("vg_relation",), over="subsets", exclude=("next to",))
    out = aggregate_accuracy(agg, {"vg_relation": task.subset}, {"vg_relation": v["correct"]})
    assert out["all"] == {"accuracy": 75.0, "items": 3, "groups": 2, "groups_excluded": 1, "groups_too_small": 0}
    small = ChoiceAggregate("m", ("vg_relation",), over="subsets", min_items=2)
    out = aggregate_accuracy(small, {"vg_relation": task.subset}, {"vg_relation": v["correct"]})
    assert out["all"]["accuracy"] == 25.0 and out["all"]["groups_too_small"] == 1  # behind has 1 item
    # micro over tasks pools rows; the task mean weighs each task once
    c = {"a": np.array([True, True, False]), "b": np.array([False])}
    assert aggregate_accuracy(ChoiceAggregate("o", ("a", "b")), {}, c)["all"] == {"accuracy": 50.0, "items": 4}
    assert aggregate_accuracy(ChoiceAggregate("o", ("a", "b"), over="tasks"), {}, c)["all"]["accuracy"] == \
        pytest.approx((200 / 3 + 0) / 2)


def test_aggregate_config_errors():
    with pytest.raises(ValueError, match="over='rows', expected one of"):
        ChoiceAggregate("x", ("a",), over="rows")
    with pytest.raises(ValueError, match="only apply to over='subsets'"):
        ChoiceAggregate("x", ("a",), min_items=25)
    suite = Suite(name="s", choice=[], meta={"aggregates": [{"name": "x", "tasks": ["t"], "over": "items"}]})
    with pytest.raises(ValueError, match="no single 'correct' verdict"):
        suite_aggregates(suite, {"t": {"original": np.array([True])}})


# -- ARO: COCO-Order / Flickr-Order ----------------------------------------------------------------
def test_order_perturbations_are_seeded_permutations():
    cap = "A young man riding a wave on top of a big blue surfboard, near the beach."
    outs = [order_perturbations(cap, np.random.default_rng([1, i, 0])) for i in range(6)]
    assert outs[0] == order_perturbations(cap, np.random.default_rng([1, 0, 0]))
    assert len({tuple(o) for o in outs}) > 1
    tokens = sorted(outs[0][3].split())
    for o in outs:
        assert len(o) == 4 and all(sorted(p.split()) == tokens for p in o)
        # nouns/adjectives shuffle keeps closed-class words where they were, and vice versa
        w = o[0].split()
        assert (w[0], w[3], w[4], w[6], w[8], w[9], w[14]) == ("A", "riding", "a", "on", "of", "a", "near")
        assert {w[1], w[10], w[11]} == {"young", "big", "blue"}
        w = o[1].split()
        assert (w[1], w[2], w[5], w[7], w[12], w[16]) == ("young", "man", "wave", "top", "surfboard", "beach")
        # trigram shuffles: each trigram keeps its words (within) / stays intact (across)
        orig = cap.replace(",", " ,").replace(".", " .").split()
        tris = [orig[i:i + 3] for i in range(0, len(orig), 3)]
        w = o[2].split()
        assert [sorted(w[i:i + 3]) for i in range(0, len(w), 3)] == [sorted(t) for t in tris]
        w = o[3].split()
        assert sorted(tuple(w[i:i + 3]) for i in range(0, len(w), 3)) == sorted(tuple(t) for t in tris)


def _karpathy(tmp_path):
    for i in range(2):
        _jpeg(tmp_path / "imgs" / "val2014" / f"{i}.jpg", (90 * i, 50, 50))
    data = [{"image": "val2014/0.jpg", "caption": ["A dog runs on the green grass.", "Dog.", "a cat near a red car"]},
            {"image": "val2014/1.jpg", "caption": ["Two men playing frisbee in a park at night!"]}]
    return _json(tmp_path / "coco_karpathy_test.json", data), data


def test_coco_order_loader_seeds_and_ties(tmp_path):
    ann, data = _karpathy(tmp_path)
    tables = Tables.empty()
    suite = SUITES["coco_order"](tables, SuiteOptions(annotations=str(tmp_path), images=str(tmp_path / "imgs"),
                                                      seeds=(1, 2)))
    t1, t2 = suite.choice
    assert (t1.name, t1.rule, suite.tie_rule) == ("order_s1", "first_ties_win", "first_ties_win")
    assert t1.left.shape == (4, 1) and t1.right.shape == (4, 5)
    assert t1.left[:, 0].tolist() == [0, 0, 0, 1] and t1.ids[1] == "val2014/0.jpg#1"
    texts = [[tables.texts.entries[j] for j in row] for row in t1.right]
    assert texts[0][0] == pre_caption(data[0]["caption"][0]) == "a dog runs on the green grass"
    assert all(t == "dog" for t in texts[1])  # nothing to shuffle: every candidate is the original
    assert suite.meta["perturbed_equal_original"]["order_s1"] >= 4
    assert suite.view_average == {"order": ["order_s1", "order_s2"]}
    again = Tables.empty()
    t1b = SUITES["coco_order"](again, SuiteOptions(annotations=str(ann), images=str(tmp_path / "imgs"))).choice[0]
    assert [[again.texts.entries[j] for j in row] for row in t1b.right] == texts  # same seed, same shuffles
    assert [[tables.texts.entries[j] for j in row] for row in t2.right] != texts
    # first_ties_win: the all-identical row is correct whatever the embeddings
    _, v = choice_metrics(t1, _scores(tables, t1))
    assert v["correct"][1] and v["tie"][1]


def test_flickr_order_needs_annotations_and_images(tmp_path):
    with pytest.raises(ValueError, match="needs --annotations"):
        SUITES["flickr_order"](Tables.empty(), SuiteOptions())
    with pytest.raises(FileNotFoundError, match="flickr30k_test.json does not exist"):
        SUITES["flickr_order"](Tables.empty(), SuiteOptions(annotations=str(tmp_path), images=str(tmp_path)))
    ann, _ = _karpathy(tmp_path)
    with pytest.raises(ValueError, match="needs --images"):
        SUITES["flickr_order"](Tables.empty(), SuiteOptions(annotations=str(ann))).check_images()


def test_real_coco_order_counts(rococo_dir, tmp_path):
    tables = Tables.empty()
    (suite,) = load_suites(["coco_order"], tables, SuiteOptions(annotations=str(rococo_dir), images=str(tmp_path)))
    (t,) = suite.choice
    assert t.right.shape == (25010, 5) and len(tables.images) == 5000


# -- hard positives --------------------------------------------------------------------------------
def _hp_items(n, bbox=False, seed=0):
    rng = np.random.default_rng(seed)
    caps = ["a white dog", "a black dog", "a dog that is white", "the cat on the mat", "the mat on the cat"]
    out = []
    for i in range(n):
        it = {"image_id": str(i), "image_path": f"data/VG_100K_2/{i % 3}.jpg", "true_caption": caps[rng.integers(5)],
              "false_caption": caps[rng.integers(5)]}
        if bbox:
            it.update(bbox_x=i % 2, bbox_y=0, bbox_w=6, bbox_h=5)
        out.append(it)
    return out


def _hard_positives(tmp_path, seed=0):
    for i in range(3):
        _jpeg(tmp_path / "data" / "VG_100K_2" / f"{i}.jpg", (50, 80 * i, 10), size=(10, 9))
    files = {}
    for k, (stem, bbox) in enumerate((("vl_checklist_attributes", False), ("visual_genome_attribution", True))):
        orig = _hp_items(9 + k, bbox, seed + k)
        swap = [dict(it, true_caption=_hp_items(9 + k, bbox, seed + 10 + k)[i]["true_caption"])
                for i, it in enumerate(orig)]
        _json(tmp_path / "data" / f"{stem}.json", orig)
        _json(tmp_path / "swapped_data" / f"{stem}.json", swap)
        files[stem] = (orig, swap)
    _json(tmp_path / "data" / "vl_checklist_relations.json", _hp_items(3))  # no swapped twin
    return files


def test_hard_positives_sets_crop_and_reference_metrics(tmp_path):
    files = _hard_positives(tmp_path)
    tables = Tables.empty()
    suite = SUITES["hard_positives"](tables, SuiteOptions(data=str(tmp_path)))
    assert suite.meta["sets_found"] == ["swap", "replace_attribute"]
    assert suite.meta["sets_missing"] == ["replace_relation"]
    assert suite.meta["unpaired_files"] == ["data/vl_checklist_relations.json"]
    assert suite.view_average == {}  # REPLACE needs both of its sets
    swap, att = suite.choice
    assert tables.images.entries[swap.left[1, 0]].crop == (1.0, 0.0, 6.0, 5.0)
    assert tables.images.entries[att.left[0, 0]].crop is None
    assert tables.images.entries[att.left[0, 0]].uri.endswith(os.path.join("data", "VG_100K_2", "0.jpg"))
    for task, stem in ((swap, "visual_genome_attribution"), (att, "vl_checklist_attributes")):
        m, _ = choice_metrics(task, _scores(tables, task))
        a = m["all"]
        orig, swapped = files[stem]
        s = []  # brute force, as the reference's run_eval.py: (c, c_P, c_N) per item
        for it, sw in zip(orig, swapped):
            crop = None if "bbox_x" not in it else tuple(float(it[k]) for k in ("bbox_x", "bbox_y", "bbox_w", "bbox_h"))
            im = _vec(("img", os.path.basename(it["image_path"]), crop))
            caps = (it["true_caption"], sw["true_caption"], it["false_caption"])
            s.append([float(im @ _vec(("txt", x))) for x in caps])
        n = len(s)
        assert a["original_accuracy"] == pytest.approx(100 * sum(c > cn for c, p, cn in s) / n)
        assert a["augmented_accuracy"] == pytest.approx(100 * sum(c > cn and p > cn for c, p, cn in s) / n)
        assert a["brittleness"] == pytest.approx(100 * sum(c > cn > p for c, p, cn in s) / n)
        assert a["orderings"]["p_gt_n_gt_c"] == sum(p > cn > c for c, p, cn in s)
        assert a["orderings"]["n_gt_c_and_p"] == sum(cn > c and cn > p for c, p, cn in s)
        assert a["ties"] == sum(cn == c or cn == p for c, p, cn in s)
        assert sum(a["orderings"].values()) + a["ties"] == a["items"] == n


def test_hard_positive_ties_only_count_against_the_negative():
    t = ChoiceTask(name="t", rule="triplet", left_modality="image", right_modality="text", left=np.zeros((3, 1), int),
                   right=np.zeros((3, 3), int), ids=["0", "1", "2"])
    s = np.array([[[0.5, 0.5, 0.1]],    # c == c_P: not a tie, augmented
                  [[0.5, 0.2, 0.2]],    # c_P == c_N: tie; original right, augmented wrong, not brittle
                  [[0.3, 0.3, 0.3]]])   # all equal: tie, everything wrong
    m, v = choice_metrics(t, s)
    assert v["augmented"].tolist() == [True, False, False] and v["original"].tolist() == [True, True, False]
    assert m["all"]["ties"] == 2 and m["all"]["brittleness"] == 0.0
    assert m["all"]["orderings"] == {"c_and_p_gt_n": 1, "c_gt_n_gt_p": 0, "p_gt_n_gt_c": 0, "n_gt_c_and_p": 0}


def test_hard_positives_alignment_and_bbox_errors(tmp_path):
    files = _hard_positives(tmp_path)
    orig, swap = files["vl_checklist_attributes"]
    swap[4] = dict(swap[4], false_caption="something else")
    _json(tmp_path / "swapped_data" / "vl_checklist_attributes.json", swap)
    with pytest.raises(SuiteFormatError, match=r"vl_checklist_attributes\.json disagree at index 4 on 'false_caption'"):
        SUITES["hard_positives"](Tables.empty(), SuiteOptions(data=str(tmp_path)))
    _json(tmp_path / "swapped_data" / "vl_checklist_attributes.json", swap[:4])
    with pytest.raises(SuiteFormatError, match=r"has 9 items but .*swapped_data.vl_checklist_attributes\.json has 4"):
        SUITES["hard_positives"](Tables.empty(), SuiteOptions(data=str(tmp_path)))
    _json(tmp_path / "swapped_data" / "vl_checklist_attributes.json", files["vl_checklist_attributes"][0])
    o, _ = files["visual_genome_attribution"]
    del o[6]["bbox_y"]
    _json(tmp_path / "data" / "visual_genome_attribution.json", o)
    with pytest.raises(SuiteFormatError, match=r"data.visual_genome_attribution\.json: item 6 lacks bbox key"):
        SUITES["hard_positives"](Tables.empty(), SuiteOptions(data=str(tmp_path)))


# -- InpaintCOCO -----------------------------------------------------------------------------------
def _image_struct():
    import pyarrow as pa

    return pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _inpaint_shard(path, rows, image_type=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {k: [r[k] for r in rows] for k in rows[0]}
    typ = image_type or _image_struct()
    schema = pa.schema([(k, typ if k in ("coco_image", "inpaint_image") else pa.string()) for k in cols])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=schema), path)
    return path


def _inpaint_row(i, cap_b="a blue cup", concept="color", coco_size=(12, 8), inp_size=(9, 14)):
    return {"concept": concept, "coco_caption": f"a red cup {i}", "inpaint_caption": cap_b,
            "coco_image": {"bytes": _jpeg_bytes(coco_size, (200, 10, i)), "path": f"{i}.jpg"},
            "inpaint_image": {"bytes": _jpeg_bytes(inp_size, (10, 10, 200 - i)), "path": f"{i}_inp.jpg"}}


def test_inpaintcoco_shards_structs_sizes_and_empty_captions(tmp_path):
    d = tmp_path / "InpaintCOCO" / "data"
    _inpaint_shard(d / "test-00001-of-00002.parquet", [_inpaint_row(3, concept="size"), _inpaint_row(4, cap_b=None)])
    _inpaint_shard(d / "test-00000-of-00002.parquet", [_inpaint_row(0), _inpaint_row(1, cap_b="  "),
                                                        _inpaint_row(2, concept="object")])
    tables = Tables.empty()
    (suite,) = load_suites(["inpaintcoco"], tables, SuiteOptions(data=str(tmp_path / "InpaintCOCO")))
    (t,) = suite.choice
    assert [os.path.basename(s) for s in suite.meta["shards"]] == ["test-00000-of-00002.parquet",
                                                                  "test-00001-of-00002.parquet"]
    assert t.ids == ["test-00000-of-00002.parquet/0", "test-00000-of-00002.parquet/2", "test-00001-of-00002.parquet/0"]
    assert t.subset == ["color", "object", "size"] and t.skipped == {"empty_caption": 2}
    assert suite.meta["rows"] == 5 and suite.meta["empty_by_column"] == {"inpaint_caption": 2, "coco_caption": 0}
    assert all(tables.images.keys(threads=1)) and not tables.images.failed
    sizes = {decode_image(tables.images.entries[j]).size for j in t.left[0]}
    assert sizes == {(12, 8), (9, 14)}  # the two images of a row differ in size
    m, _ = choice_metrics(t, _scores(tables, t))
    assert set(m) == {"all", "color", "object", "size"} and m["all"]["items"] == 3


def test_inpaintcoco_row_without_bytes_is_recorded_by_keys(tmp_path):
    row = _inpaint_row(1)
    row["inpaint_image"] = {"bytes": None, "path": "elsewhere.jpg"}
    f = _inpaint_shard(tmp_path / "test-00000-of-00001.parquet", [_inpaint_row(0), row])
    tables = Tables.empty()
    SUITES["inpaintcoco"](tables, SuiteOptions(data=str(tmp_path)))
    tables.images.keys(threads=1)
    (why,) = tables.images.failed.values()
    assert str(f) in why and "row 1 column 'inpaint_image' holds no image bytes" in why


def test_inpaintcoco_format_errors_name_file_column_and_row(tmp_path):
    import pyarrow as pa

    d = tmp_path / "a"
    _inpaint_shard(d / "test-00000-of-00003.parquet", [_inpaint_row(0)])
    _inpaint_shard(d / "test-00002-of-00003.parquet", [_inpaint_row(1)])
    with pytest.raises(FileNotFoundError, match=r"test shard\(s\) \[1\] of 3 are missing"):
        SUITES["inpaintcoco"](Tables.empty(), SuiteOptions(data=str(d)))
    row = _inpaint_row(0)
    del row["inpaint_caption"]
    f = _inpaint_shard(tmp_path / "b" / "test-00000-of-00001.parquet", [row])
    msg = r"b.test-00000-of-00001\.parquet: missing column\(s\) \['inpaint_caption'\]"
    with pytest.raises(SuiteFormatError, match=msg):
        SUITES["inpaintcoco"](Tables.empty(), SuiteOptions(data=str(f)))
    row = dict(_inpaint_row(0), coco_image="COCO_val2014_1.jpg", inpaint_image="1_inp.jpg")
    f = _inpaint_shard(tmp_path / "c" / "x.parquet", [row], image_type=pa.string())
    with pytest.raises(SuiteFormatError, match=r"x\.parquet: column 'coco_image' has type string, expected a Hugging "
                                               r"Face image struct .* row 0 holds 'COCO_val2014_1\.jpg'"):
        SUITES["inpaintcoco"](Tables.empty(), SuiteOptions(data=str(tmp_path / "c")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .parquet shards found"):
        SUITES["inpaintcoco"](Tables.empty(), SuiteOptions(data=str(tmp_path / "empty")))


def test_new_suites_are_registered():
    assert {"sugarcrepe", "aro", "coco_order", "flickr_order"} <= set(SUITES)
