"""Build the toy world on disk, in the real suites' file formats, deterministically from a seed."""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.atomic import write_text_atomic
from hardrank.errors import DataError, UsageError
from hardrank.formats.variants import TEXT_VARIANTS
from hardrank.perturb.corruptions import corrupt_images
from hardrank.perturb.images import alter_images
from hardrank.toyworld.scenes import (
    ANCHOR_TEMPLATE,
    BACKGROUNDS,
    COLOURS,
    SHAPES,
    SIZES,
    TEMPLATES,
    Scene,
    encode,
    object_mask,
    render,
    sample_scene,
)
from hardrank.toyworld.variants import (
    DANGER_WORDS,
    OTHER_CONCEPT,
    RANDOM_VOCAB,
    hard_positive_sets,
    replace_edit,
    rococo_variant,
)

__all__ = ["WorldConfig", "build_world", "world_config", "classification_split", "WORLD_VERSION", "CLASSIFY_TEMPLATES",
           "CLASSIFY_CORRUPTIONS"]

WORLD_VERSION = 1  # bump when the generator's output changes for the same config
_MANIFEST = "world.json"
_INPAINT_FILE = "test-00000-of-00001.parquet"
# Independent random streams, one per purpose, so changing one part leaves the others unchanged.
_STREAM = {"train": 0, "test": 1, "captions": 2, "six": 3, "hard_positives": 4, "inpaint": 5,
           **{v: 10 + i for i, v in enumerate(TEXT_VARIANTS)}}
_N_KEYS = (len(COLOURS) * len(SHAPES) * len(SIZES)) * ((len(COLOURS) - 1) * len(SHAPES) * len(SIZES))


@dataclass(frozen=True)
class WorldConfig:
    """What to generate; every field is recorded in world.json and a change rebuilds the world."""

    seed: int = 0
    n_train: int = 6000  # training images (for the toy checkpoints)
    n_test: int = 1000  # test images: the retrieval gallery (the demo wants >= 500), all scenes distinct
    image_size: int = 64  # side of the square images, pixels
    captions_per_image: int = 5  # captions of every train image and of most test images
    six_caption_frac: float = 0.01  # share of test images with one more caption (COCO: 10 of 5,000)
    jitter: float = 0.05  # max horizontal offset of an object centre (fraction of the side); vertical: 2.5x
    jpeg_quality: int = 95  # quality of every JPEG written
    alter_methods: tuple[str, ...] = ("mix", "patch")  # RoCOCO image alterations of the test split
    alter_lam: float = 0.9  # their lambda
    alter_seeds: tuple[int, ...] = (1,)  # their seeds (the real suite also uses 10 and 100)
    n_inpaint: int = 300  # rows of the inpaint parquet (at most n_test)
    n_inpaint_empty: int = 2  # of them, rows with an empty inpaint_caption (the real data has some)

    def __post_init__(self):
        ints = {"seed": 0, "n_train": 0, "n_test": 1, "image_size": 16, "captions_per_image": 5,
                "jpeg_quality": 1, "n_inpaint": 0, "n_inpaint_empty": 0}
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"WorldConfig.{name} must be an int >= {low}, got {v!r}")
        if self.n_test > _N_KEYS:
            raise UsageError(f"WorldConfig.n_test={self.n_test} exceeds the {_N_KEYS} distinct scenes the toy "
                             f"vocabulary can describe; use n_test <= {_N_KEYS}")
        if self.captions_per_image >= len(TEMPLATES):
            raise UsageError(f"WorldConfig.captions_per_image must be < {len(TEMPLATES)} (the number of "
                             f"templates), got {self.captions_per_image}")
        for name in ("six_caption_frac", "jitter", "alter_lam"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise UsageError(f"WorldConfig.{name} must be a number in [0, 1], got {v!r}")
        if self.jitter > 0.05:
            raise UsageError(f"WorldConfig.jitter must be <= 0.05 so shapes stay inside the image, got {self.jitter}")
        if not isinstance(self.alter_methods, tuple) or any(m not in ("mix", "patch") for m in self.alter_methods):
            raise UsageError(f"WorldConfig.alter_methods must be a tuple of 'mix'/'patch', got {self.alter_methods!r}")
        if not isinstance(self.alter_seeds, tuple) or any(isinstance(s, bool) or not isinstance(s, int)
                                                          for s in self.alter_seeds):
            raise UsageError(f"WorldConfig.alter_seeds must be a tuple of ints, got {self.alter_seeds!r}")

    def to_json(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, d: dict) -> WorldConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise DataError(f"unknown WorldConfig keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _rng(cfg: WorldConfig, stream: str) -> np.random.Generator:
    return np.random.default_rng([cfg.seed, _STREAM[stream]])


def _sample_scenes(cfg: WorldConfig) -> tuple[list[Scene], list[Scene]]:
    rng = _rng(cfg, "train")
    train = [sample_scene(rng, jitter=cfg.jitter) for _ in range(cfg.n_train)]
    rng, test, seen = _rng(cfg, "test"), [], set()
    while len(test) < cfg.n_test:  # distinct objects, so no two test images share a caption
        s = sample_scene(rng, jitter=cfg.jitter)
        if s.key() not in seen:
            seen.add(s.key())
            test.append(s)
    return train, test


def _captions(cfg: WorldConfig, scenes: list[Scene], n_six: int) -> list[list[str]]:
    rng = _rng(cfg, "captions")
    six = set(_rng(cfg, "six").choice(len(scenes), size=n_six, replace=False).tolist()) if n_six else set()
    out = []
    for i, s in enumerate(scenes):
        n = cfg.captions_per_image + (i in six)
        out.append([s.caption(int(t)) for t in rng.choice(len(TEMPLATES), size=n, replace=False)])
    return out


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj), encoding="utf-8")  # the RoCOCO files' layout: ", " / ": ", one line


