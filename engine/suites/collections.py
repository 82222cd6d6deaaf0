"""Collections: task lists in DataComp's tasklist.yml form (its 38 tasks built in), CLIP_benchmark's named
collections, each checkpoint's collection result (every task's main metric) and the aggregates DataComp reports.

A task list maps each task's key (the CLIP_benchmark dataset name, ``wds/<key>``) to its ``name`` (DataComp's
display name, which the aggregates use), ``main_metric`` (a name of ``hardrank.scoring.task_metrics.METRICS``;
default ``acc1``), and ``size``, ``time``, ``num_classes``, ``random_score``, ``tags`` as DataComp's file has
them. hardrank reads two keys more, for the worst-group metrics: ``group_by`` (the metadata field that forms the
groups) and ``metadata_fields`` (the columns of the shards' ``.npy`` members, in order); DataComp's own tasks
get theirs from ``DATACOMP_METADATA``. The aggregates are DataComp's ``aggregate_scores.py``: ImageNet (ImageNet
1k's score), the means over its groups (ImageNet distribution shifts, VTAB, retrieval) and over every task.

A collection is an alias of dataset suites (``hardrank.suites.datasets``): ``vtab``, ``vtab+``,
``imagenet_robustness`` and ``retrieval`` as CLIP_benchmark's ``dataset_collection`` lists them, and ``datacomp``,
the keys of ``--tasklist`` (default: the built-in list). Each dataset is one suite with one result per
checkpoint; ``collection_result`` gathers a checkpoint's into ``collection_<name>.json``. docs/collections.md.
"""
from __future__ import annotations

import difflib
import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from hardrank.config import DATA_DIR
from hardrank.errors import DataError
from hardrank.scoring.task_metrics import GROUP_METRICS, METRICS
from hardrank.suite_registry import result_stem

__all__ = ["TaskSpec", "read_tasklist", "parse_tasklist", "datacomp_tasks", "aggregate", "DATACOMP_TASKLIST",
           "DATACOMP_GROUPS", "DATACOMP_METADATA", "AGGREGATES", "CB_COLLECTIONS", "TaskList", "load_tasklist",
           "tasklist_option", "datacomp_members", "collection_tasks", "collection_result", "COLLECTION_TASK_TYPE"]

DATACOMP_TASKLIST = DATA_DIR / "tasklists" / "datacomp.yml"  # the published list's 38 scored tasks
# aggregate_scores.py's DATASET_GROUPS, by display name (Retrieval holds WinoGAViL too, as there)
DATACOMP_GROUPS = {
    "ImageNet dist. shifts": ("ImageNet Sketch", "ImageNet v2", "ImageNet-A", "ImageNet-O", "ImageNet-R", "ObjectNet"),
    "VTAB": ("Caltech-101", "CIFAR-100", "CLEVR Counts", "CLEVR Distance", "Describable Textures", "EuroSAT",
             "KITTI Vehicle Distance", "Oxford Flowers-102", "Oxford-IIIT Pet", "PatchCamelyon", "RESISC45", "SVHN",
             "SUN397"),
    "Retrieval": ("Flickr", "MSCOCO", "WinoGAViL"),
}
AGGREGATES = ("ImageNet", *DATACOMP_GROUPS, "Average")
# CLIP_benchmark's named collections (clip_benchmark/datasets/builder.py, dataset_collection), in its order: its
# dataset names, each a suite of hardrank.suites.datasets
_VTAB = ("vtab/caltech101", "vtab/cifar100", "vtab/clevr_count_all", "vtab/clevr_closest_object_distance",
         "vtab/diabetic_retinopathy", "vtab/dmlab", "vtab/dsprites_label_orientation", "vtab/dsprites_label_x_position",
         "vtab/dtd", "vtab/eurosat", "vtab/kitti_closest_vehicle_distance", "vtab/flowers", "vtab/pets", "vtab/pcam",
         "vtab/resisc45", "vtab/smallnorb_label_azimuth", "vtab/smallnorb_label_elevation")
