"""Stand-ins of the compositional benchmarks in their released file layouts, all under one folder."""
from __future__ import annotations

import csv
import json
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["write_standins", "STANDIN_SIZES", "STANDIN_SUITES"]

# items of each released file (or its order of magnitude where the release states none), at scale 1
STANDIN_SIZES = {
    "winoground": {"examples": 400},
    "mmvp_vlm": {"pairs_per_pattern": 15},
    "whatsup": {"controlled_a": 408, "controlled_b": 408, "coco_one": 2687, "coco_two": 1160, "gqa_one": 1451,
                "gqa_two": 1000},
    "sugarcrepe": {"add_att": 692, "add_obj": 2062, "replace_att": 788, "replace_obj": 1652, "replace_rel": 1406,
                   "swap_att": 666, "swap_obj": 245},
    "sugarcrepe_pp": {"replace_att": 788, "replace_obj": 1652, "replace_rel": 1406, "swap_att": 666, "swap_obj": 245},
    "aro": {"visual_genome_relation": 23937, "visual_genome_attribution": 28748},
    "hard_positives": {"vl_checklist_attributes": 10575, "vl_checklist_relations": 16868,
                       "visual_genome_attribution": 28748},
    # every item of each piece file (the release's count before its validation keeps ~88%)
    "valse": {"existence": 534, "plurals": 1000, "counting-hard": 1000, "counting-small-quant": 1000,
              "counting-adversarial": 756, "relations": 614, "action-replacement": 779, "actant-swap": 1042,
              "coreference-standard": 916, "coreference-hard": 141, "foil-it": 1000},
    # multi-object pairs as released; single-object images per file: an order of magnitude (not stated), 320 classes
    "cola": {"multi_object": 210, "single_gqa": 1000, "single_clevr": 1000, "single_paco": 1000, "classes": 320},
    "eqben": {"items": 6000},  # the 10% subset: ~25K image-text pairs
    # rows per CSV: an order of magnitude (the release states none)
    "crepe": {"syst_rows": 1000, "prod_rows": 500},
}
STANDIN_SUITES = tuple(STANDIN_SIZES)
_POOLS = {"coco": 5000, "vg": 10000}  # distinct COCO val2017 / Visual Genome images at scale 1
_MMVP_TYPES = ("Orientation", "Presence", "State", "Quantity", "Spatial", "Color", "Structural Character", "Text",
               "Camera Perspective")
_OBJ = "dog cat man woman horse car bus boat table chair cup bottle plate tree bird kite".split()
_ADJ = "red blue green white black small large old young wooden wet striped".split()
_REL = "on under behind near beside above holding riding watching".split()
_VALSE_SOURCES = {  # piece -> the source dataset as the release names it, and the image file name it writes
    "existence": ("visual7w", "v7w_{}.jpg"), "counting-hard": ("visual7w", "v7w_{}.jpg"),
    "counting-small-quant": ("visual7w", "v7w_{}.jpg"), "counting-adversarial": ("visual7w", "v7w_{}.jpg"),
    "plurals": ("coco2017", "{:012d}.jpg"), "relations": ("coco_2017", "{:012d}.jpg"),
    "action-replacement": ("SWiG", "exercising_{}.jpg"), "actant-swap": ("SWiG", "exercising_{}.jpg"),
    "coreference-standard": ("VisDial_v1.0", "COCO_train2014_{:012d}.jpg"),
    "coreference-hard": ("VisDial_v1.0", "VisualDialog_val2018_{:012d}.jpg"),
    "foil-it": ("FOIL dataset", "COCO_val2014_{:012d}.jpg")}
# where each source dataset's images sit under the shared --images folder (hardrank.suites.valse)
_VALSE_FOLDERS = {"v7w_": "visual7w/images", "exercising_": "images_512", "COCO_train2014_": "train2014",
                  "VisualDialog_val2018_": "VisualDialog_val2018", "COCO_val2014_": "val2014"}
_EQBEN_SUBSETS = ("eqbenag", "eqbengebc", "eqbenkubric_loc", "eqbenkubric_attr", "eqbenkubric_cnt", "eqbensd",
                  "eqbenyoucook2")


