"""VALSE, COLA, EqBen and CREPE: release layouts scored against each benchmark's own rule (written here from its
code, independently of hardrank's), the rules they brought (first_rank, multilabel), bad input, several suites."""
from __future__ import annotations

import ast
import csv
import json
import shutil
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hardrank import evaluate
from hardrank.config import build
from hardrank.items import Tables
from hardrank.jobs.bench.standins import write_standins
from hardrank.scoring.blind import blind_unresolvable
from hardrank.scoring.metrics import average_precision, choice_metrics
from hardrank.suites import SuiteFormatError, SuiteOptions, load_suites
from hardrank.tasks import ChoiceTask

NEW = ("valse", "cola", "eqben", "crepe")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("compositional_more")
    write_standins(root, scale=0.03, image_size=(24, 18), seed=2, suites=NEW)
    tables = Tables.empty()
    load_suites(list(NEW), tables, SuiteOptions(data=str(root), images=str(root)))
    rng = np.random.default_rng(11)
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
    return float(world["vec"][("image", image_id)] @ world["vec"][("text", text)])


def _pct(xs):
    return 100.0 * sum(xs) / len(xs)


# -- VALSE ---------------------------------------------------------------------------------------------------
def test_valse_matches_its_pairwise_accuracy_on_validated_items(world, tmp_path):
    _, out = _run(world, ["valse"], tmp_path)
    r, rows = out["valse"]
    m, accs, ties = r["metrics"], [], 0
    for f in sorted((world["root"] / "VALSE" / "data").glob("*.json")):
        items = json.loads(f.read_text())
        valid = {k: it for k, it in items.items() if it["mturk"]["caption"] >= 2}  # README: the valid set
        ok = {}
        for k, it in valid.items():  # lxmert_valse_eval.py: pairwise_acc counts caption score > foil score
            c, fo = _s(world, it["image_file"], it["caption"]), _s(world, it["image_file"], it["foil"])
            ok[k] = c > fo
            ties += c == fo
        assert m[f.stem]["all"]["accuracy"] == pytest.approx(_pct(list(ok.values()))), f.stem
        assert m[f.stem]["all"]["items"] == len(valid)
        assert {k: rows[(f.stem, k)]["correct"] for k in ok} == ok
        assert not any((f.stem, k) in rows for k in items if k not in valid)  # unvalidated items are not scored
        assert r["suite_meta"]["validation"][f.stem] == {"items": len(items), "kept": len(valid),
                                                        "dropped": len(items) - len(valid)}
        accs.append(_pct(list(ok.values())))
    assert len(accs) == 11 and ties > 0 and r["tie_rule"] == "first_strict"
    assert m["average"]["all"]["accuracy"] == pytest.approx(np.mean(accs))  # the paper's Avg.: over pieces
    blind = m["actant-swap"]["all"]["blind"]  # swapped actants reuse the caption's words
    assert blind["items_unresolvable"] > 0 and blind["bow_accuracy_unresolvable"] == 0.0


def test_valse_real_annotation_schema_is_read(tmp_path):
    """An item as the release writes it (README example, counting-*.json's extra fields) loads; the
    validation keeps caption votes >= 2."""
    d = tmp_path / "VALSE" / "data"
    d.mkdir(parents=True)
    items = {"counting_visual7w_1": {"dataset": "visual7w", "dataset_idx": "1", "image_file": "v7w_1.jpg",
                                     "linguistic_phenomena": "counting", "caption": "There are exactly 4 cars parked.",
                                     "answer": 4, "classes": 4, "split": "test", "original_split": "test",
                                     "classes_foil": 0, "mturk": {"foil": 0, "caption": 2, "other": 1},
                                     "foil": "There are exactly 0 cars parked."},
             "counting_visual7w_2": {"dataset": "visual7w", "dataset_idx": "2", "image_file": "v7w_2.jpg",
                                     "linguistic_phenomena": "counting", "caption": "There are exactly 4 wheels.",
                                     "answer": 4, "classes": 4, "split": "test", "original_split": "test",
                                     "classes_foil": 2, "mturk": {"foil": 1, "caption": 1, "other": 1},
                                     "foil": "There are exactly 2 wheels."}}
    (d / "counting-adversarial.json").write_text(json.dumps(items))
    tables = Tables.empty()
    (s,) = load_suites(["valse"], tables, SuiteOptions(data=str(tmp_path)))
    assert s.choice[0].ids == ["counting_visual7w_1"] and tables.images.ids == ["v7w_1.jpg"]
    assert s.meta["count_mismatch"] == {"counting-adversarial": [1, 691]}


