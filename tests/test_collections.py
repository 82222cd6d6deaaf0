"""Task lists and DataComp's aggregates: the built-in 38, a recorded table, the main metrics against slow twins."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import import_clip_benchmark, install_clip_benchmark, worst_group_twin

from hardrank.errors import DataError
from hardrank.scoring.task_metrics import (
    METRICS,
    TaskOutputs,
    group_column,
    macro_f1,
    main_metric,
    mean_average_precision,
    mean_recall_at_1,
    winogavil_jaccard,
    worst_group_accuracy,
)
from hardrank.suites.collections import (
    DATACOMP_GROUPS,
    TaskSpec,
    aggregate,
    collection_result,
    collection_tasks,
    datacomp_tasks,
    parse_tasklist,
    read_tasklist,
)

# open_clip's docs/openclip_results.csv (mlfoundations/open_clip, commit 0a1cc150), five rows as published: the 38
# DataComp tasks' main metrics (rounded to 4 places) and their average, computed by DataComp's evaluation
RECORDED = Path(__file__).parent / "golden" / "openclip_results_38.csv"
AVERAGE = "Average perf. on 38 datasets"


# -- the task list -----------------------------------------------------------------------------------------------
def test_builtin_list_is_datacomps_38_with_their_main_metrics():
    tasks = datacomp_tasks()
    header = next(csv.reader(RECORDED.open()))
    assert len(tasks) == 38 and sorted(t.name for t in tasks) == sorted(header[3:])
    metric = {t.name: t.main_metric for t in tasks}
    assert {n for n, m in metric.items() if m == "mean_per_class_recall"} == {
        "Caltech-101", "FGVC Aircraft", "Oxford Flowers-102", "Oxford-IIIT Pet"}
    assert metric["Flickr"] == metric["MSCOCO"] == "mean_recall@1"
    assert (metric["Dollar Street"], metric["GeoDE"], metric["FMoW"]) == ("acc_top5_wg", "acc_wg", "acc_worst_region")
    assert (metric["iWildCam"], metric["WinoGAViL"]) == ("F1-macro_all", "jaccard_score_10-12")
    assert metric["Pascal VOC 2007"] == "acc1"  # DataComp scores VOC's object crops (CLIP_benchmark's voc2007)
    assert sum(m == "acc1" for m in metric.values()) == 27
    geode = next(t for t in tasks if t.key == "fairness/geode")
    assert (geode.group_by, geode.metadata_fields, geode.size, geode.tags) == ("region", ("region", "country"),
                                                                               12488, ("fairness",))
    assert {t.name for t in tasks if any(tag.startswith("vtab") for tag in t.tags)} == set(DATACOMP_GROUPS["VTAB"])


def _datacomp_aggregate(results: dict) -> dict:
    """The slow twin: aggregate_scores.get_aggregate_scores's arithmetic, by display name, np.mean."""
    out = {"ImageNet": results["ImageNet 1k"]}
    for group, names in DATACOMP_GROUPS.items():
        out[group] = np.mean([results[n] for n in names])
    out["Average"] = np.mean(list(results.values()))
    return out


def test_aggregates_reproduce_the_recorded_table():
    tasks = datacomp_tasks()
    rows = list(csv.DictReader(RECORDED.open()))
    assert len(rows) == 5
    for row in rows:
        published = float(row.pop(AVERAGE))
        label = f"{row.pop('name')} {row.pop('pretrained')}"
        scores = {k: float(v) for k, v in row.items()}
        got = aggregate(scores, tasks)
        # the table's per-task numbers are rounded to 4 places, its average is of the unrounded ones: equal
        # within the rounding (each value within 5e-5, so their mean too)
        assert abs(got["Average"] - published) <= 5e-5, label
        want = _datacomp_aggregate(scores)
        assert got["ImageNet"] == scores["ImageNet 1k"]
        for k in ("ImageNet dist. shifts", "VTAB", "Retrieval", "Average"):
            assert got[k] == pytest.approx(want[k], rel=1e-14, abs=0), (label, k)
        by_key = aggregate({t.key: scores[t.name] for t in tasks}, tasks)
        assert by_key == got and got["scored"] == 38 and "missing" not in got


