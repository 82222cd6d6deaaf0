"""Confidence for results: seeded cluster-bootstrap intervals, paired tests (exact McNemar, permutation), Holm.

Every metric of a result is a function of sums over the suite's independent **units** (``UNITS``): an
image with all its captions for retrieval (its i2t query, its captions' t2i queries, its perturbed
captions and altered copies), an item (one row) for choice suites, a clean image with its corrupted
copies for classification, a question for mask suites. ``unit_stats`` turns a result and its per-query
outcomes (the Parquet) into one (U, K) matrix of per-unit sums and the list of metric ``Estimand``\\ s; a
resample is a (U,) vector of counts (how often each unit was drawn), so R resamples of every metric at
once are one (R, U) @ (U, K) product. Resampling draws an (R, U) index matrix in blocks from a seeded
``numpy.random.Generator`` (``_draws``): the same seed gives the same intervals, and the slow twin in
``tests/test_statistics.py`` recomputes each resample's metrics from its rows with the same draws.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hardrank.errors import DataError
from hardrank.scoring.metrics import CLASSIFY_SUMMARY_KEYS, corruption_severity

__all__ = ["Estimand", "UnitStats", "unit_stats", "intervals", "annotate", "compare", "Difference", "mcnemar",
           "add_mean", "holm", "stratified_sample", "get_path", "LEVEL", "RESAMPLES", "UNITS", "METHOD"]

LEVEL = 0.95       # the intervals' coverage
RESAMPLES = 1000   # default number of bootstrap resamples (and of permutations for a paired test)
_BLOCK_CELLS = 4_000_000  # resamples are drawn in blocks of about this many (resample, unit) cells
METHOD = "percentile bootstrap over units (resampled with replacement, seeded)"
# what one unit of each task type is (the result's ``statistics.unit``)
UNITS = {
    "ranking": "image: an image with all its captions (its i2t query, the t2i queries of its captions, its "
               "perturbed captions and altered copies), resampled together in both directions",
    "choice": "item: one row of a choice task (its candidates and verdicts)",
    "classification": "image: a clean image with its corrupted copies (every group's row of it)",
    "mask": "question: one question and its masks",
    "linear_probe": "image: one test image (the trained probe held fixed: its training's variance is not resampled)",
}


class Sums:
    """Resampled sums: ``col(name)`` (R,) of a per-unit column; ``by_class(name)`` (R, C) of a column split by
    the units' class (classification's per-class recalls)."""

    def __init__(self, dense: np.ndarray, per_class: np.ndarray | None, columns: dict, class_columns: dict):
        self._dense, self._per_class = dense, per_class    # (R, K), (R, C, K2)
        self._columns, self._class_columns = columns, class_columns

    def col(self, name: str) -> np.ndarray:
        return self._dense[:, self._columns[name]]

    def by_class(self, name: str) -> np.ndarray:
        return self._per_class[:, :, self._class_columns[name]]


@dataclass(frozen=True)
class Estimand:
    """One metric as a function of the units' sums: ``path`` in the result's ``metrics`` (and ``ci95``),
    ``fn`` (resampled ``Sums`` -> (R,) values, in the metric's own unit), and ``rows``: the name of its
    per-row right/wrong outcome when the metric is the percentage of rows right (R@K hits, accuracy,
    group score): such metrics are compared by the exact McNemar test on those rows."""

    path: tuple[str, ...]
    fn: Callable[[Sums], np.ndarray]
    rows: str | None = None


@dataclass
class UnitStats:
    """One result's per-unit sums, ready to resample. ``units`` (U,) sorted ids; ``dense`` (U, K) float64;
    ``unit_class`` (U,) int class of each unit and ``class_dense`` (U, K2) for per-class sums (None without);
    ``rows``: name -> (keys (n,), outcomes (n,) bool), the per-row outcomes McNemar pairs."""

    task_type: str
    units: np.ndarray
    dense: np.ndarray
    columns: dict[str, int]
    estimands: list[Estimand]
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    unit_class: np.ndarray | None = None
    class_dense: np.ndarray | None = None
    class_columns: dict[str, int] = field(default_factory=dict)
    n_classes: int = 0

    def sums(self, weights: np.ndarray) -> Sums:
        """Sums under ``weights`` (R, U): how often each unit is in each resample (ones: the data itself)."""
        w = np.asarray(weights, dtype=np.float64)
        dense = w @ self.dense
        per_class = None
        if self.unit_class is not None:
            per_class = np.zeros((len(w), self.n_classes, self.class_dense.shape[1]))
            order = np.argsort(self.unit_class, kind="stable")
            bounds = np.searchsorted(self.unit_class[order], np.arange(self.n_classes + 1))
            ws, cs = w[:, order], self.class_dense[order]
            for c in range(self.n_classes):
                a, b = bounds[c], bounds[c + 1]
                if b > a:
                    per_class[:, c, :] = ws[:, a:b] @ cs[a:b]
        return Sums(dense, per_class, self.columns, self.class_columns)

    def point(self) -> dict[tuple[str, ...], float]:
        """Every estimand on the data itself (equal to the result's metrics)."""
        s = self.sums(np.ones((1, len(self.units))))
        return {e.path: float(e.fn(s)[0]) for e in self.estimands}


class _Builder:
    """Collects per-unit columns (bincount of row values by unit) and estimands."""

    def __init__(self, task_type: str, units: np.ndarray):
        self.task_type, self.units = task_type, units
        self.cols: list[np.ndarray] = []
        self.columns: dict[str, int] = {}
        self.class_cols: list[np.ndarray] = []
        self.class_columns: dict[str, int] = {}
        self.estimands: list[Estimand] = []
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, name: str, unit_idx: np.ndarray, values, *, by_class: bool = False) -> str:
        v = np.broadcast_to(np.asarray(values, dtype=np.float64), unit_idx.shape)
        col = np.bincount(unit_idx, weights=v, minlength=len(self.units))
        if by_class:
            self.class_columns[name] = len(self.class_cols)
            self.class_cols.append(col)
        else:
            self.columns[name] = len(self.cols)
            self.cols.append(col)
        return name

    def build(self, unit_class: np.ndarray | None = None, n_classes: int = 0) -> UnitStats:
        dense = np.stack(self.cols, 1) if self.cols else np.zeros((len(self.units), 0))
        st = UnitStats(self.task_type, self.units, dense, self.columns, self.estimands, self.rows)
        if unit_class is not None and self.class_cols:
            st.unit_class, st.n_classes = unit_class, n_classes
            st.class_dense, st.class_columns = np.stack(self.class_cols, 1), self.class_columns
        return st


# -- metric functions of the sums -----------------------------------------------------------------------
def _ratio(num: str, den: str, scale: float = 100.0, eps: float = 0.0):
    def fn(s: Sums) -> np.ndarray:
        d = s.col(den) + eps
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(d > 0, scale * s.col(num) / np.where(d > 0, d, 1.0), np.nan)
    return fn


def _mean_of(fns: list[Callable[[Sums], np.ndarray]]):
    return lambda s: np.mean(np.stack([f(s) for f in fns]), axis=0)


def _minus(a, b):
    return lambda s: a(s) - b(s)


def _over(a, b):
    def fn(s: Sums) -> np.ndarray:
        den = b(s)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den != 0, a(s) / np.where(den != 0, den, 1.0), np.nan)
    return fn


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def get_path(tree: dict, path: tuple[str, ...]):
    """``tree[path[0]][path[1]]...``, or None where a key is missing."""
    for k in path:
        if not isinstance(tree, dict) or k not in tree:
            return None
        tree = tree[k]
    return tree


