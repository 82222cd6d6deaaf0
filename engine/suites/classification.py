"""Zero-shot classification from an ImageFolder tree, CLIP_benchmark's WebDataset layout or an (image, label) table."""
from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from hardrank import urls
from hardrank.config import opt
from hardrank.errors import DataError, UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.formats.variants import image_variant_names, variant_hint, variants_beside
from hardrank.inputs import read_shards
from hardrank.inputs.kinds.image_folder import IMAGE_EXTENSIONS
from hardrank.inputs.webdataset import Sample, SampleSet, variant_shards
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions
from hardrank.suites.imagenet import (
    IMAGENET_WNIDS,
    TEMPLATE_SETS,
    builtin_templates,
    folder_class_index,
    imagenet_classnames,
    shift_subset,
)
from hardrank.tasks import ClassifyTask, Suite

__all__ = ["load_classification", "ClassNamesOptions", "ClassificationOptions", "read_classnames", "read_templates",
           "build_classify",
           "read_wds_split", "wds_split_exists", "wds_shards", "DEFAULT_TEMPLATES", "CB_CLASSNAMES", "CB_TEMPLATES"]

DEFAULT_TEMPLATES = ("a photo of a {c}.",)  # when neither --templates nor the dataset names any
CB_CLASSNAMES = "classnames.txt"  # CLIP_benchmark's WebDataset root: one class name a line, label order
CB_TEMPLATES = "zeroshot_classification_templates.txt"  # ... and one template a line, {c} for the class name
_VARIANT_DIR = re.compile(r"^.+_s\d+$")  # <variant>_s<seed>: a variant folder beside the class folders
# built-in class sets (--classnames NAME): ImageNet-1k's 1,000 classes, or the 200 that ImageNet-R / -A hold (their
# published protocol scores only against those); class folders map through their WordNet id or V2 number
BUILTIN_CLASSNAMES = {"imagenet1k": "imagenet-1k", "imagenet-1k": "imagenet-1k", "imagenet-v2": "imagenet-v2",
                      "imagenet-sketch": "imagenet-sketch", "imagenet-r": "imagenet-r", "imagenet-a": "imagenet-a"}
_WNID_SET = frozenset(IMAGENET_WNIDS)


def _builtin(spec: str, names) -> str | None:
    """The built-in set ``spec`` names (a job file may have made it a path below its folder), unless it is a file."""
    name = os.path.basename(spec.rstrip("/"))
    return name if name in names and not (urls.exists(spec) and not urls.is_dir(spec)) else None


def _imagenet_classes(shift: str) -> tuple[list[str], list[int]]:
    """(class names, ImageNet index of each) of a built-in set: ImageNet-1k's, or ImageNet-R/-A's 200."""
    subset = shift_subset(shift)
    idx = list(range(len(IMAGENET_WNIDS))) if subset is None else subset
    names = imagenet_classnames()
    return [names[i] for i in idx], idx


def _read_text(path: str) -> str:
    """A text file (local or a URL) as UTF-8; a byte-order mark (Windows editors write one) is not text."""
    try:
        return urls.read_bytes(path).decode("utf-8-sig") if urls.is_url(path) else Path(path).read_text("utf-8-sig")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except UnicodeDecodeError:
        raise SuiteFormatError(f"{path}: not UTF-8 text; re-save it as UTF-8") from None


def _json_entry(path: str, data, key: str | None):
    """A CLIP_benchmark JSON file: a list, or an object keyed by dataset name (``FILE.json#<dataset>``)."""
    if isinstance(data, list) or key is None and not isinstance(data, dict):
        return data
    if key is not None:
        if key not in data:
            raise SuiteFormatError(f"{path}: no entry {key!r}; it has {sorted(data)[:20]}")
        return data[key]
    if len(data) == 1:
        return next(iter(data.values()))
    return data


def _split_key(spec: str) -> tuple[str, str | None]:
    """``FILE.json#<dataset>`` -> (FILE.json, dataset); anything else as it is."""
    path, _, key = spec.rpartition("#")
    return (path, key or None) if path.endswith(".json") else (spec, None)


