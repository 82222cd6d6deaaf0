"""EqBen (Wang et al., ICCV 2023): two video frames or renders with a minimal visual change, scored as a 2x2 group."""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_eqben", "EQBEN_SUBSETS", "EQBEN_KEYS", "EQBEN_ANNOTATIONS"]

EQBEN_KEYS = ("image0", "caption0", "image1", "caption1")  # the Winoground-style items of the released subset
# the sub-datasets: an image path's first folder (the toolkit's SUBSET_LENGTH_INFO names)
EQBEN_SUBSETS = ("eqbenag", "eqbenyoucook2", "eqbengebc", "eqbenkubric_loc", "eqbenkubric_attr", "eqbenkubric_cnt",
                 "eqbensd")
# annotation file names looked for in a --data folder [ours: the subset's file name is not stated publicly; the
# MLLM subset ships all_select.json]; otherwise the folder's only .json file
EQBEN_ANNOTATIONS = ("eqben_subset.json", "all_select.json", "eqben.json")


def _annotation(root: Path) -> Path:
    if root.is_file():
        return root
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist; --data names EqBen's annotation JSON (or its folder)")
    subs = [d for d in (root / "eqben", root / "EqBen", root / "eqben_vllm", root) if d.is_dir()]
    for sub in subs:  # the known names first, in each folder
        for n in EQBEN_ANNOTATIONS:
            if (sub / n).is_file():
                return sub / n
    for sub in subs:  # then a folder's only JSON file
        found = sorted(sub.glob("*.json"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1 and sub != root:
            raise UsageError(f"{sub}: several JSON files ({', '.join(f.name for f in found[:5])}); name EqBen's "
                             f"annotation with --data eqben=FILE")
    raise FileNotFoundError(f"{root}: no EqBen annotation JSON (looked for {list(EQBEN_ANNOTATIONS)} or a single "
                            f".json file in it and in eqben/, eqben_vllm/); name it with --data eqben=FILE")


def _caption(path: Path, i: int, it: dict, key: str) -> str:
    v = it[key]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return v[0]  # EqBen-AG's raw annotation lists captions; the toolkit uses the first [ref: EqBenAG]
    if not isinstance(v, str):
        raise SuiteFormatError(f"{path}: item {i} key {key!r} is {v!r}, expected a caption (a string)")
    return v


def load_eqben(tables: Tables, opts: SuiteOptions, name: str = "eqben") -> Suite:
    """One grid2x2 task over EqBen's Winoground-style annotation (``--data``: the JSON list of ``{image0,
    caption0, image1, caption1}``, or its folder); images by the paths the items write, under the first of the
    annotation's ``images/``, its folder, ``--images`` and its ``images/`` that holds the first item's image.
    Text, image and group scores as the toolkit's ``cal_wino_score`` (strict ``>``, a tie is wrong), overall and
    per sub-dataset (an image path's first folder). Rows whose images are YouCook2's BGR ``.npy`` frames are left
    out and counted (no image file to decode) [ours]; with ``.png`` paths missing beside ``.jpg`` files (the light
    release), the ``.jpg`` is read."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data naming EqBen's annotation JSON (a list of "
                         f"{{{', '.join(EQBEN_KEYS)}}} items) and --images its image folder")
    path = _annotation(Path(opts.data))
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: a JSON {type(data).__name__}, expected a list of {{{', '.join(EQBEN_KEYS)}}} "
                               f"items (EqBen's Winoground-style annotation; the randomised full-set file of "
                               f"{{image, caption}} items is scored only by EqBen's server)")
    for i, it in enumerate(data):
        missing = [k for k in EQBEN_KEYS if not isinstance(it, dict) or k not in it]
        if missing:
            has = sorted(it) if isinstance(it, dict) else type(it).__name__
            raise SuiteFormatError(f"{path}: item {i} lacks key(s) {missing}; it has {has} (a file of another "
                                   f"version?)")
        for k in ("image0", "image1"):
            if not isinstance(it[k], str) or not it[k]:
                raise SuiteFormatError(f"{path}: item {i} key {k!r} is {it[k]!r}, expected an image path")
    if not data:
        raise SuiteFormatError(f"{path}: holds no items")
    npy = {i for i, it in enumerate(data) if it["image0"].endswith(".npy") or it["image1"].endswith(".npy")}
    keep = [it for i, it in enumerate(data) if i not in npy]
    ids = [str(i) for i in range(len(data)) if i not in npy]
    if not keep:
        raise SuiteFormatError(f"{path}: every item's images are .npy frames, which hardrank does not decode")
    first = keep[0]["image0"]
    # the images: beside the annotation (its images/, as the release's folder), else --images (or its images/)
    roots = [path.parent / "images", path.parent, *([Path(opts.images), Path(opts.images) / "images"]
                                                    if opts.images else [])]
    names = (first, first[:-4] + ".jpg") if first.endswith(".png") else (first,)
    images = next((r for r in roots if any((r / n).is_file() for n in names)),
                  Path(opts.images) if opts.images else roots[0] if roots[0].is_dir() else path.parent)
    jpg = first.endswith(".png") and not (images / first).is_file() and (images / names[-1]).is_file()  # light

    def ref(rel: str) -> ImageRef:
        return ImageRef(os.fspath(images / (rel[:-4] + ".jpg" if jpg and rel.endswith(".png") else rel)))

    subset = [PurePosixPath(it["image0"]).parts[0] if "/" in it["image0"] else "other" for it in keep]
    task = ChoiceTask(name="eqben", rule="grid2x2", left_modality="image", right_modality="text",
                      left=tables.images.add_many((ref(it[k]) for it in keep for k in ("image0", "image1")),
                                                  (it[k] for it in keep for k in ("image0", "image1"))).reshape(-1, 2),
                      right=tables.texts.add_many(_caption(path, i, it, k) for i, it in zip(ids, keep)
                                                  for k in ("caption0", "caption1")).reshape(-1, 2),
                      ids=ids, subset=subset)
    task.validate()
    return Suite(name=name, choice=[task], tie_rule="grid2x2",
                 meta={"annotations": str(path), "images": str(images), "items": len(keep),
                       "npy_rows_skipped": len(npy), "png_read_as_jpg": jpg,
                       "subsets": sorted(set(subset)),
                       "unknown_subsets": sorted(set(subset) - set(EQBEN_SUBSETS)),
                       "scores": "text: s(i0,c0) > s(i0,c1) and s(i1,c1) > s(i1,c0); image: s(i0,c0) > s(i1,c0) and "
                                 "s(i1,c1) > s(i0,c1); group: both; strict, a tie is wrong (cal_wino_score)"})
