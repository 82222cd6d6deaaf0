"""VALSE (Parcalabescu et al., ACL 2022): a caption against a foil per linguistic phenomenon, validated items only."""
from __future__ import annotations

import os
import re
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json
from hardrank.items import ImageRef, Tables
from hardrank.scoring.choice_macro import ChoiceAggregate, attach_aggregates
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_valse", "VALSE_PIECES", "VALSE_VALID", "VALSE_KEYS", "valse_image_folders"]

# the release's piece files (data/<piece>.json) -> the paper's name (instrument: piece)
VALSE_PIECES = {"existence": "Existence", "plurals": "Plurality", "counting-hard": "Counting: balanced",
                "counting-small-quant": "Counting: small numbers", "counting-adversarial": "Counting: adversarial",
                "relations": "Relations", "action-replacement": "Actions: replacement",
                "actant-swap": "Actions: actant swap", "coreference-standard": "Coreference: standard",
                "coreference-hard": "Coreference: clean", "foil-it": "FOIL-it"}
# items each piece keeps after the validation (mturk caption votes >= 2): the paper's Table 1 and the release
VALSE_VALID = {"existence": 505, "plurals": 851, "counting-hard": 868, "counting-small-quant": 900,
               "counting-adversarial": 691, "relations": 535, "action-replacement": 648, "actant-swap": 949,
               "coreference-standard": 708, "coreference-hard": 104, "foil-it": 943}
VALSE_KEYS = {"dataset": str, "image_file": str, "caption": str, "foil": str, "mturk": dict}  # README "relevant fields"
_VOTES = ("caption", "foil", "other")
VALID_VOTES = 2  # README: valid = at least two of three annotators chose the caption and not the foil


def valse_image_folders(dataset: str, image_file: str) -> tuple[str, ...]:
    """Where a source dataset's images sit under ``--images`` (each dataset's own download folder names, then
    the folder itself) [ours: the release names only the dataset (``dataset``) and the file (``image_file``)]."""
    if image_file.startswith("COCO_train2014_"):  # VisDial v1.0 train: COCO train2014 and val2014 images
        return "train2014", "coco/train2014", "."
    if image_file.startswith("COCO_val2014_"):  # FOIL-it, VisDial
        return "val2014", "coco/val2014", "."
    if image_file.startswith("VisualDialog_val2018_"):
        return "VisualDialog_val2018", "visdial/VisualDialog_val2018", "."
    if dataset == "visual7w" or re.match(r"v7w_\d+\.", image_file):
        return "visual7w/images", "images", "visual7w", "."
    if dataset in ("coco2017", "coco_2017"):
        return "val2017", "coco/val2017", "."
    if dataset == "SWiG":
        return "images_512", "swig/images_512", "SWiG/images_512", "."
    return (".",)


def _read_piece(path: Path) -> list[tuple[str, dict]]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise SuiteFormatError(f"{path}: a JSON {type(data).__name__}, expected an object keyed by item id (the "
                               f"VALSE release's data/{path.name})")
    if not data:
        raise SuiteFormatError(f"{path}: holds no items; use the file of the VALSE release (data/{path.name})")
    for key, it in data.items():
        if not isinstance(it, dict):
            raise SuiteFormatError(f"{path}: item {key!r} is a {type(it).__name__}, expected an object with "
                                   f"keys {list(VALSE_KEYS)}")
        missing = [k for k in VALSE_KEYS if k not in it]
        if missing:
            hint = (" ('foils' where the release has 'foil': a file of another version)" if "foils" in it
                    else " (a file of another version? the release's items carry the mturk validation votes)"
                    if missing == ["mturk"] else " (a file of another version?)")
            raise SuiteFormatError(f"{path}: item {key!r} lacks key(s) {missing}; it has {sorted(it)}{hint}")
        for k, t in VALSE_KEYS.items():
            if not isinstance(it[k], t):
                raise SuiteFormatError(f"{path}: item {key!r} key {k!r} is {it[k]!r} ({type(it[k]).__name__}), "
                                       f"expected {t.__name__}")
        votes = it["mturk"]
        if any(isinstance(votes.get(v), bool) or not isinstance(votes.get(v), int) for v in _VOTES):
            raise SuiteFormatError(f"{path}: item {key!r} 'mturk' is {votes!r}, expected integer vote counts "
                                   f"{list(_VOTES)}")
    return list(data.items())


