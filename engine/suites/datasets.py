"""Datasets by the names CLIP_benchmark and DataComp give them: each a suite over its WebDataset root, found by name.

``wds/<name>`` is CLIP_benchmark's WebDataset dataset ``<name>`` (``wds/vtab/cifar10``); its plain names (``cifar10``,
``imagenet1k``, ``vtab/pets``, ``mscoco_captions``) and DataComp's task keys (``fairness/geode``, ``wilds/fmow``)
name the same data. A dataset's root is ``--images NAME=ROOT``, else ``--data-root``: a template with
CLIP_benchmark's placeholders (``{dataset}``: the name without ``wds/``, ``{dataset_cleaned}``: with '/' as '-'),
or a folder holding the roots under the names its Hugging Face mirrors have (``wds_vtab-cifar10``, or DataComp's
``wds_vtab-cifar10_test``). The task is CLIP_benchmark's (``--task``; ``auto``: retrieval for its retrieval
datasets and roots whose ``dataset_type.txt`` says so, else zero-shot classification), loaded by the suite that
does it (``classification``, ``linear_probe``, Karpathy-style retrieval over the ``txt`` captions, as written).
ImageNet-V2, -Sketch, -A, -R and ObjectNet also load from their release folders, as CLIP_benchmark's own loaders
read them. Nothing is downloaded: a missing root names the folder expected and the mirror it comes from.
docs/collections.md.
"""
from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, replace

import numpy as np

from hardrank import urls
from hardrank.errors import DataError, UsageError
from hardrank.inputs import read_shards
from hardrank.inputs.kinds.image_folder import IMAGE_EXTENSIONS
from hardrank.items import ImageRef, Tables
from hardrank.options import check_options, opt
from hardrank.scoring.task_metrics import GROUP_METRICS, TaskOutputs, group_column, main_metric
from hardrank.suites._common import SuiteOptions, caption_protocol
from hardrank.suites.classification import (
    CB_CLASSNAMES,
    ClassificationOptions,
    build_classify,
    load_classification,
    read_templates,
    read_wds_split,
    wds_shards,
    wds_split_exists,
)
from hardrank.suites.collections import TaskSpec, load_tasklist
from hardrank.suites.imagenet import builtin_templates, objectnet_classes
from hardrank.suites.karpathy import build_retrieval
from hardrank.suites.linear_probe import LinearProbeOptions, load_linear_probe
from hardrank.tasks import Suite

__all__ = ["DatasetOptions", "load_dataset", "is_dataset_name", "dataset_key", "mirror", "TASKS", "PLAIN_NAMES"]

TASKS = ("auto", "zeroshot_classification", "zeroshot_retrieval", "linear_probe")  # CLIP_benchmark's `--task` choices
# CLIP_benchmark's Hugging Face mirrors (clip-benchmark/wds_<name, '/' as '-'>): benchmark/webdatasets.txt
CB_MIRRORS = frozenset((
    "mscoco_captions", "flickr8k", "flickr30k", "imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-a",
    "imagenet-r", "imagenet-o", "objectnet", "fer2013", "voc2007", "voc2007_multilabel", "sun397", "cars",
    "fgvc_aircraft", "mnist", "stl10", "gtsrb", "country211", "renderedsst2", "vtab/caltech101", "vtab/cifar10",
    "vtab/cifar100", "vtab/clevr_count_all", "vtab/clevr_closest_object_distance", "vtab/diabetic_retinopathy",
    "vtab/dmlab", "vtab/dsprites_label_orientation", "vtab/dsprites_label_x_position",
    "vtab/dsprites_label_y_position", "vtab/dtd", "vtab/eurosat", "vtab/kitti_closest_vehicle_distance",
    "vtab/flowers", "vtab/pets", "vtab/pcam", "vtab/resisc45", "vtab/smallnorb_label_azimuth",
    "vtab/smallnorb_label_elevation", "vtab/svhn"))
# DataComp's task keys (tasklist.yml) whose data is not a CLIP_benchmark mirror: djghosh/wds_<key>_test
_DATACOMP_KEYS = frozenset(("cifar10", "food101", "fairness/dollar_street", "fairness/geode", "wilds/iwildcam",
                            "wilds/camelyon17", "wilds/fmow", "misc/winogavil",
                            "retrieval/flickr_1k_test_image_text_retrieval",
                            "retrieval/mscoco_2014_5k_test_image_text_retrieval"))