def test_collection_results_of_the_recorded_table():
    """Per-task results holding the table's main metrics (as the dataset suites write them: percent) give the
    collection result of each row: DataComp's aggregates, each task's metric named by the list."""
    tasks = datacomp_tasks()
    for row in csv.DictReader(RECORDED.open()):
        published = float(row[AVERAGE])
        results = {t.key: {"task_type": "ranking" if t.key.startswith("retrieval/") else "classification",
                           "task_metrics": {"acc1": -1.0, t.main_metric: 100 * float(row[t.name])}} for t in tasks}
        doc = collection_result("datacomp", tasks, results, "ckpt")
        assert doc["task_type"] == "collection" and doc["scored"] == doc["of"] == 38 and not doc["missing"]
        assert doc["metrics"]["Average"] == pytest.approx(100 * published, abs=5e-3)
        assert doc["metrics"]["ImageNet"] == pytest.approx(100 * float(row["ImageNet 1k"]))
        assert doc["tasks"]["vtab/caltech101"]["main_metric"] == "mean_per_class_recall"
        assert doc["tasks"]["fairness/dollar_street"]["value"] == pytest.approx(100 * float(row["Dollar Street"]))
    del results["misc/winogavil"]  # a task that did not run: listed with why, its aggregates empty
    doc = collection_result("datacomp", tasks, results, "ckpt", {"misc/winogavil": "misc/winogavil: not scored"})
    assert doc["metrics"]["Retrieval"] is None and doc["metrics"]["Average"] is None and doc["scored"] == 37
    assert doc["metrics"]["VTAB"] is not None and doc["missing"]["Retrieval"] == ["WinoGAViL"]
    assert doc["tasks"]["misc/winogavil"] == {"name": "WinoGAViL", "main_metric": "jaccard_score_10-12",
                                              "value": None, "why": "misc/winogavil: not scored"}
    # CLIP_benchmark's collections: each dataset's headline by its task, their plain mean
    vtab = collection_tasks("retrieval")
    doc = collection_result("retrieval", vtab, {"flickr30k": {"task_type": "ranking", "task_metrics": {
        "mean_recall@1": 60.0}}, "flickr8k": {"task_type": "ranking", "task_metrics": {"mean_recall@1": 40.0}},
        "mscoco_captions": {"task_type": "ranking", "task_metrics": {"mean_recall@1": 20.0}}}, "c")
    assert doc["metrics"] == {"Average": pytest.approx(40.0)} and collection_tasks("karpathy") is None


def test_a_wrong_task_entry_fails_alone():
    errors = {}
    tasks = parse_tasklist("a:\n  name: A\nb:\n  main_metric: acc_top1\nc:\n  size: many\n", "l.yml", errors)
    assert [t.key for t in tasks] == ["a"] and list(errors) == ["b", "c"]
    assert "unknown main_metric 'acc_top1'" in str(errors["b"]) and "size is 'many'" in str(errors["c"])
    with pytest.raises(DataError, match="given twice"):  # the file itself wrong: no task list at all
        parse_tasklist("a:\n  name: A\na:\n  name: B\n", "l.yml", errors)


def test_aggregates_of_a_partial_run_name_what_is_missing():
    tasks = datacomp_tasks()
    scores = {t.key: 50.0 for t in tasks if t.name not in ("Flickr", "GeoDE")}
    scores["vtab/svhn"] = float("nan")  # a task whose metric came out empty counts as unscored
    got = aggregate(scores, tasks)
    assert got["ImageNet"] == 50.0 and got["ImageNet dist. shifts"] == 50.0
    assert got["VTAB"] is None and got["Retrieval"] is None and got["Average"] is None
    assert got["missing"] == {"VTAB": ["SVHN"], "Retrieval": ["Flickr"], "Average": ["SVHN", "Flickr", "GeoDE"]}
    own = parse_tasklist("a:\n  name: A\nb:\n  name: B\n  main_metric: acc5\n")
    assert aggregate({"a": 1.0, "B": 2.0}, own) == {"Average": 1.5, "tasks": 2, "scored": 2}  # no DataComp group
    with pytest.raises(DataError, match="'c', which is no task"):
        aggregate({"c": 1.0}, own)
    with pytest.raises(DataError, match="scored twice"):
        aggregate({"a": 1.0, "A": 1.0}, own)


def test_a_tasklist_file_of_ones_own(tmp_path):
    f = tmp_path / "mine.yml"
    f.write_text("\ufeff---\n# two of DataComp's, one of mine\nvtab/pets:\n  name: Pets\n  main_metric: "
                 "mean_per_class_recall\nfairness/geode:\n  main_metric: acc_wg\nwds_mine:\n  main_metric: acc_wg\n"
                 "  group_by: site\n  metadata_fields: [camera, site]\n  tags: [mine]\n...\n")
    pets, geode, mine = read_tasklist(f)
    assert (pets.key, pets.name, pets.main_metric) == ("vtab/pets", "Pets", "mean_per_class_recall")
    assert geode.name == "fairness/geode" and geode.group_by == "region"  # DataComp's metadata fields by default
    assert (mine.group_by, mine.metadata_fields, mine.tags) == ("site", ("camera", "site"), ("mine",))


