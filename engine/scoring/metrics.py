"""Retrieval, choice and classification-variant metrics from kernel outputs, as docs/retrieval.md, choice.md say."""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from hardrank.scoring.blind import blind_summary
from hardrank.tasks import ChoiceTask, RankingTask

__all__ = ["view_outcomes", "recall_metrics", "ranking_metrics", "choice_verdicts", "choice_metrics", "group_accuracy",
           "add_drops", "average_views", "corruption_severity", "variant_entries", "RECALL_KS", "CLASSIFY_SUMMARY_KEYS",
           "average_precision", "multilabel_map"]

RECALL_KS = (1, 5, 10)
# classification: entries of a task's metrics that are no query group
CLASSIFY_SUMMARY_KEYS = ("clean", "variants_mean", "corruptions")
_SEVERITY = re.compile(r"^(?P<name>.+)_(?P<severity>[1-9]\d*)(?:_s\d+)?$")


def corruption_severity(variant: str) -> tuple[str, int] | None:
    """(corruption, severity) of a variant named ``<corruption>_<severity>`` (``gaussian_noise_3``, or with its seed:
    ``gaussian_noise_3_s0``), else None."""
    m = _SEVERITY.match(variant)
    return (m.group("name"), int(m.group("severity"))) if m else None


def variant_entries(groups: dict) -> dict[str, dict]:
    """The variants of one task's metrics (``classify_metrics``' output), a seed mean replacing its seeds' groups."""
    seeded = {m for g, gm in groups.items() if g not in CLASSIFY_SUMMARY_KEYS and isinstance(gm, dict)
              for m in gm.get("members", [])}
    return {g: gm for g, gm in groups.items()
            if g not in CLASSIFY_SUMMARY_KEYS and g not in seeded and isinstance(gm, dict)}


def view_outcomes(task: RankingTask, ranks, view: str) -> dict[str, np.ndarray]:
    """Per query over one view: ``rank`` (0 = top-1), top-1 gallery position and its group.

    ``ranks`` is the kernel's GroupedRanks (tensors or arrays). The top-1 is the best positive
    when rank == 0, otherwise the best non-positive of the view (score desc, then lowest index),
    so it agrees with the tie rule that produced the counts."""
    gi = np.array([task.groups.index(g) for g in task.views[view]], dtype=np.int64)
    counts = np.asarray(ranks.counts)[:, gi]
    rank = counts.sum(1)
    neg_s = np.asarray(ranks.neg_score)[:, gi]
    neg_i = np.asarray(ranks.neg_index)[:, gi]
    # best over groups: max score, ties -> lowest gallery index (groups are contiguous, ordered)
    best = np.full(len(rank), -1, dtype=np.int64)
    best_s = np.full(len(rank), -np.inf, dtype=np.float64)
    for j in range(len(gi)):
        s, i = neg_s[:, j], neg_i[:, j]
        better = (i >= 0) & ((s > best_s) | ((s == best_s) & ((best < 0) | (i < best))))
        best = np.where(better, i, best)
        best_s = np.where(better, s, best_s)
    top1 = np.where(rank == 0, np.asarray(ranks.pos_index), best)
    gid = np.searchsorted(task.group_bounds, top1, side="right") - 1
    return {"rank": rank, "top1": top1, "top1_group": gid}


def recall_metrics(rank: np.ndarray, ks: tuple[int, ...] = RECALL_KS) -> dict[str, float]:
    """R@K for each K of ``ks`` (% of queries with rank < K), mean and median rank (1-based)."""
    if len(rank) == 0:
        return {**{f"R@{k}": float("nan") for k in ks}, "mean_rank": float("nan"), "median_rank": float("nan")}
    out = {f"R@{k}": 100.0 * float(np.mean(rank < k)) for k in ks}
    out["mean_rank"] = float(np.mean(rank + 1))
    out["median_rank"] = float(np.median(rank + 1))
    return out


def ranking_metrics(task: RankingTask, ranks, ks: tuple[int, ...] = RECALL_KS) -> tuple[dict, dict]:
    """{view: {R@K for K in ks, mean_rank, median_rank, false_rate}} and per-view outcomes.
    false_rate = % of queries whose top-1 lies in an added (non-original) group."""
    metrics, outcomes = {}, {}
    for view in task.views:
        o = view_outcomes(task, ranks, view)
        m = recall_metrics(o["rank"], ks)
        if view != task.groups[0]:
            m["false_rate"] = 100.0 * float(np.mean(o["top1_group"] != 0)) if len(o["rank"]) else float("nan")
        metrics[view] = m
        outcomes[view] = o
    return metrics, outcomes