def read_classnames(spec: str) -> list[str]:
    """Class names in label order from a text file (one a line, CLIP_benchmark's ``classnames.txt``) or a
    JSON file: a list, or CLIP_benchmark's ``{dataset: [names]}`` (``FILE.json#<dataset>`` picks one)."""
    path, key = _split_key(spec)
    if path.endswith(".json"):
        names, unit = _json_entry(path, _loads(path), key), ("entry", "entries")
        if isinstance(names, dict):
            raise SuiteFormatError(f"{path}: holds class names of {len(names)} datasets ({sorted(names)[:5]} ...); "
                                   f"name one: --classnames {path}#<dataset>")
    else:
        names, unit = _read_text(path).splitlines(), ("line", "lines")
        while names and not names[-1].strip():
            names.pop()
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise SuiteFormatError(f"{path}: expected a non-empty list of class names (one a line, or a JSON list of "
                               f"strings), none empty")
    # stripped before the duplicate check: ' cat' and 'cat' are one name, and two classes of one name would split
    # its images' votes (the one listed first wins every tie)
    names = [n.strip() for n in names]
    first: dict[str, int] = {}
    for i, n in enumerate(names, start=1):
        if not n:
            raise SuiteFormatError(f"{path}: {unit[0]} {i} is an empty class name; every class needs a name "
                                   f"(one a line, in label order)")
        if n in first:
            raise SuiteFormatError(f"{path}: class name {n!r} is listed twice ({unit[1]} {first[n]} and {i}, "
                                   f"surrounding spaces ignored); each class needs one name: drop or rename one")
        first[n] = i
    return names


def _loads(path: str):
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise SuiteFormatError(f"{path}: not valid JSON ({exc})") from None


def _check_template(path: str, where: str, t) -> str:
    if not isinstance(t, str) or "{c}" not in t:
        raise SuiteFormatError(f"{path}: template {where} {t!r} has no {{c}}; write {{c}} where the class name goes, "
                               f"e.g. 'a photo of a {{c}}.'")
    return t


def read_templates(spec: str | None, classnames: list[str], default: list[str] | None = None,
                   ) -> tuple[list[list[str]], str]:
    """Per class, its prompts; and where they came from. ``spec``: a text file (one template a line, ``{c}``
    where the class name goes: CLIP_benchmark's ``zeroshot_classification_templates.txt``), a JSON list of
    templates, CLIP_benchmark's ``{dataset: [templates]}`` (``FILE.json#<dataset>``), or class-specific
    prompts ``{class name: [prompts]}`` (CuPL style, used as written). None: ``default`` (the dataset's own
    file) else ``DEFAULT_TEMPLATES``. Built-in sets: ``openai`` (CLIP's 80 ImageNet prompts), ``simple`` (7)."""
    if spec is None:
        templates = list(default or DEFAULT_TEMPLATES)
        source = "dataset" if default else "default"
        path = source
    elif _builtin(spec, TEMPLATE_SETS):
        templates, source, path = builtin_templates(_builtin(spec, TEMPLATE_SETS)), _builtin(spec, TEMPLATE_SETS), spec
    else:
        path, key = _split_key(spec)
        source = spec
        if path.endswith(".json"):
            templates = _json_entry(path, _loads(path), key)
            if isinstance(templates, dict):
                if not any(c in templates for c in classnames):
                    raise SuiteFormatError(f"{path}: holds templates of {len(templates)} datasets "
                                           f"({sorted(templates)[:5]} ...); name one: --templates {path}#<dataset>")
                missing = [c for c in classnames if c not in templates]
                if missing:
                    raise SuiteFormatError(
                        f"{path}: class-specific prompts lack class(es) {missing[:5]} ({len(missing)} of "
                        f"{len(classnames)}); give prompts for every class, or a list of templates with {{c}}")
                prompts = []
                for c in classnames:
                    p = templates[c]
                    if isinstance(p, str):
                        p = [p]
                    if not isinstance(p, list) or not p or not all(isinstance(x, str) and x for x in p):
                        raise SuiteFormatError(f"{path}: prompts of class {c!r} must be a non-empty list of strings")
                    prompts.append(list(p))
                return prompts, source
        else:
            templates = [line.strip() for line in _read_text(path).splitlines() if line.strip()]
    if not isinstance(templates, list) or not templates:
        raise SuiteFormatError(f"{path}: expected a non-empty list of templates with {{c}}")
    templates = [_check_template(path, f"{i + 1}", t) for i, t in enumerate(templates)]
    return [[t.replace("{c}", c) for t in templates] for c in classnames], source