def _set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


# -- per task type: per-unit columns and estimands from the outcomes ------------------------------------
def _require(table: pa.Table, columns: tuple[str, ...], result: dict) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{result.get('checkpoint')}/{result.get('suite')}: its per-query outcomes (the Parquet) lack "
                        f"column(s) {missing}, which intervals and paired tests need (results written before "
                        f"hardrank recorded each row's unit); run the same `hardrank eval` again: embeddings come "
                        f"from the store, nothing is re-encoded")


def _unique_keys(keys: list[str]) -> np.ndarray:
    """``keys`` made unique by occurrence (a second ``x`` is ``x#1``): rows pair by key, repeats in order."""
    seen: dict[str, int] = {}
    out = []
    for k in keys:
        n = seen.get(k, 0)
        seen[k] = n + 1
        out.append(k if n == 0 else f"{k}#{n}")
    return np.array(out, dtype=object)


def _codes(col) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values (object array), (n,) int64 index of each row's value): ``np.unique(...,
    return_inverse=True)`` of a string column, by Arrow's dictionary encoding (no Python sort of every row)."""
    d = pc.dictionary_encode(col).combine_chunks() if len(col) else pa.array([], pa.string()).dictionary_encode()
    values = np.array(d.dictionary.to_pylist(), dtype=object)
    order = np.argsort(values, kind="stable")
    position = np.empty(len(values), dtype=np.int64)
    position[order] = np.arange(len(values))
    return values[order], position[d.indices.to_numpy(zero_copy_only=False).astype(np.int64)]


