"""SugarCrepe (Hsieh et al., NeurIPS 2023): seven caption-vs-negative files over COCO val2017 images."""
from __future__ import annotations

import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json, require_keys
from hardrank.items import ImageRef, Tables
from hardrank.scoring.choice_macro import ChoiceAggregate, attach_aggregates
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_sugarcrepe", "coco_images", "SUGARCREPE_FILES", "SUGARCREPE_CATEGORIES"]

# released file stem -> published item count (7,511 in all)
SUGARCREPE_FILES = {"add_att": 692, "add_obj": 2062, "replace_att": 788, "replace_obj": 1652,
                    "replace_rel": 1406, "swap_att": 666, "swap_obj": 245}
SUGARCREPE_CATEGORIES = {"add": ("add_att", "add_obj"),
                         "replace": ("replace_att", "replace_obj", "replace_rel"),
                         "swap": ("swap_att", "swap_obj")}
_KEYS = ("filename", "caption", "negative_caption")


def _read_file(path: Path) -> list[tuple[str, dict]]:
    """[(key, item)] in file order. The release is a JSON object keyed "0".."N-1"."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise SuiteFormatError(f"{path}: expected a JSON object keyed \"0\"..\"N-1\" of "
                               f"{{filename, caption, negative_caption}} items, got a {type(data).__name__}; "
                               f"use the file from the SugarCrepe release (data/{path.name})")
    for key, item in data.items():
        require_keys(path, key, item, _KEYS, {k: str for k in _KEYS})
    return list(data.items())


def _data_folder(root: Path) -> Path:
    """A folder holding the repository (``sugar-crepe/data``), ``--data`` itself, or the repository root (``data/``)."""
    return release_folder(root, ("sugar-crepe/data", ".", "data"),  # first: SugarCrepe++'s files share names
                          (f"{s}.json" for s in SUGARCREPE_FILES))


def coco_images(images: Path, first: str) -> Path:
    """The COCO val2017 folder: ``--images`` itself, or its ``val2017/`` when the first file is not in
    ``--images`` (the COCO root was given). SugarCrepe and SugarCrepe++ name images by val2017 file names."""
    if not (images / first).exists() and (images / "val2017").is_dir():
        return images / "val2017"
    return images


def load_sugarcrepe(tables: Tables, opts: SuiteOptions, name: str = "sugarcrepe") -> Suite:
    """One first_strict task per file found (left: the image (n, 1); right: (caption, negative) (n, 2);
    ties wrong). Metrics: per file; per category (add / replace / swap) = mean of its files'
    accuracies, only when all its files are present; ``overall`` = micro accuracy over every item of
    the files found; ``overall_file_mean`` = mean of the file accuracies. Captions are fed raw."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding the SugarCrepe files "
                         f"({', '.join(f'{s}.json' for s in SUGARCREPE_FILES)})")
    errors = [] if opts.images is not None else [
        ValueError(f"suite {name} needs --images DIR holding the COCO val2017 images (e.g. 000000085329.jpg)")]
    folder = _data_folder(Path(opts.data))
    images = Path(opts.images or "")  # no --images: the file names as written (ids for bring-your-own embeddings)
    tasks, missing, identical = [], [], {}
    for stem in SUGARCREPE_FILES:
        path = folder / f"{stem}.json"
        if not path.is_file():
            missing.append(stem)
            continue
        items = _read_file(path)
        if opts.images and items:
            images = coco_images(images, items[0][1]["filename"])
        left = tables.images.add_many(ImageRef(os.fspath(images / it["filename"])) for _, it in items).reshape(-1, 1)
        pairs = (c for _, it in items for c in (it["caption"], it["negative_caption"]))
        right = tables.texts.add_many(pairs).reshape(-1, 2)
        identical[stem] = sum(it["caption"] == it["negative_caption"] for _, it in items)
        task = ChoiceTask(name=stem, rule="first_strict", left_modality="image", right_modality="text",
                          left=left, right=right, ids=[f"{stem}/{k}" for k, _ in items])
        task.validate()
        tasks.append(task)
    if not tasks:
        raise FileNotFoundError(f"{folder}: none of the SugarCrepe files "
                                f"{[f'{s}.json' for s in SUGARCREPE_FILES]} found")
    found = [t.name for t in tasks]
    complete = {c: list(m) for c, m in SUGARCREPE_CATEGORIES.items() if set(m) <= set(found)}
    counts = {t.name: len(t.ids) for t in tasks}
    suite = Suite(
        name=name, choice=tasks, tie_rule="first_strict", view_average=complete, image_errors=errors,
        meta={"files_found": found, "files_missing": missing, "items": counts, "total_items": sum(counts.values()),
              "published_items": {s: SUGARCREPE_FILES[s] for s in found},
              "count_mismatch": {s: [n, SUGARCREPE_FILES[s]] for s, n in counts.items() if n != SUGARCREPE_FILES[s]},
              "caption_equals_negative": {s: n for s, n in identical.items() if n},
              "categories": "mean of the category's file accuracies (only categories with all files present)",
              "overall": "micro accuracy over all items of the files found; "
                         "overall_file_mean = mean of file accuracies"})
    return attach_aggregates(suite, [ChoiceAggregate("overall", tuple(found), over="items"),
                                     ChoiceAggregate("overall_file_mean", tuple(found), over="tasks")])