def _write_images(root: Path, rels: list[str], scenes: list[Scene], cfg: WorldConfig) -> None:
    for d in {str(Path(r).parent) for r in rels}:
        (root / d).mkdir(parents=True, exist_ok=True)

    def one(i: int) -> None:
        (root / rels[i]).write_bytes(encode(render(scenes[i], cfg.image_size), quality=cfg.jpeg_quality))

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(one, range(len(rels))))


def _inpaint_table(cfg: WorldConfig, scenes: list[Scene], rels: list[str], images: Path):
    """InpaintCOCO-schema rows: a test image + caption and the scene with one attribute edited."""

    rng = _rng(cfg, "inpaint")
    n = min(cfg.n_inpaint, len(scenes))
    idx = sorted(rng.choice(len(scenes), size=n, replace=False).tolist())
    concepts = [("color", "object", "size")[k % 3] for k in range(n)]
    rng.shuffle(concepts)
    empty = set(rng.choice(n, size=min(cfg.n_inpaint_empty, n), replace=False).tolist())
    attr_of = {"color": "colour", "object": "shape", "size": "size"}
    cols = {k: [] for k in ("concept", "coco_caption", "coco_image", "inpaint_caption", "inpaint_image", "mask",
                            "worker", "coco_details", "inpaint_details")}
    for row, (i, concept) in enumerate(zip(idx, concepts)):
        scene = scenes[i]
        edited, attr, side = replace_edit(scene, rng, attr_of[concept])
        before, after = getattr(getattr(scene, side), attr), getattr(getattr(edited, side), attr)
        name = Path(rels[i]).name
        cols["concept"].append(concept)
        cols["coco_caption"].append(scene.caption(ANCHOR_TEMPLATE))
        cols["coco_image"].append({"bytes": (images / rels[i]).read_bytes(), "path": name})
        cols["inpaint_caption"].append("" if row in empty else edited.caption(ANCHOR_TEMPLATE))
        cols["inpaint_image"].append({"bytes": encode(render(edited, cfg.image_size), quality=cfg.jpeg_quality),
                                      "path": f"inpaint_{name}"})
        mask = object_mask([getattr(scene, side), getattr(edited, side)], cfg.image_size)
        cols["mask"].append({"bytes": encode(mask, "PNG"), "path": f"mask_{Path(name).stem}.png"})
        cols["worker"].append(f"worker_{int(rng.integers(5)):02d}")
        cols["coco_details"].append({"id": i, "file_name": name, "coco_url": rels[i],
                                     "height": cfg.image_size, "width": cfg.image_size})
        cols["inpaint_details"].append({"prompt": getattr(edited, side).phrase(), "object_side": side,
                                        "attribute": attr, "before": before, "after": after})
    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([
        ("concept", pa.string()), ("coco_caption", pa.string()), ("coco_image", img),
        ("inpaint_caption", pa.string()), ("inpaint_image", img), ("mask", img), ("worker", pa.string()),
        ("coco_details", pa.struct([("id", pa.int64()), ("file_name", pa.string()), ("coco_url", pa.string()),
                                    ("height", pa.int64()), ("width", pa.int64())])),
        ("inpaint_details", pa.struct([("prompt", pa.string()), ("object_side", pa.string()),
                                       ("attribute", pa.string()), ("before", pa.string()),
                                       ("after", pa.string())])),
    ])
    s = {"_type": "Value", "dtype": "string"}
    i64 = {"_type": "Value", "dtype": "int64"}
    features = {"concept": s, "coco_caption": s, "coco_image": {"_type": "Image"}, "inpaint_caption": s,
                "inpaint_image": {"_type": "Image"}, "mask": {"_type": "Image"}, "worker": s,
                "coco_details": {"id": i64, "file_name": s, "coco_url": s, "height": i64, "width": i64},
                "inpaint_details": {k: s for k in ("prompt", "object_side", "attribute", "before", "after")}}
    # the Hugging Face datasets library reads image columns back as images thanks to this
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    return pa.table(cols, schema=schema.with_metadata(meta))


