"""AmodalReasonSeg-style annotations and predictions: COCO masks (polygons, RLE, PNG) per question (the suite that
scores them: hardrank.suites.amodal; the score: hardrank.scoring.mask_score)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from hardrank.errors import DataError
from hardrank.formats.annotations import SuiteFormatError, read_json
from hardrank.formats.masks import polygons_to_mask, rle_decode
from hardrank.items import ImageRef, Tables
from hardrank.kernels.masks import PRED_KINDS

# ---------------------------------------------------------------------------------------------
# Annotation schema (one JSON file; `--data DIR` means DIR/annotations.json)
#
#   {
#     "images": [{"id": 1, "file_name": "images/000001.jpg", "height": 480, "width": 640}],
#     "questions": [
#       {"id": "q1", "image_id": 1, "question": "Which shape is partly hidden behind the red square?",
#        "targets": [{"visible": MASK, "amodal": MASK, "bbox": [x, y, w, h], "category": "circle"},
#                    {"instance_id": 7}]}
#     ],
#     "instances": [{"id": 7, "image_id": 1, "bbox": [x, y, w, h], "category": "circle",
#                    "visible": MASK, "amodal": MASK}]
#   }
#
# - images: `id` (int or str), `file_name` relative to the image root (`--images`, default the
#   annotation file's folder), `height` and `width` in pixels (required: masks are decoded at
#   that size).
# - questions: `id` (int or str, unique; it is also the predictions' file stem), `image_id`,
#   `question` (text), `targets`: a list, possibly empty (the answer is "nothing": both GT masks
#   are empty). A target carries its own `visible` and `amodal` masks or names an instance by
#   `instance_id`. **The GT of a question is the union of its targets' masks** (visible with
#   visible, amodal with amodal): a pixel is foreground if any target has it, else ignored (255)
#   if any target ignores it, else background.
# - instances (optional; the clip-regions baseline needs them): the candidate regions of each
#   image. `bbox` is the *amodal* box [x, y, w, h] (computed from the amodal mask if absent);
#   `id` is needed only when a target refers to it.
# - MASK is one of
#     * polygons, COCO style: [[x1, y1, x2, y2, ...], ...] (a flat [x1, y1, ...] is one polygon;
#       [] is an empty mask); rasterised like pycocotools (`polygons_to_mask`); several polygons
#       are united;
#     * COCO RLE: {"size": [h, w], "counts": "<compressed string>"} or {"size": [h, w], "counts":
#       [n0, n1, ...]} (uncompressed: column-major runs, starting with a run of zeros);
#     * a PNG path (str ending in .png) relative to the annotation file's folder: a single-channel
#       image, 0 background, 1..254 foreground, 255 ignored (docs/masks.md, "Annotations"). A GT PNG
#       holding only 0 and 255 is refused: it would be all "ignored"; save the foreground as 1.
#
# Predictions (a folder, keyed by question id):
#   * `<qid>.npz` with 2-D arrays `visible` and `amodal` at any resolution, and `kind` (a 0-d
#     string array: "logit" | "prob" | "binary"); float arrays need `kind`, bool/integer arrays
#     default to "binary";
#   * and/or `predictions.json`: {"predictions": {"<qid>": {"visible": MASK, "amodal": MASK}}}
#     with MASK as above (binary; PNG paths relative to the predictions folder; a PNG
#     prediction's foreground is any value > 0).
#   A question with no prediction scores as an empty prediction and is counted as missing; a
#   question predicted twice (npz and json) is an error.
# ---------------------------------------------------------------------------------------------

__all__ = ["AmodalSet", "Question", "Instance", "MaskSpec", "load_amodal", "load_predictions", "Predictions",
           "RegionItems", "clip_regions_items", "ANNOTATION_FILE", "PREDICTION_FILE"]

ANNOTATION_FILE = "annotations.json"
PREDICTION_FILE = "predictions.json"
IGNORE = 255


# ----------------------------------------------------------------------------- annotations

@dataclass(frozen=True)
class MaskSpec:
    """A validated, not yet decoded mask: ``kind`` "polygons" | "rle" | "png" and its value
    (polygon list, RLE dict, or an absolute PNG path)."""

    kind: str
    value: object


@dataclass
class Instance:
    id: object                      # as in the file (None if absent)
    image_id: object
    bbox: tuple[float, float, float, float] | None  # amodal box (x, y, w, h); None = from the mask
    category: str | None
    visible: MaskSpec
    amodal: MaskSpec


@dataclass
class Question:
    id: str
    image_id: object
    text: str
    targets: list[Instance]         # the answer's objects (targets given inline are Instances too)


@dataclass
class AmodalSet:
    """A loaded annotation file: masks are validated but decoded only on demand."""

    path: Path
    images: dict                    # image id -> {"path": str, "height": int, "width": int}
    questions: list[Question]
    instances: dict = field(default_factory=dict)  # image id -> [Instance] (candidate regions)

    def image_size(self, image_id) -> tuple[int, int]:
        im = self.images[image_id]
        return im["height"], im["width"]

    def decode(self, spec: MaskSpec, image_id, where: str, *, gt: bool = True) -> np.ndarray:
        """(H, W) uint8 mask at the image's size; errors name ``where`` (file and question)."""
        h, w = self.image_size(image_id)
        return _decode(spec, h, w, where, gt=gt)

    def gt_masks(self, q: Question) -> tuple[np.ndarray, np.ndarray]:
        """(visible, amodal) GT of a question: the union of its targets, uint8 {0, 1, 255}."""
        h, w = self.image_size(q.image_id)
        out = []
        for role in ("visible", "amodal"):
            fg = np.zeros((h, w), dtype=bool)
            ign = np.zeros((h, w), dtype=bool)
            for k, t in enumerate(q.targets):
                m = self.decode(getattr(t, role), q.image_id, f"{self.path}: question {q.id!r} target {k} {role}")
                ign |= m == IGNORE
                fg |= (m > 0) & (m != IGNORE)
            out.append(np.where(fg, 1, np.where(ign, IGNORE, 0)).astype(np.uint8))
        return out[0], out[1]

    def amodal_box(self, inst: Instance) -> tuple[float, float, float, float]:
        """The instance's amodal box clipped to the image, at least 1x1 pixel."""
        h, w = self.image_size(inst.image_id)
        if inst.bbox is not None:
            x, y, bw, bh = inst.bbox
        else:
            m = self.decode(inst.amodal, inst.image_id, f"{self.path}: instance {inst.id!r} amodal")
            ys, xs = np.nonzero((m > 0) & (m != IGNORE))
            if len(xs) == 0:
                x, y, bw, bh = 0.0, 0.0, float(w), float(h)
            else:
                x, y = float(xs.min()), float(ys.min())
                bw, bh = float(xs.max()) - x + 1, float(ys.max()) - y + 1
        x0, y0 = min(max(x, 0.0), w - 1.0), min(max(y, 0.0), h - 1.0)
        x1, y1 = min(max(x + bw, x0 + 1.0), float(w)), min(max(y + bh, y0 + 1.0), float(h))
        return (x0, y0, x1 - x0, y1 - y0)


