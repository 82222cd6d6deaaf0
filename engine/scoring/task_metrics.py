"""Main metrics of a task list, one function per name (DataComp's and CLIP_benchmark's), from per-sample outcomes.

A task list (``hardrank.suites.collections``) names each task's main metric as DataComp's ``tasklist.yml`` does:
a key of the metrics its evaluation reports. Each name here maps to one function of ``(TaskOutputs, TaskSpec)``
that reads the per-sample outcomes it needs and refuses, naming the task and the fix, when they are absent.
Values are percentages, as hardrank's metrics are (DataComp writes fractions; its aggregates are plain means,
so either unit aggregates alike). docs/classification.md, "Task lists and DataComp's aggregates", gives each
definition and its source.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hardrank.errors import DataError

__all__ = ["TaskOutputs", "METRICS", "GROUP_METRICS", "main_metric", "worst_group_accuracy", "macro_f1",
           "mean_average_precision", "winogavil_jaccard", "mean_recall_at_1", "group_column"]


@dataclass(frozen=True)
class TaskOutputs:
    """What scoring one task leaves for its main metric; each metric reads the fields it needs."""

    rank: np.ndarray | None = None      # (n,) int64 classes ranked above the true class (0: top-1; ties: index rule)
    pred: np.ndarray | None = None      # (n,) int64 predicted class (the top-1)
    labels: np.ndarray | None = None    # (n,) int64 true class
    groups: Mapping[str, np.ndarray] | None = None  # metadata field -> (n,) its value per sample (.npy columns)
    scores: np.ndarray | None = None    # (n, C) float multilabel scores
    targets: np.ndarray | None = None   # (n, C) bool multi-hot truth
    recall_at_1: Mapping[str, float] | None = None  # retrieval: {"i2t": R@1 %, "t2i": R@1 %}
    instances: Sequence[tuple[np.ndarray, np.ndarray]] | None = None  # WinoGAViL: per cue (scores (m,), truth (m,))


def _need(out: TaskOutputs, task, metric: str, *fields: str) -> None:
    missing = [f for f in fields if getattr(out, f) is None]
    if missing:
        raise DataError(f"task {task.key} ({task.name}): main metric {metric} needs each sample's "
                        f"{' and '.join(missing)}, which its scoring did not give; score it as the task list's "
                        f"metric expects, or name another main_metric for it")


# -- the metric functions (each with a slow twin in tests/test_collections.py) ----------------------------------
def worst_group_accuracy(hit: np.ndarray, groups: np.ndarray) -> float:
    """The lowest accuracy (%) over the groups present: ``hit`` (n,) bool per sample, ``groups`` (n,) its group.
    WILDS' worst-group metric (``standard_group_eval``: groups numbered by the metadata value, truncated to an
    integer, empty groups skipped)."""
    g = np.asarray(groups).astype(np.int64)
    hit = np.asarray(hit, dtype=np.float64)
    if len(g) == 0:
        return float("nan")
    values, inverse = np.unique(g, return_inverse=True)
    acc = np.bincount(inverse, hit, len(values)) / np.bincount(inverse, minlength=len(values))
    return 100.0 * float(acc.min())


def macro_f1(pred: np.ndarray, labels: np.ndarray) -> float:
    """Macro F1 (%) over the classes present in ``labels`` (WILDS' ``F1(average="macro")``: scikit-learn's
    ``f1_score`` with ``labels=unique(y_true)``): per class 2 tp / (2 tp + fp + fn), averaged."""
    pred, labels = np.asarray(pred, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    if len(labels) == 0:
        return float("nan")
    classes = np.unique(labels)
    size = int(max(labels.max(), pred.max())) + 1
    tp = np.bincount(labels[pred == labels], minlength=size)[classes].astype(np.float64)
    n_true = np.bincount(labels, minlength=size)[classes]
    n_pred = np.bincount(pred, minlength=size)[classes]
    return 100.0 * float(np.mean(2 * tp / (n_true + n_pred)))


def mean_average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """Multilabel mAP (%): per class, the samples sorted by score (descending; among equal scores the earlier
    sample first), the precision at each positive summed and divided by the positives (at least 1: a class without
    positives scores 0 and still counts), averaged over every class (CLIP_benchmark's ``average_precision_per_class``
    as VOC 2007 multilabel uses it)."""
    scores, targets = np.asarray(scores, dtype=np.float64), np.asarray(targets).astype(bool)
    n, c = scores.shape
    if c == 0:
        return float("nan")
    order = np.argsort(-scores, axis=0, kind="stable")  # (n, C)
    truth = np.take_along_axis(targets, order, axis=0)
    precision = np.cumsum(truth, axis=0) / np.arange(1, n + 1)[:, None]
    ap = (precision * truth).sum(0) / np.maximum(truth.sum(0), 1)
    return 100.0 * float(ap.mean())


def winogavil_jaccard(instances: Sequence[tuple[np.ndarray, np.ndarray]], lo: int = 10, hi: int = 12) -> float:
    """WinoGAViL's Jaccard index (%) over the cues with ``lo``..``hi`` candidates (DataComp's ``jaccard_score_10-12``):
    per cue, the k highest-scoring candidates are chosen, k its number of associations (among equal scores the
    later candidate first, as an ascending ``argsort``'s tail; a cue without associations scores 0), and scored
    |chosen & associated| / |chosen | associated|; the mean over cues."""
    out = []
    for scores, truth in instances:
        truth = np.asarray(truth).astype(bool)
        if not lo <= len(truth) <= hi:
            continue
        k = int(truth.sum())
        if k == 0:
            out.append(0.0)
            continue
        chosen = np.zeros(len(truth), dtype=bool)
        chosen[np.argsort(np.asarray(scores, dtype=np.float64), kind="stable")[-k:]] = True
        out.append(float((chosen & truth).sum()) / float((chosen | truth).sum()))
    return 100.0 * float(np.mean(out)) if out else float("nan")


def mean_recall_at_1(i2t_r1: float, t2i_r1: float) -> float:
    """DataComp's retrieval main metric: the mean of text R@1 (image -> text) and image R@1 (text -> image)."""
    return 0.5 * (i2t_r1 + t2i_r1)


def group_column(task, metadata: np.ndarray | None) -> np.ndarray:
    """The ``task.group_by`` column of the shards' per-sample metadata (n, m), its columns ``task.metadata_fields``
    (DataComp's ``.npy`` members); a DataError naming the task and the fix when the shards carry none."""
    fields = tuple(task.metadata_fields)
    if metadata is None:
        raise DataError(f"task {task.key} ({task.name}): main metric {task.main_metric} groups the samples by "
                        f"{task.group_by}, but its shards carry no metadata (.npy members with the fields "
                        f"{list(fields) or [task.group_by]}); use DataComp's shards of it, or name another main_metric")
    metadata = np.asarray(metadata)
    if metadata.ndim == 1:
        metadata = metadata[:, None]
    if task.group_by not in fields or metadata.shape[1] != len(fields):
        raise DataError(f"task {task.key} ({task.name}): its metadata has {metadata.shape[1]} column(s), expected "
                        f"{len(fields)} ({list(fields)}) holding {task.group_by}; give the task list's "
                        f"metadata_fields as the shards' .npy members order them")
    col = metadata[:, fields.index(task.group_by)]
    if np.any(col < 0) or not np.all(np.isfinite(col)):
        raise DataError(f"task {task.key} ({task.name}): metadata field {task.group_by} holds negative or non-finite "
                        f"values (e.g. {col[(col < 0) | ~np.isfinite(col)][:3].tolist()}); groups are numbered "
                        f"0, 1, ... (WILDS refuses others too)")
    return col.astype(np.int64)


# -- the registry: DataComp's main_metric names, and CLIP_benchmark's ---------------------------------------------
def _ranked(k: int):
    def metric(out: TaskOutputs, task) -> float:
        _need(out, task, f"acc{k}", "rank")
        return 100.0 * float(np.mean(np.asarray(out.rank) < k)) if len(out.rank) else float("nan")
    return metric


def _mpcr(out: TaskOutputs, task) -> float:
    _need(out, task, "mean_per_class_recall", "rank", "labels")
    lab, hit = np.asarray(out.labels, dtype=np.int64), (np.asarray(out.rank) == 0).astype(np.float64)
    present = np.unique(lab)
    return 100.0 * float(np.mean(np.bincount(lab, hit)[present] / np.bincount(lab)[present])) if len(lab) else \
        float("nan")


def _worst(k: int):
    def metric(out: TaskOutputs, task) -> float:
        _need(out, task, task.main_metric, "rank")
        if out.groups is None or task.group_by not in out.groups:
            raise DataError(f"task {task.key} ({task.name}): main metric {task.main_metric} needs each sample's "
                            f"{task.group_by} (a column of the shards' .npy metadata: {list(task.metadata_fields)}), "
                            f"which its shards did not carry; use DataComp's shards of it, or name another "
                            f"main_metric")
        return worst_group_accuracy(np.asarray(out.rank) < k, out.groups[task.group_by])
    return metric


def _f1(out: TaskOutputs, task) -> float:
    _need(out, task, "F1-macro_all", "pred", "labels")
    return macro_f1(out.pred, out.labels)


def _map(out: TaskOutputs, task) -> float:
    _need(out, task, "mean_average_precision", "scores", "targets")
    return mean_average_precision(out.scores, out.targets)


def _jaccard(out: TaskOutputs, task) -> float:
    _need(out, task, "jaccard_score_10-12", "instances")
    return winogavil_jaccard(out.instances)


def _recall(out: TaskOutputs, task) -> float:
    _need(out, task, "mean_recall@1", "recall_at_1")
    return mean_recall_at_1(out.recall_at_1["i2t"], out.recall_at_1["t2i"])


METRICS: dict[str, Callable[[TaskOutputs, object], float]] = {
    "acc1": _ranked(1),                       # top-1 (DataComp's default main metric)
    "acc5": _ranked(5),
    "mean_per_class_recall": _mpcr,           # Caltech-101, FGVC Aircraft, Flowers, Pets
    "mean_recall@1": _recall,                 # Flickr, MSCOCO: mean of image and text R@1
    "acc_top5_wg": _worst(5),                 # Dollar Street: worst income group, top-5
    "acc_wg": _worst(1),                      # GeoDE: worst region, top-1
    "acc_worst_region": _worst(1),            # FMoW: worst region, top-1
    "F1-macro_all": _f1,                      # iWildCam
    "jaccard_score_10-12": _jaccard,          # WinoGAViL, cues with 10-12 candidates
    "mean_average_precision": _map,           # VOC 2007 multilabel (CLIP_benchmark's voc2007_multilabel)
}
GROUP_METRICS = frozenset({"acc_top5_wg", "acc_wg", "acc_worst_region"})  # read a metadata field (group_by)


def main_metric(task, out: TaskOutputs) -> float:
    """``task.main_metric`` of ``out`` (percent)."""
    if task.main_metric not in METRICS:  # a task list is checked when read; this guards hand-built specs
        raise DataError(f"task {task.key}: unknown main metric {task.main_metric!r}; known: {sorted(METRICS)}")
    return METRICS[task.main_metric](out, task)