def _ranking(result: dict, t: pa.Table) -> UnitStats:
    _require(t, ("unit",), result)
    m = result["metrics"]
    units, unit_idx = _codes(t.column("unit"))
    b = _Builder("ranking", units)
    task = np.array(t.column("task").to_pylist(), dtype=object)
    view = np.array(t.column("view").to_pylist(), dtype=object)
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    group = np.array(t.column("top1_group").to_pylist(), dtype=object)
    qid = np.array(t.column("query_id").to_pylist(), dtype=object)
    recall: dict[tuple[str, str], dict[str, Callable]] = {}
    keys = sorted(set(zip(task.tolist(), view.tolist())))
    for d, v in keys:
        sel = np.nonzero((task == d) & (view == v))[0]
        vm = get_path(m, (v, d))
        if not isinstance(vm, dict):
            continue
        u, r = unit_idx[sel], rank[sel]
        row_keys = qid[sel]  # (paired by position when both results list the same queries, else by key)
        k = f"{d}|{v}"
        n = b.add(f"{k}|n", u, 1.0)
        recall[(d, v)] = {}
        for name in vm:
            if name.startswith("R@") and name[2:].isdigit() and _num(vm[name]):
                K = int(name[2:])
                hits = r < K
                fn = _ratio(b.add(f"{k}|hit{K}", u, hits), n)
                b.rows[f"{k}|hit{K}"] = (row_keys, hits)
                b.estimands.append(Estimand((v, d, name), fn, f"{k}|hit{K}"))
                recall[(d, v)][name] = fn
        if _num(vm.get("mean_rank")):
            fn = _ratio(b.add(f"{k}|rank", u, r + 1.0), n, 1.0)
            b.estimands.append(Estimand((v, d, "mean_rank"), fn))
            recall[(d, v)]["mean_rank"] = fn
        if _num(vm.get("false_rate")):
            false = group[sel] != "original"
            fn = _ratio(b.add(f"{k}|fr", u, false), n)
            b.rows[f"{k}|fr"] = (row_keys, false)
            b.estimands.append(Estimand((v, d, "false_rate"), fn, f"{k}|fr"))
            recall[(d, v)]["false_rate"] = fn
    for (d, v), fns in recall.items():  # drop = clean - variant, per R@K
        drop = get_path(m, (v, d, "drop"))
        clean = recall.get((d, "original"), {})
        if isinstance(drop, dict):
            for name in drop:
                if name in fns and name in clean and _num(drop[name]):
                    b.estimands.append(Estimand((v, d, "drop", name), _minus(clean[name], fns[name])))
    o = m.get("original", {})
    both = [recall.get((d, "original"), {}) for d in ("i2t", "t2i")]
    if isinstance(o.get("mean"), dict):
        for name in o["mean"]:
            if all(name in f for f in both) and _num(o["mean"][name]):
                b.estimands.append(Estimand(("original", "mean", name), _mean_of([f[name] for f in both])))
    if _num(o.get("rsum")) and all(all(f"R@{k}" in f for k in (1, 5, 10)) for f in both):
        parts = [f[f"R@{k}"] for f in both for k in (1, 5, 10)]
        b.estimands.append(Estimand(("original", "rsum"), lambda s, p=parts: np.sum([f(s) for f in p], axis=0)))
    for name, entry in m.items():  # seed averages: mix_0.9 = mean of mix_0.9_s1, mix_0.9_s10, ...
        if not isinstance(entry, dict) or not isinstance(entry.get("members"), list):
            continue
        for d, dm in entry.items():
            if not isinstance(dm, dict):
                continue
            for metric, value in dm.items():
                fns = [recall.get((d, mv), {}).get(metric) for mv in entry["members"] if (d, mv) in recall]
                if fns and all(f is not None for f in fns) and _num(value):
                    b.estimands.append(Estimand((name, d, metric), _mean_of(fns)))
    return b.build()


_CHOICE_SINGLE = {"correct": "accuracy", "original": "original_accuracy", "augmented": "augmented_accuracy",
                  "brittle": "brittleness", "text": "text_score", "image": "image_score", "group": "group_score"}


def _verdicts(t: pa.Table) -> dict[str, np.ndarray]:
    """The ``verdicts`` map column as {name: (n,) bool}: every row of one task holds the same names."""
    col = t.column("verdicts").combine_chunks()
    if len(col) == 0:
        return {}
    offsets = col.offsets.to_numpy()
    counts = np.diff(offsets)
    if col.null_count or np.any(counts != counts[0]):
        raise DataError("a choice task's outcome rows hold different verdicts (the Parquet is not one written by "
                        "`hardrank eval`)")
    names = [k for k, _ in col[0].as_py()]
    items = col.items.to_numpy(zero_copy_only=False).astype(bool)
    if len(items) != len(col) * counts[0]:  # a sliced array: its children still hold the whole buffer
        items = items[offsets[0]:offsets[-1]]
    items = items.reshape(len(col), counts[0])
    return {k: items[:, j] for j, k in enumerate(names)}