def _decode(spec: MaskSpec, h: int, w: int, where: str, *, gt: bool) -> np.ndarray:
    if spec.kind == "polygons":
        return polygons_to_mask(spec.value, h, w)
    if spec.kind == "rle":
        try:
            return rle_decode(spec.value)
        except ValueError as exc:
            raise SuiteFormatError(f"{where}: bad RLE ({exc})") from exc

    try:
        with Image.open(spec.value) as im:
            if im.mode not in ("1", "L", "P", "I", "I;16"):
                raise SuiteFormatError(f"{where}: PNG {spec.value} has mode {im.mode}; expected a "
                                       f"single-channel mask (L or P) with 0 background, 1 foreground, 255 ignored")
            m = np.array(im).astype(np.int64)
    except OSError as exc:
        raise SuiteFormatError(f"{where}: cannot read PNG {spec.value} ({exc})") from exc
    if m.shape != (h, w) and gt:
        raise SuiteFormatError(f"{where}: PNG {spec.value} is {m.shape[1]}x{m.shape[0]} but the image is {w}x{h}")
    m = np.clip(m, 0, 255).astype(np.uint8)
    if gt and m.any() and not ((m > 0) & (m != IGNORE)).any():
        raise SuiteFormatError(f"{where}: PNG {spec.value} holds only 0 and 255, and 255 means 'ignored' "
                               f"(docs/masks.md, \"Annotations\"); save the foreground as 1")
    return m


