"""Intervals and paired tests (hardrank.scoring.statistics) against slow, obviously correct twins: each resample's
metrics recomputed from its rows, McNemar against an exact binomial computation, coverage by simulation."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from hardrank.errors import DataError
from hardrank.scoring.results import outcome_schema, verdict_map
from hardrank.scoring.statistics import (
    _draws,
    compare,
    get_path,
    holm,
    intervals,
    mcnemar,
    stratified_sample,
    unit_stats,
)

# -- synthetic results: rows as eval writes them, metrics from the twins below ------------------------------


def _table(rows: list[dict]) -> pa.Table:
    """The rows as the results Parquet holds them, one part per task (each task has its own verdicts)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if len(tasks) > 1:
        return pa.concat_tables([_table([r for r in rows if r["task"] == t]) for t in tasks])
    cols = {f.name: [r.get(f.name) for r in rows] for f in outcome_schema() if f.name != "verdicts"}
    n = len(rows)
    names = list(rows[0]["verdicts"]) if rows and rows[0].get("verdicts") else []
    cols["verdicts"] = (verdict_map({k: np.array([r["verdicts"][k] for r in rows]) for k in names}, n) if names
                        else [None] * n)
    return pa.Table.from_pydict(cols, schema=outcome_schema())


def _ranking_rows(rng, n_images=23):
    """Awkward on purpose: 1-6 captions an image, an image whose captions are all missing from t2i, ties in rank."""
    rows = []
    for i in range(n_images):
        unit = f"img{i:02d}.jpg"
        for view in ("original", "same_concept"):
            rows.append({"kind": "ranking", "task": "i2t", "view": view, "query_id": unit, "unit": unit,
                         "rank": int(rng.integers(0, 12)),
                         "top1_group": "original" if view == "original" or rng.random() < 0.6 else view})
        for c in range(0 if i == 3 else int(rng.integers(1, 7))):
            for view in ("original", "mix_0.9_s1", "mix_0.9_s2"):
                rows.append({"kind": "ranking", "task": "t2i", "view": view, "query_id": f"cap {i} {c}",
                             "unit": unit, "rank": int(rng.integers(0, 12)),
                             "top1_group": "original" if view == "original" or rng.random() < 0.7 else view})
    return rows