@pytest.mark.parametrize("edit, message", [
    (lambda d: {k: {**{x: y for x, y in v.items() if x != "foil"}, "foils": [v["foil"]]} for k, v in d.items()},
     r"existence\.json: item '.*' lacks key\(s\) \['foil'\]; it has .*'foils' where the release has 'foil'"),
    (lambda d: {k: {x: y for x, y in v.items() if x != "mturk"} for k, v in d.items()},
     r"lacks key\(s\) \['mturk'\].*carry the mturk validation votes"),
    (lambda d: {k: {**v, "mturk": {"caption": "3"}} for k, v in d.items()}, r"'mturk' is .* expected integer vote"),
    (lambda d: list(d.values()), r"existence\.json: a JSON list, expected an object keyed by item id"),
    (lambda d: {}, r"existence\.json: holds no items"),
])
def test_valse_bad_pieces(world, tmp_path, edit, message):
    d = tmp_path / "VALSE"
    shutil.copytree(world["root"] / "VALSE", d)
    f = d / "data" / "existence.json"
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))
    with pytest.raises(SuiteFormatError, match=message):
        load_suites(["valse"], Tables.empty(), SuiteOptions(data=str(tmp_path)))


# -- COLA ----------------------------------------------------------------------------------------------------
def _ap_reference(scores, truth):
    """Average precision as a step function over the distinct score thresholds, highest first: at each, the
    recall gained times the precision of everything scoring at least that much (torchmetrics' binary AP)."""
    total = sum(truth)
    if total == 0:
        return 0.0
    ap, prev = 0.0, 0.0
    for t in sorted(set(scores), reverse=True):
        hits = [y for s, y in zip(scores, truth) if s >= t]
        recall = sum(hits) / total
        ap += (recall - prev) * sum(hits) / len(hits)
        prev = recall
    return ap


def test_cola_matches_its_pair_metric_and_map(world, tmp_path):
    _, out = _run(world, ["cola"], tmp_path)
    r, rows = out["cola"]
    m = r["metrics"]
    d = world["root"] / "COLA" / "data"
    image_ok, text_ok, group_ok = {}, {}, {}
    for i, (u1, c1, u2, c2) in enumerate(json.loads((d / "COLA_multiobjects_matching_benchmark.json").read_text())):
        i1, i2 = u1.rsplit("/", 1)[1], u2.rsplit("/", 1)[1]
        p = np.array([[_s(world, i1, c1), _s(world, i1, c2)], [_s(world, i2, c1), _s(world, i2, c2)]])
        image_ok[str(i)] = bool(p[0, 0] > p[1, 0] and p[1, 1] > p[0, 1])  # scripts/eval.py ColaMultiObjAcc
        text_ok[str(i)] = bool(p[0, 0] > p[0, 1] and p[1, 1] > p[1, 0])
        group_ok[str(i)] = image_ok[str(i)] and text_ok[str(i)]
    a = m["multi_object"]["all"]
    assert a["image_score"] == pytest.approx(_pct(list(image_ok.values())))
    assert (a["text_score"], a["group_score"]) == pytest.approx((_pct(list(text_ok.values())),
                                                                 _pct(list(group_ok.values()))))
    assert {k: dict(rows[("multi_object", k)]["verdicts"])["image"] for k in image_ok} == image_ok
    for task, fname in (("single_gqa", "GQA"), ("single_clevr", "CLEVR"), ("single_paco", "PACO")):
        data = json.loads((d / f"COLA_singleobjects_benchmark_{fname}.json").read_text())
        labels, items = data["labels"], data["data"]
        preds = [[_s(world, it[0].rsplit("/", 1)[1], lab) for lab in labels] for it in items]
        aps = []
        for c in range(len(labels)):  # ColaSingleObjAP: per class, over the images its hard_list marks
            lab_row = [it[-2][c] for it in items]
            if sum(lab_row) == 0:
                continue
            hard = [j for j, it in enumerate(items) if it[-1][c] == 1]
            if not hard:
                continue
            aps.append(_ap_reference([preds[j][c] for j in hard], [lab_row[j] for j in hard]))
        assert m[task]["all"]["mAP"] == pytest.approx(100 * np.mean(aps)), task
        assert m[task]["all"]["classes"] == len(aps)
        assert rows[(task, "0")]["scores"] == pytest.approx(preds[0], abs=1e-6)  # the row's class scores
    assert r["suite_meta"]["headline"] == {"entries": ["multi_object"], "key": "image_score"}
    from hardrank.scoring.results import summary_row

    assert summary_row(r)["single_gqa mAP"] == m["single_gqa"]["all"]["mAP"]  # in the terminal table
    from hardrank.jobs.report.tables import main_metric

    assert main_metric(r) == ("multi_object image_score", pytest.approx(_pct(list(image_ok.values()))))