def _mask_spec(value, where: str, size: tuple[int, int] | None, base: Path) -> MaskSpec:
    if isinstance(value, str):
        if not value.lower().endswith(".png"):
            raise SuiteFormatError(f"{where}: mask string {value!r} is not a .png path; masks are polygon "
                                   f"lists, RLE objects {{'size', 'counts'}} or PNG paths")
        p = base / value
        if not p.is_file():
            raise SuiteFormatError(f"{where}: mask PNG {p} does not exist")
        return MaskSpec("png", os.fspath(p))
    if isinstance(value, dict):
        if "counts" not in value or "size" not in value:
            raise SuiteFormatError(f"{where}: RLE mask needs 'size' and 'counts', got keys {sorted(value)}")
        sz, counts = value["size"], value["counts"]
        if not (isinstance(sz, list) and len(sz) == 2 and all(isinstance(v, int) and v >= 0 for v in sz)):
            raise SuiteFormatError(f"{where}: RLE 'size' must be [height, width], got {sz!r}")
        if size is not None and tuple(sz) != size:
            raise SuiteFormatError(f"{where}: RLE size {sz} does not match the image's [height, width] {list(size)}")
        if isinstance(counts, list):
            if not all(isinstance(c, int) and c >= 0 for c in counts):
                raise SuiteFormatError(f"{where}: uncompressed RLE 'counts' must be non-negative ints")
            if sum(counts) != sz[0] * sz[1]:
                raise SuiteFormatError(f"{where}: RLE counts sum to {sum(counts)} but size {sz} has "
                                       f"{sz[0] * sz[1]} pixels")
        elif not isinstance(counts, str):
            raise SuiteFormatError(f"{where}: RLE 'counts' must be a string or a list of ints, "
                                   f"got {type(counts).__name__}")
        return MaskSpec("rle", {"size": list(sz), "counts": counts})
    if isinstance(value, list):
        if value and all(_is_number(v) for v in value):
            value = [value]  # one flat polygon
        for k, poly in enumerate(value):
            if not (isinstance(poly, list) and all(_is_number(v) for v in poly)):
                raise SuiteFormatError(f"{where}: polygon {k} must be a flat list of numbers [x1, y1, x2, y2, ...]")
            if len(poly) % 2 or len(poly) < 6:
                raise SuiteFormatError(f"{where}: polygon {k} has {len(poly)} coordinates; need an even number >= 6 "
                                       f"(at least 3 points)")
        return MaskSpec("polygons", value)
    raise SuiteFormatError(f"{where}: a mask must be a polygon list, an RLE object or a PNG path, "
                           f"got {type(value).__name__}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bbox(value, where: str):
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 4 and all(_is_number(v) for v in value)):
        raise SuiteFormatError(f"{where}: 'bbox' must be [x, y, w, h], got {value!r}")
    return tuple(float(v) for v in value)


def _instance(item, where: str, size, base: Path, image_id) -> Instance:
    for role in ("visible", "amodal"):
        if role not in item:
            raise SuiteFormatError(f"{where}: lacks the {role!r} mask (has keys {sorted(item)}); give both "
                                   f"'visible' and 'amodal' ([] for an empty mask)")
    return Instance(id=item.get("id"), image_id=image_id, bbox=_bbox(item.get("bbox"), where),
                    category=item.get("category"),
                    visible=_mask_spec(item["visible"], f"{where} visible", size, base),
                    amodal=_mask_spec(item["amodal"], f"{where} amodal", size, base))


def _resolve_annotations(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / ANNOTATION_FILE
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist; --data must hold {ANNOTATION_FILE} "
                                    f"(or pass the annotation file itself)")
    return p


