"""What's Up (Kamath et al., EMNLP 2023): spatial relations, one image against captions that differ in a preposition."""
from __future__ import annotations

import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_json, require_keys
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, RowGroups, Suite

__all__ = ["load_whatsup", "WHATSUP_FILES", "WHATSUP_DATASETS"]

# task -> released file (the repository's data/ folder); the first caption option is the correct one in all
WHATSUP_FILES = {"controlled_a": "controlled_images_dataset.json", "controlled_b": "controlled_clevr_dataset.json",
                 "coco_one": "coco_qa_one_obj.json", "coco_two": "coco_qa_two_obj.json",
                 "gqa_one": "vg_qa_one_obj.json", "gqa_two": "vg_qa_two_obj.json"}
# the paper's datasets (its Table 1): each the mean of its two subsets, reported when both are there [ref: README]
WHATSUP_DATASETS = {"whatsup": ("controlled_a", "controlled_b"), "coco_spatial": ("coco_one", "coco_two"),
                    "gqa_spatial": ("gqa_one", "gqa_two")}
# Controlled-A / -B: the pairs of opposite prepositions a pair accuracy counts (the file name's second field)
_PAIRS = {"controlled_a": (("left", "right"), ("on", "under")),
          "controlled_b": (("left", "right"), ("in-front", "behind"))}


def _controlled_prep(task: str, image_path: str) -> str:
    """The reference's per-preposition label: tested on the whole path, in its order."""
    if "left_of" in image_path:
        return "left_of"
    if "right_of" in image_path:
        return "right_of"
    if task == "controlled_a":
        return "on" if "_on_" in image_path else "under"
    return "in-front_of" if "_in-front_of_" in image_path else "behind"


def _qa_prep(task: str, caption: str) -> str:
    """The reference's per-preposition label of a COCO / GQA spatial item, from its correct caption."""
    if task.endswith("_one"):
        return caption.split()[-1] if caption.split() else ""
    tests = (("left of", "left"), ("right of", "right"), ("above", "above")) if task == "coco_two" else (
        ("left of", "left"), ("right of", "right"), ("front of", "front"), ("behind", "behind"))
    return next((lab for needle, lab in tests if needle in caption), "below" if task == "coco_two" else "top")


def _pair_sets(task: str, paths: list[str], meta: dict) -> dict[str, RowGroups]:
    """Pair and set labels of the Controlled rows, keyed as the reference keys them: the objects (file name
    fields first and last, the 5-character ``.jpeg`` dropped) and the preposition (second field). A later
    row with the same key and preposition replaces an earlier one, as the reference's dict does."""
    last: dict[tuple[str, str, str], int] = {}
    for i, p in enumerate(paths):
        fields = p.split("/")[-1].split("_")
        last[(fields[0], fields[-1][:-5], fields[1] if len(fields) > 1 else "")] = i
    pair_of = {prep: "-".join(pair) for pair in _PAIRS[task] for prep in pair}
    pair, whole = [None] * len(paths), [None] * len(paths)
    for (a, b, prep), i in last.items():
        if prep in pair_of:
            pair[i], whole[i] = f"{a}|{b}|{pair_of[prep]}", f"{a}|{b}"
    unexpected = sorted({k[2] for k in last if k[2] not in pair_of})
    meta.setdefault("replaced_rows", {})[task] = len(paths) - len(last)
    if unexpected:
        meta.setdefault("unexpected_prepositions", {})[task] = unexpected
    return {"pair": RowGroups(pair, 2), "set": RowGroups(whole, 4)}


def _controlled(tables: Tables, path: Path, folder: Path, task: str, meta: dict) -> ChoiceTask:
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: expected a JSON list of {{image_path, caption_options}} items, got a "
                               f"{type(data).__name__}; use the file of the What's Up release (data/{path.name})")
    n_opts = set()
    for i, it in enumerate(data):
        require_keys(path, i, it, ("image_path", "caption_options"), {"image_path": str, "caption_options": list})
        opts = it["caption_options"]
        if len(opts) < 2 or not all(isinstance(c, str) for c in opts):
            raise SuiteFormatError(f"{path}: item {i} 'caption_options' is {opts!r}, expected a list of at least "
                                   f"two captions (the first the correct one)")
        n_opts.add(len(opts))
    if len(n_opts) > 1:
        raise SuiteFormatError(f"{path}: items have {sorted(n_opts)} caption options; every item of a file needs "
                               f"the same number (the release: 4)")

    def image(rel: str) -> str:  # the release writes paths from its repository root: data/controlled_images/...
        return os.fspath(folder / (rel[len("data/"):] if rel.startswith("data/") else rel))

    paths = [it["image_path"] for it in data]
    t = ChoiceTask(name=task, rule="first_ties_win", left_modality="image", right_modality="text",
                   left=tables.images.add_many((ImageRef(image(p)) for p in paths), paths).reshape(-1, 1),
                   right=tables.texts.add_many(c for it in data for c in it["caption_options"]).reshape(len(data), -1),
                   ids=[f"{task}/{i}" for i in range(len(data))],
                   subset=[_controlled_prep(task, p) for p in paths], groups=_pair_sets(task, paths, meta))
    t.validate()
    return t


