"""The report's numbers: the main metric per (checkpoint, suite), leaderboard rows and CSV, the pivot table."""
from __future__ import annotations

import csv
import math
from pathlib import Path

from hardrank.atomic import atomic_path
from hardrank.jobs.report.load import Axis, Result
from hardrank.scoring.results import summary_row
from hardrank.suites.collections import COLLECTION_TASK_TYPE

__all__ = ["num", "directions", "top_level", "drop", "main_metric", "main_paths", "leaderboard", "write_csv",
           "pivot", "MASK_ROLES"]

_MAIN_CHOICE = ("accuracy", "augmented_accuracy", "group_score", "i2t_accuracy")
_HEAD = ("checkpoint", "step", "step_unit", "order", "suite", "task_type", "main_metric", "main")  # always there
_TAIL = ("model_fingerprint", "tie_rule", "failed_items", "result")  # the CSV's last columns
MASK_ROLES = ("visible", "amodal")  # the mask suites' two mask kinds, each with gIoU and cIoU


def num(v) -> float | None:
    """``v`` as a float if it is a finite number (not a bool), else None."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def directions(view_metrics: dict) -> list[str]:
    """The directions (i2t, t2i) of one view of a ranking result."""
    return [d for d, v in view_metrics.items() if d != "mean" and isinstance(v, dict) and "R@1" in v]


def top_level(metrics: dict) -> list[str]:
    """Entries to show, aggregates replacing their members: ``mix_0.9`` for its seeds' views,
    ``replace`` for its two hard-positive sets, SugarCrepe ``overall`` for its tasks."""
    members = {m for v in metrics.values() if isinstance(v, dict) for m in v.get("members", [])}
    return [v for v, d in metrics.items() if v != "original" and v not in members and isinstance(d, dict)]


def drop(metrics: dict, view: str, d: str) -> float | None:
    """Clean minus variant R@1 of one view and direction: the result's ``drop``, else computed."""
    vm = metrics.get(view, {}).get(d, {})
    value = vm.get("drop")
    if isinstance(value, dict) and num(value.get("R@1")) is not None:
        return num(value["R@1"])
    if num(value) is not None:
        return num(value)
    clean, var = num(metrics.get("original", {}).get(d, {}).get("R@1")), num(vm.get("R@1"))
    return None if clean is None or var is None else clean - var


def main_paths(res: dict) -> tuple[str, list[tuple[str, ...]]]:
    """The main metric's name and the metric paths it averages: ranking, clean R@1 (mean of i2t and t2i);
    choice, the suite's accuracy (over its top-level tasks); mask, the amodal gIoU; classification, clean top-1;
    a linear probe, its test top-1; a collection, the average of its tasks' main metrics."""
    m = res["metrics"]

    def present(paths):
        return [p for p in paths if num(_at(m, p)) is not None]
    if res["task_type"] == "ranking":
        o = m.get("original", {})
        if isinstance(o.get("mean"), dict) and num(o["mean"].get("R@1")) is not None:
            return "R@1 mean", [("original", "mean", "R@1")]
        return "R@1", present([("original", d, "R@1") for d in directions(o)])
    if res["task_type"] == "classification":
        return "top-1", present([(t, "clean", "acc1") for t, v in m.items() if isinstance(v, dict)])
    if res["task_type"] == "linear_probe":
        return "probe top-1", present([(t, "acc1") for t, v in m.items() if isinstance(v, dict)])
    if res["task_type"] == COLLECTION_TASK_TYPE:  # its tasks' main metrics, averaged (DataComp's Average)
        return "average", present([("Average",)])
    if res["task_type"] == "mask":
        for role in MASK_ROLES[::-1]:  # amodal first: the suite's point
            if num(m.get(role, {}).get("gIoU")) is not None:
                return f"{role} gIoU", [(role, "gIoU")]
        return "-", []
    head = (res.get("suite_meta") or {}).get("headline")  # a suite naming its headline (SugarCrepe++: ITT)
    if isinstance(head, dict) and isinstance(head.get("entries"), list):
        paths = present([(e, "all", head.get("key")) for e in head["entries"]])
        if paths:
            return f"{'/'.join(head['entries'])} {head.get('key')}", paths
    for key in _MAIN_CHOICE:
        paths = present([(t, "all", key) for t in top_level(m) if isinstance(m[t].get("all"), dict)])
        if paths:
            return key, paths
    return "-", []


def _at(tree, path):
    for k in path:
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


def main_metric(res: dict) -> tuple[str, float | None]:
    """The one number per (checkpoint, suite) of the heatmap and the pivot table (``main_paths``' mean)."""
    name, paths = main_paths(res)
    vals = [num(_at(res["metrics"], p)) for p in paths]
    return name, (sum(vals) / len(vals) if vals else None)


def leaderboard(results: list[Result], axis: Axis, suites: list[str], marks: dict | None = None) -> list[dict]:
    """One row per (checkpoint, suite), in checkpoint then suite order: ``step`` (None when the name
    holds none), ``step_unit``, ``order`` (position in the checkpoint order), the main metric, then
    the headline numbers of the terminal table. ``marks`` (``significance.main_marks``) adds the main
    metric's 95% interval (``main_ci95_low``, ``main_ci95_high``) and its gap to the suite's best checkpoint
    (``vs_best``, ``vs_best_p_holm``, ``vs_best_holds``)."""
    marks = marks or {}
    rows = []
    order = axis.order
    for r in sorted(results, key=lambda r: (order.index(r.label), suites.index(r.suite))):
        name, value = main_metric(r.data)
        step = axis.step[r.label]
        row = {"checkpoint": r.label, "step": step, "step_unit": axis.unit if step is not None else None,
               "order": order.index(r.label), "suite": r.suite, "task_type": r.data["task_type"],
               "main_metric": name, "main": None if value is None else round(value, 4)}
        mk = marks.get((r.label, r.suite), {})
        if "ci95" in mk:
            row["main_ci95_low"], row["main_ci95_high"] = (round(x, 4) for x in mk["ci95"])
        if "vs_best" in mk:
            row["vs_best"] = round(mk["vs_best"], 4)
            row["vs_best_p_holm"] = round(mk["p_holm"], 6) if "p_holm" in mk else None
            row["vs_best_holds"] = mk.get("holds") if "p_holm" in mk else None
        if r.ranking and num(r.data["metrics"].get("original", {}).get("rsum")) is not None:
            row["rsum"] = round(r.data["metrics"]["original"]["rsum"], 4)
        for k, v in summary_row(r.data).items():
            row[k] = round(v, 4) if num(v) is not None else None
        row.update({"model_fingerprint": r.data.get("model_fingerprint"), "tie_rule": r.data.get("tie_rule"),
                    "failed_items": r.data.get("failed_items", 0), "result": r.path.as_posix()})
        rows.append(row)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """The rows as CSV (atomically): the union of their keys in first-seen order, provenance last."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    cols = list(_HEAD) + [c for c in cols if c not in _TAIL and c not in _HEAD] + list(_TAIL)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def pivot(results: list[Result], order: list[str], suites: list[str]):
    """``(cell, best)``: the main metric's name and value per (checkpoint, suite), and the best value per suite."""
    cell = {(r.label, r.suite): main_metric(r.data) for r in results}
    best = {}
    for s in suites:
        vals = [cell[(l, s)][1] for l in order if (l, s) in cell and cell[(l, s)][1] is not None]
        best[s] = max(vals) if vals else None
    return cell, best