def test_average_precision_groups_ties_and_matches_a_step_reference():
    rng = np.random.default_rng(3)
    assert average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1, 0, 1, 0])) == pytest.approx(5 / 6)
    assert average_precision(np.array([0.9, 0.5, 0.5, 0.1]), np.array([1, 1, 0, 0])) == pytest.approx(5 / 6)
    assert average_precision(np.array([0.3, 0.2]), np.array([0, 0])) == 0.0
    for n in (1, 2, 7, 31):
        for _ in range(20):
            x = rng.choice([0.1, 0.2, 0.3, 0.4], size=n)
            y = rng.random(n) < 0.4
            assert average_precision(x, y) == pytest.approx(_ap_reference(x.tolist(), y.tolist())), (x, y)


@pytest.mark.parametrize("fname, edit, message", [
    ("COLA_multiobjects_matching_benchmark.json", lambda d: d[:1] + [d[1][:3]] + d[2:],
     r"item 1 is .* expected \[image 1, caption 1, image 2, caption 2\]"),
    ("COLA_multiobjects_matching_benchmark.json", lambda d: [], r"matching_benchmark\.json: holds no items"),
    ("COLA_singleobjects_benchmark_GQA.json", lambda d: [d["labels"], d["data"]],
     r"has a JSON list, expected an object with keys 'labels'"),
    ("COLA_singleobjects_benchmark_CLEVR.json", lambda d: {**d, "data": d["data"][:2] + [d["data"][2][:2]]},
     r"CLEVR\.json: item 2 is .* expected \[image_file, annotation, label, hard_list\]"),
    ("COLA_singleobjects_benchmark_GQA.json",
     lambda d: {**d, "data": [[*d["data"][0][:2], d["data"][0][2][:5], d["data"][0][3]], *d["data"][1:]]},
     r"item 0 'label' is .* expected 320 values 0/1"),
])
def test_cola_bad_files(world, tmp_path, fname, edit, message):
    shutil.copytree(world["root"] / "COLA", tmp_path / "COLA")
    f = tmp_path / "COLA" / "data" / fname
    f.write_text(json.dumps(edit(json.loads(f.read_text()))))
    with pytest.raises(SuiteFormatError, match=message):
        load_suites(["cola"], Tables.empty(), SuiteOptions(data=str(tmp_path)))