def build_classify(tables: Tables, refs: list[ImageRef], ids: list[str], labels: np.ndarray, classnames: list[str],
                   prompts: list[list[str]], variants: dict[str, list[ImageRef]] | None = None,
                   keys: list[str | None] | None = None) -> ClassifyTask:
    """The task over these images (``refs``, clean) and their copies per variant, with each class's prompts."""
    variants = variants or {}
    keys = keys or [None] * len(refs)
    rows = [np.array([tables.images.add(r, i, k) for r, i, k in zip(refs, ids, keys)], dtype=np.int64)]
    for v, vrefs in variants.items():
        rows.append(np.array([tables.images.add(r, f"{v}/{i}") for r, i in zip(vrefs, ids)], dtype=np.int64))
    ptr = np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64)
    prompt_rows = tables.texts.add_many(t for p in prompts for t in p)
    task = ClassifyTask(name="zeroshot", classnames=list(classnames), prompt_ptr=ptr, prompt_rows=prompt_rows,
                        groups=["clean", *variants], query_items=np.stack(rows) if rows[0].size else
                        np.zeros((len(rows), 0), dtype=np.int64), query_ids=list(ids),
                        labels=np.asarray(labels, dtype=np.int64))
    task.validate()
    return task


# -- layouts -------------------------------------------------------------------------------------------
def _folder_index(name: str, classnames: list[str], index: dict[str, int]) -> int | None:
    if name in index:
        return index[name]
    if name.isdigit() and int(name) < len(classnames):  # ImageNet-V2: folders 0..999 in label order
        return int(name)
    return None


def _image_folder(root: str, classnames: list[str] | None, skip: set[str], cn_source: str | None,
                  imagenet: list[int] | None = None):
    """(relative paths, labels, classnames, ignored variant folders) of an ImageFolder tree ``root/<class>/*``.
    ``imagenet``: the classes are these ImageNet indices (a built-in set): folders are WordNet ids or V2 numbers."""
    local = not urls.is_url(root)
    entries = sorted(os.listdir(root)) if local else sorted(
        {f[len(root.rstrip("/")) + 1:].split("/", 1)[0] for f in urls.list_files(root)})
    files_by_folder, ignored = {}, []
    for name in entries:
        full = urls.join(root, name)
        if local and not os.path.isdir(full):
            continue
        files = [f for f in urls.list_files(full) if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
        if name in skip or (_VARIANT_DIR.match(name) and not _direct_images(full, files)):
            ignored.append(name)
            continue
        if not files:
            raise DataError(f"{full}: class folder {name!r} holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}); "
                            f"add its images or remove the folder")
        files_by_folder[name] = files
    if not files_by_folder:
        raise DataError(f"{root}: no class folders (expected the ImageFolder layout {root}/<class>/<image>)")
    if imagenet is not None:
        pos = {c: i for i, c in enumerate(imagenet)}
        folder_label = {}
        for name in files_by_folder:
            c = folder_class_index(name)
            if c not in pos:
                raise DataError(f"{urls.join(root, name)}: class folder {name!r} (ImageNet class {c}) is not among the "
                                f"{len(imagenet)} classes of --classnames {cn_source}; use --classnames imagenet1k, or "
                                f"the set these images come from")
            folder_label[name] = pos[c]
    elif classnames is None:
        classnames = list(files_by_folder)
        folder_label = {n: i for i, n in enumerate(classnames)}
    else:
        index = {n: i for i, n in enumerate(classnames)}
        folder_label = {}
        for name in files_by_folder:
            lab = _folder_index(name, classnames, index)
            if lab is None:
                raise DataError(f"{urls.join(root, name)}: class folder {name!r} is not in --classnames {cn_source} "
                                f"({len(classnames)} names, e.g. {classnames[:3]}); name the folder as its class or "
                                f"its label 0..{len(classnames) - 1}, or pass a --classnames file that lists it")
            folder_label[name] = lab
    rels, labels = [], []
    base = root.rstrip("/") + "/"
    for name, files in files_by_folder.items():
        for f in files:
            rels.append(f[len(base):] if f.startswith(base) else os.path.relpath(f, root))
            labels.append(folder_label[name])
    return rels, np.array(labels, dtype=np.int64), classnames, ignored


def _wnid_folders(root: str, skip: set[str]) -> str | None:
    """The built-in set an ImageFolder of WordNet id folders is (ImageNet-R / -A when its folders are exactly their
    200 classes, else ImageNet-1k), or None when its folders are not all WordNet ids."""
    if urls.is_url(root):
        return None
    folders = {n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)) and n not in skip
               and not _VARIANT_DIR.match(n)}
    if not folders or not folders <= _WNID_SET:
        return None
    for shift in ("imagenet-r", "imagenet-a"):
        if folders == {IMAGENET_WNIDS[i] for i in shift_subset(shift)}:
            return shift
    return "imagenet-1k"