@pytest.mark.parametrize("text, match", [
    ("a:\n  main_metric: acc_1\n", r"mine\.yml: task 'a': unknown main_metric 'acc_1' \(did you mean 'acc1'"),
    ("a:\n  name: A\n  main_metrc: acc1\n", r"task 'a' has an unknown field 'main_metrc' \(did you mean 'main_metric'"),
    ("a:\n  name: A\na:\n  name: B\n", r"line 3: 'a' is given twice \(first on line 1\)"),
    ("a:\n  name: A\nb:\n  name: A\n", r"task 'b' has the name 'A' of task 'a'"),
    ("mine:\n  main_metric: acc_wg\n", r"task 'mine': main_metric acc_wg is a worst-group accuracy; .*group_by"),
    ("m:\n  main_metric: acc_wg\n  group_by: site\n  metadata_fields: [camera]\n", r"'site' is not among .*camera"),
    ("- a\n- b\n", r"expected a mapping of task keys"),
    ("a:\n  size: many\n", r"task 'a': size is 'many'; expected a whole number"),
    ("a: [1\n", r"not valid YAML"),
])
def test_bad_tasklists_name_the_file_the_task_and_the_fix(tmp_path, text, match):
    f = tmp_path / "mine.yml"
    f.write_text(text)
    with pytest.raises(DataError, match=match):
        read_tasklist(f)


# -- the metric functions and their slow twins ----------------------------------------------------------------------
def _f1_twin(pred, labels):
    f1s = []
    for c in sorted(set(labels.tolist())):
        tp = sum(p == c and y == c for p, y in zip(pred, labels))
        fp = sum(p == c and y != c for p, y in zip(pred, labels))
        fn = sum(p != c and y == c for p, y in zip(pred, labels))
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn)
        f1s.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    return 100 * sum(f1s) / len(f1s)


def _ap_twin(scores, targets):
    aps = []
    for k in range(scores.shape[1]):
        order = sorted(range(len(scores)), key=lambda i: (-scores[i, k], i))  # ties: the earlier sample first
        hits, total = 0, 0.0
        for rank, i in enumerate(order, start=1):
            if targets[i, k]:
                hits += 1
                total += hits / rank
        aps.append(total / max(int(targets[:, k].sum()), 1))
    return 100 * sum(aps) / len(aps)


def _jaccard_twin(instances):
    out = []
    for scores, truth in instances:
        if not 10 <= len(truth) <= 12:
            continue
        k = int(sum(truth))
        # the k best; among equal scores the later candidate first (an ascending sort's tail)
        chosen = set(sorted(range(len(scores)), key=lambda i: (scores[i], i))[len(scores) - k:]) if k else set()
        true = {i for i, t in enumerate(truth) if t}
        out.append(len(chosen & true) / len(chosen | true) if k else 0.0)
    return 100 * sum(out) / len(out)


def test_metric_functions_match_slow_twins():
    rng = np.random.default_rng(3)
    for n, c, g in ((1, 1, 1), (2, 3, 2), (17, 5, 3), (64, 7, 11), (97, 2, 4)):
        hit = rng.random(n) < 0.6
        groups = rng.integers(0, g, n).astype(np.float32) * 2  # float metadata, gaps between group numbers
        assert worst_group_accuracy(hit, groups) == pytest.approx(worst_group_twin(hit, groups))
        labels, pred = rng.integers(0, c, n), rng.integers(0, c + 2, n)  # predictions of classes never present
        assert macro_f1(pred, labels) == pytest.approx(_f1_twin(pred, labels))
        scores = rng.integers(0, 4, (n, c)).astype(np.float32)  # ties
        targets = rng.random((n, c)) < 0.3
        targets[:, 0] = False  # a class without positives: AP 0, still averaged
        assert mean_average_precision(scores, targets) == pytest.approx(_ap_twin(scores, targets))
    instances = []
    for _ in range(40):
        m = int(rng.choice([5, 6, 10, 11, 12]))
        truth = rng.random(m) < 0.3
        instances.append((rng.integers(0, 3, m).astype(np.float32), truth))  # ties, and cues without associations
    assert winogavil_jaccard(instances) == pytest.approx(_jaccard_twin(instances))
    assert winogavil_jaccard([(np.zeros(5), np.ones(5, dtype=bool))]) != winogavil_jaccard([])  # nan: no 10-12 cue
    assert mean_recall_at_1(60.0, 41.0) == 50.5