# -- EqBen ---------------------------------------------------------------------------------------------------
def test_eqben_matches_cal_wino_score_by_subset(world, tmp_path):
    _, out = _run(world, ["eqben"], tmp_path)
    r, rows = out["eqben"]
    items = json.loads((world["root"] / "eqben_vllm" / "all_select.json").read_text())
    res, by = {}, defaultdict(list)
    for i, it in enumerate(items):
        if it["image0"].endswith(".npy"):
            continue
        c0i0, c1i0 = _s(world, it["image0"], it["caption0"]), _s(world, it["image0"], it["caption1"])
        c0i1, c1i1 = _s(world, it["image1"], it["caption0"]), _s(world, it["image1"], it["caption1"])
        text, image = c0i0 > c1i0 and c1i1 > c0i1, c0i0 > c0i1 and c1i1 > c1i0  # eqben_acc.cal_wino_score
        res[str(i)] = (text, image, text and image)
        by[it["image0"].split("/")[0]].append(str(i))
    m = r["metrics"]["eqben"]
    for key, ids in [("all", list(res)), *by.items()]:
        for j, name in enumerate(("text_score", "image_score", "group_score")):
            assert m[key][name] == pytest.approx(_pct([res[i][j] for i in ids])), (key, name)
    assert {i: rows[("eqben", i)]["correct"] for i in res} == {i: v[2] for i, v in res.items()}
    npy = sum(it["image0"].endswith(".npy") for it in items)
    assert npy and r["suite_meta"]["npy_rows_skipped"] == npy and m["all"]["items"] == len(items) - npy
    assert m["all"]["ties"] > 0


def test_eqben_light_release_jpg_and_bad_items(world, tmp_path):
    d = tmp_path / "eq"
    shutil.copytree(world["root"] / "eqben_vllm", d)
    for p in (d / "images").rglob("*.png"):  # the light release: every png converted to jpg
        p.rename(p.with_suffix(".jpg"))
    tables = Tables.empty()
    (s,) = load_suites(["eqben"], tables, SuiteOptions(data=str(d)))
    assert s.meta["png_read_as_jpg"] and all(Path(e.uri).is_file() for e in tables.images.entries)
    f = d / "all_select.json"
    items = json.loads(f.read_text())
    f.write_text(json.dumps(items[:3] + [{k: v for k, v in items[3].items() if k != "caption1"}]))
    with pytest.raises(SuiteFormatError, match=r"all_select\.json: item 3 lacks key\(s\) \['caption1'\]"):
        load_suites(["eqben"], Tables.empty(), SuiteOptions(data=str(f)))


# -- CREPE ---------------------------------------------------------------------------------------------------
def _crepe_files(root):
    for split in ("seen_compounds", "unseen_compounds"):
        for train in ("cc12m", "yfcc", "laion"):
            f = root / "syst_hard_negatives" / f"syst_vg_hard_negs_{split}_in_{train}.csv"
            for hn in ("atom", "comp", "combined"):
                yield f"syst_{split.split('_')[0]}_{train}_{hn}", f, f"valid_hard_negs_{hn}"
    for hn in ("atom", "negate", "swap"):
        for c in range(4, 13):
            yield f"prod_{hn}_c{c}", root / "prod_hard_negatives" / hn / f"prod_vg_hard_negs_{hn}_complexity_{c}.csv", \
                "hard_negs"


def test_crepe_matches_its_one2many_recall(world, tmp_path):
    _, out = _run(world, ["crepe"], tmp_path)
    r, rows = out["crepe"]
    m = r["metrics"]
    tasks = 0
    for task, f, column in _crepe_files(world["root"]):
        with f.open(newline="") as fh:
            data = list(csv.DictReader(fh))
        preds = []
        for i, row in enumerate(data):  # crepe_eval_utils.get_one2many_rank: argsort descending, caption at 0
            texts = [row["caption"]] + list(ast.literal_eval(row[column]))
            logits = np.array([_s(world, f"{row['image_id']}.jpg", t) for t in texts])
            ranking = np.argsort(-logits, kind="stable")  # torch's CPU sort keeps ties in order at these sizes
            preds.append(int(np.nonzero(ranking == 0)[0][0]))
            assert rows[(task, str(i))]["rank"] == preds[-1]
            assert len(rows[(task, str(i))]["scores"]) == len(texts)  # the row's own candidates only
        p = np.array(preds)
        a = m[task]["all"]  # get_one2many_metrics
        for k in (1, 3, 5, 10):
            assert a[f"R@{k}"] == pytest.approx(100 * np.mean(p < k)), (task, k)
        assert a["accuracy"] == a["R@1"]
        assert (a["mean_rank"], a["median_rank"]) == pytest.approx((p.mean() + 1, np.floor(np.median(p)) + 1))
        tasks += 1
    assert tasks == len([k for k in m if k.startswith(("syst_", "prod_"))]) == 45
    assert sum(m[k]["all"]["ties"] for k in m) > 0 and r["tie_rule"] == "first_rank"
    assert r["suite_meta"]["blind"]["tasks"]["prod_swap_c4"]["forced_verdict"] == "correct"  # ties go to the caption