# the names CLIP_benchmark's dataset builder knows beside its mirrors (torchvision's datasets and its vtab/ ones)
PLAIN_NAMES = CB_MIRRORS | _DATACOMP_KEYS | frozenset((
    "cifar100", "dtd", "pets", "caltech101", "flowers", "eurosat", "pcam"))
_RETRIEVAL = frozenset(("mscoco_captions", "flickr8k", "flickr30k"))  # CLIP_benchmark's retrieval datasets
# DataComp reads its two retrieval tasks from Hugging Face datasets (nlphuji/...): the same Karpathy test splits are
# CLIP_benchmark's WebDataset roots of these names
_ROOT_OF = {"retrieval/flickr_1k_test_image_text_retrieval": "flickr30k",
            "retrieval/mscoco_2014_5k_test_image_text_retrieval": "mscoco_captions"}
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*$")


def is_dataset_name(name: str) -> bool:
    """Whether ``name`` is a dataset of this family: ``wds/<name>``, or a plain name CLIP_benchmark or DataComp
    gives one (``cifar10``, ``vtab/<anything>``, ``fairness/geode``)."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        return False
    return (name.startswith("wds/") and len(name) > 4) or name in PLAIN_NAMES or name.startswith("vtab/")


def dataset_key(name: str) -> str:
    """The dataset's name without ``wds/`` (what CLIP_benchmark formats ``--dataset_root`` with)."""
    return name[4:] if name.startswith("wds/") else name


def _cleaned(key: str) -> str:
    return key.replace("/", "-")


def mirror(key: str) -> str | None:
    """Where the dataset's WebDataset copy is published: CLIP_benchmark's mirror, else DataComp's; None: neither."""
    key = _ROOT_OF.get(key, key)
    if key in CB_MIRRORS:
        return f"huggingface.co/datasets/clip-benchmark/wds_{_cleaned(key)}"
    if key in _DATACOMP_KEYS and not key.startswith(("misc/", "retrieval/")):
        return f"huggingface.co/datasets/djghosh/wds_{_cleaned(key.removeprefix('fairness/'))}_test"
    return None


@dataclass(frozen=True)
class DatasetOptions(ClassificationOptions, LinearProbeOptions):
    """The dataset suites' own options (CLIP_benchmark's names, ``wds/<name>``): where their roots are, the task,
    the task list giving each its main metric; and the options of the suites they load through (class names and
    templates; the linear probe's)."""

    data_root: str | None = opt(None, "datasets by name (wds/<name>, cifar10, vtab/pets, ... and the collections): "
                                "a folder holding each under its mirror's name (wds_vtab-pets/, or DataComp's "
                                "wds_vtab-pets_test/), or CLIP_benchmark's dataset_root template, e.g. "
                                "'data/{dataset}' ({dataset}: vtab/pets) or 'data/wds_{dataset_cleaned}' "
                                "({dataset_cleaned}: vtab-pets); --images NAME=ROOT names one", path=True,
                                metavar="DIR|TEMPLATE")
    task: str = opt("auto", "datasets by name: CLIP_benchmark's task option; auto: zeroshot_retrieval for its "
                    "retrieval datasets (mscoco_captions, flickr30k, flickr8k, DataComp's retrieval/) and roots whose "
                    "dataset_type.txt says retrieval, else zeroshot_classification", choices=TASKS)
    tasklist: str | None = opt(None, "a task list in DataComp's tasklist.yml form: the tasks of --suite datacomp and "
                               "each one's main metric (default: DataComp's 38, built in)", path=True)
    skip_existing: bool = opt(True, "datasets by name: a (checkpoint, dataset) whose result is in --out for the same "
                              "model fingerprint and options is not scored again (CLIP_benchmark's skip_existing "
                              "option, on by default)")

    def __post_init__(self):
        super().__post_init__()
        check_options(self)


