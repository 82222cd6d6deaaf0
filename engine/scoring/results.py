"""Results files (a public contract): one JSON and one Parquet of outcomes per (checkpoint, suite)."""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.atomic import atomic_path, write_json_atomic
from hardrank.errors import DataError
from hardrank.scoring.metrics import variant_entries

log = logging.getLogger("hardrank.scoring.results")

__all__ = ["write_result", "read_results", "ResultFile", "outcome_schema", "summary_row", "summary_intervals",
           "headline_paths", "format_table", "verdict_map", "RESULT_VERSION", "RESULT_KEYS"]

RESULT_VERSION = 1
RESULT_KEYS = ("suite", "checkpoint", "task_type", "metrics")  # every result JSON has these


@dataclass
class ResultFile:
    """One (checkpoint, suite) result as written by ``write_result``."""

    path: Path   # <out>/<checkpoint>/<suite>.json
    data: dict   # its content: suite, checkpoint, task_type, metrics, counts, provenance, ...

    def outcomes(self) -> pa.Table:
        """The per-query outcomes (the ``.parquet`` beside the JSON; ``outcome_schema``)."""
        p = self.path.with_suffix(".parquet")
        return pq.read_table(p) if p.is_file() else outcome_schema().empty_table()


def read_results(results_dir: str | os.PathLike, *, skip: str | os.PathLike | None = None) -> list[ResultFile]:
    """Every result below ``results_dir`` (the ``--out`` of ``hardrank eval`` / ``run``), in path
    order: JSON files holding ``RESULT_KEYS``; other JSON (a report, a summary) is ignored, and so is
    anything under ``skip``. Raises DataError when there is none."""
    root = Path(results_dir)
    if not root.is_dir():
        raise DataError(f"results folder {root} does not exist; pass the --out folder of `hardrank eval` "
                        f"(it holds <checkpoint>/<suite>.json)")
    skip_dir = Path(skip).resolve() if skip is not None else None
    found = []
    for p in sorted(root.rglob("*.json")):
        if p.name.startswith(".") or (skip_dir is not None and skip_dir in p.resolve().parents):
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("skipping %s: not readable JSON (%s)", p, exc)
            continue
        if isinstance(data, dict) and all(k in data for k in RESULT_KEYS):
            found.append(ResultFile(p, data))
    if not found:
        raise DataError(f"no result files under {root}: expected <checkpoint>/<suite>.json files with keys "
                        f"{list(RESULT_KEYS)}, as written by `hardrank eval --out {root}`")
    return found


def outcome_schema() -> pa.Schema:
    """Per-query outcomes: ranking rows fill rank/top1_*, choice rows fill subset/scores/correct/verdicts.
    ``unit``: the independent unit the row belongs to (``statistics.UNITS``: the image of a retrieval query,
    the clean image of a classification row, the item of a choice row, the question of a mask row);
    ``verdicts``: every named verdict of a choice row (``metrics.choice_verdicts``)."""
    return pa.schema([
        ("kind", pa.string()), ("task", pa.string()), ("view", pa.string()), ("query_id", pa.string()),
        ("rank", pa.int64()), ("top1_id", pa.string()), ("top1_group", pa.string()),
        ("subset", pa.string()), ("scores", pa.list_(pa.float32())), ("correct", pa.bool_()),
        ("unit", pa.string()), ("verdicts", pa.map_(pa.string(), pa.bool_())),
    ])


def verdict_map(verdicts: dict[str, np.ndarray], n: int) -> pa.MapArray:
    """The ``verdicts`` column of ``n`` choice rows: each row maps every verdict name to its (n,) bool value."""
    names = list(verdicts)
    keys = pa.array(names * n, type=pa.string())
    items = pa.array(np.stack([np.asarray(verdicts[k], dtype=bool) for k in names], 1).reshape(-1)
                     if names else np.zeros(0, bool), type=pa.bool_())
    return pa.MapArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * len(names)), keys, items)


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if math.isnan(f) else round(f, 6)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_result(out_dir: str | os.PathLike, stem: str, result: dict, outcomes: list[pa.Table]) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.parquet`` atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, pq_path = out / f"{stem}.json", out / f"{stem}.parquet"
    table = pa.concat_tables(outcomes) if outcomes else outcome_schema().empty_table()
    with atomic_path(pq_path, table.nbytes) as tmp:  # (uncompressed: an upper bound)
        pq.write_table(table, tmp)
    write_json_atomic(json_path, _clean({"result_version": RESULT_VERSION, **result}))
    return json_path, pq_path