def test_crepe_train_set_option_missing_images_and_bad_rows(world, tmp_path):
    root = tmp_path / "c"
    for sub in ("syst_hard_negatives", "prod_hard_negatives", "VG_100K", "VG_100K_2"):
        shutil.copytree(world["root"] / sub, root / sub)
    opts = build(SuiteOptions, {"data": str(root), "images": str(root), "crepe_train_data": ["laion"]})
    (s,) = load_suites(["crepe"], Tables.empty(), opts)
    assert {t.name.split("_")[2] for t in s.choice if t.name.startswith("syst")} == {"laion"}
    gone = sorted((root / "VG_100K").glob("*.jpg"))[0]  # CREPE is scored where its images are on disk
    gone.unlink()
    (s,) = load_suites(["crepe"], Tables.empty(), SuiteOptions(data=str(root), images=str(root)))
    assert gone.stem in s.meta["images_not_found"] and sum(s.meta["rows_without_image"].values()) > 0
    f = root / "prod_hard_negatives" / "swap" / "prod_vg_hard_negs_swap_complexity_5.csv"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:2] + [lines[2].replace("']", "'", 1)] + lines[3:]) + "\n")
    with pytest.raises(SuiteFormatError, match=r"complexity_5\.csv: line 3 column 'hard_negs' is .* expected a list"):
        load_suites(["crepe"], Tables.empty(), SuiteOptions(data=str(root), images=str(root)))
    f.write_text(lines[0].replace("hard_negs", "negatives") + "\n")
    with pytest.raises(SuiteFormatError, match=r"no column\(s\) \['hard_negs'\]; its header has .*another version"):
        load_suites(["crepe"], Tables.empty(), SuiteOptions(data=str(root), images=str(root)))


# -- the rules the new suites brought ------------------------------------------------------------------------
def test_first_rank_with_retrieval_sets_of_several_sizes():
    # row 0: 3 real candidates; row 1: 2 real + padding (repeating candidate 0, never scored); row 2: alone
    t = ChoiceTask(name="r", rule="first_rank", left_modality="image", right_modality="text",
                   left=np.zeros((3, 1), int), right=np.array([[0, 1, 2], [3, 4, 3], [5, 5, 5]]),
                   ids=["a", "b", "c"], candidates=np.array([3, 2, 1]))
    t.validate()
    s = np.array([[[0.5, 0.5, 0.9]], [[0.4, 0.1, 0.4]], [[0.2, 0.2, 0.2]]])
    m, v = choice_metrics(t, s)
    assert v["rank"].tolist() == [1, 0, 0] and v["correct"].tolist() == [False, True, True]
    assert v["tie"].tolist() == [True, False, False]  # padding equal to the first is no tie
    assert m["all"]["R@1"] == pytest.approx(200 / 3) and m["all"]["R@3"] == 100.0 and m["all"]["ties"] == 1
    assert (m["all"]["mean_rank"], m["all"]["median_rank"]) == pytest.approx((4 / 3, 1.0))
    texts = ["a b", "b a", "c", "x y", "y x", "z"]
    assert blind_unresolvable(t, texts).tolist() == [False, True, True]  # row 1's only real other: a reordering
    assert t.keep_rows(np.array([False, True, True])).candidates.tolist() == [2, 1]
    with pytest.raises(ValueError, match="candidates must be"):
        ChoiceTask(name="r", rule="first_rank", left_modality="image", right_modality="text", left=t.left,
                   right=t.right, ids=t.ids, candidates=np.array([3, 4, 1])).validate()