def load_amodal(path: str | os.PathLike, images: str | os.PathLike | None = None) -> AmodalSet:
    """Read and validate an annotation file (or a folder holding ``annotations.json``). Image
    paths resolve against ``images`` (default: the file's folder), PNG masks against the file's
    folder. Masks are decoded later, on demand."""
    path = _resolve_annotations(path)
    doc = read_json(path)
    base = path.parent
    root = Path(images) if images is not None else base
    if not (isinstance(doc, dict) and isinstance(doc.get("images"), list) and isinstance(doc.get("questions"), list)):
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise SuiteFormatError(f"{path}: expected an object with 'images' and 'questions' lists "
                               f"(and optionally 'instances'), got {got}")
    imgs: dict = {}
    for i, im in enumerate(doc["images"]):
        where = f"{path}: images[{i}]"
        if not isinstance(im, dict) or any(k not in im for k in ("id", "file_name", "height", "width")):
            raise SuiteFormatError(f"{where} needs 'id', 'file_name', 'height' and 'width', got "
                                   f"{sorted(im) if isinstance(im, dict) else type(im).__name__}")
        if not all(isinstance(im[k], int) and im[k] > 0 for k in ("height", "width")):
            raise SuiteFormatError(f"{where}: height/width must be positive ints, got {im['height']!r}/{im['width']!r}")
        if im["id"] in imgs:
            raise SuiteFormatError(f"{where}: duplicate image id {im['id']!r}")
        imgs[im["id"]] = {"path": os.fspath(root / im["file_name"]), "height": im["height"], "width": im["width"]}

    def size_of(image_id, where):
        if image_id not in imgs:
            known = list(imgs)[:5]
            raise SuiteFormatError(f"{where}: image_id {image_id!r} is not in 'images' (ids look like {known})")
        return imgs[image_id]["height"], imgs[image_id]["width"]

    instances: dict = {}
    by_id: dict = {}
    for i, it in enumerate(doc.get("instances") or []):
        where = f"{path}: instances[{i}]"
        if not isinstance(it, dict) or "image_id" not in it:
            raise SuiteFormatError(f"{where} needs 'image_id', 'visible' and 'amodal'")
        inst = _instance(it, where, size_of(it["image_id"], where), base, it["image_id"])
        instances.setdefault(it["image_id"], []).append(inst)
        if inst.id is not None:
            if inst.id in by_id:
                raise SuiteFormatError(f"{where}: duplicate instance id {inst.id!r}")
            by_id[inst.id] = inst

    questions: list[Question] = []
    seen: set[str] = set()
    for i, q in enumerate(doc["questions"]):
        if not isinstance(q, dict) or any(k not in q for k in ("id", "image_id", "question", "targets")):
            raise SuiteFormatError(f"{path}: questions[{i}] needs 'id', 'image_id', 'question' and 'targets', "
                                   f"got {sorted(q) if isinstance(q, dict) else type(q).__name__}")
        qid = str(q["id"])
        where = f"{path}: question {qid!r}"
        if qid in seen:
            raise SuiteFormatError(f"{where}: duplicate question id")
        if not isinstance(q["question"], str) or not isinstance(q["targets"], list):
            raise SuiteFormatError(f"{where}: 'question' must be a string and 'targets' a list")
        seen.add(qid)
        size = size_of(q["image_id"], where)
        targets = []
        for k, t in enumerate(q["targets"]):
            tw = f"{where} target {k}"
            if not isinstance(t, dict):
                raise SuiteFormatError(f"{tw}: expected an object, got {type(t).__name__}")
            if "visible" not in t and "amodal" not in t and "instance_id" in t:
                inst = by_id.get(t["instance_id"])
                if inst is None:
                    raise SuiteFormatError(f"{tw}: instance_id {t['instance_id']!r} is not in 'instances'")
                if inst.image_id != q["image_id"]:
                    raise SuiteFormatError(f"{tw}: instance {t['instance_id']!r} belongs to image {inst.image_id!r}, "
                                           f"not {q['image_id']!r}")
                targets.append(inst)
            else:
                targets.append(_instance(t, tw, size, base, q["image_id"]))
        questions.append(Question(id=qid, image_id=q["image_id"], text=q["question"], targets=targets))
    return AmodalSet(path=path, images=imgs, questions=questions, instances=instances)


# ----------------------------------------------------------------------------- predictions