def headline_paths(result: dict) -> dict[str, tuple[str, ...]]:
    """The terminal table's columns of one result and where each sits in ``result["metrics"]`` (and in
    ``result["ci95"]``), e.g. ``{"i2t R@1": ("original", "i2t", "R@1"), ...}``."""
    out: dict[str, tuple[str, ...]] = {}
    m = result["metrics"]
    if result.get("task_type") == "ranking":
        for d in ("i2t", "t2i"):
            if d in m.get("original", {}):
                out[f"{d} R@1"] = ("original", d, "R@1")
        for d, vm in m.get("original", {}).items():  # i2t@<variant>: the variant's images as the queries
            if d.startswith("i2t@") and isinstance(vm, dict) and "R@1" in vm:
                out[f"{d} R@1"] = ("original", d, "R@1")
        for view, dirs in m.items():
            if view == "original":
                continue
            for d, vm in dirs.items():
                if isinstance(vm, dict) and "R@1" in vm:
                    out[f"{d}:{view} R@1"] = (view, d, "R@1")
                    if "false_rate" in vm:
                        out[f"{d}:{view} FR"] = (view, d, "false_rate")
    elif result.get("task_type") == "classification":
        for task, groups in m.items():
            prefix = "" if len(m) == 1 else f"{task} "
            clean = groups.get("clean", {})
            for k, short in (("acc1", "top1"), ("acc5", "top5"), ("mean_per_class_recall", "mpcr")):
                if k in clean:
                    out[f"{prefix}zs {short}"] = (task, "clean", k)
            # variants: per corruption (mean over its severities) where named <corruption>_<severity>, else each
            if groups.get("corruptions"):
                for g in groups["corruptions"]:
                    out[f"{prefix}zs:{g} top1"] = (task, "corruptions", g, "acc1")
            else:
                for g in variant_entries(groups):
                    out[f"{prefix}zs:{g} top1"] = (task, g, "acc1")
            if "variants_mean" in groups:
                out[f"{prefix}zs:variants top1"] = (task, "variants_mean", "acc1")
    elif result.get("task_type") == "linear_probe":
        for task, tm in m.items():
            prefix = "" if len(m) == 1 else f"{task} "
            for k, short in (("acc1", "top1"), ("acc5", "top5"), ("mean_per_class_recall", "mpcr")):
                if k in tm:
                    out[f"{prefix}lp {short}"] = (task, k)
    elif result.get("task_type") == "collection":  # its aggregates (DataComp's, or the mean of its tasks)
        for k, v in m.items():
            if not isinstance(v, dict):
                out[f"{result.get('suite')} {k}"] = (k,)
    elif result.get("task_type") == "mask":
        for role, rm in m.items():
            for k in rm:
                out[f"{role} {k}"] = (role, k)
    else:
        for task, tm in m.items():
            a = tm.get("all", {})
            for k in ("accuracy", "augmented_accuracy", "original_accuracy", "group_score", "i2t_accuracy", "mAP"):
                if k in a:
                    out[f"{task} {k.replace('_accuracy', '').replace('accuracy', 'acc')}"] = (task, "all", k)
    return out


def _at(tree, path: tuple[str, ...]):
    for k in path:
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


def summary_row(result: dict) -> dict[str, float]:
    """The headline numbers of one result for the terminal table."""
    return {col: _at(result["metrics"], path) for col, path in headline_paths(result).items()}


def summary_intervals(result: dict) -> dict[str, tuple[float, float]]:
    """The 95% interval of each headline number (``summary_row``'s columns) that the result holds."""
    ci = result.get("ci95") or {}
    out = {}
    for col, path in headline_paths(result).items():
        v = _at(ci, path)
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            out[col] = (float(v[0]), float(v[1]))
    return out


def format_table(rows: list[tuple[str, dict]], max_width: int = 11,
                 intervals: dict[str, dict[str, tuple[float, float]]] | None = None) -> str:
    """Plain-text table: one line per label, one column per metric (union, first-seen order). With
    ``intervals`` ({label: {column: (low, high)}}) a cell reads ``85.7±1.6``: the value and the half-width of
    its 95% interval (the mean of its two sides; bootstrap intervals are near symmetric)."""
    cols: list[str] = []
    for _, r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    intervals = intervals or {}

    def cell(label: str, r: dict, c: str) -> str:
        if c not in r or r[c] is None:
            return "-"
        ci = intervals.get(label, {}).get(c)
        if ci is None or not all(math.isfinite(x) for x in ci):
            return f"{r[c]:.1f}"
        return f"{r[c]:.1f}±{(ci[1] - ci[0]) / 2:.1f}"

    label_w = max([len("checkpoint")] + [len(l) for l, _ in rows])
    lines = []
    for i in range(0, len(cols), 8):  # wrap wide tables into blocks of 8 columns
        block = cols[i:i + 8]
        cells = [[cell(label, r, c) for c in block] for label, r in rows]
        widths = [max([len(c), 6] + [len(row[j]) for row in cells]) for j, c in enumerate(block)]
        lines.append("  ".join(["checkpoint".ljust(label_w)] + [c.rjust(w) for c, w in zip(block, widths)]))
        for (label, _), row in zip(rows, cells):
            lines.append("  ".join([label.ljust(label_w)] + [v.rjust(w) for v, w in zip(row, widths)]))
        lines.append("")
    if any(v for v in intervals.values()):
        lines.append("±: half the width of the 95% bootstrap interval (result field ci95)")
    return "\n".join(lines).rstrip()