def _choice(result: dict, t: pa.Table) -> UnitStats:
    _require(t, ("verdicts",), result)
    m = result["metrics"]
    task = np.array(t.column("task").to_pylist(), dtype=object)
    qid = t.column("query_id").to_pylist()
    subset = np.array(t.column("subset").to_pylist(), dtype=object)
    unit_keys = np.empty(len(task), dtype=object)
    order = list(dict.fromkeys(task.tolist()))
    for name in order:
        sel = np.nonzero(task == name)[0]
        unit_keys[sel] = [f"{name}\x1f{k}" for k in _unique_keys([qid[i] for i in sel])]
    units, unit_idx = np.unique(unit_keys, return_inverse=True)
    b = _Builder("choice", units)
    correct: dict[str, tuple] = {}  # task -> (unit idx, correct, subsets): for the suite's aggregates
    for name in order:
        sel = np.nonzero(task == name)[0]
        u, keys = unit_idx[sel], unit_keys[sel]
        v = _verdicts(t.take(pa.array(sel)))
        labels = subset[sel]
        for s in [None, *sorted({x for x in labels if x is not None})]:
            part = "all" if s is None else s
            pm = get_path(m, (name, part))
            if not isinstance(pm, dict):
                continue
            mask = np.ones(len(sel), bool) if s is None else labels == s
            k = f"{name}|{part}"
            n = b.add(f"{k}|n", u, mask)
            for verdict, metric in _CHOICE_SINGLE.items():
                if verdict in v and _num(pm.get(metric)):
                    b.estimands.append(Estimand((name, part, metric), _ratio(b.add(f"{k}|{verdict}", u,
                                                                                    v[verdict] & mask), n),
                                                f"{k}|{verdict}"))
                    b.rows[f"{k}|{verdict}"] = (keys[mask], v[verdict][mask])
            for side in ("i2t", "t2i"):  # grid2x2: two choices per item, pooled
                if f"{side}_0" in v and _num(pm.get(f"{side}_accuracy")):
                    hits = v[f"{side}_0"].astype(float) + v[f"{side}_1"]
                    two = b.add(f"{k}|2n", u, 2.0 * mask)
                    b.estimands.append(Estimand((name, part, f"{side}_accuracy"),
                                                _ratio(b.add(f"{k}|{side}", u, hits * mask), two), f"{k}|{side}"))
                    b.rows[f"{k}|{side}"] = (np.concatenate([[f"{x}|0" for x in keys[mask]],
                                                             [f"{x}|1" for x in keys[mask]]]).astype(object),
                                             np.concatenate([v[f"{side}_0"][mask], v[f"{side}_1"][mask]]))
        if "correct" in v:
            correct[name] = (u, v["correct"], labels, keys)
    task_acc = {name: e.fn for e in b.estimands for name in [e.path[0]] if e.path[1:] == ("all", "accuracy")}
    for name, entry in m.items():  # view averages (replace = mean of its members) and suite aggregates
        if not isinstance(entry, dict) or not isinstance(entry.get("members"), list) or name in order:
            continue
        members = entry["members"]
        allm = entry.get("all", {})
        over = entry.get("over")
        if over is None:  # a view average: mean of the members' "all" metrics
            for metric, value in allm.items():
                fns = [next((e.fn for e in b.estimands if e.path == (mb, "all", metric)), None) for mb in members]
                if fns and all(f is not None for f in fns) and _num(value):
                    b.estimands.append(Estimand((name, "all", metric), _mean_of(fns)))
            continue
        if not _num(allm.get("accuracy")) or not all(mb in correct for mb in members):
            continue
        if over == "items":
            u = np.concatenate([correct[mb][0] for mb in members])
            c = np.concatenate([correct[mb][1] for mb in members])
            k = f"{name}|items"
            fn = _ratio(b.add(f"{k}|correct", u, c), b.add(f"{k}|n", u, 1.0))
            b.rows[f"{k}|correct"] = (np.concatenate([correct[mb][3] for mb in members]), c)
            b.estimands.append(Estimand((name, "all", "accuracy"), fn, f"{k}|correct"))
        elif over == "tasks":
            b.estimands.append(Estimand((name, "all", "accuracy"), _mean_of([task_acc[mb] for mb in members])))
        else:
            spec = next((a for a in result.get("suite_meta", {}).get("aggregates", []) if a.get("name") == name), {})
            excluded, min_items = set(spec.get("exclude", [])), int(spec.get("min_items", 1))
            by_subset: dict[str, list] = defaultdict(list)
            for mb in members:
                u, c, labels, _ = correct[mb]
                for s in dict.fromkeys(labels.tolist()):
                    by_subset[s].append((u[labels == s], c[labels == s]))
            fns = []
            for s, parts in by_subset.items():
                size = sum(len(p[0]) for p in parts)
                if s in excluded or size < min_items:
                    continue
                u = np.concatenate([p[0] for p in parts])
                c = np.concatenate([p[1] for p in parts])
                fns.append(_ratio(b.add(f"{name}|{s}|correct", u, c), b.add(f"{name}|{s}|n", u, 1.0)))
            if fns:
                b.estimands.append(Estimand((name, "all", "accuracy"),
                                            lambda st, f=fns: np.nanmean(np.stack([x(st) for x in f]), axis=0)))
    return b.build()


