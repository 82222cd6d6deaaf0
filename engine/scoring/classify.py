"""Zero-shot classification scored as ranking: class embeddings from prompts, ranks from the kernels, metrics."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from hardrank.scoring import backends
from hardrank.scoring.backends import Backend
from hardrank.scoring.metrics import corruption_severity
from hardrank.scoring.results import outcome_schema
from hardrank.tasks import ClassifyTask

__all__ = ["class_embeddings", "classify_ranks", "classify_metrics", "classify_outcomes", "CLASSIFY_KS"]


CLASSIFY_KS = (1, 5)


def class_embeddings(text_emb: np.ndarray, prompt_ptr: np.ndarray, prompt_rows: np.ndarray) -> np.ndarray:
    """(C, d) float32 classifier: per class, its prompts' embeddings each L2-normalised, averaged, the mean
    normalised again (open_clip's ``build_zero_shot_classifier``, CLIP_benchmark's ``zero_shot_classifier``).
    ``text_emb`` (rows, d) whole-table; class c averages rows ``prompt_rows[prompt_ptr[c]:prompt_ptr[c+1]]``."""
    x = torch.from_numpy(np.ascontiguousarray(text_emb[prompt_rows], dtype=np.float32))  # (P, d)
    x = torch.nn.functional.normalize(x, dim=-1)
    counts = torch.from_numpy(np.diff(prompt_ptr))
    owner = torch.repeat_interleave(torch.arange(len(counts)), counts)
    mean = torch.zeros(len(counts), x.shape[1], dtype=torch.float32).index_add_(0, owner, x)
    mean /= counts.unsqueeze(1).float()
    return torch.nn.functional.normalize(mean, dim=-1).numpy()


def classify_ranks(task: ClassifyTask, image_emb: np.ndarray, text_emb: np.ndarray, *, tie_rule: str = "index",
                   device: str = "cpu", budget_bytes: int = 256 << 20, search: str = "exhaustive",
                   precision: str = "auto", backend: Backend | None = None) -> dict:
    """One kernel pass of every valid (group, image) copy against the C classes. Returns per copy (flattened
    over groups, valid copies only): ``group`` index, ``image`` index, ``rank`` (classes scoring above the
    true class under ``tie_rule``; 0 = top-1), ``top1`` (predicted class: the true one when rank is 0, else
    the best other class, lowest index among equal scores) and ``tie`` (the true class's score equals the
    best other's). Also the ``info`` of the search backend."""
    valid = task.valid if task.valid is not None else np.ones(task.query_items.shape, dtype=bool)
    g_idx, i_idx = np.nonzero(valid)
    rows = task.query_items[g_idx, i_idx]
    labels = task.labels[i_idx]
    classes = class_embeddings(text_emb, task.prompt_ptr, task.prompt_rows)
    c = len(task.classnames)
    r = backends.grouped_ranks(search, np.ascontiguousarray(image_emb[rows]), classes,
                               np.array([0, c], dtype=np.int64), np.arange(len(rows) + 1, dtype=np.int64),
                               labels.astype(np.int64), backend=backend, tie_rule=tie_rule, device=device,
                               budget_bytes=budget_bytes, precision=precision)
    rank = np.asarray(r.counts).sum(1).astype(np.int64)
    neg_i = np.asarray(r.neg_index)[:, 0]
    top1 = np.where(rank == 0, labels, neg_i)
    tie = np.asarray(r.pos_score) == np.asarray(r.neg_score)[:, 0]
    return {"group": g_idx, "image": i_idx, "label": labels, "rank": rank, "top1": top1, "tie": tie,
            "info": getattr(r, "info", {}) or {}}


def _group_metrics(rank: np.ndarray, labels: np.ndarray, tie: np.ndarray, n_classes: int) -> dict:
    """top-1 / top-5 accuracy and mean per-class recall (balanced accuracy over the classes present), %."""
    n = len(rank)
    if n == 0:
        return {"acc1": float("nan"), "acc5": float("nan"), "mean_per_class_recall": float("nan"), "images": 0,
                "ties": 0}
    out = {f"acc{k}": 100.0 * float(np.mean(rank < k)) if n_classes >= k else float("nan") for k in CLASSIFY_KS}
    present = np.unique(labels)
    hits = np.bincount(labels, weights=(rank == 0).astype(np.float64), minlength=n_classes)
    totals = np.bincount(labels, minlength=n_classes)
    out["mean_per_class_recall"] = 100.0 * float(np.mean(hits[present] / totals[present]))
    out["images"] = int(n)
    out["ties"] = int(tie.sum())
    return out


def classify_metrics(task: ClassifyTask, ranks: dict, variant_seeds: dict[str, list[str]] | None = None) -> dict:
    """{group: {acc1, acc5, mean_per_class_recall, images, ties}} for the clean images and every variant
    group, plus ``relative_robustness`` (variant acc1 / clean acc1, a fraction) per variant; ``variant_seeds``
    (variant -> its seeds' groups) adds each variant's mean over seeds under its own name, and
    ``variants_mean`` is the mean over the variants (seed means where given); ``corruptions`` the mean acc1
    per corruption over its severities when variants are named ``<corruption>_<severity>``."""
    c = len(task.classnames)
    metrics = {}
    for g, name in enumerate(task.groups):
        sel = ranks["group"] == g
        metrics[name] = _group_metrics(ranks["rank"][sel], ranks["label"][sel], ranks["tie"][sel], c)
    clean = metrics[task.groups[0]]["acc1"]

    def robustness(m: dict) -> None:
        m["relative_robustness"] = m["acc1"] / clean if clean and clean == clean else float("nan")

    for name in task.groups[1:]:
        robustness(metrics[name])
    variant_seeds = variant_seeds or {}
    seeded = {g for members in variant_seeds.values() for g in members}
    per_variant = {}
    for v, members in variant_seeds.items():
        present = [metrics[m] for m in members if m in metrics]
        if len(present) > 1:
            keys = ("acc1", "acc5", "mean_per_class_recall")
            metrics[v] = {**{k: float(np.mean([p[k] for p in present])) for k in keys}, "members": members}
            robustness(metrics[v])
            per_variant[v] = metrics[v]
        elif present:
            per_variant[v] = present[0]
    for name in task.groups[1:]:
        if name not in seeded:
            per_variant[name] = metrics[name]
    if per_variant:
        keys = ("acc1", "acc5", "mean_per_class_recall", "relative_robustness")
        metrics["variants_mean"] = {k: float(np.mean([m[k] for m in per_variant.values()])) for k in keys}
        metrics["variants_mean"]["members"] = list(per_variant)
        by_corruption: dict[str, list[float]] = {}
        for v, m in per_variant.items():
            cs = corruption_severity(v)
            if cs is not None:
                by_corruption.setdefault(cs[0], []).append(m["acc1"])
        if by_corruption:
            metrics["corruptions"] = {k: {"acc1": float(np.mean(v)), "severities": len(v)}
                                      for k, v in sorted(by_corruption.items())}
    return metrics


def classify_outcomes(task: ClassifyTask, ranks: dict) -> pa.Table:
    """Per (group, image): its rank, the predicted class (``top1_id``), the true class (``subset``), correct."""
    n = len(ranks["rank"])
    names = task.classnames
    return pa.Table.from_pydict({
        "kind": ["classification"] * n, "task": [task.name] * n,
        "view": [task.groups[g] for g in ranks["group"]],
        "query_id": [task.query_ids[i] for i in ranks["image"]], "rank": ranks["rank"].astype(np.int64),
        "top1_id": [names[t] if t >= 0 else None for t in ranks["top1"]], "top1_group": [None] * n,
        "subset": [names[lab] for lab in ranks["label"]], "scores": [None] * n,
        "correct": (ranks["rank"] == 0).tolist(),
        "unit": [task.query_ids[i] for i in ranks["image"]], "verdicts": [None] * n,
    }, schema=outcome_schema())