CB_COLLECTIONS = {
    "vtab": (*_VTAB, "sun397", "vtab/svhn"),
    "vtab+": ("imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-a", "imagenet-r", "objectnet", "fer2013",
              "voc2007", "voc2007_multilabel", "sun397", "cars", "fgvc_aircraft", "mnist", "stl10", "gtsrb",
              "country211", "renderedsst2", "vtab/caltech101", "vtab/cifar10", *_VTAB[1:], "vtab/svhn"),
    "retrieval": ("mscoco_captions", "flickr8k", "flickr30k"),
    "imagenet_robustness": ("imagenetv2", "imagenet_sketch", "imagenet-a", "imagenet-r", "objectnet"),
}
COLLECTION_TASK_TYPE = "collection"  # a collection result's task_type
# the .npy metadata of DataComp's shards (its evaluators' _metadata_fields) and the field each worst-group metric
# groups by (DollarStreetEvaluator: income_ds; GeoDEEvaluator and FMoWEvaluator: region)
DATACOMP_METADATA = {
    "fairness/dollar_street": (("income_ds", "income_meta", "region"), "income_ds"),
    "fairness/geode": (("region", "country"), "region"),
    "wilds/fmow": (("region", "year", "y"), "region"),
    "wilds/iwildcam": (("location", "sequence", "year", "month", "day", "hour", "minute", "second", "y"), None),
    "wilds/camelyon17": (("hospital", "slide", "y"), None),
}
_FIELDS = {"name": str, "size": int, "main_metric": str, "time": (int, float), "num_classes": int,
           "random_score": (int, float), "tags": list, "group_by": str, "metadata_fields": list}


@dataclass(frozen=True)
class TaskSpec:
    """One task of a task list."""

    key: str                          # CLIP_benchmark's dataset name: vtab/caltech101 (its root: wds_vtab-caltech101)
    name: str                         # DataComp's display name: Caltech-101 (the aggregates' key)
    main_metric: str = "acc1"         # a name of hardrank.scoring.task_metrics.METRICS
    size: int | None = None           # test images (DataComp's count)
    num_classes: int | None = None
    random_score: float | None = None  # chance level, as a fraction
    tags: tuple[str, ...] = ()        # vtab_natural, retrieval, wilds, fairness, ...
    group_by: str | None = None       # worst-group metrics: the metadata field forming the groups
    metadata_fields: tuple[str, ...] = ()  # the shards' .npy metadata columns, in order


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (the plain loader keeps the last silently)."""


def _unique_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise DataError(f"{loader.name}: line {key_node.start_mark.line + 1}: {key!r} is given twice (first on "
                            f"line {seen[key]}); each task, and each field of a task, once")
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_tasklist(text: str, source: str = "<task list>", errors: dict | None = None) -> list[TaskSpec]:
    """The tasks of a task list in DataComp's ``tasklist.yml`` form, in file order; every problem a DataError
    naming ``source``, the task and the fix. With ``errors`` (a dict), a task whose entry is wrong (an unknown
    metric, field or type) is recorded there under its key and left out, and the others are returned; a file that
    is no task list, a key given twice or two tasks of one name still raise."""
    tasks = []
    for key, task in _parse(text, source):
        if isinstance(task, DataError):
            if errors is None:
                raise task
            errors[key] = task
        else:
            tasks.append(task)
    return tasks


def _parse(text: str, source: str) -> list[tuple[str, TaskSpec | DataError]]:
    """Each task of a task list, in file order: its spec, or the DataError its entry gives."""
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = source
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise DataError(f"{source}: not valid YAML ({str(exc).splitlines()[0]}); a task list is DataComp's "
                        f"tasklist.yml form: '<task key>:' then its fields indented below") from None
    if not isinstance(data, dict) or not data:
        raise DataError(f"{source}: expected a mapping of task keys (e.g. vtab/caltech101:) to their fields "
                        f"(name, main_metric, size, tags), got {type(data).__name__}")
    out, names = [], {}
    for key, entry in data.items():
        if not isinstance(key, str) or not key.strip():
            raise DataError(f"{source}: task key {key!r} is not a name; use the CLIP_benchmark dataset name "
                            f"(vtab/caltech101, cifar10, ...)")
        try:
            task = _task(key, entry, source)
        except DataError as exc:
            out.append((key, exc))
            continue
        if task.name in names:
            raise DataError(f"{source}: task {key!r} has the name {task.name!r} of task {names[task.name]!r}; the "
                            f"aggregates key tasks by name: give each its own")
        names[task.name] = key
        out.append((key, task))
    return out


def _task(key: str, entry, source: str) -> TaskSpec:
    """One entry of a task list, checked (a DataError naming the file, the task and the fix)."""
    where = f"{source}: task {key!r}"
    entry = {} if entry is None else entry
    if not isinstance(entry, dict):
        raise DataError(f"{where} is a {type(entry).__name__}; expected its fields (name: ..., main_metric: ...)")
    for field, value in entry.items():
        if field not in _FIELDS:
            hint = difflib.get_close_matches(str(field), list(_FIELDS), n=1)
            raise DataError(f"{where} has an unknown field {field!r}" + (f" (did you mean {hint[0]!r}?)" if hint
                            else "") + f"; known fields: {', '.join(_FIELDS)}")
        if isinstance(value, bool) or not isinstance(value, _FIELDS[field]):
            what = {str: "a string", int: "a whole number", list: "a list"}.get(_FIELDS[field], "a number")
            raise DataError(f"{where}: {field} is {value!r}; expected {what}")
    metric = entry.get("main_metric", "acc1")
    if metric not in METRICS:
        hint = difflib.get_close_matches(metric, list(METRICS), n=1)
        raise DataError(f"{where}: unknown main_metric {metric!r}" + (f" (did you mean {hint[0]!r}?)" if hint
                        else "") + f"; hardrank computes {', '.join(METRICS)}")
    tags = entry.get("tags", [])
    fields = entry.get("metadata_fields")
    if not all(isinstance(t, str) for t in tags) or (fields is not None and not all(isinstance(f, str)
                                                                                     for f in fields)):
        raise DataError(f"{where}: tags and metadata_fields are lists of names")
    default_fields, default_group = DATACOMP_METADATA.get(key, ((), None))
    group_by = entry.get("group_by", default_group if metric in GROUP_METRICS else None)
    fields = tuple(fields if fields is not None else default_fields)
    if metric in GROUP_METRICS:
        if group_by is None:
            raise DataError(f"{where}: main_metric {metric} is a worst-group accuracy; say which metadata field "
                            f"forms the groups: group_by: <field>, and the shards' .npy columns: "
                            f"metadata_fields: [<field>, ...]")
        if group_by not in fields:
            raise DataError(f"{where}: group_by {group_by!r} is not among its metadata_fields {list(fields)}; "
                            f"list the shards' .npy columns in order, {group_by} among them")
    return TaskSpec(key=key, name=entry.get("name", key), main_metric=metric, size=entry.get("size"),
                    num_classes=entry.get("num_classes"), random_score=entry.get("random_score"),
                    tags=tuple(tags), group_by=group_by, metadata_fields=fields)


def _read(p: Path) -> str:
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist (expected a task list in DataComp's tasklist.yml form)")
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{p}: not UTF-8 text; re-save it as UTF-8") from None


def read_tasklist(path: str | Path) -> list[TaskSpec]:
    """A task list file (``--tasklist FILE``) in DataComp's form."""
    return parse_tasklist(_read(Path(path)), str(path))