def test_multilabel_rule_leaves_out_classes_as_cola_does():
    truth = np.array([[1, 0, 0], [0, 0, 0], [1, 0, 1]], bool)
    elig = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 0]], bool)
    t = ChoiceTask(name="s", rule="multilabel", left_modality="image", right_modality="text",
                   left=np.zeros((3, 1), int), right=np.tile(np.arange(3), (3, 1)), ids=["0", "1", "2"],
                   truth=truth, eligible=elig)
    t.validate()
    s = np.array([[[0.9, 0.1, 0.0]], [[0.5, 0.2, 0.0]], [[0.2, 0.3, 0.0]]])
    m, v = choice_metrics(t, s)
    # class 0: AP over rows 0-2 = (1/2 * 1) + (1/2 * 2/3); class 1: no positive, left out; class 2: no eligible row
    assert m["all"]["mAP"] == pytest.approx(100 * (0.5 + 1 / 3)) and m["all"]["classes"] == 1
    assert (m["all"]["classes_without_positive"], m["all"]["classes_without_eligible"]) == (1, 1)
    assert v == {} and "blind" not in m["all"]
    with pytest.raises(ValueError, match="truth and eligible go with rule multilabel"):
        ChoiceTask(name="s", rule="multilabel", left_modality="image", right_modality="text", left=t.left,
                   right=t.right, ids=t.ids, truth=truth).validate()


# -- several suites in one command; a broken one is reported, the others run ---------------------------------
def test_new_suites_in_one_command_and_a_broken_one(world, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(world["root"], root, ignore=shutil.ignore_patterns("*.jpg", "*.png", "*.npy"))
    (root / "VALSE" / "data" / "plurals.json").write_text("{not json")
    rep = evaluate(embeddings=str(world["byo"]), suites=list(NEW), data=str(root), out=str(tmp_path / "res"),
                   bootstrap=20)
    assert [r["suite"] for r in rep.results] == ["cola", "eqben", "crepe"]
    crepe = rep.results[-1]  # intervals from the outcomes: R@1 of a rank rule, no verdict rows for the mAP
    assert len(crepe["ci95"]["prod_atom_c4"]["all"]["accuracy"]) == 2
    assert list(rep.failed_suites) == ["valse"] and "plurals.json: not valid JSON" in str(rep.failed_suites["valse"])


def test_missing_image_is_recorded_by_its_file_and_the_row_dropped(world, tmp_path):
    from helpers import save_random_checkpoint, write_tiny_config

    d = tmp_path / "d"
    shutil.copytree(world["root"] / "VALSE", d / "VALSE")
    shutil.copytree(world["root"] / "visual7w", d / "visual7w")
    for p in (d / "VALSE" / "data").glob("*.json"):
        if p.name != "existence.json":
            p.unlink()
    items = json.loads((d / "VALSE" / "data" / "existence.json").read_text())
    valid = [it for it in items.values() if it["mturk"]["caption"] >= 2]
    (d / "visual7w" / "images" / valid[0]["image_file"]).unlink()
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "m.safetensors", seed=0)
    rep = evaluate(model=str(cfg), checkpoints=[str(ckpt)], suites=["valse"], data=str(d), images=str(d),
                   out=str(tmp_path / "res"), store=str(tmp_path / "store"), batch_size=8)
    (r,) = rep.results
    lost = sum(it["image_file"] == valid[0]["image_file"] for it in valid)
    assert r["failed_items"] == 1 and valid[0]["image_file"] in r["failures"][0]["source"]
    assert r["counts"]["existence"]["skipped"] == {"unreadable": lost}
    assert r["metrics"]["existence"]["all"]["items"] == len(valid) - lost


def test_every_compositional_suite_from_one_data_folder(tmp_path):
    """The compositional releases side by side under one --data and one --images, as the benchmark runs
    them: each loader finds its own files (EqBen its annotation though ARO's JSON files sit at the top)."""
    from hardrank.jobs.bench.standins import STANDIN_SUITES as SUITES

    write_standins(tmp_path, scale=0.005, image_size=(8, 6), seed=3)
    failures = {}
    suites = load_suites(list(SUITES), Tables.empty(), SuiteOptions(data=str(tmp_path), images=str(tmp_path)),
                         failures=failures)
    assert failures == {} and [s.name for s in suites] == list(SUITES)
    assert next(s for s in suites if s.name == "eqben").meta["annotations"].endswith("eqben_vllm/all_select.json")
