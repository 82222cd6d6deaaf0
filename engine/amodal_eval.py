"""AmodalReasonSeg scoring: predictions or the clip-regions retrieval baseline -> visible/amodal gIoU, cIoU."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from hardrank.kernels.masks import giou_ciou, mask_iou_stats

from .items import ImageRef, Tables
from .suites.amodal import AmodalSet, Question, load_amodal, load_predictions

__all__ = ["score_predictions", "RegionItems", "clip_regions_items", "clip_regions", "AmodalConfig",
           "evaluate_amodal", "ROLES", "BASELINES"]

ROLES = ("visible", "amodal")
BASELINES = ("clip-regions",)
# clip-regions tie rule: equal similarities go to the instance listed first in the annotation file.
CLIP_REGIONS_TIE_RULE = "first-instance"


def _device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _score(data: AmodalSet, answer, *, device: str = "auto", block: int = 32) -> dict:
    """``answer(q)`` -> ``(pred_kind, visible, amodal)`` numpy arrays or None (= empty prediction).
    Streams questions ``block`` at a time; returns metrics, counts and per-question outcomes."""
    dev = _device(device)
    n = len(data.questions)
    if n == 0:
        raise ValueError(f"{data.path}: no questions to score")
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
    res = _score(data, preds.get, device=device, block=block)
    res["counts"]["unknown_predictions"] = len(preds.unknown)
    return res


# ----------------------------------------------------------------------------- clip-regions baseline

@dataclass
class RegionItems:
    """Table rows of the clip-regions baseline: one text row per question, and per question the
    crops of its image's candidate instances (CSR)."""

    question_rows: np.ndarray   # (nq,) int64 rows of tables.texts
    cand_ptr: np.ndarray        # (nq+1,) int64: question q's candidates are [cand_ptr[q], cand_ptr[q+1])
    cand_rows: np.ndarray       # (nc,) int64 rows of tables.images (amodal-box crops)
    cand_index: np.ndarray      # (nc,) int64 index of the candidate in data.instances[image_id]


def clip_regions_items(data: AmodalSet, tables: Tables) -> RegionItems:
    """Add every question text and every candidate crop (``ImageRef(image, crop=amodal box)``)
    to ``tables``; the embed stage then encodes them like any suite's items."""
    if not any(data.instances.values()):
        raise ValueError(f"{data.path}: the clip-regions baseline needs an 'instances' list (the candidate "
                         f"regions of each image); the file has none")
    crops: dict = {}
    for image_id, insts in data.instances.items():
        uri = data.images[image_id]["path"]
        crops[image_id] = [ImageRef(uri, crop=data.amodal_box(inst)) for inst in insts]
    qrows = tables.texts.add_many(q.text for q in data.questions)
    ptr, rows, index = [0], [], []
    for q in data.questions:
        refs = crops.get(q.image_id, [])
        rows.extend(tables.images.add(r) for r in refs)
        index.extend(range(len(refs)))
        ptr.append(len(rows))
    return RegionItems(question_rows=qrows, cand_ptr=np.array(ptr, dtype=np.int64),
                       cand_rows=np.array(rows, dtype=np.int64), cand_index=np.array(index, dtype=np.int64))


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
    res = _score(data, answer, device=device, block=block)
    res["counts"]["no_candidate_questions"] = int((counts == 0).sum())
    res["counts"]["candidates"] = int(counts.sum())
    res["answers"] = {q.id: c for q, c in zip(data.questions, choice)}
    return res


# ----------------------------------------------------------------------------- the eval job

@dataclass(frozen=True)
class AmodalConfig:
    annotations: str                        # annotation JSON, or a folder holding annotations.json
    out: str                                # results folder (one sub-folder per checkpoint / predictions)
    predictions: str | None = None          # predictions folder to score (no model needed)
    baseline: str | None = None             # "clip-regions": rank candidate crops with the model
    images: str | None = None               # image root (default: the annotation file's folder)
    model: str | None = None                # open_clip name / config .json / local-dir: (baseline only)
    checkpoints: tuple[str | None, ...] = (None,)
    store: str | None = None                # embedding store root (baseline only)
    precision: str = "auto"
    device: str = "auto"
    batch_size: int = 256
    decode_threads: int = 2
    max_failures: int | None = 100


def _outcome_tables(res: dict, answers: dict | None):
    import pyarrow as pa

    from .results import outcome_schema

    o = res["outcomes"]
    n = len(o["question_id"])
    top = [None if answers is None or answers.get(q) is None else str(answers[q]) for q in o["question_id"]]
    return [pa.Table.from_pydict({
        "kind": ["mask"] * n, "task": [role] * n, "view": [None] * n, "query_id": o["question_id"],
        "rank": [None] * n, "top1_id": top, "top1_group": [None] * n, "subset": [None] * n,
        "scores": np.stack([o[f"{role}_iou"], o[f"{role}_inter"], o[f"{role}_union"]], 1).astype(np.float32).tolist(),
        "correct": [None] * n,
    }, schema=outcome_schema()) for role in ROLES]


