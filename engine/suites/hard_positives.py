"""Hard positives (Kamath et al., ECCV 2024): index-aligned (c, c_N) / (c_P, c_N) file pairs."""
from __future__ import annotations

import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_bbox, read_json, require_keys
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_hard_positives", "HARD_POSITIVE_SETS"]

# released file name -> reported set name
HARD_POSITIVE_SETS = {
    "vl_checklist_attributes": "replace_attribute",
    "vl_checklist_relations": "replace_relation",
    "visual_genome_attribution": "swap",
}
_KEYS = ("true_caption", "false_caption", "image_path")
_CROPPED = {"visual_genome_attribution"}  # SWAP: each image is cropped to the item's bbox [ref]


def _resolve_image(images: Path, rel: str) -> str:
    p = images / rel
    if not p.exists() and rel.startswith("data/"):  # the release writes paths relative to its repo root
        alt = images / rel[len("data/"):]
        if alt.exists():
            return os.fspath(alt)
    return os.fspath(p)


def _load_pair(data_dir: Path, stem: str):
    orig_path = data_dir / "data" / f"{stem}.json"
    swap_path = data_dir / "swapped_data" / f"{stem}.json"
    orig, swap = read_json(orig_path), read_json(swap_path)
    for path, items in ((orig_path, orig), (swap_path, swap)):
        if not isinstance(items, list):
            raise SuiteFormatError(f"{path}: expected a JSON list of triplet items, got {type(items).__name__}")
        for i, it in enumerate(items):
            require_keys(path, i, it, _KEYS, {k: str for k in _KEYS})
    if len(orig) != len(swap):
        raise SuiteFormatError(f"{orig_path} has {len(orig)} items but {swap_path} has {len(swap)}; "
                               f"the two files must be index-aligned")
    for i, (a, b) in enumerate(zip(orig, swap)):
        if a["image_path"] != b["image_path"] or a["false_caption"] != b["false_caption"]:
            field = "image_path" if a["image_path"] != b["image_path"] else "false_caption"
            raise SuiteFormatError(f"{orig_path} and {swap_path} disagree at index {i} on {field!r} "
                                   f"({a[field]!r} vs {b[field]!r}); the pair must be index-aligned")
    return orig, swap


def load_hard_positives(tables: Tables, opts: SuiteOptions, name: str = "hard_positives") -> Suite:
    """Triplet choice tasks (image; c, c_P, c_N) for every set found in ``--data`` (pairs of
    data/<set>.json and swapped_data/<set>.json). SWAP items are cropped to their bbox (required);
    other sets are cropped only when they carry one. ``replace`` = mean of the two REPLACE sets.
    Captions are fed raw (the model's tokenizer cleans them)."""
    if opts.data is None:
        raise UsageError("suite hard_positives needs --data DIR holding data/ and swapped_data/")
    data_dir = Path(opts.data)
    images = Path(opts.images) if opts.images else data_dir
    stems = sorted(p.stem for p in (data_dir / "data").glob("*.json")) if (data_dir / "data").is_dir() else []
    unpaired = [s for s in stems if not (data_dir / "swapped_data" / f"{s}.json").is_file()]
    stems = [s for s in stems if s not in unpaired]
    if not stems:
        raise FileNotFoundError(f"{data_dir}: no data/<set>.json with a matching swapped_data/<set>.json "
                                f"(expected sets: {sorted(HARD_POSITIVE_SETS)})")
    tasks = []
    for stem in stems:
        orig, swap = _load_pair(data_dir, stem)
        orig_path = data_dir / "data" / f"{stem}.json"
        refs, caps = [], []
        for i, (a, b) in enumerate(zip(orig, swap)):
            crop = read_bbox(orig_path, i, a, required=stem in _CROPPED)
            refs.append(ImageRef(_resolve_image(images, a["image_path"]), crop))
            caps.append((a["true_caption"], b["true_caption"], a["false_caption"]))
        left = tables.images.add_many(refs).reshape(-1, 1)
        right = tables.texts.add_many(c for trip in caps for c in trip).reshape(-1, 3)
        t = ChoiceTask(name=HARD_POSITIVE_SETS.get(stem, stem), rule="triplet", left_modality="image",
                       right_modality="text", left=left, right=right,
                       ids=[f"{stem}/{i}" for i in range(len(orig))])
        t.validate()
        tasks.append(t)
    found = [t.name for t in tasks]
    return Suite(name=name, choice=tasks, tie_rule="triplet",
                 meta={"sets_found": found, "files_found": stems,
                       "sets_missing": [HARD_POSITIVE_SETS[s] for s in sorted(HARD_POSITIVE_SETS) if s not in stems],
                       "unpaired_files": [f"data/{s}.json" for s in unpaired],
                       "items": {t.name: len(t.ids) for t in tasks},
                       "metrics": "original = P[c > c_N]; augmented = P[c > c_N and c_P > c_N]; "
                                  "brittleness = P[c > c_N > c_P]; orderings and ties around c_N; ties wrong"},
                 view_average={"replace": ["replace_attribute", "replace_relation"]}
                 if {"replace_attribute", "replace_relation"} <= set(found) else {})