def add_drops(metrics: dict, base: str = "original") -> None:
    """In place: for each view and direction, ``drop`` = clean - variant in points (each R@K reported)."""
    for view, dirs in metrics.items():
        if view == base or not isinstance(dirs, dict):
            continue
        for d, m in dirs.items():
            clean = metrics.get(base, {}).get(d)
            if isinstance(clean, dict) and isinstance(m, dict):
                drop = {k: clean[k] - v for k, v in m.items() if k.startswith("R@") and k in clean}
                if drop:
                    m["drop"] = drop


def average_views(metrics: dict, averages: dict[str, list[str]]) -> None:
    """In place: metrics[name] = mean over member views (e.g. the three seeds of mix_0.9)."""
    for name, members in averages.items():
        present = [metrics[m] for m in members if m in metrics]
        if not present:
            continue
        out = {}
        for d in present[0]:
            if not isinstance(present[0][d], dict):
                continue
            keys = [k for k, v in present[0][d].items() if isinstance(v, (int, float))]
            out[d] = {k: float(np.mean([p[d][k] for p in present])) for k in keys}
        out["members"] = members
        metrics[name] = out


# -- choice ---------------------------------------------------------------------------------
def _first_row(task: ChoiceTask, s: np.ndarray) -> np.ndarray:
    """(n, B) the anchor's scores of every candidate, a row's padding (past ``task.candidates``) at -inf."""
    row = s[:, 0, :]
    if task.candidates is None:
        return row
    return np.where(np.arange(row.shape[1])[None, :] < task.candidates[:, None], row, -np.inf)