def _direct_images(folder: str, files: list[str]) -> bool:
    """Whether a folder holds images itself (a class folder), not only below subfolders (a variant folder)."""
    base = folder.rstrip("/") + "/"
    return any("/" not in (f[len(base):] if f.startswith(base) else os.path.relpath(f, folder)).replace(os.sep, "/")
               for f in files)


def _label(where: str, value, classnames: list[str], index: dict[str, int]) -> int:
    """A label (a table's cell, a sample's ``cls``): a class index 0..C-1 or a class name. ``where`` names it.
    A number must be whole (``3``, ``3.0``): ``1.7`` is refused, never truncated to class 1."""
    if isinstance(value, str) and value.strip() in index:
        return index[value.strip()]
    try:
        num = float(value.strip() if isinstance(value, str) else value)
        if isinstance(value, bool) or not math.isfinite(num):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"{where} label {value!r} is neither a class index nor one of the {len(classnames)} "
                        f"class names (e.g. {classnames[:3]}); fix the row or the --classnames file") from None
    if not num.is_integer():
        raise DataError(f"{where} label {value!r} is not a whole number: a label is a class index 0.."
                        f"{len(classnames) - 1} (or a class name); fix the row (a float column rounded elsewhere?)")
    lab = int(value) if isinstance(value, int) else int(num)  # an int as it is: float() rounds past 2**53
    if not 0 <= lab < len(classnames):
        raise DataError(f"{where} label {lab} is out of range for {len(classnames)} classes (0.."
                        f"{len(classnames) - 1}); fix the label or pass the --classnames file it indexes")
    return lab


def _table(path: str):
    """(image paths, raw labels) from a CSV (header ``image,label``) or Parquet table."""
    if path.endswith(".parquet"):
        t = pq.read_table(urls.local_path(path))
        cols = t.column_names
        rows = None
    else:
        text = _read_text(path)
        reader = csv.DictReader(text.splitlines())
        cols = reader.fieldnames or []
        rows = list(reader)
    missing = [c for c in ("image", "label") if c not in cols]
    if missing:
        raise SuiteFormatError(f"{path}: lacks column(s) {missing}; expected columns image (a path relative to "
                               f"--images) and label (a class index or name); it has {cols}")
    if rows is None:
        return [str(x) for x in t.column("image").to_pylist()], t.column("label").to_pylist()
    return [r["image"] for r in rows], [r["label"] for r in rows]


def wds_split_exists(root: str, split: str) -> bool:
    """Whether CLIP_benchmark's WebDataset root holds ``split`` (``root/<split>/nshards.txt`` or a ``.tar`` there)."""
    folder = urls.join(root, split)
    return urls.exists(urls.join(folder, "nshards.txt")) or (
        urls.is_dir(folder) and any(f.endswith(".tar") for f in urls.list_files(folder)))


def wds_shards(root: str, split: str = "test") -> tuple[list[str], str]:
    """The shards of CLIP_benchmark's WebDataset layout: ``root/<split>/{0..n-1}.tar`` (``nshards.txt``)."""
    folder = urls.join(root, split)
    n_file = urls.join(folder, "nshards.txt")
    if urls.exists(n_file):
        text = _read_text(n_file).strip()
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise SuiteFormatError(f"{n_file}: expected the number of shards ({folder}/0.tar .. <n-1>.tar) as a "
                                   f"positive whole number, got {text[:40]!r}; write it (e.g. 4), or delete the file "
                                   f"to read every .tar in {folder}")
        return [urls.join(folder, f"{i}.tar") for i in range(int(text))], folder
    shards = [f for f in urls.list_files(folder) if f.endswith(".tar")] if urls.is_dir(folder) else []
    if not shards:
        raise FileNotFoundError(f"{folder}: no tar shards (CLIP_benchmark's layout: {root}/{split}/0.tar ..., "
                                f"nshards.txt)")
    return shards, folder