def datacomp_tasks() -> list[TaskSpec]:
    """DataComp's 38 scored tasks, as its published tasklist.yml lists them."""
    return read_tasklist(DATACOMP_TASKLIST)


@dataclass(frozen=True)
class TaskList:
    """A task list as a run reads it: every task key in file order, the specs of the good entries, and why each
    other entry is wrong (its task fails alone: the others run)."""

    source: str                       # the file, or "datacomp (built in)"
    keys: tuple[str, ...]
    tasks: Mapping[str, TaskSpec]
    errors: Mapping[str, DataError]


def load_tasklist(path: str | os.PathLike | None = None) -> TaskList:
    """The task list ``path`` (None: DataComp's, built in), read once per version of the file."""
    p = Path(path) if path else DATACOMP_TASKLIST
    if not p.is_file():
        raise FileNotFoundError(f"--tasklist {p} does not exist (expected a task list in DataComp's tasklist.yml "
                                f"form: '<task key>:' then its fields)")
    st = p.stat()
    return _load(str(p), st.st_mtime_ns, st.st_size, path is None)


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int, size: int, builtin: bool) -> TaskList:
    source = "datacomp (built in)" if builtin else path
    parsed = _parse(_read(Path(path)), source)
    return TaskList(source, tuple(k for k, _ in parsed),
                    {k: t for k, t in parsed if isinstance(t, TaskSpec)},
                    {k: t for k, t in parsed if isinstance(t, DataError)})


def tasklist_option(opts) -> str | None:
    """The run's ``--tasklist`` (its value for suite datacomp, else the common one) from its ``SuiteOptions``,
    read as given (None: the built-in list)."""
    if opts is None:
        return None
    per = [v for s, k, v in getattr(opts, "per_suite", ()) if k == "tasklist" and s == "datacomp"]
    return per[-1] if per else dict(getattr(opts, "own", ())).get("tasklist")


def datacomp_members(opts=None) -> tuple[str, ...]:
    """the tasks of --tasklist (default: DataComp's 38)"""
    return load_tasklist(tasklist_option(opts)).keys


def collection_tasks(name: str, opts=None) -> list[TaskSpec] | None:
    """The tasks of collection ``name`` with the run's suite options (None: ``name`` is no collection). CLIP_benchmark's
    collections score each dataset by its task's headline (``main_metric`` ""; acc1, or retrieval's mean R@1)."""
    if name in CB_COLLECTIONS:
        return [TaskSpec(key=k, name=k, main_metric="") for k in CB_COLLECTIONS[name]]
    if name != "datacomp":
        return None
    tl = load_tasklist(tasklist_option(opts))
    return [tl.tasks.get(k) or TaskSpec(key=k, name=k, main_metric="") for k in tl.keys]