class _Writer:
    def __init__(self, root: Path, rng: np.random.Generator, size: tuple[int, int]):
        self.root, self.rng, self.size = root, rng, size
        self.written: set[Path] = set()

    def image(self, path: Path, seed: int, fmt: str = "JPEG") -> None:
        """A smooth random picture (``seed`` picks it: two paths with one seed hold different files of one look)."""
        if path in self.written or path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        w, h = self.size
        r = np.random.default_rng(seed)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        f, ph = r.uniform(8, 40, 3), r.uniform(0, 6.3, 3)
        img = np.stack([128 + 90 * np.sin(xx / f[0] + ph[0]), 128 + 90 * np.cos(yy / f[1] + ph[1]),
                        128 + 90 * np.sin((xx + yy) / f[2] + ph[2])], -1) + r.normal(0, 5, (h, w, 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, format=fmt, **(
            {"quality": 90} if fmt == "JPEG" else {}))
        self.written.add(path)

    def caption(self) -> str:
        r = self.rng
        return f"a {r.choice(_ADJ)} {r.choice(_OBJ)} {r.choice(_REL)} the {r.choice(_ADJ)} {r.choice(_OBJ)}"

    def negative(self, caption: str, swap: bool) -> str:
        w = caption.split()
        if swap:  # the objects trade places: the same words in another order
            w[2], w[6] = w[6], w[2]
        else:
            w[1] = str(self.rng.choice([a for a in _ADJ if a != w[1]]))
        return " ".join(w)


def _seed(*parts) -> int:
    """A picture's seed from what names it (stable across processes, unlike ``hash``)."""
    return zlib.crc32(repr(parts).encode())


def _json(path: Path, obj, indent=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent), encoding="utf-8")


def _n(count: int, scale: float) -> int:
    return max(2, int(round(count * scale)))


