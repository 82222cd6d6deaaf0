"""Winoground (Thrush et al., CVPR 2022): two images and two captions of the same words, scored as a 2x2 group."""
from __future__ import annotations

import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_jsonl
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_winoground", "WINOGROUND_KEYS", "WINOGROUND_ITEMS"]

# the fields of data/examples.jsonl in the facebook/winoground dataset, and their JSON types
WINOGROUND_KEYS = {"id": int, "image_0": str, "image_1": str, "caption_0": str, "caption_1": str, "tag": str,
                   "secondary_tag": str, "num_main_preds": int, "collapsed_tag": str}
WINOGROUND_ITEMS = 400
_FACETS = ("tag", "secondary_tag", "num_main_preds")  # reported as "<facet>=<label>"; collapsed_tag: the subsets


def _images_folder(folder: Path, path: Path, first: dict) -> Path:
    images = folder / "images"
    if not images.is_dir():
        hint = ("extract images.zip there (unzip images.zip)" if (folder / "images.zip").is_file()
                else "download data/images.zip of facebook/winoground and extract it there")
        raise FileNotFoundError(f"{folder}: no images/ folder beside {path.name} (item {first['id']} names image "
                                f"{first['image_0']!r}); {hint}")
    return images


def load_winoground(tables: Tables, opts: SuiteOptions, name: str = "winoground") -> Suite:
    """One grid2x2 task over ``examples.jsonl`` (the Hugging Face dataset's ``data/`` folder: the folder
    itself, the dataset repository, or a folder holding ``winoground/``) and ``images/<image_k>.png`` beside
    it. Text score: each image scores its caption strictly above the other; image score: each caption scores
    its image strictly above the other; group: both (ties wrong, as the reference's ``>``). Subsets: the
    collapsed tag (Object, Relation, Both); facets: ``tag=``, ``secondary_tag=``, ``num_main_preds=``."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding examples.jsonl and images/ (the data/ folder "
                         f"of the facebook/winoground dataset)")
    root = Path(opts.data)
    folder = release_folder(root, (".", "data", "winoground/data", "winoground"), ("examples.jsonl",))
    path = folder / "examples.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no examples.jsonl (looked in it and in data/, winoground/data/, "
                                f"winoground/); --data names the data/ folder of the facebook/winoground dataset")
    items = read_jsonl(path, WINOGROUND_KEYS, "facebook/winoground")
    if not items:
        raise SuiteFormatError(f"{path}: holds no items; use the file of the facebook/winoground dataset")
    images = _images_folder(folder, path, items[0])

    def ref(image: str):
        return ImageRef(os.fspath(images / f"{image}.png"))

    left = tables.images.add_many((ref(it[f"image_{k}"]) for it in items for k in (0, 1)),
                                  ids=(it[f"image_{k}"] for it in items for k in (0, 1))).reshape(-1, 2)
    right = tables.texts.add_many(it[f"caption_{k}"] for it in items for k in (0, 1)).reshape(-1, 2)
    facets = {
        "tag": [(it["tag"],) for it in items],
        # a row may carry several visual tags, comma-separated; "" is none [ours]
        "secondary_tag": [tuple(t.strip() for t in it["secondary_tag"].split(",") if t.strip()) for it in items],
        "num_main_preds": [(str(it["num_main_preds"]),) for it in items],
    }
    task = ChoiceTask(name="winoground", rule="grid2x2", left_modality="image", right_modality="text",
                      left=left, right=right, ids=[str(it["id"]) for it in items],
                      subset=[it["collapsed_tag"] for it in items], facets=facets)
    task.validate()
    n = len(items)
    return Suite(name=name, choice=[task], tie_rule="grid2x2",
                 meta={"annotations": str(path), "images": str(images), "items": n,
                       "published_items": WINOGROUND_ITEMS,
                       **({"count_mismatch": [n, WINOGROUND_ITEMS]} if n != WINOGROUND_ITEMS else {}),
                       "subsets": "collapsed_tag", "facets": list(_FACETS),
                       "scores": "text: s(i0,c0) > s(i0,c1) and s(i1,c1) > s(i1,c0); image: s(i0,c0) > s(i1,c0) "
                                 "and s(i1,c1) > s(i0,c1); group: both; strict, a tie is wrong"})