_HEADLINE = {"ranking": "mean_recall@1", "classification": "acc1", "linear_probe": "acc1"}


def collection_result(name: str, tasks: Sequence[TaskSpec], results: Mapping[str, dict], checkpoint: str,
                      why: Mapping[str, str] | None = None, tasklist: str | None = None) -> dict:
    """One checkpoint's result of collection ``name``: each task's main metric from its dataset's result
    (``results``: suite name -> that checkpoint's result dict; ``task_metrics`` as ``hardrank.suites.datasets``
    writes them) and the aggregates (``aggregate``) as ``metrics``. ``why``: the error of each task that did not
    load. A task without a value is listed, with why, and leaves every aggregate holding it empty."""
    why = why or {}
    per, scores = {}, {}
    for t in tasks:
        r = results.get(t.key)
        entry: dict = {"name": t.name}
        if r is None:
            entry.update(main_metric=t.main_metric or None, value=None,
                         why=why.get(t.key, "no result for this checkpoint (it was not run)"))
        else:
            metric = t.main_metric or _HEADLINE.get(r.get("task_type"), "acc1")
            value = (r.get("task_metrics") or {}).get(metric)
            entry.update(main_metric=metric, value=value, task_type=r.get("task_type"),
                         result=f"{result_stem(t.key)}.json")
            if value is None:
                entry["why"] = r.get("task_metric_error") or f"its result holds no {metric}"
        per[t.key], scores[t.key] = entry, entry["value"]
    agg = aggregate(scores, tasks)
    # the members' own (not other suites', nor a collection's written earlier: a list there is no set member)
    fingerprints = sorted({results[t.key]["model_fingerprint"] for t in tasks
                           if isinstance((results.get(t.key) or {}).get("model_fingerprint"), str)})
    return {"suite": name, "checkpoint": checkpoint, "task_type": COLLECTION_TASK_TYPE,
            "model_fingerprint": fingerprints[0] if len(fingerprints) == 1 else fingerprints or None,
            "metrics": {k: v for k, v in agg.items() if k not in ("tasks", "scored", "missing")},
            "tasks": per, "scored": agg["scored"], "of": agg["tasks"], "missing": agg.get("missing", {}),
            "tasklist": tasklist, "metrics_unit": "percent (DataComp writes fractions: divide by 100)",
            "aggregates": "DataComp's aggregate_scores.py: ImageNet 1k; the means over its groups; the mean over "
                          "every task" if name == "datacomp" else "the mean of the tasks' main metrics"}


def _score(v) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def aggregate(scores: Mapping[str, float | None], tasks: Sequence[TaskSpec]) -> dict:
    """DataComp's aggregates of main-metric ``scores`` (keyed by task key or display name; None or NaN: no score):
    ``ImageNet`` (ImageNet 1k's score), ``ImageNet dist. shifts``, ``VTAB``, ``Retrieval`` (the means over
    ``DATACOMP_GROUPS``) and ``Average`` (the mean over every task of ``tasks``), each None where a member has no
    score (listed under ``missing``); a group none of whose members is in ``tasks`` is left out. Means are of the
    values as given (DataComp's are fractions), summed exactly (``math.fsum``), so the order does not matter."""
    by_key = {t.key: t for t in tasks}
    by_name = {t.name: t for t in tasks}
    values: dict[str, float | None] = {}
    for k, v in scores.items():
        t = by_key.get(k) or by_name.get(k)
        if t is None:
            raise DataError(f"score for {k!r}, which is no task of the task list (keys such as "
                            f"{list(by_key)[:3]}, names such as {list(by_name)[:3]})")
        if t.name in values:
            raise DataError(f"task {t.key} ({t.name}) is scored twice (by its key and by its name); give one")
        values[t.name] = _score(v)
    out, missing = {}, {}

    def mean(names):
        lack = [n for n in names if values.get(n) is None]
        return (None, lack) if lack else (math.fsum(values[n] for n in names) / len(names), [])

    if "ImageNet 1k" in by_name:
        out["ImageNet"], lack = mean(["ImageNet 1k"])
        if lack:
            missing["ImageNet"] = lack
    for group, names in DATACOMP_GROUPS.items():
        if any(n in by_name for n in names):  # a member outside the task list counts as unscored
            out[group], lack = mean(names)
            if lack:
                missing[group] = lack
    out["Average"], lack = mean([t.name for t in tasks])
    if lack:
        missing["Average"] = lack
    out["tasks"] = len(tasks)
    out["scored"] = sum(v is not None for v in values.values())
    if missing:
        out["missing"] = missing
    return out
