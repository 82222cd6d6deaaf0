"""COLA (Ray et al., NeurIPS 2023): multi-object image pairs with swapped captions, and single-object class mAP."""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import numpy as np

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_cola", "COLA_MULTI", "COLA_SINGLE", "COLA_IMAGE_FOLDERS", "find_image"]

COLA_MULTI = "COLA_multiobjects_matching_benchmark.json"  # [image 1 URL, caption 1, image 2 URL, caption 2] items
COLA_SINGLE = {"single_gqa": "COLA_singleobjects_benchmark_GQA.json",  # {"labels": [...], "data": [[image_file,
               "single_clevr": "COLA_singleobjects_benchmark_CLEVR.json",  # annotation, label, hard_list], ...]}
               "single_paco": "COLA_singleobjects_benchmark_PACO.json"}
COLA_MULTI_PAIRS = 210
# where Visual Genome / GQA images may sit under --images, tried after the path as written [ours]
COLA_IMAGE_FOLDERS = ("vg_gqa_images", "VG_100K", "VG_100K_2", "images", "gqa/images", ".")


def find_image(images: Path, written: str, folders: tuple[str, ...] = COLA_IMAGE_FOLDERS) -> tuple[str, str]:
    """(path on disk, id) of an image the release names by URL or by a path of the authors' machine: under
    ``images``, the path as written (its last six components at most) down to the file name, then the file name in each
    of ``folders``; the first that exists, else the file name in ``images`` (its absence is recorded when read).
    The id (for ``--embeddings``) is the file name [ours]."""
    parts = PurePosixPath(urlparse(written).path if "://" in written else written).parts
    parts = [p for p in parts if p not in ("/", "..", ".")]
    base = parts[-1] if parts else written
    for k in range(min(len(parts), 6), 0, -1):  # the path as written (up to six components), then shorter tails
        cand = images.joinpath(*parts[-k:])
        if cand.is_file():
            return os.fspath(cand), base
    for f in folders:
        if (images / f / base).is_file():
            return os.fspath(images / f / base), base
    return os.fspath(images / base), base


def _multi(tables: Tables, path: Path, images: Path | None) -> ChoiceTask:
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: a JSON {type(data).__name__}, expected a list of [image 1, caption 1, "
                               f"image 2, caption 2] items (COLA's data/{COLA_MULTI})")
    if not data:
        raise SuiteFormatError(f"{path}: holds no items; use COLA's data/{COLA_MULTI}")
    for i, it in enumerate(data):
        if not (isinstance(it, list) and len(it) == 4 and all(isinstance(x, str) for x in it)):
            raise SuiteFormatError(f"{path}: item {i} is {str(it)[:200]}, expected [image 1, caption 1, image 2, "
                                   f"caption 2] (four strings; a file of another version?)")
    refs, ids = [], []
    for it in data:
        for k in (0, 2):
            where, iid = find_image(images, it[k]) if images is not None else (it[k], it[k])
            refs.append(ImageRef(where))
            ids.append(iid)
    task = ChoiceTask(name="multi_object", rule="grid2x2", left_modality="image", right_modality="text",
                      left=tables.images.add_many(refs, ids).reshape(-1, 2),
                      right=tables.texts.add_many(c for it in data for c in (it[1], it[3])).reshape(-1, 2),
                      ids=[str(i) for i in range(len(data))])
    task.validate()
    return task