def load_valse(tables: Tables, opts: SuiteOptions, name: str = "valse") -> Suite:
    """One first_strict task per piece file found under ``--data`` (the repository's ``data/`` folder, the
    repository, or a folder holding ``VALSE/``): per item the image against (caption, foil), correct iff the
    caption scores strictly above the foil (acc_r, the paper's pairwise ranking accuracy; lxmert_valse_eval.py
    counts ``>``, a tie is wrong). Only items the validation keeps (``mturk["caption"] >= 2``, the README's
    valid set) are scored. Images: each source dataset's folder under ``--images`` (``valse_image_folders``).
    ``average`` = the mean over the pieces found (the paper's Avg.)."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding VALSE's data/ piece files "
                         f"({', '.join(f'{p}.json' for p in VALSE_PIECES)}) and --images with the source datasets' "
                         f"images")
    root = Path(opts.data)
    folder = release_folder(root, (".", "data", "VALSE/data"), [f"{p}.json" for p in VALSE_PIECES])
    images = Path(opts.images) if opts.images else None
    tasks, missing, validation, identical, found_dirs = [], [], {}, {}, {}
    for piece in VALSE_PIECES:
        path = folder / f"{piece}.json"
        if not path.is_file():
            missing.append(path.name)
            continue
        items = _read_piece(path)
        kept = [(k, it) for k, it in items if it["mturk"]["caption"] >= VALID_VOTES]
        validation[piece] = {"items": len(items), "kept": len(kept), "dropped": len(items) - len(kept)}
        refs = []
        for _, it in kept:
            rel = it["image_file"]
            if images is None:  # ids as the file writes them (bring-your-own embeddings)
                refs.append(ImageRef(rel))
                continue
            cands = valse_image_folders(it["dataset"], rel)
            where = next((c for c in cands if (images / c / rel).is_file()), cands[0])
            found_dirs.setdefault(piece, set()).add(where)
            refs.append(ImageRef(os.fspath(images / where / rel)))
        task = ChoiceTask(name=piece, rule="first_strict", left_modality="image", right_modality="text",
                          left=tables.images.add_many(refs, [it["image_file"] for _, it in kept]).reshape(-1, 1),
                          right=tables.texts.add_many(c for _, it in kept for c in (it["caption"], it["foil"]))
                          .reshape(-1, 2), ids=[k for k, _ in kept])
        task.validate()
        tasks.append(task)
        identical[piece] = sum(it["caption"] == it["foil"] for _, it in kept)
    if not tasks:
        raise FileNotFoundError(f"{root}: none of VALSE's piece files {[f'{p}.json' for p in VALSE_PIECES]} found "
                                f"(looked in it and in data/, VALSE/data/)")
    found = [t.name for t in tasks]
    kept_n = {p: v["kept"] for p, v in validation.items()}
    suite = Suite(name=name, choice=tasks, tie_rule="first_strict",
                  meta={"folder": str(folder), "files_found": [f"{p}.json" for p in found], "files_missing": missing,
                        "pieces": {p: VALSE_PIECES[p] for p in found}, "validation": validation,
                        "validation_rule": f"an item is kept when mturk['caption'] >= {VALID_VOTES} (at least two of "
                                           f"three annotators chose the caption, not the foil)",
                        "published_valid": {p: VALSE_VALID[p] for p in found},
                        "count_mismatch": {p: [n, VALSE_VALID[p]] for p, n in kept_n.items() if n != VALSE_VALID[p]},
                        "caption_equals_foil": {p: n for p, n in identical.items() if n},
                        "image_folders": {p: sorted(d) for p, d in found_dirs.items()},
                        "metric": "accuracy = acc_r, the pairwise ranking accuracy: s(image, caption) > "
                                  "s(image, foil), strict; acc, p_c, p_f and min(p_c, p_f) need a binary match "
                                  "decision (an ITM head) that a dual encoder does not make: the paper reports only "
                                  "acc_r for CLIP"})
    return attach_aggregates(suite, [ChoiceAggregate("average", tuple(found), over="tasks")])