def choice_verdicts(task: ChoiceTask, scores: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row outcomes of a choice task from its (n, A, B) scores: named (n,) bool verdicts, and for
    ``first_rank`` also ``rank`` (n,) int64 (candidates strictly above the first). ``multilabel`` rows have no
    verdict of their own (average precision is per class, over rows): an empty dict."""
    s = np.asarray(scores, dtype=np.float64)
    if task.rule in ("first_strict", "first_ties_win", "first_rank"):
        row = _first_row(task, s)
        best_other = row[:, 1:].max(1) if row.shape[1] > 1 else np.full(len(row), -np.inf)
        tie = row[:, 0] == best_other
        if task.rule == "first_rank":
            rank = (row[:, 1:] > row[:, :1]).sum(1).astype(np.int64)
            return {"correct": rank == 0, "tie": (row[:, 1:] == row[:, :1]).any(1), "rank": rank}
        ok = row[:, 0] > best_other if task.rule == "first_strict" else row[:, 0] >= best_other
        return {"correct": ok, "tie": tie}
    if task.rule == "multilabel":
        return {}
    if task.rule == "triplet":
        c, p, n = s[:, 0, 0], s[:, 0, 1], s[:, 0, 2]
        # The reference (hard_positives run_eval.py) places c_N against c and c_P; the four orderings
        # and the ties with c_N partition the rows. c vs c_P never matters, so c == c_P is no tie.
        return {
            "original": c > n,
            "augmented": (c > n) & (p > n),
            "brittle": (c > n) & (n > p),
            "c_and_p_gt_n": (c > n) & (p > n), "c_gt_n_gt_p": (c > n) & (n > p),
            "p_gt_n_gt_c": (p > n) & (n > c), "n_gt_c_and_p": (n > c) & (n > p),
            "tie": (c == n) | (p == n),
        }
    if task.rule == "grid2x2":
        s00, s01, s10, s11 = s[:, 0, 0], s[:, 0, 1], s[:, 1, 0], s[:, 1, 1]
        i2t0, i2t1 = s00 > s01, s11 > s10     # each image picks its caption
        t2i0, t2i1 = s00 > s10, s11 > s01     # each caption picks its image
        text, image = i2t0 & i2t1, t2i0 & t2i1
        return {"i2t_0": i2t0, "i2t_1": i2t1, "t2i_0": t2i0, "t2i_1": t2i1,
                "text": text, "image": image, "group": text & image,
                "tie": (s00 == s01) | (s11 == s10) | (s00 == s10) | (s11 == s01)}
    if task.rule == "pair_t2i":
        # s[:, a, b] = image a . text b; text b picks image 0 iff s[0, b] > s[1, b] (MMVP-VLM's
        # "probability of image 0 > 0.5"), else image 1: a tie picks image 1
        t0, t1 = s[:, 0, 0] > s[:, 1, 0], ~(s[:, 0, 1] > s[:, 1, 1])
        return {"t2i_0": t0, "t2i_1": t1, "correct": t0 & t1,
                "tie": (s[:, 0, 0] == s[:, 1, 0]) | (s[:, 0, 1] == s[:, 1, 1])}
    if task.rule == "two_positives":
        p1, p2, n = s[:, 0, 0], s[:, 0, 1], s[:, 0, 2]
        return {"correct": (p1 > n) & (p2 > n), "p1": p1 > n, "p2": p2 > n, "tie": (p1 == n) | (p2 == n)}
    if task.rule == "text_triplet":
        p1p2, p1n, p2n = s[:, 0, 1], s[:, 0, 2], s[:, 1, 2]
        return {"correct": (p1p2 > p1n) & (p1p2 > p2n), "tie": (p1p2 == p1n) | (p1p2 == p2n)}
    raise ValueError(f"unknown choice rule {task.rule!r}")


def _blind(task: ChoiceTask, v: dict[str, np.ndarray], sel: np.ndarray) -> dict | None:
    """Accuracy on the rows a bag-of-words text-only scorer can and cannot separate (scoring/blind.py)."""
    if task.blind is None:
        return None
    main = v.get("correct", v.get("augmented", v.get("group")))
    if main is None:
        return None
    return blind_summary(task.rule, main[sel], task.blind[sel])


def average_precision(scores: np.ndarray, truth: np.ndarray) -> float:
    """Average precision (a fraction) of one class: the items sorted by score, descending, items of equal score
    taken together as one threshold (so their order does not matter), sum over thresholds of (recall gained) x
    (precision there): torchmetrics' binary ``average_precision`` (scikit-learn's ``average_precision_score``),
    which COLA's code calls. No positive: 0 (torchmetrics warns and returns 0)."""
    x, y = np.asarray(scores, dtype=np.float64), np.asarray(truth, dtype=bool)
    if not y.any():
        return 0.0
    order = np.argsort(-x, kind="stable")
    xs, ys = x[order], y[order]
    ends = np.r_[np.nonzero(xs[1:] != xs[:-1])[0], len(xs) - 1]  # last index of each run of equal scores
    tps = np.cumsum(ys)[ends].astype(np.float64)
    precision, recall = tps / (ends + 1), tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def multilabel_map(task: ChoiceTask, s: np.ndarray, sel: np.ndarray) -> dict:
    """COLA's single-object mAP over rows ``sel``: per class (candidate column), a class with no positive among the
    rows is left out, as is one with no eligible row; its AP is over the rows eligible for it (COLA's hard_list);
    the mean over the classes kept (%)."""
    truth, elig = task.truth[sel], task.eligible[sel]
    x = np.asarray(s, dtype=np.float64)[sel, 0, :]
    aps, no_pos, no_elig, none_eligible_pos = [], 0, 0, 0
    for c in range(truth.shape[1]):
        if not truth[:, c].any():
            no_pos += 1
            continue
        rows = elig[:, c]
        if not rows.any():
            no_elig += 1
            continue
        none_eligible_pos += not truth[rows, c].any()
        aps.append(average_precision(x[rows, c], truth[rows, c]))
    return {"mAP": 100.0 * float(np.mean(aps)) if aps else float("nan"), "classes": len(aps),
            "classes_without_positive": no_pos, "classes_without_eligible": no_elig,
            "classes_eligible_without_positive": none_eligible_pos}