def _winoground(w: _Writer, folder: Path, n: int) -> None:
    tags = ("Noun", "Adjective-Color", "Verb", "Preposition", "Scope-Preposition")
    lines = []
    for i in range(n):
        a, b = w.rng.choice(_OBJ, 2, replace=False)
        rel = w.rng.choice(_REL)
        for k in (0, 1):
            w.image(folder / "images" / f"ex_{i}_img_{k}.png", _seed("wino", i, k), fmt="PNG")
        lines.append(json.dumps({"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1",
                                 "caption_0": f"a {a} {rel} a {b}", "caption_1": f"a {b} {rel} a {a}",
                                 "tag": str(w.rng.choice(tags)), "secondary_tag": str(w.rng.choice(
                                     ["", "", "Symbolic", "Pragmatics", "Series", "Symbolic, Series"])),
                                 "num_main_preds": int(w.rng.integers(1, 3)),
                                 "collapsed_tag": str(w.rng.choice(["Object", "Relation", "Both"]))}))
    (folder / "examples.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _mmvp(w: _Writer, folder: Path, per_pattern: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "Questions.csv").open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["Question ID", "Type", "Statement"])
        qid = 0
        for typ in _MMVP_TYPES:
            for _ in range(per_pattern):
                obj, adj = w.rng.choice(_OBJ), w.rng.choice(_ADJ)
                for statement in (f"the {obj} is {adj}", f"the {obj} is not {adj}, seen from the side"):
                    qid += 1
                    w.image(folder / "MLLM_VLM Images" / typ / f"{qid}.jpg", _seed("mmvp", qid))
                    out.writerow([qid, typ, statement])


def _whatsup(w: _Writer, folder: Path, sizes: dict, coco: list[str], vg: list[int]) -> None:
    phrases = {"left_of": "to the left of", "right_of": "to the right of", "on": "on", "under": "under",
               "in-front_of": "in front of", "behind": "behind"}
    for task, fname, sub, preps in (("controlled_a", "controlled_images_dataset.json", "controlled_images",
                                     ("left_of", "right_of", "on", "under")),
                                    ("controlled_b", "controlled_clevr_dataset.json", "controlled_clevr",
                                     ("left_of", "right_of", "in-front_of", "behind"))):
        items = []
        for j in range(max(1, sizes[task] // 4)):
            a, b = f"{w.rng.choice(_OBJ)}-{j}", str(w.rng.choice(_OBJ))
            for prep in preps:
                name = f"{a}_{prep}_{b}.jpeg"
                w.image(folder / sub / name, _seed(task, name))
                caps = [f"A {a} {phrases[prep]} a {b}"] + [f"A {a} {phrases[p]} a {b}" for p in preps if p != prep]
                items.append({"image_path": f"data/{sub}/{name}", "caption_options": caps})
        _json(folder / fname, items)
    one = (("left", "right"), ("right", "left"), ("top", "bottom"), ("bottom", "top"))
    for task, fname in (("coco_one", "coco_qa_one_obj.json"), ("coco_two", "coco_qa_two_obj.json"),
                        ("gqa_one", "vg_qa_one_obj.json"), ("gqa_two", "vg_qa_two_obj.json")):
        items = []
        for _ in range(sizes[task]):
            a, b = w.rng.choice(_OBJ, 2, replace=False)
            img = int(coco[w.rng.integers(len(coco))].split(".")[0]) if task.startswith("coco") else int(
                vg[w.rng.integers(len(vg))])
            if task.endswith("one"):
                p, q = one[w.rng.integers(len(one))]
                items.append([img, f"A {a} on the {p}", f"A {a} on the {q}"])
            else:
                p, q = (("left of", "right of"), ("above", "below"), ("behind", "in front of"))[w.rng.integers(3)]
                items.append([img, f"A {a} {p} a {b}", f"A {a} {q} a {b}"])
        _json(folder / fname, items)


def _valse(w: _Writer, folder: Path, images: Path, sizes: dict, coco: list[str]) -> None:
    """VALSE's data/<piece>.json (objects keyed by item id, the README's fields, the mturk votes) and each source
    dataset's images under ``images`` (COCO val2017 from the shared pool)."""
    for piece, count in sizes.items():
        dataset, pattern = _VALSE_SOURCES[piece]
        items = {}
        for i in range(count):
            if dataset.startswith("coco"):
                fname = coco[w.rng.integers(len(coco))]
            else:
                fname = pattern.format(int(w.rng.integers(1, max(2, count // 2))))
                sub = next(v for k, v in _VALSE_FOLDERS.items() if fname.startswith(k))
                w.image(images / sub / fname, _seed("valse", sub, fname))
            cap = w.caption()
            votes = int(w.rng.choice([3, 2, 1, 0], p=[0.55, 0.33, 0.08, 0.04]))
            other = int(w.rng.integers(0, 4 - votes))
            items[f"{piece}_{i}"] = {"dataset": dataset, "original_split": "test", "dataset_idx": str(i),
                                     "linguistic_phenomena": piece.split("-")[0], "image_file": fname,
                                     "caption": cap, "classes": cap.split()[1], "classes_foil": "x",
                                     "mturk": {"foil": 3 - votes - other, "caption": votes, "other": other},
                                     "foil": w.negative(cap, piece == "actant-swap")}
        _json(folder / f"{piece}.json", items)


def _cola(w: _Writer, folder: Path, images: Path, sizes: dict, vg: list[int]) -> None:
    """COLA's data/: the multi-object pairs ([image URL, caption, image URL, caption]) with the Visual Genome
    images as the URLs name them, and the single-object files ({"labels", "data"}) with their images."""
    items = []
    for _ in range(sizes["multi_object"]):
        a, b = (int(vg[w.rng.integers(len(vg))]) for _ in range(2))
        for i in (a, b):
            w.image(images / "vg_gqa_images" / f"{i}.jpg", _seed("vg", i))
        cap = w.caption()
        items.append([f"https://cs-people.bu.edu/array/data/vg_gqa_images/{a}.jpg", cap,
                      f"https://cs-people.bu.edu/array/data/vg_gqa_images/{b}.jpg", w.negative(cap, False)])
    _json(folder / "COLA_multiobjects_matching_benchmark.json", items)
    n_cls = sizes["classes"]
    labels = list(dict.fromkeys(f"{a1} {a2} {o}" for a1 in _ADJ for a2 in _ADJ for o in _OBJ if a1 != a2))[:n_cls]
    for task, fname in (("single_gqa", "GQA"), ("single_clevr", "CLEVR"), ("single_paco", "PACO")):
        data = []
        for k in range(sizes[task]):
            rel = {"single_gqa": f"vg_gqa_images/{vg[k % len(vg)]}.jpg",
                   "single_clevr": f"CLEVR_v1.0/images/val/CLEVR_val_{k:06d}.png",
                   "single_paco": f"paco/images/{k:012d}.jpg"}[task]
            w.image(images / rel, _seed("vg", vg[k % len(vg)]) if task == "single_gqa" else _seed(task, k),
                    fmt="PNG" if rel.endswith(".png") else "JPEG")
            pos = w.rng.choice(len(labels), int(w.rng.integers(1, 4)), replace=False)
            label = np.zeros(len(labels), dtype=int)
            label[pos] = 1
            hard = label | (w.rng.random(len(labels)) < 0.1)
            row = [rel, {str(w.rng.choice(_OBJ)): [str(w.rng.choice(_ADJ))]}, label.tolist(), hard.astype(int).tolist()]
            data.append(row if task != "single_paco" else [row[0], *row[2:]])  # PACO: no annotation (README)
        _json(folder / f"COLA_singleobjects_benchmark_{fname}.json", {"labels": labels, "data": data})


def _eqben(w: _Writer, folder: Path, n: int) -> None:
    """EqBen's Winoground-style annotation (a list of {image0, caption0, image1, caption1}; paths start with the
    sub-dataset's folder) and its images (PNG frames; YouCook2's as BGR .npy arrays), as its eqben_vllm folder."""
    items = []
    for i in range(n):
        sub = _EQBEN_SUBSETS[i % len(_EQBEN_SUBSETS)]
        ext = ".npy" if sub == "eqbenyoucook2" else ".png"
        paths = [f"{sub}/video_{i // 4}/frame_{i}_{k}{ext}" for k in (0, 1)]
        for rel, k in zip(paths, (0, 1)):
            target = folder / "images" / rel
            if ext == ".npy":
                target.parent.mkdir(parents=True, exist_ok=True)
                np.save(target, np.random.default_rng(_seed("eqben", i, k)).integers(0, 255, (24, 32, 3), np.uint8))
            else:
                w.image(target, _seed("eqben", i, k), fmt="PNG")
        cap = w.caption()
        items.append({"image0": paths[0], "caption0": cap, "image1": paths[1], "caption1": w.negative(cap, False)})
    _json(folder / "all_select.json", items)


def _crepe(w: _Writer, root: Path, sizes: dict, vg: list[int], box) -> None:
    """CREPE's extracted data zips: syst_hard_negatives/ (one CSV per compound split and pretraining set, three
    hard-negative columns) and prod_hard_negatives/<type>/ (one CSV per complexity), hard negatives written as
    Python list literals (as pandas writes a list), regions of Visual Genome images in VG_100K/ and VG_100K_2/."""
    half = len(vg) // 2

    def region() -> dict:
        i = int(vg[w.rng.integers(len(vg))])
        w.image(root / ("VG_100K" if vg.index(i) < half else "VG_100K_2") / f"{i}.jpg", _seed("vg", i))
        b = box()
        return {"image_id": str(i), "x": b["bbox_x"], "y": b["bbox_y"], "width": b["bbox_w"], "height": b["bbox_h"]}

    def negatives(cap: str, k: int) -> list[str]:
        return [w.negative(cap, j % 2 == 1) + ("" if j < 2 else f" {_OBJ[j % len(_OBJ)]}") for j in range(k)]

    for split in ("seen_compounds", "unseen_compounds"):
        for train in ("cc12m", "yfcc", "laion"):
            rows = []
            for r in range(sizes["syst_rows"]):
                cap = w.caption()
                atom, comp = negatives(cap, int(w.rng.integers(1, 5))), negatives(cap, int(w.rng.integers(0, 4)))
                rows.append({"region_id": str(r), **region(), "caption": cap, "valid_hard_negs_atom": str(atom),
                             "valid_hard_negs_comp": str(comp), "valid_hard_negs_combined": str(atom + comp)})
            _csv(root / "syst_hard_negatives" / f"syst_vg_hard_negs_{split}_in_{train}.csv", rows)
    for hn in ("atom", "negate", "swap"):
        for c in range(4, 13):
            rows = []
            for _ in range(sizes["prod_rows"]):
                cap = " ".join([w.caption()] + [str(w.rng.choice(_ADJ)) for _ in range(c - 4)])
                rows.append({**region(), "caption": cap, "hard_negs": str(negatives(cap, int(w.rng.integers(1, 6))))})
            _csv(root / "prod_hard_negatives" / hn / f"prod_vg_hard_negs_{hn}_complexity_{c}.csv", rows)


def _csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)


def write_standins(root: str | Path, *, scale: float = 1.0, seed: int = 0, image_size=(640, 480),
                   suites=STANDIN_SUITES) -> dict[str, int]:
    """Write stand-ins of ``suites`` under ``root``, each in its release's layout under the release's folder
    name, so one ``--data root --images root`` serves them all: ``winoground/data/`` (examples.jsonl, images/),
    ``MMVP_VLM/`` (Questions.csv, MLLM_VLM Images/<Type>/), ``whatsup_vlms/data/`` (its six JSON files,
    controlled_images/, controlled_clevr/, vg_images/), ``scpp/data/`` (SugarCrepe++), ``sugar-crepe/data/``
    (SugarCrepe), ARO's two JSON files and ``images/`` at the top, hard positives' ``data/`` and
    ``swapped_data/`` (images ``data/VG_100K_2/``), ``VALSE/data/`` (its piece files; the source datasets' images
    under their own folder names: ``visual7w/images/``, ``images_512/``, ``train2014/``, ``val2014/``,
    ``VisualDialog_val2018/``), ``COLA/data/`` (images ``vg_gqa_images/``, ``CLEVR_v1.0/``, ``paco/``),
    ``eqben_vllm/`` (``all_select.json``, ``images/``), CREPE's ``syst_hard_negatives/`` and
    ``prod_hard_negatives/`` (images ``VG_100K/``, ``VG_100K_2/``), and the COCO val2017 images they share in
    ``val2017/``.
    Item counts are ``STANDIN_SIZES`` times ``scale``; images come from pools (COCO 5,000, VG 10,000 at
    scale 1) as in the releases, where many items share an image. Returns the items per suite."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    w = _Writer(root, rng, tuple(image_size))
    coco = [f"{i:012d}.jpg" for i in rng.choice(999_999, _n(_POOLS["coco"], scale), replace=False)]
    vg = [int(i) for i in rng.choice(2_400_000, _n(_POOLS["vg"], scale), replace=False)]
    counts = {}
    uses_coco = {"sugarcrepe", "sugarcrepe_pp", "whatsup", "valse"} & set(suites)
    for name in coco if uses_coco else []:
        w.image(root / "val2017" / name, _seed("coco", name))
    if "winoground" in suites:
        n = _n(STANDIN_SIZES["winoground"]["examples"], scale)
        _winoground(w, root / "winoground" / "data", n)
        counts["winoground"] = n
    if "mmvp_vlm" in suites:
        per = max(1, int(round(STANDIN_SIZES["mmvp_vlm"]["pairs_per_pattern"] * scale)))
        _mmvp(w, root / "MMVP_VLM", per)
        counts["mmvp_vlm"] = per * len(_MMVP_TYPES)
    if "whatsup" in suites:
        sizes = {k: _n(v, scale) for k, v in STANDIN_SIZES["whatsup"].items()}
        folder = root / "whatsup_vlms" / "data"
        for i in vg:
            w.image(folder / "vg_images" / f"{i}.jpg", _seed("vg", i))
        _whatsup(w, folder, sizes, coco, vg)
        counts["whatsup"] = sum(sizes.values())
    for suite, folder, listed in (("sugarcrepe", root / "sugar-crepe" / "data", False),
                                  ("sugarcrepe_pp", root / "scpp" / "data", True)):
        if suite not in suites:
            continue
        total = 0
        for stem, count in STANDIN_SIZES[suite].items():
            items = []
            for i in range(_n(count, scale)):
                cap = w.caption()
                it = {"filename": coco[rng.integers(len(coco))], "caption": cap,
                      "negative_caption": w.negative(cap, stem.startswith("swap"))}
                if listed:
                    it = {"id": i, "filename": it["filename"], "caption": cap,
                          "caption2": " ".join(reversed(cap.split()[3:])) + " " + " ".join(cap.split()[:3]),
                          "negative_caption": it["negative_caption"]}
                items.append(it)
            total += len(items)
            _json(folder / f"{stem}.json", items if listed else {str(i): it for i, it in enumerate(items)},
                  indent=1 if listed else None)
        counts[suite] = total
    if "aro" in suites or "hard_positives" in suites:
        for i in vg:
            if "aro" in suites:
                w.image(root / "images" / f"{i}.jpg", _seed("vg", i))
            if "hard_positives" in suites:
                w.image(root / "data" / "VG_100K_2" / f"{i}.jpg", _seed("vg", i))
    if "valse" in suites:
        sizes = {k: _n(v, scale) for k, v in STANDIN_SIZES["valse"].items()}
        _valse(w, root / "VALSE" / "data", root, sizes, coco)
        counts["valse"] = sum(sizes.values())
    if "cola" in suites:
        sizes = {k: (v if k == "classes" else _n(v, scale)) for k, v in STANDIN_SIZES["cola"].items()}
        _cola(w, root / "COLA" / "data", root, sizes, vg)
        counts["cola"] = sum(v for k, v in sizes.items() if k != "classes")
    if "eqben" in suites:
        n = _n(STANDIN_SIZES["eqben"]["items"], scale)
        _eqben(w, root / "eqben_vllm", n)
        counts["eqben"] = n
    iw, ih = w.size

    def box() -> dict:
        x, y = int(rng.integers(0, iw // 2)), int(rng.integers(0, ih // 2))
        return {"bbox_x": x, "bbox_y": y, "bbox_w": int(rng.integers((iw - x + 1) // 2, iw - x + 1)),
                "bbox_h": int(rng.integers((ih - y + 1) // 2, ih - y + 1))}

    if "aro" in suites:
        total = 0
        for stem, count in STANDIN_SIZES["aro"].items():
            items = []
            for _ in range(_n(count, scale)):
                cap = w.caption()
                it = {"image_id": str(vg[rng.integers(len(vg))]), **box(), "true_caption": cap,
                      "false_caption": w.negative(cap, True)}
                it["image_path"] = f"{it['image_id']}.jpg"
                if stem.endswith("relation"):
                    it["relation_name"] = cap.split()[3]
                else:
                    it["attributes"] = [cap.split()[1], cap.split()[5]]
                items.append(it)
            total += len(items)
            _json(root / f"{stem}.json", items)
        counts["aro"] = total
    if "hard_positives" in suites:
        total = 0
        for stem, count in STANDIN_SIZES["hard_positives"].items():
            orig, swapped = [], []
            for _ in range(_n(count, scale)):
                cap, img = w.caption(), vg[rng.integers(len(vg))]
                it = {"image_id": str(img), "true_caption": cap, "false_caption": w.negative(cap, True),
                      "image_path": f"data/VG_100K_2/{img}.jpg"}
                if stem == "visual_genome_attribution":  # SWAP: cropped to a box
                    it.update(box())
                orig.append(it)
                swapped.append({**it, "true_caption": " ".join(cap.split()[3:] + cap.split()[:3])})
            total += len(orig)
            _json(root / "data" / f"{stem}.json", orig)
            _json(root / "swapped_data" / f"{stem}.json", swapped)
        counts["hard_positives"] = total
    if "crepe" in suites:
        sizes = {k: _n(v, scale) for k, v in STANDIN_SIZES["crepe"].items()}
        _crepe(w, root, sizes, vg, box)
        counts["crepe"] = sizes["syst_rows"] * 6 * 3 + sizes["prod_rows"] * 27
    return counts