def _build(out: Path, cfg: WorldConfig) -> dict:
    """Write the whole world under out (an empty folder); returns the manifest."""

    images = out / "images"
    train, test = _sample_scenes(cfg)
    train_rels = [f"train/toy_{i:06d}.jpg" for i in range(len(train))]
    test_rels = [f"test/toy_{i:06d}.jpg" for i in range(len(test))]
    _write_images(images, train_rels + test_rels, train + test, cfg)

    n_six = max(1, math.floor(cfg.six_caption_frac * cfg.n_test + 0.5)) if cfg.six_caption_frac > 0 else 0
    train_items = [{"image": r, "caption": c} for r, c in zip(train_rels, _captions(cfg, train, 0))]
    test_items = [{"image": r, "caption": c} for r, c in zip(test_rels, _captions(cfg, test, n_six))]
    _write_json(out / "karpathy_train.json", train_items)
    _write_json(out / "karpathy_test.json", test_items)
    for v in TEXT_VARIANTS:
        _write_json(out / "rococo" / f"{v}.json", rococo_variant(test_items, v, _rng(cfg, v)))

    alterations = []
    for method in cfg.alter_methods:
        for seed in cfg.alter_seeds:
            rep = alter_images(images, test_rels, images, method=method, lam=cfg.alter_lam, seed=seed,
                               size=cfg.image_size, device="cpu", quality=cfg.jpeg_quality)
            rep["out_dir"] = os.path.relpath(rep["out_dir"], out)
            alterations.append({k: rep[k] for k in ("method", "lam", "seed", "images", "self_pairs", "out_dir")})

    for name, (data, swapped) in hard_positive_sets(test, test_rels, _rng(cfg, "hard_positives")).items():
        _write_json(out / "hard_positives" / "data" / f"{name}.json", data)
        _write_json(out / "hard_positives" / "swapped_data" / f"{name}.json", swapped)

    table = _inpaint_table(cfg, test, test_rels, images)
    (out / "inpaint").mkdir()
    pq.write_table(table, out / "inpaint" / _INPAINT_FILE)
    _write_classification(out / _CLASSIFY_DIR, test, cfg)

    return {
        "version": WORLD_VERSION,
        "config": cfg.to_json(),
        "counts": {"train_images": len(train), "test_images": len(test),
                   "test_captions": sum(len(it["caption"]) for it in test_items),
                   "test_images_with_6_captions": n_six, "inpaint_rows": table.num_rows,
                   "inpaint_empty_captions": min(cfg.n_inpaint_empty, table.num_rows)},
        "vocab": {"colours": list(COLOURS), "shapes": list(SHAPES), "sizes": list(SIZES),
                  "backgrounds": list(BACKGROUNDS), "templates": list(TEMPLATES),
                  "other_concept": list(OTHER_CONCEPT), "random_vocab": list(RANDOM_VOCAB),
                  "danger": list(DANGER_WORDS)},
        "alterations": alterations,
    }


