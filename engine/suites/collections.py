"""Task lists in DataComp's tasklist.yml form (its 38 tasks built in), and the aggregates DataComp reports.

A task list maps each task's key (the CLIP_benchmark dataset name, ``wds/<key>``) to its ``name`` (DataComp's
display name, which the aggregates use), ``main_metric`` (a name of ``hardrank.scoring.task_metrics.METRICS``;
default ``acc1``), and ``size``, ``time``, ``num_classes``, ``random_score``, ``tags`` as DataComp's file has
them. hardrank reads two keys more, for the worst-group metrics: ``group_by`` (the metadata field that forms the
groups) and ``metadata_fields`` (the columns of the shards' ``.npy`` members, in order); DataComp's own tasks
get theirs from ``DATACOMP_METADATA``. The aggregates are DataComp's ``aggregate_scores.py``: ImageNet (ImageNet
1k's score), the means over its groups (ImageNet distribution shifts, VTAB, retrieval) and over every task.
docs/classification.md, "Task lists and DataComp's aggregates".
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from hardrank.config import DATA_DIR
from hardrank.errors import DataError
from hardrank.scoring.task_metrics import GROUP_METRICS, METRICS

__all__ = ["TaskSpec", "read_tasklist", "parse_tasklist", "datacomp_tasks", "aggregate", "DATACOMP_TASKLIST",
           "DATACOMP_GROUPS", "DATACOMP_METADATA", "AGGREGATES"]

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


def parse_tasklist(text: str, source: str = "<task list>") -> list[TaskSpec]:
    """The tasks of a task list in DataComp's ``tasklist.yml`` form, in file order; every problem a DataError
    naming ``source``, the task and the fix."""
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
    tasks, names = [], {}
    for key, entry in data.items():
        where = f"{source}: task {key!r}"
        if not isinstance(key, str) or not key.strip():
            raise DataError(f"{source}: task key {key!r} is not a name; use the CLIP_benchmark dataset name "
                            f"(vtab/caltech101, cifar10, ...)")
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
        name = entry.get("name", key)
        if name in names:
            raise DataError(f"{where} has the name {name!r} of task {names[name]!r}; the aggregates key tasks by "
                            f"name: give each its own")
        names[name] = key
        tasks.append(TaskSpec(key=key, name=name, main_metric=metric, size=entry.get("size"),
                              num_classes=entry.get("num_classes"), random_score=entry.get("random_score"),
                              tags=tuple(tags), group_by=group_by, metadata_fields=fields))
    return tasks


def read_tasklist(path: str | Path) -> list[TaskSpec]:
    """A task list file (``--tasklist FILE``) in DataComp's form."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist (expected a task list in DataComp's tasklist.yml form)")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"{p}: not UTF-8 text; re-save it as UTF-8") from None
    return parse_tasklist(text, str(p))


def datacomp_tasks() -> list[TaskSpec]:
    """DataComp's 38 scored tasks, as its published tasklist.yml lists them."""
    return read_tasklist(DATACOMP_TASKLIST)


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
