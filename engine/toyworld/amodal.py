"""A toy amodal world: overlapping coloured shapes with known visible/amodal masks, questions, predictions."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image

from hardrank.formats.amodal import ANNOTATION_FILE, PREDICTION_FILE
from hardrank.formats.masks import polygons_to_mask, rle_encode
from hardrank.store.embedding_store import write_json_atomic

__all__ = ["build_amodal_world"]

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 210, 40),
           "purple": (150, 60, 190), "orange": (240, 140, 30)}
SHAPES = ("square", "circle", "triangle")
SIZES = ((96, 72), (80, 64))  # (W, H): two sizes, so batches mix shapes
_VERSION = 1                  # bump when the world's content changes


def _shape(kind: str, cx: float, cy: float, r: float, h: int, w: int):
    """(amodal mask, polygon or None): squares/triangles are polygons (rasterised COCO-style, so the
    polygon *is* the truth), circles are disks."""
    if kind == "circle":
        yy, xx = np.mgrid[0:h, 0:w]
        return (((xx - cx) ** 2 + (yy - cy) ** 2) <= r * r).astype(np.uint8), None
    if kind == "square":
        poly = [cx - r, cy - r, cx + r, cy - r, cx + r, cy + r, cx - r, cy + r]
    else:
        poly = [cx, cy - r, cx + r, cy + r * 0.8, cx - r, cy + r * 0.8]
    poly = [round(v, 2) for v in poly]
    return polygons_to_mask([poly], h, w), poly


def _scene(rng: np.random.Generator, h: int, w: int) -> list[dict]:
    n = int(rng.integers(2, 5))
    pairs = [(c, s) for c in COLOURS for s in SHAPES]
    picks = rng.choice(len(pairs), size=n, replace=False)
    shapes = []
    for k, p in enumerate(picks):
        colour, kind = pairs[p]
        r = float(rng.uniform(8, 14))
        if k and rng.random() < 0.85:  # overlap an earlier shape most of the time
            ref = shapes[int(rng.integers(0, k))]
            cx, cy = ref["cx"] + rng.uniform(-1.3, 1.3) * r, ref["cy"] + rng.uniform(-1.3, 1.3) * r
        else:
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        cx, cy = float(np.clip(cx, r * 0.5, w - r * 0.5)), float(np.clip(cy, r * 0.5, h - r * 0.5))
        amodal, poly = _shape(kind, cx, cy, r, h, w)
        shapes.append({"colour": colour, "kind": kind, "cx": cx, "cy": cy, "amodal": amodal, "poly": poly})
    for k, s in enumerate(shapes):  # painter's order: later shapes hide earlier ones
        above = np.zeros((h, w), dtype=bool)
        for t in shapes[k + 1:]:
            above |= t["amodal"] > 0
        s["visible"] = ((s["amodal"] > 0) & ~above).astype(np.uint8)
    return shapes


def _box(m: np.ndarray) -> list[float]:
    ys, xs = np.nonzero(m)
    if len(xs) == 0:
        return [0.0, 0.0, 1.0, 1.0]
    return [float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1), float(ys.max() - ys.min() + 1)]


def build_amodal_world(out_dir: str | os.PathLike, seed: int = 0, n_images: int = 60) -> Path:
    """Write ``images/*.jpg``, ``annotations.json`` (masks as polygons, compressed and uncompressed
    RLE and PNG), and ``predictions/perfect`` (scores 1) and ``predictions/noisy`` (noisy logits,
    some at half resolution). Reuses a complete world built with the same arguments."""

    out = Path(out_dir)
    stamp = {"version": _VERSION, "seed": seed, "n_images": n_images}
    stamp_path = out / ".amodal_world.json"
    if stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return out
    for sub in ("images", "masks", "predictions/perfect/png", "predictions/noisy"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images, instances, questions = [], [], []
    gts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    n_inst = 0
    for i in range(n_images):
        w, h = SIZES[i % len(SIZES)]
        shapes = _scene(rng, h, w)
        pixels = np.full((h, w, 3), 235, dtype=np.uint8)
        for s in shapes:
            pixels[s["amodal"] > 0] = COLOURS[s["colour"]]
        name = f"images/{i:05d}.jpg"
        Image.fromarray(pixels).save(out / name, quality=95)
        images.append({"id": i, "file_name": name, "height": h, "width": w})
        for s in shapes:
            s["id"] = n_inst
            amodal = s["poly"] if s["poly"] is not None else rle_encode(s["amodal"], compress=n_inst % 3 != 0)
            if n_inst % 7 == 3:
                vis = f"masks/{n_inst:05d}_visible.png"
                Image.fromarray(s["visible"]).save(out / vis)
            else:
                vis = rle_encode(s["visible"], compress=n_inst % 2 == 0)
            s["json"] = {"visible": vis, "amodal": amodal}
            instances.append({"id": n_inst, "image_id": i, "bbox": _box(s["amodal"]),
                              "category": f"{s['colour']} {s['kind']}", **s["json"]})
            n_inst += 1

        def ask(text: str, targets: list[dict], inline: bool):
            qid = f"q{len(questions):05d}"
            tj = [dict(t["json"], category=f"{t['colour']} {t['kind']}") if inline else {"instance_id": t["id"]}
                  for t in targets]
            questions.append({"id": qid, "image_id": i, "question": text, "targets": tj})
            vis, amo = np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)
            for t in targets:
                vis |= t["visible"]
                amo |= t["amodal"]
            gts[qid] = (vis, amo)

        named = shapes[int(rng.integers(0, len(shapes)))]
        ask(f"the {named['colour']} {named['kind']}", [named], inline=False)
        for k, s in enumerate(shapes):
            hidden = [t for t in shapes[:k] if ((t["amodal"] > 0) & (s["amodal"] > 0)).any()]
            if hidden:
                ask(f"which shape is partly hidden behind the {s['colour']} {s['kind']}?", hidden, inline=True)
            elif k == len(shapes) - 1 and i % 3 == 0:
                ask(f"which shape is hidden behind the {s['colour']} {s['kind']}?", [], inline=True)
    write_json_atomic(out / ANNOTATION_FILE, {"info": {"description": "hardrank toy amodal world", **stamp},
                                              "images": images, "questions": questions, "instances": instances})
    _write_predictions(out / "predictions", gts, rng)
    stamp_path.write_text(json.dumps(stamp))
    return out


def _write_predictions(root: Path, gts: dict, rng: np.random.Generator) -> None:
    perfect: dict = {}
    for n, (qid, (vis, amo)) in enumerate(gts.items()):
        form = n % 4
        if form < 2:     # logits / probabilities
            hi, lo, kind = (8.0, -8.0, "logit") if form == 0 else (0.9, 0.1, "prob")
            np.savez_compressed(root / "perfect" / f"{qid}.npz", kind=kind,
                                visible=np.where(vis > 0, hi, lo).astype(np.float32),
                                amodal=np.where(amo > 0, hi, lo).astype(np.float32))
        elif form == 2:  # compressed RLE + a 0/255 PNG
            Image.fromarray((amo * 255).astype(np.uint8)).save(root / "perfect" / "png" / f"{qid}_amodal.png")
            perfect[qid] = {"visible": rle_encode(vis), "amodal": f"png/{qid}_amodal.png"}
        else:            # uncompressed RLE
            perfect[qid] = {"visible": rle_encode(vis, compress=False), "amodal": rle_encode(amo, compress=False)}
        noisy = {}
        for role, m in (("visible", vis), ("amodal", amo)):
            logit = np.where(m > 0, 2.0, -2.0) + rng.normal(0, 1.2, m.shape)
            noisy[role] = (logit[::2, ::2] if n % 2 else logit).astype(np.float32)  # half resolution for some
        np.savez_compressed(root / "noisy" / f"{qid}.npz", kind="logit", **noisy)
    write_json_atomic(root / "perfect" / PREDICTION_FILE, {"predictions": perfect})
