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

__all__ = ["write_result", "read_results", "ResultFile", "outcome_schema", "summary_row", "format_table",
           "RESULT_VERSION", "RESULT_KEYS"]

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
    """Per-query outcomes: ranking rows fill rank/top1_*, choice rows fill subset/scores/correct."""
    return pa.schema([
        ("kind", pa.string()), ("task", pa.string()), ("view", pa.string()), ("query_id", pa.string()),
        ("rank", pa.int64()), ("top1_id", pa.string()), ("top1_group", pa.string()),
        ("subset", pa.string()), ("scores", pa.list_(pa.float32())), ("correct", pa.bool_()),
    ])


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


def summary_row(result: dict) -> dict[str, float]:
    """The headline numbers of one result for the terminal table."""
    row = {}
    m = result["metrics"]
    if result.get("task_type") == "ranking":
        for d in ("i2t", "t2i"):
            if d in m.get("original", {}):
                row[f"{d} R@1"] = m["original"][d]["R@1"]
        for d, vm in m.get("original", {}).items():  # i2t@<variant>: the variant's images as the queries
            if d.startswith("i2t@") and isinstance(vm, dict) and "R@1" in vm:
                row[f"{d} R@1"] = vm["R@1"]
        for view, dirs in m.items():
            if view == "original":
                continue
            for d, vm in dirs.items():
                if isinstance(vm, dict) and "R@1" in vm:
                    row[f"{d}:{view} R@1"] = vm["R@1"]
                    if "false_rate" in vm:
                        row[f"{d}:{view} FR"] = vm["false_rate"]
    elif result.get("task_type") == "classification":
        for task, groups in m.items():
            prefix = "" if len(m) == 1 else f"{task} "
            clean = groups.get("clean", {})
            for k, short in (("acc1", "top1"), ("acc5", "top5"), ("mean_per_class_recall", "mpcr")):
                if k in clean:
                    row[f"{prefix}zs {short}"] = clean[k]
            # variants: per corruption (mean over its severities) where named <corruption>_<severity>, else each
            shown = groups.get("corruptions") or variant_entries(groups)
            for g, gm in shown.items():
                row[f"{prefix}zs:{g} top1"] = gm.get("acc1")
            if "variants_mean" in groups:
                row[f"{prefix}zs:variants top1"] = groups["variants_mean"]["acc1"]
    elif result.get("task_type") == "linear_probe":
        for task, tm in m.items():
            prefix = "" if len(m) == 1 else f"{task} "
            for k, short in (("acc1", "top1"), ("acc5", "top5"), ("mean_per_class_recall", "mpcr")):
                if k in tm:
                    row[f"{prefix}lp {short}"] = tm[k]
    elif result.get("task_type") == "mask":
        for role, rm in m.items():
            for k, v in rm.items():
                row[f"{role} {k}"] = v
    else:
        for task, tm in m.items():
            a = tm.get("all", {})
            for k in ("accuracy", "augmented_accuracy", "original_accuracy", "group_score", "i2t_accuracy"):
                if k in a:
                    row[f"{task} {k.replace('_accuracy', '').replace('accuracy', 'acc')}"] = a[k]
    return row


def format_table(rows: list[tuple[str, dict]], max_width: int = 11) -> str:
    """Plain-text table: one line per label, one column per metric (union, first-seen order)."""
    cols: list[str] = []
    for _, r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    label_w = max([len("checkpoint")] + [len(l) for l, _ in rows])
    lines = []
    for i in range(0, len(cols), 8):  # wrap wide tables into blocks of 8 columns
        block = cols[i:i + 8]
        widths = [max(len(c), 6) for c in block]
        lines.append("  ".join(["checkpoint".ljust(label_w)] + [c.rjust(w) for c, w in zip(block, widths)]))
        for label, r in rows:
            cells = [(f"{r[c]:.1f}" if c in r and r[c] is not None else "-").rjust(w) for c, w in zip(block, widths)]
            lines.append("  ".join([label.ljust(label_w)] + cells))
        lines.append("")
    return "\n".join(lines).rstrip()