def _ranking_twin(rows) -> dict:
    m: dict = {}
    for d in ("i2t", "t2i"):
        for v in ("original", "same_concept", "mix_0.9_s1", "mix_0.9_s2"):
            rs = [r for r in rows if r["task"] == d and r["view"] == v]
            if not rs:
                continue
            rank = np.array([r["rank"] for r in rs])
            vm = {f"R@{k}": 100.0 * np.mean(rank < k) for k in (1, 5, 10)}
            vm["mean_rank"] = float(np.mean(rank + 1))
            if v != "original":
                vm["false_rate"] = 100.0 * np.mean([r["top1_group"] != "original" for r in rs])
            m.setdefault(v, {})[d] = vm
    for v, dirs in m.items():
        for d, vm in dirs.items():
            if v != "original":
                vm["drop"] = {k: m["original"][d][k] - vm[k] for k in ("R@1", "R@5", "R@10")}
    o = m["original"]
    o["mean"] = {k: (o["i2t"][k] + o["t2i"][k]) / 2 for k in ("R@1", "R@5", "R@10")}
    o["rsum"] = sum(o[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    m["mix_0.9"] = {"t2i": {k: (m["mix_0.9_s1"]["t2i"][k] + m["mix_0.9_s2"]["t2i"][k]) / 2
                            for k in ("R@1", "R@5", "R@10", "mean_rank", "false_rate")},
                    "members": ["mix_0.9_s1", "mix_0.9_s2"]}
    return m


def _choice_rows(rng):
    rows = []
    for i in range(31):
        v = {"correct": bool(rng.random() < 0.7), "tie": False}
        rows.append({"kind": "choice", "task": "att", "query_id": f"q{i % 29}", "unit": f"q{i}",  # ids repeat
                     "subset": ["red", "blue", "green"][i % 3], "verdicts": v, "correct": v["correct"]})
    for i in range(17):
        v = {"correct": bool(rng.random() < 0.4), "tie": False}
        rows.append({"kind": "choice", "task": "rel", "query_id": f"q{i}", "unit": f"q{i}", "subset": None,
                     "verdicts": v, "correct": v["correct"]})
    for i in range(13):
        g = {k: bool(rng.random() < 0.8) for k in ("i2t_0", "i2t_1", "t2i_0", "t2i_1")}
        g.update(text=g["i2t_0"] and g["i2t_1"], image=g["t2i_0"] and g["t2i_1"], tie=False)
        g["group"] = g["text"] and g["image"]
        rows.append({"kind": "choice", "task": "grid", "query_id": f"p{i}", "unit": f"p{i}", "subset": None,
                     "verdicts": g, "correct": g["group"]})
    return rows


def _choice_twin(rows) -> dict:
    m: dict = {}
    pct = (lambda xs: 100.0 * float(np.mean(xs)))
    for task in ("att", "rel"):
        rs = [r for r in rows if r["task"] == task]
        m[task] = {"all": {"accuracy": pct([r["verdicts"]["correct"] for r in rs])}}
        for s in sorted({r["subset"] for r in rs if r["subset"] is not None}):
            m[task][s] = {"accuracy": pct([r["verdicts"]["correct"] for r in rs if r["subset"] == s])}
    g = [r["verdicts"] for r in rows if r["task"] == "grid"]
    m["grid"] = {"all": {"i2t_accuracy": pct([x["i2t_0"] for x in g] + [x["i2t_1"] for x in g]),
                         "t2i_accuracy": pct([x["t2i_0"] for x in g] + [x["t2i_1"] for x in g]),
                         **{f"{k}_score": pct([x[k] for x in g]) for k in ("text", "image", "group")}}}
    pooled = [r["verdicts"]["correct"] for r in rows if r["task"] in ("att", "rel")]
    m["overall"] = {"all": {"accuracy": pct(pooled)}, "members": ["att", "rel"], "over": "items"}
    m["macro"] = {"all": {"accuracy": (m["att"]["all"]["accuracy"] + m["rel"]["all"]["accuracy"]) / 2},
                  "members": ["att", "rel"], "over": "tasks"}
    m["both"] = {"all": {"accuracy": (m["att"]["all"]["accuracy"] + m["rel"]["all"]["accuracy"]) / 2},
                 "members": ["att", "rel"]}
    return m


def _classify_rows(rng):
    rows = []
    classes = ["cat", "dog", "eel", "fox", "gnu", "hen"]
    for i in range(40):
        label = classes[i % 5 if i < 35 else 5]  # one class with few images
        for g in ("clean", "blur_1", "blur_2"):
            if g != "clean" and i == 7:
                continue  # a copy that failed to load
            rows.append({"kind": "classification", "task": "zeroshot", "view": g, "query_id": f"im{i}",
                         "unit": f"im{i}", "subset": label, "rank": int(rng.integers(0, 8))})
    return rows


def _classify_twin(rows) -> dict:
    t: dict = {}
    for g in ("clean", "blur_1", "blur_2"):
        rs = [r for r in rows if r["view"] == g]
        rank = np.array([r["rank"] for r in rs])
        labels = [r["subset"] for r in rs]
        rec = [np.mean([r["rank"] == 0 for r in rs if r["subset"] == c]) for c in sorted(set(labels))]
        t[g] = {"acc1": 100.0 * np.mean(rank < 1), "acc5": 100.0 * np.mean(rank < 5),
                "mean_per_class_recall": 100.0 * float(np.mean(rec))}
    for g in ("blur_1", "blur_2"):  # (a resample whose clean acc1 is 0 has none: nan, as the result writes it)
        t[g]["relative_robustness"] = t[g]["acc1"] / t["clean"]["acc1"] if t["clean"]["acc1"] else float("nan")
    keys = ("acc1", "acc5", "mean_per_class_recall", "relative_robustness")
    t["variants_mean"] = {k: (t["blur_1"][k] + t["blur_2"][k]) / 2 for k in keys}
    t["variants_mean"]["members"] = ["blur_1", "blur_2"]
    t["corruptions"] = {"blur": {"acc1": t["variants_mean"]["acc1"], "severities": 2}}
    return {"zeroshot": t}


def _mask_rows(rng):
    rows = []
    for i in range(19):
        for role in ("visible", "amodal"):
            inter, union = float(rng.integers(0, 50)), float(rng.integers(50, 100))
            rows.append({"kind": "mask", "task": role, "query_id": f"q{i}", "unit": f"q{i}",
                         "scores": [inter / (union + 1e-5), inter, union]})
    return rows


def _mask_twin(rows) -> dict:
    out = {}
    for role in ("visible", "amodal"):
        s = np.array([r["scores"] for r in rows if r["task"] == role], dtype=np.float32).astype(np.float64)
        out[role] = {"gIoU": 100.0 * s[:, 0].mean(), "cIoU": 100.0 * s[:, 1].sum() / (s[:, 2].sum() + 1e-10)}
    return out


KINDS = {"ranking": (_ranking_rows, _ranking_twin), "choice": (_choice_rows, _choice_twin),
         "classification": (_classify_rows, _classify_twin), "mask": (_mask_rows, _mask_twin)}


def _result(kind, rows):
    return {"suite": "s", "checkpoint": "c", "task_type": kind, "metrics": KINDS[kind][1](rows)}


def _unit_of(kind, r) -> str:
    return f"{r['task']}\x1f{r['unit']}" if kind in ("choice", "classification") else r["unit"]


def _flatten(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flatten(v, (*prefix, k))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("severities",):
            yield (*prefix, k), float(v)


@pytest.mark.parametrize("kind", list(KINDS))
def test_intervals_equal_the_slow_twin_resampling_rows(kind):
    """Each resample's metrics recomputed from its rows (every drawn unit's rows, as often as drawn) with the
    same draws: the vectorised sums give the same values, so the same intervals; the point estimates equal
    the result's metrics."""
    rng = np.random.default_rng(7)
    rows = _rows_fixed = KINDS[kind][0](rng)
    if kind == "choice":  # two rows with one id in a task are two units: the fast path numbers repeats
        seen: dict = {}
        for r in _rows_fixed:
            key = (r["task"], r["query_id"])
            n = seen.get(key, 0)
            seen[key] = n + 1
            r["unit"] = r["query_id"] if n == 0 else f"{r['query_id']}#{n}"
    result = _result(kind, rows)
    stats = unit_stats(result, _table(rows))
    paths = [e.path for e in stats.estimands]
    expected = dict(_flatten(result["metrics"]))
    assert set(paths) == {p for p in expected if get_path(result["metrics"], p[:-1]) is not None}, \
        set(expected) ^ set(paths)
    for p, v in stats.point().items():
        assert v == pytest.approx(expected[p], rel=1e-9, abs=1e-9), p
    resamples, seed = 57, 3
    fast = intervals(stats, resamples=resamples, seed=seed)
    by_unit: dict = {}
    for r in rows:
        by_unit.setdefault(_unit_of(kind, r), []).append(r)
    units = list(stats.units)
    assert sorted(by_unit) == units
    values = {p: [] for p in paths}
    for idx in _draws(seed, resamples, len(units)):
        for draw in idx:
            sample = [r for u in draw for r in by_unit[units[u]]]
            twin = dict(_flatten(KINDS[kind][1](sample)))
            for p in paths:
                values[p].append(twin.get(p, float("nan")))
    for p in paths:
        v = np.array(values[p], dtype=float)
        v = v[np.isfinite(v)]
        lo, hi = np.quantile(v, [0.025, 0.975])
        assert fast[p] == pytest.approx((lo, hi), rel=1e-9, abs=1e-9), p


def test_intervals_reproduce_for_a_seed_and_move_with_it():
    rng = np.random.default_rng(1)
    rows = _choice_rows(rng)
    stats = unit_stats(_result("choice", rows), _table(rows))
    a, b = intervals(stats, seed=5), intervals(stats, seed=5)
    assert a == b
    assert intervals(stats, seed=6) != a


def test_bootstrap_intervals_cover_the_truth_at_about_the_nominal_rate():
    """Known-probability Bernoulli items (p = 0.3, 200 items), 400 data sets with fixed seeds: the 95% percentile
    interval of the accuracy covers 30% in 92-97.5% of them (deterministic: the seeds are fixed)."""
    covered = 0
    trials = 400
    for s in range(trials):
        rng = np.random.default_rng(10_000 + s)
        correct = rng.random(200) < 0.3
        rows = [{"kind": "choice", "task": "t", "query_id": f"q{i}", "unit": f"q{i}", "subset": None,
                 "verdicts": {"correct": bool(c)}, "correct": bool(c)} for i, c in enumerate(correct)]
        result = {"suite": "s", "checkpoint": "c", "task_type": "choice",
                  "metrics": {"t": {"all": {"accuracy": 100.0 * correct.mean()}}}}
        (lo, hi), = intervals(unit_stats(result, _table(rows)), resamples=1000, seed=s).values()
        covered += lo <= 30.0 <= hi
    assert 0.92 <= covered / trials <= 0.975, covered / trials


def _binomial_p(k: int, n: int) -> float:
    """Two-sided exact binomial p of k successes in n at 1/2, in exact fractions."""
    tail = sum(Fraction(math.comb(n, i), 2 ** n) for i in range(min(k, n - k) + 1))
    return float(min(Fraction(1), 2 * tail))


@pytest.mark.parametrize("n01, n10", [(0, 0), (0, 1), (3, 3), (2, 9), (30, 12), (1200, 1290), (0, 40)])
def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs(n01, n10):
    a = np.array([True] * n01 + [False] * n10 + [True] * 5 + [False] * 7)
    b = np.array([False] * n01 + [True] * n10 + [True] * 5 + [False] * 7)
    p, x, y = mcnemar(a, b)
    assert (x, y) == (n01, n10)
    assert p == pytest.approx(_binomial_p(n01, n01 + n10) if n01 + n10 else 1.0, rel=1e-9)
    scipy_stats = pytest.importorskip("scipy.stats")
    if n01 + n10:
        assert p == pytest.approx(scipy_stats.binomtest(n01, n01 + n10, 0.5).pvalue, rel=1e-9)


def test_compare_uses_mcnemar_on_the_per_item_parquet_rows_and_permutation_for_the_rest():
    rng = np.random.default_rng(3)
    rows_a = _ranking_rows(rng)
    rows_b = [{**r, "rank": max(0, r["rank"] - int(rng.integers(0, 3)))} for r in rows_a]
    ra, rb = _result("ranking", rows_a), _result("ranking", rows_b)
    diffs = {d.path: d for d in compare(ra, _table(rows_a), rb, _table(rows_b), resamples=200)}
    d = diffs[("original", "t2i", "R@1")]
    ya = np.array([r["rank"] < 1 for r in rows_a if r["task"] == "t2i" and r["view"] == "original"])
    yb = np.array([r["rank"] < 1 for r in rows_b if r["task"] == "t2i" and r["view"] == "original"])
    assert d.test == "mcnemar" and d.p == pytest.approx(_binomial_p(int((ya & ~yb).sum()), int((ya ^ yb).sum())))
    assert d.diff == pytest.approx(100 * (yb.mean() - ya.mean()))
    assert diffs[("original", "t2i", "mean_rank")].test == "permutation"
    assert diffs[("original", "mean", "R@1")].test == "permutation"
    same = compare(ra, _table(rows_a), ra, _table(rows_a), resamples=50)
    assert all(x.diff == 0 and x.p == 1.0 for x in same)


def test_compare_names_the_items_that_differ_and_results_without_units():
    rng = np.random.default_rng(4)
    rows = _ranking_rows(rng)
    fewer = [r for r in rows if r["unit"] != "img05.jpg"]
    with pytest.raises(DataError, match=r"different items: 1 unit\(s\) only in the first \(e.g. img05.jpg\), 0 only"):
        compare(_result("ranking", rows), _table(rows), _result("ranking", fewer), _table(fewer))
    old = _table(rows).drop_columns(["unit", "verdicts"])  # a Parquet written before units were recorded
    with pytest.raises(DataError, match=r"lack column\(s\) \['unit'\].*run the same `hardrank eval` again"):
        unit_stats(_result("ranking", rows), old)
    with pytest.raises(DataError, match="no per-item outcomes"):
        unit_stats(_result("ranking", rows), outcome_schema().empty_table())


def test_holm_against_its_definition():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # sorted: 0.005 (x5), 0.01 (x4), 0.03 (x3), 0.04 (x2), 0.5 (x1), running maximum
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.5])
    assert holm([]) == [] and holm([0.7]) == [0.7]


def test_stratified_sample_is_proportional_seeded_and_exact():
    strata = ["a"] * 50 + ["b"] * 30 + ["c"] * 15 + ["d"] * 5
    s = stratified_sample(strata, 20, seed=1)
    assert len(s) == 20 and len(set(s.tolist())) == 20
    got = {k: sum(strata[i] == k for i in s) for k in "abcd"}
    assert got == {"a": 10, "b": 6, "c": 3, "d": 1}
    assert np.array_equal(s, stratified_sample(strata, 20, seed=1))
    assert not np.array_equal(s, stratified_sample(strata, 20, seed=2))
    assert set(stratified_sample(strata, 3, seed=0).tolist()) <= set(range(100))
    assert {strata[i] for i in stratified_sample(strata, 4, seed=0)} == set("abcd")  # each stratum keeps one
    assert len(stratified_sample(strata, 500, seed=0)) == 100