def _class_metrics(b: _Builder, k: str, path: tuple[str, ...], keys: np.ndarray, u: np.ndarray, r: np.ndarray,
                   classes: np.ndarray, gm: dict) -> dict[str, Callable]:
    """The acc1 / acc5 / mean_per_class_recall estimands (those ``gm`` reports) of one group of rows that rank a
    true class (``r``: its rank, ``classes``: its index, ``u``: each row's unit), added to ``b`` under ``path``."""
    out: dict[str, Callable] = {}
    n = b.add(f"{k}|n", u, 1.0)
    for K in (1, 5):
        if _num(gm.get(f"acc{K}")):
            fn = _ratio(b.add(f"{k}|hit{K}", u, r < K), n)
            b.rows[f"{k}|hit{K}"] = (keys, r < K)
            b.estimands.append(Estimand((*path, f"acc{K}"), fn, f"{k}|hit{K}"))
            out[f"acc{K}"] = fn
    if _num(gm.get("mean_per_class_recall")):
        present = np.unique(classes)
        hits, count = b.add(f"{k}|hit1", u, r < 1, by_class=True), b.add(f"{k}|n", u, 1.0, by_class=True)

        def mpcr(s: Sums, h=hits, c=count, p=present) -> np.ndarray:
            num, den = s.by_class(h)[:, p], s.by_class(c)[:, p]
            with np.errstate(invalid="ignore", divide="ignore"):
                rec = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
            return 100.0 * np.nanmean(rec, axis=1)
        b.estimands.append(Estimand((*path, "mean_per_class_recall"), mpcr))
        out["mean_per_class_recall"] = mpcr
    return out


def _class_units(t: pa.Table):
    """(task, query id, rank, unit of each row, the units, class of each row, class keys, class of each unit) of
    rows that rank a true class among classes (classification, linear probes): a unit is one (task, image)."""
    task = np.array(t.column("task").to_pylist(), dtype=object)
    qid = np.array(t.column("query_id").to_pylist(), dtype=object)
    cls = np.array(t.column("subset").to_pylist(), dtype=object)
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    units, unit_idx = np.unique(np.array([f"{a}\x1f{q}" for a, q in zip(task.tolist(), qid.tolist())], dtype=object),
                                return_inverse=True)
    class_keys, class_idx = np.unique(np.array([f"{a}\x1f{c}" for a, c in zip(task.tolist(), cls.tolist())],
                                               dtype=object), return_inverse=True)
    unit_class = np.zeros(len(units), dtype=np.int64)
    unit_class[unit_idx] = class_idx
    return task, qid, rank, unit_idx, units, class_idx, class_keys, unit_class


def _linear_probe(result: dict, t: pa.Table) -> UnitStats:
    m = result["metrics"]
    task, qid, rank, unit_idx, units, class_idx, class_keys, unit_class = _class_units(t)
    b = _Builder("linear_probe", units)
    for name in dict.fromkeys(task.tolist()):
        sel = np.nonzero(task == name)[0]
        _class_metrics(b, name, (name,), qid[sel], unit_idx[sel], rank[sel], class_idx[sel], m.get(name, {}))
    return b.build(unit_class, len(class_keys))


def _classification(result: dict, t: pa.Table) -> UnitStats:
    m = result["metrics"]
    task, qid, rank, unit_idx, units, class_idx, class_keys, unit_class = _class_units(t)
    group = np.array(t.column("view").to_pylist(), dtype=object)
    b = _Builder("classification", units)
    for name in dict.fromkeys(task.tolist()):
        tm = m.get(name, {})
        acc1: dict[str, Callable] = {}
        per: dict[tuple[str, str], Callable] = {}
        for g in dict.fromkeys(group[task == name].tolist()):
            sel = np.nonzero((task == name) & (group == g))[0]
            gm = tm.get(g)
            if not isinstance(gm, dict):
                continue
            fns = _class_metrics(b, f"{name}|{g}", (name, g), qid[sel], unit_idx[sel], rank[sel], class_idx[sel], gm)
            per.update({(g, k): fn for k, fn in fns.items()})
            if (g, "acc1") in per:
                acc1[g] = per[(g, "acc1")]
        clean = acc1.get("clean")
        for g, gm in tm.items():
            if g in CLASSIFY_SUMMARY_KEYS or not isinstance(gm, dict):
                continue
            if isinstance(gm.get("members"), list):  # a variant's mean over its seeds
                for k in ("acc1", "acc5", "mean_per_class_recall"):
                    fns = [per.get((mb, k)) for mb in gm["members"] if mb in tm]
                    if fns and all(f is not None for f in fns) and _num(gm.get(k)):
                        per[(g, k)] = _mean_of(fns)
                        b.estimands.append(Estimand((name, g, k), per[(g, k)]))
            if clean is not None and (g, "acc1") in per and _num(gm.get("relative_robustness")):
                per[(g, "relative_robustness")] = _over(per[(g, "acc1")], clean)
                b.estimands.append(Estimand((name, g, "relative_robustness"), per[(g, "relative_robustness")]))
        vm = tm.get("variants_mean")
        if isinstance(vm, dict) and isinstance(vm.get("members"), list):
            for k in ("acc1", "acc5", "mean_per_class_recall", "relative_robustness"):
                fns = [per.get((mb, k)) for mb in vm["members"]]
                if fns and all(f is not None for f in fns) and _num(vm.get(k)):
                    b.estimands.append(Estimand((name, "variants_mean", k), _mean_of(fns)))
            for c, cm in (tm.get("corruptions") or {}).items():
                fns = [per.get((mb, "acc1")) for mb in vm["members"] if (corruption_severity(mb) or ("",))[0] == c]
                if fns and all(f is not None for f in fns) and _num(cm.get("acc1")):
                    b.estimands.append(Estimand((name, "corruptions", c, "acc1"), _mean_of(fns)))
    return b.build(unit_class, len(class_keys))


