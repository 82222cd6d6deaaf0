"""SugarCrepe++ (Dumpala et al., NeurIPS 2024): two paraphrases against a hard negative, with and without the image."""
from __future__ import annotations

import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json, require_keys
from hardrank.items import ImageRef, Tables
from hardrank.scoring.choice_macro import ChoiceAggregate, attach_aggregates
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.suites.sugarcrepe import coco_images
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_sugarcrepe_pp", "SUGARCREPE_PP_FILES"]

# released file stem -> published item count (evaluate_ulms.py's DATA_SIZE; 4,757 in all)
SUGARCREPE_PP_FILES = {"replace_att": 788, "replace_obj": 1652, "replace_rel": 1406, "swap_att": 666, "swap_obj": 245}
_KEYS = ("filename", "caption", "caption2", "negative_caption")


def _read(path: Path) -> list[dict]:
    data = read_json(path)
    if isinstance(data, dict):
        raise SuiteFormatError(f"{path}: a JSON object (keyed {next(iter(data), '')!r}, ...), expected a JSON list of "
                               f"{{id, filename, caption, caption2, negative_caption}} items: this looks like a "
                               f"SugarCrepe file (--suite sugarcrepe); use SugarCrepe++'s data/{path.name}")
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: expected a JSON list of SugarCrepe++ items, got a {type(data).__name__}")
    for i, it in enumerate(data):
        if isinstance(it, dict) and "caption2" not in it and {"caption", "negative_caption"} <= set(it):
            raise SuiteFormatError(f"{path}: item {i} has no 'caption2' (the second positive): a SugarCrepe "
                                   f"item, not SugarCrepe++; use SugarCrepe++'s data/{path.name}")
        require_keys(path, i, it, _KEYS, {k: str for k in _KEYS})
    return data


def load_sugarcrepe_pp(tables: Tables, opts: SuiteOptions, name: str = "sugarcrepe_pp") -> Suite:
    """Per released file found under ``--data`` (the files, the repository's ``data/``, or a folder holding
    ``scpp/``) two tasks over COCO val2017 images (``--images``): ``<file>`` (ITT, rule two_positives: the
    image scores both positives strictly above the negative; also each positive alone, ``p1_accuracy``,
    ``p2_accuracy``) and ``<file>_tot`` (TOT, rule text_triplet: s(p1, p2) strictly above s(p1, n) and
    s(p2, n), texts only). ``itt`` and ``tot``: micro accuracy over the files found. Captions are fed raw."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding SugarCrepe++'s files "
                         f"({', '.join(f'{s}.json' for s in SUGARCREPE_PP_FILES)})")
    errors = [] if opts.images is not None else [
        ValueError(f"suite {name} needs --images DIR holding the COCO val2017 images (e.g. 000000331352.jpg)")]
    root = Path(opts.data)
    folder = release_folder(root, ("scpp/data", ".", "data"),  # scpp/ first: SugarCrepe's files have the same names
                            (f"{s}.json" for s in SUGARCREPE_PP_FILES))
    images = Path(opts.images or "")  # no --images: the file names as written (ids for bring-your-own embeddings)
    tasks, missing, counts, same = [], [], {}, {}
    for stem in SUGARCREPE_PP_FILES:
        path = folder / f"{stem}.json"
        if not path.is_file():
            missing.append(stem)
            continue
        items = _read(path)
        if opts.images and items:
            images = coco_images(images, items[0]["filename"])
        ids = [f"{stem}/{it.get('id', i)}" for i, it in enumerate(items)]
        texts = tables.texts.add_many(c for it in items for c in (it["caption"], it["caption2"],
                                                                   it["negative_caption"])).reshape(-1, 3)  # p1, p2, n
        left = tables.images.add_many((ImageRef(os.fspath(images / it["filename"])) for it in items),
                                      (it["filename"] for it in items)).reshape(-1, 1)
        tasks.append(ChoiceTask(name=stem, rule="two_positives", left_modality="image", right_modality="text",
                                left=left, right=texts, ids=ids))
        tasks.append(ChoiceTask(name=f"{stem}_tot", rule="text_triplet", left_modality="text", right_modality="text",
                                left=texts, right=texts, ids=ids))
        counts[stem] = len(items)
        same[stem] = sum(it["caption"] == it["caption2"] for it in items)
    if not tasks:
        raise FileNotFoundError(f"{root}: none of SugarCrepe++'s files {[f'{s}.json' for s in SUGARCREPE_PP_FILES]} "
                                f"found (looked in it and in data/, scpp/data/)")
    for t in tasks:
        t.validate()
    itt = tuple(t.name for t in tasks if t.rule == "two_positives")
    tot = tuple(t.name for t in tasks if t.rule == "text_triplet")
    suite = Suite(name=name, choice=tasks, tie_rule="two_positives / text_triplet", image_errors=errors,
                  meta={"folder": str(folder), "files_found": list(counts), "files_missing": missing, "items": counts,
                        "published_items": {s: SUGARCREPE_PP_FILES[s] for s in counts},
                        "count_mismatch": {s: [n, SUGARCREPE_PP_FILES[s]] for s, n in counts.items()
                                           if n != SUGARCREPE_PP_FILES[s]},
                        "caption_equals_caption2": {s: n for s, n in same.items() if n},
                        "itt": "the image scores caption and caption2 strictly above negative_caption",
                        "tot": "s(caption, caption2) strictly above s(caption, negative) and s(caption2, negative)",
                        "headline": {"entries": ["itt"], "key": "accuracy"}})
    return attach_aggregates(suite, [ChoiceAggregate("itt", itt), ChoiceAggregate("tot", tot)])
