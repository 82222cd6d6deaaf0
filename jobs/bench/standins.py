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
}
STANDIN_SUITES = tuple(STANDIN_SIZES)
_POOLS = {"coco": 5000, "vg": 10000}  # distinct COCO val2017 / Visual Genome images at scale 1
_MMVP_TYPES = ("Orientation", "Presence", "State", "Quantity", "Spatial", "Color", "Structural Character", "Text",
               "Camera Perspective")
_OBJ = "dog cat man woman horse car bus boat table chair cup bottle plate tree bird kite".split()
_ADJ = "red blue green white black small large old young wooden wet striped".split()
_REL = "on under behind near beside above holding riding watching".split()


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


def write_standins(root: str | Path, *, scale: float = 1.0, seed: int = 0, image_size=(640, 480),
                   suites=STANDIN_SUITES) -> dict[str, int]:
    """Write stand-ins of ``suites`` under ``root``, each in its release's layout under the release's folder
    name, so one ``--data root --images root`` serves them all: ``winoground/data/`` (examples.jsonl, images/),
    ``MMVP_VLM/`` (Questions.csv, MLLM_VLM Images/<Type>/), ``whatsup_vlms/data/`` (its six JSON files,
    controlled_images/, controlled_clevr/, vg_images/), ``scpp/data/`` (SugarCrepe++), ``sugar-crepe/data/``
    (SugarCrepe), ARO's two JSON files and ``images/`` at the top, hard positives' ``data/`` and
    ``swapped_data/`` (images ``data/VG_100K_2/``), and the COCO val2017 images they share in ``val2017/``.
    Item counts are ``STANDIN_SIZES`` times ``scale``; images come from pools (COCO 5,000, VG 10,000 at
    scale 1) as in the releases, where many items share an image. Returns the items per suite."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    w = _Writer(root, rng, tuple(image_size))
    coco = [f"{i:012d}.jpg" for i in rng.choice(999_999, _n(_POOLS["coco"], scale), replace=False)]
    vg = [int(i) for i in rng.choice(2_400_000, _n(_POOLS["vg"], scale), replace=False)]
    counts = {}
    uses_coco = {"sugarcrepe", "sugarcrepe_pp", "whatsup"} & set(suites)
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
    return counts
