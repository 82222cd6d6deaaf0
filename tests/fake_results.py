"""Fake but valid result folders, written with the engine's own metric functions and writer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from hardrank.metrics import add_drops, choice_metrics, recall_metrics
from hardrank.results import outcome_schema, write_result
from hardrank.tasks import ChoiceTask

TEXT_VIEWS = ("same_concept", "diff_concept", "rand_voca", "danger")
IMAGE_VIEWS = ("mix_0.9_s1", "patch_0.9_s1")
CHECKPOINTS = ("toy-clip_step0000", "toy-clip_step0200", "toy-clip_step0400", "toy-clip_step0800")
COLOURS = ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle")


def _caption(i: int, j: int) -> str:
    return f"a {COLOURS[(i + j) % 5]} {SHAPES[i % 3]} number {i} take {j}"


def write_images(root: Path, n_images: int) -> None:
    """Small solid-colour JPEGs where the fake ids point, for thumbnails."""
    from PIL import Image

    rgb = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (230, 210, 40),
           "purple": (140, 60, 170)}
    for i in range(n_images):
        for prefix in ("", *[v + "/" for v in IMAGE_VIEWS]):
            p = root / f"{prefix}val2014/img_{i:03d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (48, 48), rgb[COLOURS[i % 5]]).save(p)


def _ranking_outcomes(rng, skill, n_q, view, gallery_pos, perturbed, others):
    """rank per query, top-1 id and group. ``gallery_pos(q)`` is the query's true match id."""
    rank = np.where(rng.random(n_q) < skill, 0, rng.integers(1, 30, n_q))
    top1, group = [], []
    for q in range(n_q):
        if rank[q] == 0:
            top1.append(gallery_pos(q))
            group.append("original")
        elif view != "original" and rng.random() < 0.6:
            top1.append(perturbed(q))
            group.append(view)
        else:
            top1.append(others(q))
            group.append("original")
    return rank, top1, group