def _summarise(task: ChoiceTask, v: dict[str, np.ndarray], sel: np.ndarray, s: np.ndarray) -> dict:
    n = int(sel.sum())
    pct = (lambda x: 100.0 * float(x[sel].mean()) if n else float("nan"))
    both = (lambda a, b: 100.0 * float(np.concatenate([a[sel], b[sel]]).mean()) if n else float("nan"))
    if task.rule in ("first_strict", "first_ties_win"):
        out = {"accuracy": pct(v["correct"]), "items": n, "ties": int(v["tie"][sel].sum())}
    elif task.rule == "first_rank":  # CREPE's get_one2many_metrics: mean rank + 1, floor(median rank) + 1
        r = v["rank"][sel]
        out = {"accuracy": pct(v["correct"]), **{f"R@{k}": pct(v["rank"] < k) for k in (1, 3, 5, 10)},
               "mean_rank": float(r.mean()) + 1 if n else float("nan"),
               "median_rank": float(np.floor(np.median(r))) + 1 if n else float("nan"),
               "items": n, "ties": int(v["tie"][sel].sum())}
    elif task.rule == "multilabel":
        out = {**multilabel_map(task, s, sel), "items": n}
    elif task.rule == "triplet":
        out = {"original_accuracy": pct(v["original"]), "augmented_accuracy": pct(v["augmented"]),
               "brittleness": pct(v["brittle"]), "items": n, "ties": int(v["tie"][sel].sum())}
        out["orderings"] = {k: int(v[k][sel].sum()) for k in v if "_gt_" in k}
    elif task.rule == "grid2x2":
        out = {"i2t_accuracy": both(v["i2t_0"], v["i2t_1"]), "t2i_accuracy": both(v["t2i_0"], v["t2i_1"]),
               "text_score": pct(v["text"]), "image_score": pct(v["image"]), "group_score": pct(v["group"]),
               "items": n, "ties": int(v["tie"][sel].sum())}
    elif task.rule == "pair_t2i":
        out = {"accuracy": pct(v["correct"]), "statement_accuracy": both(v["t2i_0"], v["t2i_1"]),
               "items": n, "ties": int(v["tie"][sel].sum())}
    elif task.rule == "two_positives":
        out = {"accuracy": pct(v["correct"]), "p1_accuracy": pct(v["p1"]), "p2_accuracy": pct(v["p2"]),
               "items": n, "ties": int(v["tie"][sel].sum())}
    elif task.rule == "text_triplet":
        out = {"accuracy": pct(v["correct"]), "items": n, "ties": int(v["tie"][sel].sum())}
    else:
        raise ValueError(task.rule)
    blind = _blind(task, v, sel)
    if blind is not None:
        out["blind"] = blind
    return out


def group_accuracy(correct: np.ndarray, labels: list[str | None], size: int) -> float:
    """% of sets correct, over ``len(rows) / size`` sets (What's Up's denominator): a set is correct when
    it has all ``size`` of its rows and each is correct. Rows labelled None are in no set."""
    members: dict[str, list[bool]] = defaultdict(list)
    for ok, lab in zip(np.asarray(correct, dtype=bool).tolist(), labels):
        if lab is not None:
            members[lab].append(ok)
    whole = sum(len(m) == size and all(m) for m in members.values())
    return 100.0 * whole / (len(labels) / size) if len(labels) else float("nan")


def choice_metrics(task: ChoiceTask, scores: np.ndarray) -> tuple[dict, dict]:
    """{"all": {...}, "<subset>": {...}, "<facet>=<label>": {...}} and the per-row verdicts. Set
    accuracies (``task.groups``) are added to "all" as ``<name>_accuracy``."""
    v = choice_verdicts(task, scores)
    n = len(task.ids)
    out = {"all": _summarise(task, v, np.ones(n, dtype=bool), scores)}
    for name, g in task.groups.items():
        out["all"][f"{name}_accuracy"] = group_accuracy(v["correct"], g.labels, g.size)
        out["all"][f"{name}_sets"] = len({lab for lab in g.labels if lab is not None})
    breakdowns = []
    if task.subset is not None:
        breakdowns.append(("", [(s,) for s in task.subset]))
    breakdowns.extend((f"{facet}=", labels) for facet, labels in task.facets.items())
    for prefix, labels in breakdowns:
        groups = defaultdict(list)
        for i, labs in enumerate(labels):
            for lab in labs:
                groups[lab].append(i)
        for s, rows in sorted(groups.items()):
            sel = np.zeros(n, dtype=bool)
            sel[rows] = True
            out[f"{prefix}{s}"] = _summarise(task, v, sel, scores)
    return out, v