def _single(tables: Tables, path: Path, images: Path | None, task_name: str, meta: dict) -> ChoiceTask:
    data = read_json(path)
    if not isinstance(data, dict) or not {"labels", "data"} <= set(data):
        got = sorted(data) if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise SuiteFormatError(f"{path}: has {got}, expected an object with keys 'labels' (the class captions) and "
                               f"'data' (COLA's single-object release, README 'Single Objects setting')")
    labels, rows = data["labels"], data["data"]
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise SuiteFormatError(f"{path}: 'labels' is {str(labels)[:200]}, expected a list of class captions "
                               f"(strings, e.g. 'square white plate')")
    if not isinstance(rows, list) or not rows:
        raise SuiteFormatError(f"{path}: 'data' holds no items; expected a list of [image_file, annotation, label, "
                               f"hard_list]")
    c = len(labels)
    files, truth, elig = [], np.zeros((len(rows), c), bool), np.zeros((len(rows), c), bool)
    for i, it in enumerate(rows):
        # [image_file, objects_attributes_annotation, label, hard_list]; the README says the annotation is
        # absent in the PACO file: a 3-field item is read as [image_file, label, hard_list] [ours]
        ok = isinstance(it, list) and len(it) in (3, 4) and isinstance(it[0], str)
        lab, hard = (it[-2], it[-1]) if ok else (None, None)
        for name_, v in (("label", lab), ("hard_list", hard)):
            if ok and not (isinstance(v, list) and len(v) == c and all(x in (0, 1) for x in v)):
                raise SuiteFormatError(f"{path}: item {i} '{name_}' is {str(v)[:120]}, expected {c} values 0/1 (one "
                                       f"per class in 'labels')")
        if not ok:
            raise SuiteFormatError(f"{path}: item {i} is {str(it)[:200]}, expected [image_file, annotation, label, "
                                   f"hard_list] (a file of another version?)")
        files.append(it[0])
        truth[i], elig[i] = lab, hard
    refs, ids = [], []
    for f in files:
        where, iid = find_image(images, f) if images is not None else (f, f)
        refs.append(ImageRef(where))
        ids.append(iid)
    label_rows = tables.texts.add_many(labels)
    task = ChoiceTask(name=task_name, rule="multilabel", left_modality="image", right_modality="text",
                      left=tables.images.add_many(refs, ids).reshape(-1, 1),
                      right=np.tile(label_rows, (len(rows), 1)), ids=[str(i) for i in range(len(rows))],
                      truth=truth, eligible=elig)
    task.validate()
    meta.setdefault("classes", {})[task_name] = c
    return task


def load_cola(tables: Tables, opts: SuiteOptions, name: str = "cola") -> Suite:
    """COLA's released files found under ``--data`` (the repository's ``data/`` folder, the repository, or a
    folder holding ``COLA/``): the multi-object pairs (``multi_object``, rule grid2x2: COLA's metric is the
    image score, each caption picking its own image, strict ``>`` as ``ColaMultiObjAcc``; text and group
    scores beside it) and the single-object files (``single_gqa``, ``single_clevr``, ``single_paco``, rule
    multilabel: per class the AP over the images its ``hard_list`` marks, classes with no positive image left
    out, their mean: ``ColaSingleObjAP``). Images under ``--images`` by the file name the release writes
    (``find_image``)."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding COLA's data/ files ({COLA_MULTI}, "
                         f"{', '.join(COLA_SINGLE.values())}) and --images with their images")
    root = Path(opts.data)
    files = [COLA_MULTI, *COLA_SINGLE.values()]
    folder = release_folder(root, (".", "data", "COLA/data", "cola/data"), files)
    images = Path(opts.images) if opts.images else None
    tasks, meta = [], {}
    if (folder / COLA_MULTI).is_file():
        tasks.append(_multi(tables, folder / COLA_MULTI, images))
    for task_name, fname in COLA_SINGLE.items():
        if (folder / fname).is_file():
            tasks.append(_single(tables, folder / fname, images, task_name, meta))
    if not tasks:
        raise FileNotFoundError(f"{root}: none of COLA's files {files} found (looked in it and in data/, COLA/data/)")
    found = [t.name for t in tasks]
    head = ({"entries": ["multi_object"], "key": "image_score"} if "multi_object" in found
            else {"entries": found, "key": "mAP"})
    n_multi = next((len(t.ids) for t in tasks if t.name == "multi_object"), None)
    return Suite(name=name, choice=tasks, tie_rule="grid2x2 (multi_object) / multilabel",
                 meta={"folder": str(folder), "files_found": [f for f in files if (folder / f).is_file()],
                       "files_missing": [f for f in files if not (folder / f).is_file()],
                       "items": {t.name: len(t.ids) for t in tasks}, **meta,
                       **({"count_mismatch": {"multi_object": [n_multi, COLA_MULTI_PAIRS]}}
                          if n_multi not in (None, COLA_MULTI_PAIRS) else {}),
                       "headline": head,
                       "metrics": "multi_object: image_score is COLA's metric (each caption scores its own image "
                                  "strictly above the other); single_*: mAP over classes (AP per class over the "
                                  "images eligible for it by hard_list; ties grouped as torchmetrics' average "
                                  "precision groups them; a class with no positive image is left out)"})