def test_metric_functions_agree_with_scikit_learn_and_clip_benchmark(clip_benchmark_path, monkeypatch):
    """The functions DataComp's evaluation calls: scikit-learn's f1_score (WILDS' F1) and jaccard_score, and
    CLIP_benchmark's average_precision_per_class (on distinct scores: its torch.sort leaves ties unordered)."""
    import torch

    sk, zsc = import_clip_benchmark(clip_benchmark_path, monkeypatch, "sklearn.metrics",
                                    "clip_benchmark.metrics.zeroshot_classification")
    rng = np.random.default_rng(5)
    for n, c in ((7, 3), (50, 6), (200, 20)):
        labels, pred = rng.integers(0, c, n), rng.integers(0, c, n)
        want = sk.f1_score(labels, pred, average="macro", labels=np.unique(labels), zero_division=0)
        assert macro_f1(pred, labels) == pytest.approx(100 * want)
        scores = rng.random((n, c))
        targets = rng.random((n, c)) < 0.25
        want = zsc.average_precision_per_class(torch.from_numpy(scores), torch.from_numpy(targets)).mean().item()
        assert mean_average_precision(scores, targets) == pytest.approx(100 * want, rel=1e-6)
    for _ in range(20):
        m = int(rng.integers(10, 13))
        truth = rng.random(m) < 0.4
        truth[0] = True
        scores = rng.random(m)
        chosen = np.isin(np.arange(m), np.argsort(scores)[-int(truth.sum()):])  # wino_eval.py's choice
        assert winogavil_jaccard([(scores, truth)]) == pytest.approx(100 * sk.jaccard_score(truth, chosen))


@pytest.fixture(scope="module")
def clip_benchmark_path():
    return install_clip_benchmark()


def test_main_metric_dispatch_and_missing_fields():
    tasks = {t.key: t for t in datacomp_tasks()}
    rank = np.array([0, 3, 0, 7, 1, 0])
    labels = np.array([2, 1, 0, 1, 2, 0])
    pred = np.where(rank == 0, labels, (labels + 1) % 3)
    meta = np.array([[4, 1, 0], [4, 2, 1], [9, 1, 1], [9, 3, 2], [9, 1, 2], [4, 0, 0]], dtype=np.float64)
    out = TaskOutputs(rank=rank, pred=pred, labels=labels, recall_at_1={"i2t": 80.0, "t2i": 60.0},
                      groups={"income_ds": group_column(tasks["fairness/dollar_street"], meta)})
    assert main_metric(tasks["imagenet1k"], out) == pytest.approx(50.0)
    assert main_metric(tasks["vtab/pets"], out) == pytest.approx(100 * np.mean([1.0, 0.0, 0.5]))
    assert main_metric(tasks["fairness/dollar_street"], out) == pytest.approx(100 * 2 / 3)  # group 9: rank 7 misses
    assert main_metric(tasks["retrieval/flickr_1k_test_image_text_retrieval"], out) == 70.0
    assert main_metric(tasks["wilds/iwildcam"], out) == pytest.approx(macro_f1(pred, labels))
    assert set(METRICS) >= {t.main_metric for t in tasks.values()}
    # group fields absent: the task, the field and the fix
    with pytest.raises(DataError, match=r"fairness/geode \(GeoDE\): main metric acc_wg needs each sample's region "
                                        r".*\['region', 'country'\].*DataComp's shards"):
        main_metric(tasks["fairness/geode"], out)
    with pytest.raises(DataError, match=r"wilds/fmow \(FMoW\): .*groups the samples by region, but its shards "
                                        r"carry no metadata"):
        group_column(tasks["wilds/fmow"], None)
    with pytest.raises(DataError, match=r"metadata has 2 column\(s\), expected 3"):
        group_column(tasks["wilds/fmow"], meta[:, :2])
    with pytest.raises(DataError, match=r"needs each sample's scores and targets"):
        main_metric(TaskSpec("voc2007_multilabel", "VOC", "mean_average_precision"), out)
    with pytest.raises(DataError, match=r"needs each sample's instances"):
        main_metric(tasks["misc/winogavil"], out)
    assert math.isnan(worst_group_accuracy(np.zeros(0, bool), np.zeros(0)))