# Zero-shot classification: the class of a test image is its left object's colour and shape (24 classes); the
# prompts are phrased as the captions the toy checkpoints trained on phrase a left object.
CLASSIFY_TEMPLATES = ("a small {c} to the left of", "a large {c} to the left of", "a small {c} on the left",
                      "a large {c} on the left")
_CLASSIFY_DIR = "classify"
# two ImageNet-C corruptions at three severities, seed 0: <world>/images/<name>_<severity>_s0/test/... (cheap on 64 px)
CLASSIFY_CORRUPTIONS = (("gaussian_noise", "motion_blur"), (1, 3, 5), 0)
CLASSIFY_IMAGES = 500  # the first test images: with 6 variants, 3,500 images to embed per checkpoint


def classification_split(world: str | Path) -> Path:
    """``<world>/classify``: ``labels.csv`` (the first ``CLASSIFY_IMAGES`` test images, paths relative to
    ``<world>/images``, ``CLASSIFY_CORRUPTIONS`` copies of each beside them; label = the left object's
    "<colour> <shape>"), ``classnames.txt`` (every colour x shape, label order) and ``templates.txt``. Written
    once from the world's config (the test scenes are drawn again from their seed: no image is read), so a
    world built before the split existed gets it too."""
    out = Path(world) / _CLASSIFY_DIR
    if (out / "labels.csv").is_file():
        return out
    cfg = world_config(world)
    if cfg is None:
        raise DataError(f"{world} is not a toy world (no {_MANIFEST}); build one with `hardrank toy world`")
    _write_classification(out, _sample_scenes(cfg)[1], cfg)
    return out


def _write_classification(out: Path, test: list[Scene], cfg: WorldConfig) -> None:
    classes = [f"{c} {s}" for c in COLOURS for s in SHAPES]
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "classnames.txt", "\n".join(classes) + "\n")
    write_text_atomic(out / "templates.txt", "\n".join(CLASSIFY_TEMPLATES) + "\n")
    test = test[:CLASSIFY_IMAGES]
    rels = [f"test/toy_{i:06d}.jpg" for i in range(len(test))]
    names, severities, seed = CLASSIFY_CORRUPTIONS
    corrupt_images(out.parent / "images", rels, out.parent / "images", corruptions=names, severities=severities,
                   seed=seed, quality=cfg.jpeg_quality)
    rows = [f"{r},{s.left.colour} {s.left.shape}" for r, s in zip(rels, test)]
    write_text_atomic(out / "labels.csv", "image,label\n" + "\n".join(rows) + "\n")  # written last: the marker


def _is_current(out: Path, cfg: WorldConfig) -> bool:
    try:
        m = json.loads((out / _MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("version") == WORLD_VERSION and m.get("config") == cfg.to_json()


def world_config(out_dir: str | Path) -> WorldConfig | None:
    """The config a world folder was built with (its world.json), or None when there is none."""
    try:
        m = json.loads((Path(out_dir) / _MANIFEST).read_text(encoding="utf-8"))
        return WorldConfig.from_json(m["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_world(out_dir: str | Path, cfg: WorldConfig = WorldConfig()) -> Path:
    """Build the toy world in out_dir (or return at once if it is already built with this config).

    Builds in a sibling temporary folder and renames it into place, so a killed build leaves no
    half world; an existing world with another config or version is replaced.
    """
    if not isinstance(cfg, WorldConfig):
        raise UsageError(f"cfg must be a WorldConfig, got {type(cfg).__name__}")
    out = Path(out_dir)
    if _is_current(out, cfg):
        return out
    if out.exists() and not (out / _MANIFEST).exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not a toy world (no {_MANIFEST}); choose an empty or new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = out.with_name(f"{out.name}.tmp-{tag}")
    tmp.mkdir()
    try:
        manifest = _build(tmp, cfg)
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")  # written last
        if _is_current(out, cfg):  # another process finished first
            return out
        old = out.with_name(f"{out.name}.old-{tag}")
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
