"""Results files (a public contract): one JSON and one Parquet of outcomes per (checkpoint, suite)."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path, write_json_atomic

__all__ = ["write_result", "outcome_schema", "summary_row", "format_table", "RESULT_VERSION"]

RESULT_VERSION = 1


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
    with atomic_path(pq_path) as tmp:
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
        for view, dirs in m.items():
            if view == "original":
                continue
            for d, vm in dirs.items():
                if isinstance(vm, dict) and "R@1" in vm:
                    row[f"{d}:{view} R@1"] = vm["R@1"]
                    if "false_rate" in vm:
                        row[f"{d}:{view} FR"] = vm["false_rate"]
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
