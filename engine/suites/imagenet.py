"""ImageNet-1k metadata: WordNet ids, CLIP class names and templates, the shifts' class subsets, ObjectNet's map."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

from hardrank.config import DATA_DIR
from hardrank.errors import DataError, UsageError

__all__ = ["IMAGENET_WNIDS", "TEMPLATE_SETS", "SHIFTS", "imagenet_classnames", "builtin_templates", "shift_subset",
           "folder_class_index", "ObjectNetClass", "objectnet_classes", "OBJECTNET_MAPPING_FILES"]

_ASSETS = DATA_DIR / "imagenet"


def _read_wnids(name: str) -> tuple[str, ...]:
    return tuple((_ASSETS / name).read_text(encoding="ascii").split())


# The 1,000 classes in the standard order (sorted WordNet ids): index i is output i of every ImageNet classifier.
IMAGENET_WNIDS: tuple[str, ...] = _read_wnids("wnids.txt")
_WNID_INDEX = {w: i for i, w in enumerate(IMAGENET_WNIDS)}

TEMPLATE_SETS = ("openai", "simple")  # 80 CLIP prompts; the 7 short ones (open_clip's SIMPLE_IMAGENET_TEMPLATES)
# dataset -> its class subset file (None: all 1,000 classes). ImageNet-R/-A hold 200 classes, and the published
# protocol scores an image only against those 200 (the other 800 logits are dropped).
SHIFTS = {"imagenet-1k": None, "imagenet-v2": None, "imagenet-sketch": None,
          "imagenet-r": "imagenet_r_wnids.txt", "imagenet-a": "imagenet_a_wnids.txt"}


def imagenet_classnames() -> list[str]:
    """The CLIP class names (Radford et al.'s cleaned-up names, as open_clip and CLIP_benchmark use them),
    index i naming ``IMAGENET_WNIDS[i]``."""
    return list(IMAGENET_CLASSNAMES)


def builtin_templates(name: str) -> list[str]:
    """A built-in prompt set as format strings with a ``{c}`` placeholder for the class name (CLIP_benchmark's
    template format): ``openai`` (CLIP's 80 ImageNet prompts) or ``simple`` (open_clip's 7 short ones)."""
    sets = {"openai": OPENAI_IMAGENET_TEMPLATES, "simple": SIMPLE_IMAGENET_TEMPLATES}
    if name not in sets:
        raise UsageError(f"unknown built-in template set {name!r}; choose from {list(TEMPLATE_SETS)}, "
                         f"or pass a file of templates with {{c}} for the class name")
    # open_clip stores them as f-string lambdas: called with the literal "{c}" they give the format string
    # (none holds another brace, so nothing needs escaping; a test checks format() reproduces each lambda).
    return [t("{c}") for t in sets[name]]


def shift_subset(name: str) -> list[int] | None:
    """The ImageNet indices (ascending) a dataset's images are scored against: ImageNet-R and ImageNet-A
    (200 classes each) -> their 200 indices; ImageNet-1k, -V2 and -Sketch -> None (all 1,000)."""
    if name not in SHIFTS:
        raise UsageError(f"unknown ImageNet dataset {name!r}; choose from {list(SHIFTS)}")
    if SHIFTS[name] is None:
        return None
    return sorted(_WNID_INDEX[w] for w in _read_wnids(SHIFTS[name]))


_NUMERIC = re.compile(r"^(0|[1-9][0-9]{0,2})$")  # ImageNet-V2 folders: "0".."999", no leading zeros


def folder_class_index(folder: str) -> int:
    """A class folder's ImageNet index: a WordNet id folder (ImageNet, -Sketch, -R, -A: ``n01440764``) or
    a numeric one (ImageNet-V2: ``"0"``..``"999"``, the index itself)."""
    name = Path(folder).name
    if name in _WNID_INDEX:
        return _WNID_INDEX[name]
    if _NUMERIC.match(name) and int(name) < len(IMAGENET_WNIDS):
        return int(name)
    raise DataError(f"class folder {folder!r} is neither an ImageNet-1k WordNet id (n01440764 .. n15075141, "
                    f"the folder names of ImageNet, -Sketch, -R and -A) nor an ImageNet-V2 class number "
                    f"(0 .. 999); give the dataset's own class folders, or --classnames for another class set")


# ObjectNet 1.0 ships these in objectnet-1.0/mappings/ (CLIP_benchmark copies them into the dataset root)
OBJECTNET_MAPPING_FILES = ("folder_to_objectnet_label.json", "objectnet_to_imagenet_1k.json",
                           "pytorch_to_imagenet_2012_id.json", "imagenet_to_label_2012_v2")


@dataclass(frozen=True)
class ObjectNetClass:
    """One of ObjectNet's classes that overlap ImageNet-1k (113 in ObjectNet 1.0)."""

    name: str                          # ObjectNet's label, e.g. "Alarm clock"
    folder: str                        # its image folder under objectnet-1.0/images/, e.g. "alarm_clock"
    imagenet_indices: tuple[int, ...]  # the ImageNet-1k classes it covers (ascending; one or more)


def _mapping_dir(root: Path) -> Path:
    for cand in (root, root / "mappings", root / "objectnet-1.0" / "mappings"):
        if all((cand / f).is_file() for f in OBJECTNET_MAPPING_FILES):
            return cand
    missing = [f for f in OBJECTNET_MAPPING_FILES if not (root / "objectnet-1.0" / "mappings" / f).is_file()]
    raise DataError(f"{root}: ObjectNet's mapping files not found (looked in {root}, {root / 'mappings'} and "
                    f"{root / 'objectnet-1.0' / 'mappings'}; missing there: {missing}); pass the folder the "
                    f"objectnet-1.0.zip release unpacks to, which holds objectnet-1.0/mappings/")


def _read_mapping(path: Path, kind: type):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not a UTF-8 JSON file ({exc}); use the file from ObjectNet's mappings/") from None
    if not isinstance(data, kind):
        raise DataError(f"{path}: expected a JSON {kind.__name__}, got a {type(data).__name__}; "
                        f"use the file from ObjectNet's mappings/")
    return data


def objectnet_classes(root: str | Path) -> list[ObjectNetClass]:
    """ObjectNet's classes that overlap ImageNet-1k, sorted by folder, each with the ImageNet indices it covers,
    read from the release's mapping files (``OBJECTNET_MAPPING_FILES``) under ``root``.

    Scoring protocols (which one a result used must be recorded with it):
    - ObjectNet's own (Barbu et al. 2019, the release's evaluation code) and the robustness literature
      (Radford et al. 2021; Taori et al. 2020): the model classifies among ImageNet classes and an image counts
      as correct when its top ImageNet class is one of ``imagenet_indices`` of the image's ObjectNet class
      (a prediction outside every ObjectNet class is wrong; Taori et al. restrict the logits to the union of
      the covered classes first, and take the max over each class's indices).
    - CLIP_benchmark's ``objectnet``: a zero-shot classifier over the ObjectNet class names themselves
      (``name`` lower-cased, in folder order), so no ImageNet index is involved."""
    folder = _mapping_dir(Path(root))
    to_label = _read_mapping(folder / "folder_to_objectnet_label.json", dict)
    to_imagenet = _read_mapping(folder / "objectnet_to_imagenet_1k.json", dict)
    pytorch_to_2012 = _read_mapping(folder / "pytorch_to_imagenet_2012_id.json", dict)
    # line i of imagenet_to_label_2012_v2 names ImageNet 2012 id i; pytorch_to_imagenet_2012_id.json maps the
    # usual (sorted-wnid) index to that id, so label -> usual index goes through both
    labels_path = folder / "imagenet_to_label_2012_v2"
    labels = [line.strip() for line in labels_path.read_text(encoding="utf-8").splitlines()]
    from_2012 = {}
    for k, v in pytorch_to_2012.items():
        if not (str(k).isdigit() and isinstance(v, int) and 0 <= int(k) < len(IMAGENET_WNIDS)):
            raise DataError(f"{folder / 'pytorch_to_imagenet_2012_id.json'}: entry {k!r}: {v!r} is not "
                            f"index -> ImageNet 2012 id (0..999 -> an int)")
        from_2012[v] = int(k)
    label_to_index = {}
    for i, label in enumerate(labels):
        if label and i in from_2012:
            label_to_index[label] = from_2012[i]  # a repeated label keeps its last line, as CLIP_benchmark reads it
    folder_of = {label: f for f, label in to_label.items()}
    out = []
    for name, imagenet_names in to_imagenet.items():
        if name not in folder_of:
            raise DataError(f"{folder / 'objectnet_to_imagenet_1k.json'}: class {name!r} has no folder in "
                            f"folder_to_objectnet_label.json; use the two files from the same ObjectNet release")
        if not isinstance(imagenet_names, str) or not imagenet_names.strip():
            raise DataError(f"{folder / 'objectnet_to_imagenet_1k.json'}: class {name!r} maps to "
                            f"{imagenet_names!r}, expected ImageNet labels joined by '; '")
        indices = []
        for label in imagenet_names.split("; "):
            if label not in label_to_index:
                raise DataError(f"{folder / 'objectnet_to_imagenet_1k.json'}: class {name!r} maps to ImageNet "
                                f"label {label!r}, which is not a line of {labels_path}; use the files from the "
                                f"same ObjectNet release")
            indices.append(label_to_index[label])
        out.append(ObjectNetClass(name=name, folder=folder_of[name], imagenet_indices=tuple(sorted(set(indices)))))
    return sorted(out, key=lambda c: c.folder)