def _mask(result: dict, t: pa.Table) -> UnitStats:
    m = result["metrics"]
    role = np.array(t.column("task").to_pylist(), dtype=object)
    qid = np.array(t.column("query_id").to_pylist(), dtype=object)
    units, unit_idx = np.unique(qid, return_inverse=True)
    b = _Builder("mask", units)
    scores = t.column("scores").combine_chunks()
    flat = scores.values.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(scores), 3)
    for r in dict.fromkeys(role.tolist()):
        sel = np.nonzero(role == r)[0]
        u = unit_idx[sel]
        iou, inter, union = flat[sel, 0], flat[sel, 1], flat[sel, 2]
        n = b.add(f"{r}|n", u, 1.0)
        if _num(get_path(m, (r, "gIoU"))):
            b.estimands.append(Estimand((r, "gIoU"), _ratio(b.add(f"{r}|iou", u, iou), n)))
        if _num(get_path(m, (r, "cIoU"))):
            b.estimands.append(Estimand((r, "cIoU"), _ratio(b.add(f"{r}|inter", u, inter),
                                                             b.add(f"{r}|union", u, union), eps=1e-10)))
    return b.build()


_BUILDERS = {"ranking": _ranking, "choice": _choice, "classification": _classification, "mask": _mask,
             "linear_probe": _linear_probe}


def unit_stats(result: dict, outcomes: pa.Table) -> UnitStats:
    """The per-unit sums and estimands of one result (its JSON dict) from its per-query ``outcomes``. Raises
    DataError, naming the result, when the outcomes lack what is needed (no rows; a Parquet written before the
    ``unit`` / ``verdicts`` columns)."""
    kind = result.get("task_type")
    if kind not in _BUILDERS:
        raise DataError(f"{result.get('checkpoint')}/{result.get('suite')}: task type {kind!r} has no statistics")
    rows = (outcomes.filter(pc.equal(outcomes.column("kind"), kind)) if "kind" in outcomes.column_names
            else outcomes.slice(0, 0))
    if rows.num_rows == 0:
        raise DataError(f"{result.get('checkpoint')}/{result.get('suite')}: no per-item outcomes (its .parquet is "
                        f"missing or empty), which intervals and paired tests are computed from; run the same "
                        f"`hardrank eval` again to write them (embeddings come from the store)")
    return _BUILDERS[kind](result, rows)