# -- where a dataset is ------------------------------------------------------------------------------------------
def _fields(template: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise UsageError(f"--data-root {template!r}: not a template ({exc}); write {{dataset}} or "
                         f"{{dataset_cleaned}} where the name goes, or give a folder") from None


def candidates(key: str, data_root: str) -> list[str]:
    """The folders ``--data-root`` names for dataset ``key``, in the order they are tried."""
    root_key = _ROOT_OF.get(key, key)
    fields = _fields(data_root)
    if fields:
        unknown = sorted(set(fields) - {"dataset", "dataset_cleaned"})
        if unknown:
            raise UsageError(f"--data-root {data_root!r}: unknown placeholder(s) {unknown}; CLIP_benchmark's are "
                             f"{{dataset}} (e.g. vtab/pets) and {{dataset_cleaned}} (vtab-pets)")
        return [data_root.format(dataset=root_key, dataset_cleaned=_cleaned(root_key))]
    out = [urls.join(data_root, f"wds_{_cleaned(root_key)}")]
    if root_key in _DATACOMP_KEYS or root_key.startswith("vtab/") or root_key in CB_MIRRORS:
        out.append(urls.join(data_root, f"wds_{_cleaned(root_key.removeprefix('fairness/'))}_test"))
    return out


def _root(name: str, key: str, opts: SuiteOptions, own: DatasetOptions) -> str:
    """The dataset's root: ``--images`` as it sees them, else the first existing folder ``--data-root`` names."""
    if opts.images:
        if not urls.exists(opts.images):
            raise DataError(f"{name}: {opts.images} does not exist; " + _fetch_hint(name, opts.images))
        return opts.images
    if not own.data_root:
        raise UsageError(f"{name}: where is it? give --data-root DIR (a folder holding "
                         f"wds_{_cleaned(_ROOT_OF.get(key, key))}/, as its mirror is named, or a template such as "
                         f"'DIR/{{dataset}}') or --images {name}=ROOT")
    tried = candidates(key, own.data_root)
    found = next((c for c in tried if urls.exists(c)), None)
    if found is None:
        raise DataError(f"{name}: no dataset folder {' or '.join(tried)}; " + _fetch_hint(name, tried[0]))
    return found


def _fetch_hint(name: str, folder: str) -> str:
    """How to get dataset ``name`` into ``folder``: its mirror, else CLIP_benchmark's converter; or name another."""
    where = mirror(dataset_key(name))
    if where is None:
        return (f"put CLIP_benchmark's WebDataset root there (classnames.txt, test/0.tar ...: its "
                f"clip_benchmark_export_wds writes one), or name it with --images {name}=ROOT")
    repo = where.split("/datasets/", 1)[1]
    return (f"it comes from {where} (nothing is downloaded: e.g. `huggingface-cli download --repo-type dataset "
            f"{repo} --local-dir {folder}`), or name another folder with --images {name}=ROOT")


def _dataset_type(root: str) -> str | None:
    f = urls.join(root, "dataset_type.txt")
    if not urls.exists(f):
        return None
    return urls.read_bytes(f).decode("utf-8-sig", "replace").strip().lower() or None


def _task(key: str, root: str, own: DatasetOptions) -> str:
    if own.task != "auto":
        return own.task
    if key in _RETRIEVAL or key.startswith("retrieval/") or _dataset_type(root) == "retrieval":
        return "zeroshot_retrieval"
    return "zeroshot_classification"


# -- the loaders -------------------------------------------------------------------------------------------------
def load_dataset(tables: Tables, opts: SuiteOptions, own: DatasetOptions, name: str) -> Suite:
    """Dataset ``name`` (``wds/<name>`` or a plain name) as one suite: its root found by name, its task chosen as
    CLIP_benchmark chooses it, loaded by the suite that does that task; its results carry each metric a task
    list may name (``task_metrics``) and, when the run's task list names this dataset, its main metric."""
    key = dataset_key(name)
    spec = _spec(name, key, own)
    if key == "misc/winogavil" or (spec is not None and spec.main_metric == "jaccard_score_10-12"):
        raise DataError(f"{name}: WinoGAViL is read by DataComp with Hugging Face datasets from a loading script "
                        f"(nlphuji/winogavil), which hardrank does not run, and has no WebDataset copy, so it is not "
                        f"scored; leave it out of the task list (--tasklist FILE) to aggregate the others")
    if (spec is not None and spec.main_metric == "mean_average_precision") or key == "voc2007_multilabel":
        raise DataError(f"{name}: a multilabel dataset (mean average precision over multi-hot .npy labels) is not "
                        f"scored by hardrank; use voc2007 (single-label crops) or leave it out of the collection")
    root = _root(name, key, opts, own)
    task = _task(key, root, own)
    mine = replace(opts, images=root)
    if task == "zeroshot_retrieval":
        suite = _retrieval(tables, mine, root, name)
    elif task == "linear_probe":
        _check_wds(name, root, own.train_split)
        suite = load_linear_probe(tables, mine, own, name=name)
    else:
        suite = _classification(tables, mine, own, root, key, name)
    metadata = _metadata(name, key, root, spec, suite) if spec is not None and spec.main_metric in GROUP_METRICS \
        else None
    suite.meta["dataset"] = {"name": name, "key": key, "root": root, "task": task, "mirror": mirror(key),
                             "tasklist": (own.tasklist or "datacomp (built in)") if spec is not None else None,
                             "main_metric": spec.main_metric if spec is not None else None}
    suite.annotate = _Annotate(spec, metadata, list((suite.classify or suite.probe)[0].classnames)
                               if suite.classify or suite.probe else [])
    return suite


def _spec(name: str, key: str, own: DatasetOptions) -> TaskSpec | None:
    """This dataset's entry in the run's task list (``--tasklist``, default DataComp's), if it has one; its entry's
    own problem (an unknown metric) as the DataError naming it."""
    tl = load_tasklist(own.tasklist)
    for k in (name, key):  # a task list may key it as given (wds/vtab/pets) or as DataComp does (vtab/pets)
        if k in tl.errors:
            raise DataError(f"{name}: {tl.errors[k]}")
        if k in tl.tasks:
            return tl.tasks[k]
    return None


def _check_wds(name: str, root: str, split: str = "test") -> None:
    if not wds_split_exists(root, split):
        raise DataError(f"{name}: {root} holds no {split} split ({urls.join(root, split)}/0.tar ... with "
                        f"nshards.txt, CLIP_benchmark's layout); " + _fetch_hint(name, root))


def _classification(tables: Tables, opts: SuiteOptions, own: DatasetOptions, root: str, key: str,
                    name: str) -> Suite:
    """Zero-shot classification of CLIP_benchmark's WebDataset root, or of the release folder its own loader
    reads for ImageNet-1k (``val/``), -V2 (``ImageNetV2-matched-frequency/``), -Sketch, -A, -R and ObjectNet."""
    if urls.exists(urls.join(root, CB_CLASSNAMES)) or wds_split_exists(root, "test"):
        _check_wds(name, root)
        if own.classnames is None and not urls.exists(urls.join(root, CB_CLASSNAMES)):
            raise DataError(f"{name}: {root} has test/ shards but no {CB_CLASSNAMES} (one class name a line, in label "
                            f"order); " + (f"copy it from {mirror(key)}" if mirror(key) else "write it")
                            + ", or pass --classnames FILE")
        return load_classification(tables, opts, own, name=name)
    release = _RELEASES.get(_ROOT_OF.get(key, key))
    if release is None or urls.is_url(root):
        raise DataError(f"{name}: {root} is not CLIP_benchmark's WebDataset root (no {CB_CLASSNAMES}, no test/ "
                        f"shards); " + _fetch_hint(name, root))
    folder, classnames = release
    if classnames is None:  # ObjectNet: its own classes, from the release's mapping files
        return _objectnet(tables, opts, own, root, name)
    images = os.path.join(root, folder) if folder else root
    if not os.path.isdir(images):
        raise DataError(f"{name}: {root} is neither CLIP_benchmark's WebDataset root ({CB_CLASSNAMES}, test/) nor "
                        f"the release layout its loader reads ({images}/<class>/<image>); " + _fetch_hint(name, root))
    own = replace(own, classnames=own.classnames or classnames)
    suite = load_classification(tables, replace(opts, images=images), own, name=name)
    suite.meta["layout"] = f"release folder ({folder or 'class folders'})"
    return suite


# CLIP_benchmark's non-WebDataset loaders of the ImageNet family: (image folder below the root, the class set)
_RELEASES = {"imagenet1k": ("val", "imagenet1k"), "imagenetv2": ("ImageNetV2-matched-frequency", "imagenet1k"),
             "imagenet_sketch": ("", "imagenet1k"), "imagenet-a": ("", "imagenet-a"), "imagenet-r": ("", "imagenet-r"),
             "objectnet": ("objectnet-1.0/images", None)}


def _objectnet(tables: Tables, opts: SuiteOptions, own: DatasetOptions, root: str, name: str) -> Suite:
    """ObjectNet as CLIP_benchmark's ``objectnet`` reads it: the images of the 113 classes that overlap ImageNet
    (``<root>/objectnet-1.0/images/<folder>/``), classified among those classes' names (lower-cased, in folder
    order) with its default templates (ImageNet's 80)."""
    classes = objectnet_classes(root)
    images_dir = os.path.join(root, "objectnet-1.0", "images")
    refs, ids, labels = [], [], []
    for label, c in enumerate(classes):
        folder = os.path.join(images_dir, c.folder)
        if not os.path.isdir(folder):
            raise DataError(f"{name}: {folder} does not exist (ObjectNet class {c.name!r}); pass the folder the "
                            f"objectnet-1.0.zip release unpacks to")
        for f in sorted(os.listdir(folder)):
            if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                refs.append(ImageRef(os.path.join(folder, f)))
                ids.append(f"{c.folder}/{f}")
                labels.append(label)
    classnames = [c.name.lower() for c in classes]
    default = None if own.templates else builtin_templates("openai")
    prompts, source = read_templates(own.templates, classnames, default)
    task = build_classify(tables, refs, ids, np.asarray(labels, dtype=np.int64), classnames, prompts)
    return Suite(name=name, classify=[task], tie_rule=opts.tie_rule,
                 meta={"images": root, "layout": "objectnet release", "classes": len(classnames),
                       "images_per_group": len(ids), "prompts": int(task.prompt_ptr[-1]), "classnames_from":
                       "objectnet mappings", "templates_from": source,
                       "tie_rule": f"{opts.tie_rule} (among equal scores the class listed first wins)"})


def _retrieval(tables: Tables, opts: SuiteOptions, root: str, name: str) -> Suite:
    """Image-text retrieval over CLIP_benchmark's retrieval root (``test/*.tar``: an image and a ``txt`` of its
    captions, one a line), captions as written (its protocol; ``--caption-protocol`` chooses another)."""
    _check_wds(name, root)
    shards, folder = wds_shards(root, "test")
    ss = read_shards(shards, source=folder)
    clean, refs, keys, skipped = [], [], [], 0
    for s in ss.samples:
        caps = [c for c in (s.texts.get("txt") or "").splitlines() if c.strip()]
        if s.image is None or not caps:
            skipped += 1
            continue
        clean.append((s.id, caps))
        refs.append(ImageRef(s.image))
        keys.append(s.image_key)
    if not clean:
        raise DataError(f"{name}: {folder} holds {len(ss.samples)} sample(s) and none has an image and a txt member "
                        f"(its captions, one a line: CLIP_benchmark's retrieval layout); " + _fetch_hint(name, root))
    protocol, normalise = caption_protocol(opts, default="raw")
    tasks = build_retrieval(tables, None, clean, refs=refs, image_keys=keys, normalise=normalise)
    return Suite(name=name, ranking=tasks, tie_rule=opts.tie_rule,
                 meta={**ss.meta(), "images": root, "layout": "clip_benchmark_wds retrieval",
                       "caption_protocol": protocol, "images_count": len(clean),
                       "captions": int(tasks[0].pos_ptr[-1]), "samples_skipped": skipped})


def _metadata(name: str, key: str, root: str, spec: TaskSpec, suite: Suite) -> dict[str, float]:
    """Each test image's ``spec.group_by`` value (its id -> the value), from the shards' ``.npy`` members; a
    DataError naming the dataset and the fix when they carry none."""
    if not suite.classify and not suite.probe:
        raise DataError(f"{name}: main metric {spec.main_metric} groups images by {spec.group_by}; a "
                        f"{suite.meta.get('layout', 'retrieval')} task has no image classes to group")
    classnames = (suite.classify or suite.probe)[0].classnames
    if suite.meta.get("layout") != "clip_benchmark_wds":
        raise DataError(f"{name}: main metric {spec.main_metric} needs each image's {spec.group_by}, which only "
                        f"WebDataset shards carry (.npy members); use DataComp's shards of it ({mirror(key)}), or "
                        f"name another main_metric in --tasklist")
    _, kept, _ = read_wds_split(root, "test", classnames)
    rows = [s.arrays.get("npy") for s in kept]
    if any(r is None for r in rows):
        lacking = [s.id for s, r in zip(kept, rows) if r is None]
        raise DataError(f"{name}: main metric {spec.main_metric} groups images by {spec.group_by}, but "
                        f"{len(lacking)} of {len(kept)} test samples carry no .npy metadata (e.g. {lacking[0]}); use "
                        f"DataComp's shards of it ({mirror(key) or 'its wds_*_test copy'}), which hold "
                        f"{list(spec.metadata_fields)} per image, or name another main_metric in --tasklist")
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise DataError(f"{name}: the test samples' .npy metadata have {sorted(width)} values each; DataComp's "
                        f"shards hold {len(spec.metadata_fields)} per image ({list(spec.metadata_fields)})")
    column = group_column(spec, np.asarray(rows, dtype=np.float64))
    return dict(zip((s.id for s in kept), column.tolist()))


class _Annotate:
    """A dataset result's ``task_metrics``: every metric a task list may name that its outcomes give (accuracies,
    mean per-class recall, macro F1; retrieval's mean R@1), and its task list's main metric. Called with one
    checkpoint's scored output (``hardrank.evaluate``)."""

    def __init__(self, spec: TaskSpec | None, metadata: dict[str, float] | None, classnames: list[str]):
        self.spec, self.metadata, self.classnames = spec, metadata, classnames

    def __call__(self, scored: dict) -> dict:
        out = _outputs(scored, self.spec, self.metadata, self.classnames)
        values = {}
        for metric, field in (("acc1", "rank"), ("acc5", "rank"), ("mean_per_class_recall", "labels"),
                              ("F1-macro_all", "pred"), ("mean_recall@1", "recall_at_1")):
            if getattr(out, field) is not None:
                values[metric] = main_metric(TaskSpec(key="", name="", main_metric=metric), out)
        extra = {}
        if self.spec is not None and self.spec.main_metric not in values:
            try:
                values[self.spec.main_metric] = main_metric(self.spec, out)
            except DataError as exc:  # its task list's metric does not fit this task: the collection says so
                extra["task_metric_error"] = str(exc)
        return {"task_metrics": {k: (None if v != v else float(v)) for k, v in values.items()}, **extra}


def _outputs(scored: dict, spec: TaskSpec | None, metadata: dict[str, float] | None,
             classnames: list[str]) -> TaskOutputs:
    """The per-image outcomes of one scored dataset as ``TaskOutputs``: classification's clean images or the
    probe's test images (rank, predicted and true class), or retrieval's R@1 both ways."""
    if scored["task_type"] == "ranking":
        m = scored["metrics"].get("original", {})
        return TaskOutputs(recall_at_1={d: m[d]["R@1"] for d in ("i2t", "t2i")})
    table = scored["outcomes"][0]
    view = "test" if scored["task_type"] == "linear_probe" else "clean"
    keep = np.asarray([v == view for v in table.column("view").to_pylist()], dtype=bool)
    ids = [i for i, k in zip(table.column("query_id").to_pylist(), keep) if k]
    index = {n: i for i, n in enumerate(classnames)}  # an image left unscored predicts "no class" (len)
    labels = np.asarray([index[n] for n, k in zip(table.column("subset").to_pylist(), keep) if k], dtype=np.int64)
    pred = np.asarray([index.get(p, len(classnames)) for p, k in zip(table.column("top1_id").to_pylist(), keep)
                       if k], dtype=np.int64)
    rank = np.asarray(table.column("rank").to_pylist(), dtype=np.int64)[keep]
    groups = None
    if metadata is not None and spec is not None:
        groups = {spec.group_by: np.asarray([metadata[i] for i in ids], dtype=np.float64)}
    return TaskOutputs(rank=rank, pred=pred, labels=labels, groups=groups)