def _result(res: dict, **fields) -> dict:
    metrics = {r: {k: 100.0 * v for k, v in res[r].items()} for r in ROLES}  # percentages, as every suite
    return {"suite": "amodal", "task_type": "mask", "metrics": metrics, "metrics_unit": "percent",
            "counts": res["counts"], **fields}


def evaluate_amodal(cfg: AmodalConfig, *, progress=None, echo=None) -> list[dict]:
    """Score ``cfg.predictions`` and/or run ``cfg.baseline`` for every checkpoint; write one
    result JSON + outcome Parquet per run under ``cfg.out/<label>/amodal.*``."""
    from .results import write_result

    echo = echo or (lambda s: None)
    if cfg.predictions is None and cfg.baseline is None:
        raise ValueError("suite amodal needs --predictions DIR and/or --baseline clip-regions")
    if cfg.baseline is not None and cfg.baseline not in BASELINES:
        raise ValueError(f"unknown baseline {cfg.baseline!r}; choose from {BASELINES}")
    t0 = time.perf_counter()
    data = load_amodal(cfg.annotations, cfg.images)
    echo(f"amodal: {len(data.questions)} questions on {len(data.images)} images ({time.perf_counter() - t0:.1f}s)")
    protocol = {"gIoU": "mean I/(U+1e-5), empty GT+pred = 1", "cIoU": "sum I/(sum U+1e-10)",
                "ignore_index": 255, "resize": "pred -> GT size: bilinear logits/probs, nearest-exact binary",
                "gt_of_question": "union of targets"}
    results = []
    if cfg.predictions is not None:
        t = time.perf_counter()
        res = score_predictions(data, cfg.predictions, device=cfg.device)
        label = Path(cfg.predictions).resolve().name or "predictions"
        result = _result(res, checkpoint=label, predictions=os.fspath(cfg.predictions), tie_rule="n/a",
                         protocol=protocol, provenance={"timings": {"score": time.perf_counter() - t}})
        write_result(Path(cfg.out) / label, "amodal", result, _outcome_tables(res, None))
        results.append(result)
    if cfg.baseline is not None:
        results.extend(_clip_regions_runs(cfg, data, protocol, progress, echo))
    return results


def _clip_regions_runs(cfg: AmodalConfig, data: AmodalSet, protocol: dict, progress, echo) -> list[dict]:
    from .embed import embed_tables, table_embeddings
    from .models import ModelSpec, load_model
    from .results import write_result
    from .store import EmbeddingStore

    if cfg.model is None or cfg.store is None:
        raise ValueError("--baseline clip-regions needs --model (and a --store) to embed the crops and questions")
    tables = Tables.empty()
    items = clip_regions_items(data, tables)
    models = [load_model(ModelSpec(cfg.model, c, cfg.precision, cfg.device)) for c in cfg.checkpoints]
    stores = [EmbeddingStore(cfg.store, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype,
                             meta={"arch": m.arch_name, "checkpoint": m.spec.checkpoint, "precision": m.precision,
                                   "preprocess": m.preprocess_cfg}) for m in models]
    stats = embed_tables(tables, models, stores, batch_size=cfg.batch_size, decode_threads=cfg.decode_threads,
                         max_failures=cfg.max_failures, progress=progress)
    # an unreadable image leaves zero embeddings for its crops: they score 0 and rarely win; counted
    failed = len(tables.images.failed)
    out = []
    for model, store in zip(models, stores):
        emb = {mod: table_embeddings(store, tables.of(mod), np.float32) for mod in ("image", "text")}
        t = time.perf_counter()
        res = clip_regions(data, items, emb["image"], emb["text"], device=model.device)
        res["counts"]["unreadable_images"] = failed
        result = _result(res, checkpoint=model.label, checkpoint_path=model.spec.checkpoint, model=cfg.model,
                         model_fingerprint=model.fingerprint, baseline=cfg.baseline,
                         tie_rule=CLIP_REGIONS_TIE_RULE, protocol=protocol,
                         provenance={"architecture": model.arch_name, "precision": model.precision,
                                     "device": model.device, "checkpoint_hash": model.checkpoint_hash,
                                     "embed": {k: v.as_dict() for k, v in stats.items()},
                                     "timings": {"score": time.perf_counter() - t},
                                     "config": asdict(cfg)})
        write_result(Path(cfg.out) / model.label, "amodal", result, _outcome_tables(res, res["answers"]))
        echo(f"{model.label}: visible gIoU {result['metrics']['visible']['gIoU']:.1f}, "
             f"amodal gIoU {result['metrics']['amodal']['gIoU']:.1f}")
        out.append(result)
    return out
