"""Mask tasks scored: answers (predicted masks, or the clip-regions baseline's choices) -> gIoU, cIoU."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from hardrank.devices import resolve_device
from hardrank.errors import DataError
from hardrank.formats.amodal import AmodalSet, Question, RegionItems, load_amodal, load_predictions
from hardrank.kernels.masks import giou_ciou, mask_iou_stats
from hardrank.scoring.results import outcome_schema

__all__ = ["score_masks", "score_predictions", "clip_regions", "mask_outcomes", "ROLES", "PROTOCOL",
           "CLIP_REGIONS_TIE_RULE"]

ROLES = ("visible", "amodal")
# clip-regions tie rule: equal similarities go to the instance listed first in the annotation file.
CLIP_REGIONS_TIE_RULE = "first-instance"
PROTOCOL = {"gIoU": "mean I/(U+1e-5), empty GT+pred = 1", "cIoU": "sum I/(sum U+1e-10)",
            "ignore_index": 255, "resize": "pred -> GT size: bilinear logits/probs, nearest-exact binary",
            "gt_of_question": "union of targets"}


def score_masks(data: AmodalSet, answer, *, device: str = "auto", block: int = 32) -> dict:
    """``answer(q)`` -> ``(pred_kind, visible, amodal)`` numpy arrays or None (= empty prediction).
    Streams questions ``block`` at a time; returns metrics, counts and per-question outcomes."""
    dev = resolve_device(device)
    n = len(data.questions)
    if n == 0:
        raise DataError(f"{data.path}: no questions to score")
    stats = {r: np.zeros((4, n), dtype=np.int64) for r in ROLES}  # inter, union, gt_empty, pred_empty
    missing: list[str] = []
    for s in range(0, n, block):
        qs = data.questions[s:s + block]
        by_kind: dict[str, list] = {}  # kind -> [(position, gt_vis, gt_amo, pred_vis, pred_amo)]
        for k, q in enumerate(qs):
            gv, ga = data.gt_masks(q)
            a = answer(q)
            if a is None:
                missing.append(q.id)
                a = ("binary", np.zeros(gv.shape, np.uint8), np.zeros(ga.shape, np.uint8))
            by_kind.setdefault(a[0], []).append((s + k, gv, ga, a[1], a[2]))
        for kind, rows in by_kind.items():
            pos = np.array([r[0] for r in rows])
            for j, role in enumerate(ROLES):
                gts = [torch.from_numpy(r[1 + j]).to(dev) for r in rows]
                preds = [torch.from_numpy(np.ascontiguousarray(r[3 + j])) for r in rows]
                out = mask_iou_stats(preds, gts, pred_kind=kind, block=block)
                stats[role][:, pos] = np.stack([t.cpu().numpy().astype(np.int64) for t in out])
    metrics, per_q = {}, {}
    for role in ROLES:
        inter, union, ge, pe = stats[role]
        g, c = giou_ciou(torch.from_numpy(inter), torch.from_numpy(union), torch.from_numpy(ge).bool(),
                         torch.from_numpy(pe).bool())
        metrics[role] = {"gIoU": g, "cIoU": c}
        both_empty = (ge == 1) & (pe == 1)
        per_q[role] = {"iou": np.where(both_empty, 1.0, inter / (union + 1e-5)), "inter": inter, "union": union}
    counts = {"questions": n, "targets": sum(len(q.targets) for q in data.questions),
              "no_target_questions": sum(not q.targets for q in data.questions),
              "missing_predictions": len(missing), "missing_examples": missing[:10],
              "empty_gt": {r: int(stats[r][2].sum()) for r in ROLES}}
    outcomes = {"question_id": [q.id for q in data.questions], **{
        f"{r}_{k}": v for r in ROLES for k, v in per_q[r].items()}}
    return {**metrics, "counts": counts, "outcomes": outcomes}


def _as_set(annotations) -> AmodalSet:
    return annotations if isinstance(annotations, AmodalSet) else load_amodal(annotations)


def score_predictions(annotations, predictions_dir, *, device: str = "auto", block: int = 32) -> dict:
    """Score a predictions folder against annotations (path, folder or loaded ``AmodalSet``).

    Returns ``{"visible": {"gIoU", "cIoU"}, "amodal": {...}, "counts": {...}, "outcomes": {...}}``:
    metrics are fractions in [0, 1] (LISA's definitions, see kernels.masks); ``outcomes`` holds
    per-question IoU, intersection and union per role, in annotation order.
    """
    data = _as_set(annotations)
    preds = load_predictions(predictions_dir, data)
    res = score_masks(data, preds.get, device=device, block=block)
    res["counts"]["unknown_predictions"] = len(preds.unknown)
    return res


def clip_regions(data: AmodalSet, items: RegionItems, image_emb: np.ndarray, text_emb: np.ndarray, *,
                 device: str = "auto", block: int = 32) -> dict:
    """Answer each question with the candidate whose crop embedding is most similar to the
    question's text embedding (ties: the instance listed first), i.e. that instance's visible and
    amodal masks, and score the answers. ``image_emb`` / ``text_emb`` are whole-table ``(rows, d)``
    arrays in table-row order. Questions without candidates get empty answers (counted).
    Returns ``score_predictions``'s dict plus ``answers`` (question id -> candidate index or None)."""
    nq = len(data.questions)
    if len(items.question_rows) != nq:
        raise ValueError(f"items cover {len(items.question_rows)} questions but {data.path} has {nq}; "
                         f"build them with clip_regions_items on the same AmodalSet")
    need_i = int(items.cand_rows.max()) + 1 if len(items.cand_rows) else 0
    need_t = int(items.question_rows.max()) + 1 if nq else 0
    if image_emb.ndim != 2 or text_emb.ndim != 2 or len(image_emb) < need_i or len(text_emb) < need_t \
            or image_emb.shape[1] != text_emb.shape[1]:
        raise ValueError(f"embeddings must be (rows, d) arrays covering the tables: image_emb {image_emb.shape} "
                         f"(needs >= {need_i} rows), text_emb {text_emb.shape} (needs >= {need_t} rows), same d")
    counts = np.diff(items.cand_ptr)
    t = text_emb[items.question_rows].astype(np.float32)                 # (nq, d)
    e = image_emb[items.cand_rows].astype(np.float32)                    # (nc, d)
    sim = np.einsum("cd,cd->c", e, np.repeat(t, counts, axis=0))         # (nc,)
    choice: list[int | None] = []
    for q in range(nq):
        a, b = items.cand_ptr[q], items.cand_ptr[q + 1]
        choice.append(int(items.cand_index[a + int(np.argmax(sim[a:b]))]) if b > a else None)  # argmax: first max

    def answer(q: Question):
        k = choice[pos[q.id]]
        if k is None:
            return None
        inst = data.instances[q.image_id][k]
        return ("binary", data.decode(inst.visible, q.image_id, f"{data.path}: instance {k} of image {q.image_id!r}"),
                data.decode(inst.amodal, q.image_id, f"{data.path}: instance {k} of image {q.image_id!r}"))

    pos = {q.id: i for i, q in enumerate(data.questions)}
    res = score_masks(data, answer, device=device, block=block)
    res["counts"]["no_candidate_questions"] = int((counts == 0).sum())
    res["counts"]["candidates"] = int(counts.sum())
    res["answers"] = {q.id: c for q, c in zip(data.questions, choice)}
    return res


def mask_outcomes(res: dict, answers: dict | None = None) -> list[pa.Table]:
    """Per-question outcome rows (the results Parquet): ``scores`` = (IoU, intersection, union) per role."""
    o = res["outcomes"]
    n = len(o["question_id"])
    top = [None if answers is None or answers.get(q) is None else str(answers[q]) for q in o["question_id"]]
    return [pa.Table.from_pydict({
        "kind": ["mask"] * n, "task": [role] * n, "view": [None] * n, "query_id": o["question_id"],
        "rank": [None] * n, "top1_id": top, "top1_group": [None] * n, "subset": [None] * n,
        "scores": np.stack([o[f"{role}_iou"], o[f"{role}_inter"], o[f"{role}_union"]], 1).astype(np.float32).tolist(),
        "correct": [None] * n, "unit": o["question_id"], "verdicts": [None] * n,
    }, schema=outcome_schema()) for role in ROLES]