def _rococo(rng, skill, n_images):
    images = [f"val2014/img_{i:03d}.jpg" for i in range(n_images)]
    captions = [_caption(i, j) for i in range(n_images) for j in range(5)]
    metrics, counts, outcomes = {}, {}, []
    specs = [("i2t", v) for v in ("original", *TEXT_VIEWS)] + [("t2i", v) for v in ("original", *IMAGE_VIEWS)]
    for task, view in specs:
        hard = 0.0 if view == "original" else 0.25
        if task == "i2t":
            n_q, qids = n_images, images
            pos = lambda q: _caption(q, 0)
            pert = lambda q, v=view: f"{_caption(q, 1).replace('a ', 'one ', 1)} ({v})"
            other = lambda q: _caption((q + 1) % n_images, 2)
            gallery = len(captions) * (1 if view == "original" else 2)
        else:
            n_q, qids = len(captions), captions
            pos = lambda q: images[q // 5]
            pert = lambda q, v=view: f"{v}/{images[(q // 5 + 3) % n_images]}"
            other = lambda q: images[(q // 5 + 1) % n_images]
            gallery = n_images * (1 if view == "original" else 2)
        rank, top1, group = _ranking_outcomes(rng, max(skill - hard, 0.02), n_q, view, pos, pert, other)
        m = recall_metrics(rank)
        if view != "original":
            m["false_rate"] = 100.0 * float(np.mean(np.array(group) != "original"))
        metrics.setdefault(view, {})[task] = m
        counts.setdefault(view, {})[task] = {"queries": n_q, "gallery": gallery}
        outcomes.append(pa.Table.from_pydict({
            "kind": ["ranking"] * n_q, "task": [task] * n_q, "view": [view] * n_q, "query_id": qids,
            "rank": rank.astype(np.int64), "top1_id": top1, "top1_group": group, "subset": [None] * n_q,
            "scores": [None] * n_q, "correct": (rank == 0).tolist()}, schema=outcome_schema()))
    counts["skipped"] = {"i2t": {}, "t2i": {}}
    o = metrics["original"]
    o["rsum"] = sum(o[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    o["mean"] = {f"R@{k}": (o["i2t"][f"R@{k}"] + o["t2i"][f"R@{k}"]) / 2 for k in (1, 5, 10)}
    add_drops(metrics)
    return {"task_type": "ranking", "metrics": metrics, "counts": counts}, outcomes


def _choice(rng, skill, tasks):
    metrics, counts, outcomes = {}, {}, []
    for name, rule, shape, subsets in tasks:
        n = 40
        task = ChoiceTask(name=name, rule=rule, left_modality="image", right_modality="text",
                          left=np.zeros((n, shape[0]), np.int64), right=np.zeros((n, shape[1]), np.int64),
                          ids=[f"{name}/{i}" for i in range(n)],
                          subset=[subsets[i % len(subsets)] for i in range(n)] if subsets else None)
        scores = rng.normal(0.2, 0.05, (n, *shape)).astype(np.float32)
        scores[:, 0, 0] += skill * 0.1
        if rule == "grid2x2":
            scores[:, 1, 1] += skill * 0.1
        m, verdicts = choice_metrics(task, scores)
        metrics[name] = m
        counts[name] = {"items": n, "candidates": int(shape[0] * shape[1]), "skipped": {}}
        main = verdicts.get("correct", verdicts.get("augmented", verdicts.get("group")))
        outcomes.append(pa.Table.from_pydict({
            "kind": ["choice"] * n, "task": [name] * n, "view": [None] * n, "query_id": task.ids,
            "rank": [None] * n, "top1_id": [None] * n, "top1_group": [None] * n,
            "subset": task.subset if task.subset is not None else [None] * n,
            "scores": scores.reshape(n, -1).tolist(), "correct": main.tolist()}, schema=outcome_schema()))
    if {"replace_attribute", "replace_relation"} <= set(metrics):
        members = ["replace_attribute", "replace_relation"]
        keys = [k for k, v in metrics[members[0]]["all"].items() if isinstance(v, float)]
        metrics["replace"] = {"all": {k: float(np.mean([metrics[mb]["all"][k] for mb in members])) for k in keys},
                              "members": members}
    return {"task_type": "choice", "metrics": metrics, "counts": counts}, outcomes


def make_fake_results(root: Path, checkpoints=CHECKPOINTS, *, n_images: int = 12, seed: int = 0,
                      world: Path | None = None) -> Path:
    """``root/<checkpoint>/{toy-rococo,toy-hard-positives,toy-inpaint}.{json,parquet}``; the checkpoints
    get better in order. ``world`` (if given) is recorded as the suite's toy world, with images under
    ``world/images`` (written here)."""
    root = Path(root)
    if world is not None:
        write_images(Path(world) / "images", n_images)
    for k, ckpt in enumerate(checkpoints):
        rng = np.random.default_rng(seed + k)
        skill = 0.15 + 0.75 * k / max(len(checkpoints) - 1, 1)
        suites = {
            "toy-rococo": _rococo(rng, skill, n_images),
            "toy-hard-positives": _choice(rng, skill, [("replace_attribute", "triplet", (1, 3), None),
                                                       ("replace_relation", "triplet", (1, 3), None),
                                                       ("swap", "triplet", (1, 3), None)]),
            "toy-inpaint": _choice(rng, skill, [("inpaint", "grid2x2", (2, 2), ["color", "object", "size"])]),
        }
        for suite, (res, outcomes) in suites.items():
            result = {
                "suite": suite, "checkpoint": ckpt, "checkpoint_path": f"/ckpts/{ckpt}.safetensors",
                "model_fingerprint": f"toy-clip-fp32-{k:016x}", "model": "toy-clip.json", "tie_rule": "index",
                "task_type": res["task_type"], "counts": res["counts"], "metrics": res["metrics"],
                "suite_meta": {"world": str(world)} if world is not None else {}, "failures": [], "failed_items": 0,
                "provenance": {"architecture": "toy-clip", "precision": "fp32", "device": "cpu",
                               "checkpoint_hash": f"{k:032x}", "versions": {}, "embed": {},
                               "timings": {"suite_load": 0.1}, "config": {},
                               "suite_options": {"images": None, "data": str(world) if world else None}},
            }
            write_result(root / ckpt, suite, result, outcomes)
    return root