def _qa(tables: Tables, path: Path, images: Path, task: str) -> ChoiceTask:
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: expected a JSON list of [image id, correct caption, wrong caption] "
                               f"items, got a {type(data).__name__}; use the file of the What's Up release")
    for i, it in enumerate(data):
        if (not isinstance(it, list) or len(it) != 3 or isinstance(it[0], bool)
                or not isinstance(it[0], (int, str)) or not all(isinstance(c, str) for c in it[1:])):
            raise SuiteFormatError(f"{path}: item {i} is {it!r}, expected [image id, correct caption, wrong "
                                   f"caption] (a file of another version?)")
    coco = task.startswith("coco")
    names = [f"{str(it[0]).zfill(12)}.jpg" if coco else f"{it[0]}.jpg" for it in data]
    t = ChoiceTask(name=task, rule="first_ties_win", left_modality="image", right_modality="text",
                   left=tables.images.add_many((ImageRef(os.fspath(images / n)) for n in names), names).reshape(-1, 1),
                   right=tables.texts.add_many(c for it in data for c in it[1:]).reshape(-1, 2),
                   ids=[f"{task}/{i}" for i in range(len(data))], subset=[_qa_prep(task, it[1]) for it in data])
    t.validate()
    return t


def _coco_images(folder: Path, opts: SuiteOptions) -> Path:
    """COCO val2017: the release's data/val2017, else ``--images`` (the folder, or the COCO root holding it)."""
    if (folder / "val2017").is_dir() or opts.images is None:
        return folder / "val2017"
    images = Path(opts.images)
    return images / "val2017" if (images / "val2017").is_dir() else images


def load_whatsup(tables: Tables, opts: SuiteOptions, name: str = "whatsup") -> Suite:
    """What's Up's released files found under ``--data`` (the repository's ``data/`` folder, the repository,
    or a folder holding ``whatsup_vlms/``): Controlled-A and -B (4 captions), COCO- and GQA-spatial one- and
    two-object (2 captions). The first caption is the correct one; the reference's ``argmax`` gives a tie to
    the first, so a tie is correct (first_ties_win). Per file: accuracy and per preposition; Controlled-A/-B
    also the reference's pair and set accuracies (``pair_accuracy``, ``set_accuracy``); the paper's datasets
    (``whatsup``, ``coco_spatial``, ``gqa_spatial``) as the mean of their two subsets."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding What's Up's data/ folder "
                         f"({', '.join(WHATSUP_FILES.values())} and their images)")
    root = Path(opts.data)
    folder = release_folder(root, (".", "data", "whatsup_vlms/data"), WHATSUP_FILES.values())
    tasks, missing, meta = [], [], {}
    for task, fname in WHATSUP_FILES.items():
        path = folder / fname
        if not path.is_file():
            missing.append(fname)
        elif task.startswith("controlled"):
            tasks.append(_controlled(tables, path, folder, task, meta))
        else:
            images = _coco_images(folder, opts) if task.startswith("coco") else folder / "vg_images"
            tasks.append(_qa(tables, path, images, task))
    if not tasks:
        raise FileNotFoundError(f"{root}: none of What's Up's files {list(WHATSUP_FILES.values())} found (looked "
                                f"in it and in data/, whatsup_vlms/data/)")
    found = [t.name for t in tasks]
    return Suite(name=name, choice=tasks, tie_rule="first_ties_win",
                 view_average={d: list(m) for d, m in WHATSUP_DATASETS.items() if set(m) <= set(found)},
                 meta={"folder": str(folder), "files_found": [WHATSUP_FILES[t] for t in found],
                       "files_missing": missing,
                       "items": {t.name: len(t.ids) for t in tasks},
                       "caption_options": {t.name: int(t.right.shape[1]) for t in tasks}, **meta,
                       "datasets": {d: list(m) for d, m in WHATSUP_DATASETS.items()},
                       "pair_set": "pair_accuracy: opposite prepositions of one object pair both right, over rows/2; "
                                   "set_accuracy: all four right, over rows/4 (the reference's denominators)"})