def read_wds_split(root: str, split: str, classnames: list[str]) -> tuple[SampleSet, list[Sample], np.ndarray]:
    """One split of CLIP_benchmark's WebDataset root (``root/<split>/{0..n-1}.tar``): its shards' samples, those
    holding an image (in shard order), and their labels (``cls`` members: class indices or names)."""
    shards, folder = wds_shards(root, split)
    ss = read_shards(shards, source=folder)
    index = {n: i for i, n in enumerate(classnames)}
    kept = [s for s in ss.samples if s.image is not None]
    for s in kept:
        if "cls" not in s.texts:
            raise DataError(f"{root}: sample {s.id} of split {split} has no cls member (its label); CLIP_benchmark's "
                            f"layout writes <key>.cls beside each image")
    labels = np.array([_label(f"{root}: sample {s.id}", s.texts["cls"], classnames, index) for s in kept],
                      dtype=np.int64)
    return ss, kept, labels


@dataclass(frozen=True)
class ClassNamesOptions:
    """Where the class names come from: shared by every suite that classifies (the zero-shot suites, the linear
    probe) through its options class deriving from this one."""

    classnames: str | None = opt(None, "class names in label order: a text file (one a line, "
                                 "CLIP_benchmark's classnames.txt), JSON (a list, or {dataset: [names]} with "
                                 "FILE.json#dataset), or built-in: imagenet1k, imagenet-r, imagenet-a (their 200 "
                                 "classes); default: the dataset's, else the class folders' names", path=True)


@dataclass(frozen=True)
class ClassificationOptions(ClassNamesOptions):
    """The zero-shot classification suites' own options (imagefolder, classification)."""

    templates: str | None = opt(None, "prompt templates with {c} for the class name: a text "
                                "file (one a line) or JSON (a list, {dataset: [templates]} with FILE.json#dataset, "
                                "or per-class prompts {class: [prompts]}), or built-in: openai (80), simple (7); "
                                "default: the dataset's own, openai for ImageNet classes, else 'a photo of a {c}.'",
                                path=True)