# -- resampling ---------------------------------------------------------------------------------------------
def _draws(seed: int, resamples: int, n_units: int):
    """Blocks of bootstrap index matrices: (r, U) int64 unit indices drawn with replacement, seeded; the
    blocks together hold ``resamples`` rows, the same for a given (seed, resamples, U)."""
    rng = np.random.default_rng(seed)
    block = max(1, min(resamples, _BLOCK_CELLS // max(n_units, 1)))
    done = 0
    while done < resamples:
        r = min(block, resamples - done)
        yield rng.integers(0, n_units, size=(r, n_units), dtype=np.int64)
        done += r


def _counts(idx: np.ndarray, n_units: int) -> np.ndarray:
    """(r, U) index matrix -> (r, U) float64 counts: how often each unit was drawn in each resample."""
    r = len(idx)
    flat = idx + (np.arange(r, dtype=np.int64) * n_units)[:, None]
    counts = np.bincount(flat.reshape(-1), minlength=r * n_units).reshape(r, n_units)
    return counts.astype(np.float64, copy=False)


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    a = (1.0 - LEVEL) / 2
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(v, [a, 1.0 - a])
    return float(lo), float(hi)


def intervals(stats: UnitStats, *, resamples: int = RESAMPLES, seed: int = 0) -> dict[tuple[str, ...], tuple]:
    """{metric path: (low, high)}: the 95% percentile-bootstrap interval of every estimand."""
    values = {e.path: [] for e in stats.estimands}
    for idx in _draws(seed, resamples, len(stats.units)):
        s = stats.sums(_counts(idx, len(stats.units)))
        for e in stats.estimands:
            values[e.path].append(e.fn(s))
    return {p: _quantiles(np.concatenate(v)) for p, v in values.items()}


def annotate(result: dict, outcomes: pa.Table, *, resamples: int = RESAMPLES, seed: int = 0) -> None:
    """In place: ``result["ci95"]`` (the metrics' tree, each interval as [low, high]) and
    ``result["statistics"]`` (method, level, resamples, seed, unit, units) from its ``outcomes``."""
    stats = unit_stats(result, outcomes)
    tree: dict = {}
    for path, (lo, hi) in intervals(stats, resamples=resamples, seed=seed).items():
        _set_path(tree, path, [lo, hi])
    result["ci95"] = tree
    result["statistics"] = {"method": METHOD, "level": LEVEL, "resamples": resamples, "seed": seed,
                            "unit": UNITS[stats.task_type], "units": len(stats.units)}


# -- paired comparison ------------------------------------------------------------------------------------
def mcnemar(a: np.ndarray, b: np.ndarray) -> tuple[float, int, int]:
    """Exact McNemar test of paired right/wrong outcomes ``a``, ``b`` (n,) bool: (two-sided p, a-only, b-only).
    p = the two-sided exact binomial test of the discordant pairs against 1/2: min(1, 2 P(X <= min(n01, n10))),
    X ~ Binomial(n01 + n10, 1/2); 1 without discordant pairs."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    n01, n10 = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n, k = n01 + n10, min(n01, n10)
    if n == 0:
        return 1.0, n01, n10
    i = np.arange(k, dtype=np.float64)  # log C(n, x) for x = 0..k by the ratio C(n, x+1) / C(n, x) = (n-x)/(x+1)
    logs = np.concatenate([[0.0], np.cumsum(np.log(n - i) - np.log(i + 1.0))]) - n * math.log(2.0)
    top = logs.max()
    tail = math.exp(top) * float(np.sum(np.exp(logs - top)))
    return min(1.0, 2.0 * tail), n01, n10


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment: adjusted p_(i) = max over j <= i of min(1, (m - j + 1) p_(j)), p sorted."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.empty_like(p)
    running = 0.0
    m = len(p)
    for j, i in enumerate(np.argsort(p, kind="stable")):
        running = max(running, min(1.0, (m - j) * p[i]))
        out[i] = running
    return out.tolist()


@dataclass(frozen=True)
class Difference:
    """One metric compared between two results of the same items: ``b - a`` with its 95% interval and p-value
    (``test``: ``mcnemar`` or ``permutation``); ``p_holm`` once adjusted within the comparison."""

    path: tuple[str, ...]
    a: float
    b: float
    diff: float
    low: float
    high: float
    p: float
    test: str
    p_holm: float | None = None
    discordant: tuple[int, int] | None = None  # McNemar: (right only in a, right only in b)


def _name(result: dict) -> str:
    return f"{result.get('checkpoint')}/{result.get('suite')}"


def _check_same(sa: UnitStats, sb: UnitStats, ra: dict, rb: dict) -> None:
    if len(sa.units) == len(sb.units) and np.array_equal(sa.units, sb.units):
        return
    only_a = np.setdiff1d(sa.units, sb.units)
    only_b = np.setdiff1d(sb.units, sa.units)
    show = (lambda xs: ", ".join(str(x).replace("\x1f", "/") for x in xs[:3]))
    raise DataError(f"{_name(ra)} and {_name(rb)} were evaluated on different items: {len(only_a)} unit(s) only in "
                    f"the first (e.g. {show(only_a) or '-'}), {len(only_b)} only in the second (e.g. "
                    f"{show(only_b) or '-'}); compare results of the same suite files (and the same --subset/--seed)")


def add_mean(stats: UnitStats, path: tuple[str, ...], members: list[tuple[str, ...]]) -> bool:
    """In place: a derived estimand at ``path``, the mean of the estimands ``members`` (the report's main metric:
    the mean of i2t and t2i R@1, of a suite's task accuracies). A lone member keeps its per-row outcomes (so it
    is still compared by McNemar). False when a member has no estimand."""
    have = {e.path: e for e in stats.estimands}
    if not members or any(m not in have for m in members):
        return False
    rows = have[members[0]].rows if len(members) == 1 else None
    stats.estimands.append(Estimand(path, _mean_of([have[m].fn for m in members]), rows))
    return True


def compare(ra: dict, ta: pa.Table, rb: dict, tb: pa.Table, *, paths: list[tuple[str, ...]] | None = None,
            resamples: int = RESAMPLES, seed: int = 0,
            means: dict[tuple[str, ...], list[tuple[str, ...]]] | None = None) -> list[Difference]:
    """Paired comparison of two results of one suite (dicts and their outcome tables) on ``paths`` (default:
    every estimand both have): b - a, its percentile-bootstrap interval over the shared units (one draw for
    both), and p: exact McNemar on the rows for right/wrong metrics, else a paired permutation test (each
    unit's two outcomes swapped with probability 1/2, ``resamples`` times: p = (1 + #|d*| >= |d|) / (R + 1)).
    No multiple-testing adjustment here: ``holm`` over the list. ``means``: derived estimands to add first
    (``add_mean``). Raises DataError when the items differ."""
    sa, sb = unit_stats(ra, ta), unit_stats(rb, tb)
    _check_same(sa, sb, ra, rb)
    for path, members in (means or {}).items():
        add_mean(sa, path, members)
        add_mean(sb, path, members)
    ea, eb = {e.path: e for e in sa.estimands}, {e.path: e for e in sb.estimands}
    wanted = [p for p in (paths if paths is not None else list(ea)) if p in ea and p in eb]
    if not wanted:
        return []
    pa_, pb_ = sa.point(), sb.point()
    n = len(sa.units)
    boot = {p: [] for p in wanted}
    for idx in _draws(seed, resamples, n):
        w = _counts(idx, n)
        s1, s2 = sa.sums(w), sb.sums(w)
        for p in wanted:
            boot[p].append(eb[p].fn(s2) - ea[p].fn(s1))
    need_perm = [p for p in wanted if ea[p].rows is None or eb[p].rows is None]
    perm = {p: [] for p in need_perm}
    if need_perm:
        rng = np.random.default_rng(seed + 1)
        block = max(1, min(resamples, _BLOCK_CELLS // max(n, 1)))
        for start in range(0, resamples, block):
            flip = rng.random((min(block, resamples - start), n)) < 0.5  # (r, U): swap a and b in this unit
            f = flip.astype(np.float64)
            # the swapped a takes b's sums where flipped: a' = (1-f) a + f b, b' = f a + (1-f) b
            sa_w = _mix(sa, sb, 1.0 - f, f)
            sb_w = _mix(sa, sb, f, 1.0 - f)
            for p in need_perm:
                perm[p].append(eb[p].fn(sb_w) - ea[p].fn(sa_w))
    out = []
    for p in wanted:
        d = pb_[p] - pa_[p]
        lo, hi = _quantiles(np.concatenate(boot[p]))
        if p in perm:
            null = np.concatenate(perm[p])
            null = null[np.isfinite(null)]
            pv = (1.0 + float(np.sum(np.abs(null) >= abs(d) - 1e-12))) / (len(null) + 1.0) if math.isfinite(d) \
                else float("nan")
            out.append(Difference(p, pa_[p], pb_[p], d, lo, hi, pv, "permutation"))
        else:
            keys_a, ya = sa.rows[ea[p].rows]
            keys_b, yb = sb.rows[eb[p].rows]
            if len(keys_a) == len(keys_b) and np.array_equal(keys_a, keys_b):  # the same rows in the same order
                oa = ob = slice(None)
            else:  # rows in another order: pair by key (repeats in order of appearance)
                keys_a, keys_b = _unique_keys(list(keys_a)), _unique_keys(list(keys_b))
                oa, ob = np.argsort(keys_a, kind="stable"), np.argsort(keys_b, kind="stable")
            if len(keys_a) != len(keys_b) or not np.array_equal(keys_a[oa], keys_b[ob]):
                raise DataError(f"{_name(ra)} and {_name(rb)} were evaluated on different queries of "
                                f"{'/'.join(p[:-1])}: {len(np.setdiff1d(keys_a, keys_b))} only in the first, "
                                f"{len(np.setdiff1d(keys_b, keys_a))} only in the second; compare results of the "
                                f"same suite files")
            pv, n01, n10 = mcnemar(ya[oa], yb[ob])
            out.append(Difference(p, pa_[p], pb_[p], d, lo, hi, pv, "mcnemar", discordant=(n01, n10)))
    return out


def _mix(sa: UnitStats, sb: UnitStats, wa: np.ndarray, wb: np.ndarray) -> Sums:
    """Sums of a mixture: unit u contributes wa[r, u] x its sums in ``sa`` + wb[r, u] x those in ``sb``."""
    x, y = sa.sums(wa), sb.sums(wb)
    dense = x._dense + y._dense
    per_class = None if x._per_class is None else x._per_class + y._per_class
    return Sums(dense, per_class, sa.columns, sa.class_columns)


# -- lite subsets -----------------------------------------------------------------------------------------
def stratified_sample(strata: list, n: int, seed: int) -> np.ndarray:
    """Sorted indices of ``n`` of the ``len(strata)`` units, drawn without replacement within each stratum
    (``strata[i]``: unit i's stratum), each stratum's share proportional to its size (largest remainders;
    every stratum keeps at least one unit while n allows). All units when n >= their number. Seeded."""
    total = len(strata)
    if n >= total:
        return np.arange(total)
    labels, inverse = np.unique(np.array([str(s) for s in strata], dtype=object), return_inverse=True)
    sizes = np.bincount(inverse, minlength=len(labels))
    exact = n * sizes / total
    take = np.floor(exact).astype(np.int64)
    if n >= len(labels):
        take = np.maximum(take, 1)
    left = n - int(take.sum())
    order = np.lexsort((np.arange(len(labels)), -(exact - np.floor(exact))))
    for i in order:
        if left <= 0:
            break
        if take[i] < sizes[i]:
            take[i] += 1
            left -= 1
    while left < 0:  # the floor of one per stratum overshot: trim the largest
        i = int(np.argmax(take))
        take[i] -= 1
        left += 1
    rng = np.random.default_rng(seed)
    picked = [rng.choice(np.nonzero(inverse == s)[0], size=int(take[s]), replace=False) for s in range(len(labels))]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