class Predictions:
    """A predictions folder (see the schema above): ``get(question)`` -> ``(kind, visible, amodal)``
    arrays, or None when the question has no prediction. Files are read on demand."""

    def __init__(self, folder: str | os.PathLike, data: AmodalSet):
        self.dir = Path(folder)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"predictions folder {self.dir} does not exist")
        self.data = data
        self._json: dict = {}
        jpath = self.dir / PREDICTION_FILE
        if jpath.is_file():
            doc = read_json(jpath)
            if not isinstance(doc, dict) or not isinstance(doc.get("predictions"), dict):
                raise SuiteFormatError(f"{jpath}: expected {{'predictions': {{question id: {{'visible': MASK, "
                                       f"'amodal': MASK}}}}}}")
            self._json = {str(k): v for k, v in doc["predictions"].items()}
        self._jpath = jpath
        self._npz = {p.stem for p in self.dir.glob("*.npz")}
        both = sorted(self._npz & set(self._json))
        if both:
            raise SuiteFormatError(f"{self.dir}: question(s) {both[:5]} are predicted both in {PREDICTION_FILE} "
                                   f"and as .npz; keep one")
        qids = {q.id for q in data.questions}
        self.unknown = sorted((self._npz | set(self._json)) - qids)  # predictions for no question
        if not (self._npz | set(self._json)) & qids:
            raise SuiteFormatError(f"{self.dir}: no prediction matches a question id of {data.path} "
                                   f"(found {len(self._npz)} .npz and {len(self._json)} {PREDICTION_FILE} entries; "
                                   f"ids look like {[q.id for q in data.questions[:3]]})")

    def get(self, q: Question):
        if q.id in self._npz:
            return self._read_npz(q)
        if q.id in self._json:
            return self._read_json(q)
        return None

    def _read_npz(self, q: Question):
        path = self.dir / f"{q.id}.npz"
        where = f"{path} (question {q.id!r})"
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as exc:
            raise SuiteFormatError(f"{where}: cannot read ({exc})") from exc
        missing = [k for k in ("visible", "amodal") if k not in arrays]
        if missing:
            raise SuiteFormatError(f"{where}: lacks array(s) {missing}; it has {sorted(arrays)}")
        vis, amo = arrays["visible"], arrays["amodal"]
        for name, a in (("visible", vis), ("amodal", amo)):
            if a.ndim != 2:
                raise SuiteFormatError(f"{where}: {name!r} must be 2-D (H, W), got shape {a.shape}")
        if "kind" in arrays:
            kind = str(arrays["kind"])
            if kind not in PRED_KINDS:
                raise SuiteFormatError(f"{where}: kind {kind!r} is not one of {PRED_KINDS}")
        elif vis.dtype.kind == "f" or amo.dtype.kind == "f":
            raise SuiteFormatError(f"{where}: float arrays need a 'kind' entry ('logit' or 'prob'): "
                                   f"np.savez(path, visible=..., amodal=..., kind='logit')")
        else:
            kind = "binary"
        if kind != "binary":
            vis, amo = vis.astype(np.float32, copy=False), amo.astype(np.float32, copy=False)
        return kind, vis, amo

    def _read_json(self, q: Question):
        entry = self._json[q.id]
        where = f"{self._jpath}: question {q.id!r}"
        if not isinstance(entry, dict) or "visible" not in entry or "amodal" not in entry:
            raise SuiteFormatError(f"{where}: expected {{'visible': MASK, 'amodal': MASK}}")
        h, w = self.data.image_size(q.image_id)
        out = []
        for role in ("visible", "amodal"):
            spec = _mask_spec(entry[role], f"{where} {role}", None, self.dir)
            out.append(_decode(spec, h, w, f"{where} {role}", gt=False))
        return "binary", out[0], out[1]


def load_predictions(folder: str | os.PathLike, data: AmodalSet) -> Predictions:
    """Open a predictions folder against loaded annotations (validates ids up front)."""
    return Predictions(folder, data)


# ----------------------------------------------------------------------------- the suite

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
        raise DataError(f"{data.path}: the clip-regions baseline needs an 'instances' list (the candidate "
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