def load_classification(tables: Tables, opts: SuiteOptions, own: ClassificationOptions,
                        name: str = "classification") -> Suite:
    """Zero-shot classification: ``--images`` is an ImageFolder tree (``root/<class folder>/*``, folders in
    sorted order unless ``--classnames`` maps them: a folder named as a class or by its label), or
    CLIP_benchmark's WebDataset root (``classnames.txt``, ``zeroshot_classification_templates.txt`` and
    ``test/*.tar`` with ``cls`` members), local or a URL; ``--annotations`` a CSV/Parquet table of
    (image, label) with image paths relative to ``--images``. ``--image-variants V --seeds S``: the same
    images from ``<images>/<V>_s<S>/<same path>`` (tar shards: ``<shard folder>/<V>_s<S>/<shard>``) as
    extra query groups."""
    if not opts.images:
        raise UsageError(f"suite {name} needs --images: an ImageFolder root (<root>/<class>/<image>), "
                         f"CLIP_benchmark's WebDataset root (classnames.txt + test/*.tar), or the folder the "
                         f"--annotations table's image paths are relative to")
    root = opts.images
    shift = _builtin(own.classnames, BUILTIN_CLASSNAMES) if own.classnames else None
    imagenet = None
    if shift:
        classnames, imagenet = _imagenet_classes(BUILTIN_CLASSNAMES[shift])
    else:
        classnames = read_classnames(own.classnames) if own.classnames else None
    variants = image_variant_names(opts.image_variants, opts.seeds)
    vroot = opts.variants_dir or root  # where perturb images --out wrote the variant folders
    default_templates, keys, meta = None, None, {}
    if opts.annotations:
        paths, raw = _table(opts.annotations)
        if classnames is None:
            raise UsageError(f"suite {name}: a table of (image, label) needs --classnames FILE (the names its labels "
                             f"index)")
        index = {n: i for i, n in enumerate(classnames)}
        labels = np.array([_label(f"{opts.annotations}: row {i}", v, classnames, index) for i, v in enumerate(raw)],
                          dtype=np.int64)
        ids = paths
        refs = [ImageRef(p if os.path.isabs(p) or urls.is_url(p) else urls.join(root, p)) for p in paths]
        vrefs = {v: [ImageRef(urls.join(vroot, v, p)) for p in paths] for v in variants}
        meta["layout"] = "table"
    elif urls.exists(urls.join(root, CB_CLASSNAMES)) or (classnames is not None and wds_split_exists(root, "test")):
        if classnames is None:
            classnames = read_classnames(urls.join(root, CB_CLASSNAMES))
        if urls.exists(urls.join(root, CB_TEMPLATES)):
            default_templates = [t.strip() for t in _read_text(urls.join(root, CB_TEMPLATES)).splitlines()
                                 if t.strip()]
        ss, kept, labels = read_wds_split(root, "test", classnames)
        ids = [s.id for s in kept]
        refs, keys = [ImageRef(s.image) for s in kept], [s.image_key for s in kept]
        vrefs = {}
        for v in variants:
            vs = read_shards(variant_shards(ss, opts.variants_dir or "", v), source=v)
            by_id = {s.id: s for s in vs.samples if s.image is not None}
            missing = [i for i in ids if i not in by_id]
            if missing:
                raise DataError(f"image variant {v}: {len(missing)} sample(s) have no altered image, e.g. "
                                f"{missing[:3]}; make the variant again with hardrank perturb images")
            vrefs[v] = [ImageRef(by_id[i].image) for i in ids]
        meta.update({**ss.meta(), "layout": "clip_benchmark_wds"})
    elif urls.is_dir(root):
        cn_source = own.classnames
        if classnames is None:
            shift = _wnid_folders(root, set(variants))
            if shift:
                classnames, imagenet = _imagenet_classes(shift)
                cn_source = meta["imagenet_set"] = f"{shift} (WordNet id folders)"
        rels, labels, classnames, ignored = _image_folder(root, classnames, set(variants), cn_source, imagenet)
        ids = rels
        refs = [ImageRef(urls.join(root, r)) for r in rels]
        vrefs = {v: [ImageRef(urls.join(vroot, v, r)) for r in rels] for v in variants}
        meta["layout"] = "imagefolder"
        if ignored:
            meta["variant_folders_ignored"] = ignored
    else:
        raise FileNotFoundError(f"{root} does not exist (expected an ImageFolder root or CLIP_benchmark's "
                                f"WebDataset root holding {CB_CLASSNAMES})")
    errors = []
    if meta["layout"] != "clip_benchmark_wds":
        beside = variants_beside(root)
        for v in variants:
            d = urls.join(vroot, v)
            if not urls.is_dir(d):
                make = f"{variant_hint(v).removesuffix(' ...')} --images {root} --out {opts.variants_dir or beside}"
                errors.append(FileNotFoundError(
                    f"image variant folder {d} does not exist; make it with `{make}`" + (
                        "" if opts.variants_dir else f" and pass --variants-dir {beside} (variant folders inside "
                        f"an ImageFolder root would count as classes)")))
    if imagenet is not None and own.templates is None and default_templates is None:
        default_templates = builtin_templates("openai")  # CLIP_benchmark's default for ImageNet and its shifts
    prompts, template_source = read_templates(own.templates, classnames, default_templates)
    if imagenet is not None:
        meta["imagenet_classes"] = "all 1000" if len(imagenet) == len(IMAGENET_WNIDS) else imagenet
    task = build_classify(tables, refs, ids, labels, classnames, prompts, vrefs, keys)
    seeds = {v: [f"{v}_s{s}" for s in opts.seeds] for v in opts.image_variants} if len(opts.seeds) > 1 else {}
    return Suite(name=name, classify=[task], tie_rule=opts.tie_rule, image_errors=errors,
                 meta={**meta, "images": root, "annotations": opts.annotations, "classes": len(classnames),
                       "images_per_group": len(ids), "prompts": int(task.prompt_ptr[-1]),
                       "classnames_from": own.classnames or meta.get("imagenet_set") or (
                           "dataset" if meta["layout"] != "imagefolder" else "folder names"),
                       "templates_from": template_source, "image_variants": variants, "variant_seeds": seeds,
                       "tie_rule": f"{opts.tie_rule} (among equal scores the class listed first wins)"})
