"""Building a report: a results folder -> leaderboard.csv, report.html, report.md and plots/*.png."""
from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

from hardrank.atomic import atomic_path, write_text_atomic
from hardrank.attack_run import TRANSFER_KIND
from hardrank.config import check_writable_dir
from hardrank.errors import MissingExtra, UsageError
from hardrank.jobs.report.failures import Thumbs, worst_failures
from hardrank.jobs.report.load import checkpoint_axis, load_results
from hardrank.jobs.report.render import render_html, render_md
from hardrank.jobs.report.significance import main_marks
from hardrank.jobs.report.tables import leaderboard, write_csv

__all__ = ["build_report", "plot_bench"]


def _plots(what: str):
    """The plots module, imported on first use: matplotlib is the optional extra ``report``."""
    try:
        return importlib.import_module(f"{__package__}.plots")
    except ModuleNotFoundError as exc:
        if exc.name != "matplotlib" and not (exc.name or "").startswith("matplotlib."):
            raise
        raise MissingExtra(what, "report", "matplotlib") from exc


def _transfers(results_dir: Path, skip: Path) -> dict[str, dict]:
    """Attack transfer matrices (``transfer_<modality>.json`` of ``hardrank attack``) below ``results_dir``,
    keyed ``transfer_<modality>`` (``transfer_<modality>_<n>`` when several)."""
    found: dict[str, dict] = {}
    for p in sorted(results_dir.rglob("transfer_*.json")):
        if skip.resolve() in p.resolve().parents:
            continue
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == TRANSFER_KIND:
            key = f"transfer_{doc['modality']}"
            n = sum(k == key or k.startswith(key + "_") for k in found)
            found[key if not n else f"{key}_{n}"] = doc
    return found


def build_report(results_dir: str | Path, out: str | Path | None = None, *, top: int = 20) -> dict[str, Path]:
    """Write ``leaderboard.csv``, ``report.html`` (plots embedded) and ``report.md`` (+ ``plots/*.png``)
    for every ``<checkpoint>/<suite>.json`` under ``results_dir``. Returns their paths. Needs
    matplotlib (``pip install 'hardrank[report]'``); raises ``MissingExtra`` before any work without it.

    A report folder that cannot be written is refused before anything is read past the JSON files. Every
    part is made in memory before the first file is written (each atomically), so a problem found on the
    way leaves the folder as it was; a damaged per-query Parquet is named (logged, and in the report's
    worst-failures section) and its checkpoint's failures left out: the metrics come from the JSON files."""
    if top < 0:
        raise UsageError(f"top must be >= 0, got {top}")
    plots = _plots("hardrank report")
    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / "report"
    results = load_results(results_dir, skip=out.resolve() if out.exists() else None)
    check_writable_dir(out, "out (--out; default RESULTS_DIR/report)")
    axis = checkpoint_axis(sorted({r.label for r in results}))
    order = axis.order
    kinds = {"ranking": 0, "choice": 1, "mask": 2}  # ranking suites first, mask suites last
    suites = sorted({r.suite for r in results},
                    key=lambda s: (min(kinds.get(r.data["task_type"], 3) for r in results if r.suite == s), s))
    by_suite = {s: [r for r in results if r.suite == s] for s in suites}
    marks = main_marks(by_suite)  # the main metric's interval and whether its gap to the best holds
    rows = leaderboard(results, axis, suites, marks)
    pngs = plots.report_plots(results, by_suite, axis, suites)
    for name, doc in _transfers(results_dir, out).items():
        pngs[name] = plots.plot_transfer(doc)
    plot_files = {k: f"plots/{k}.png" for k, png in pngs.items() if png}
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    unreadable: list[tuple[Path, str]] = []
    ctx = {"results": results, "order": order, "axis": axis, "suites": suites, "plots": pngs, "rows": rows,
           "marks": marks,
           "columns": columns,
           "failures": worst_failures(by_suite, order, top, unreadable), "unreadable": unreadable,
           "results_dir": str(results_dir), "results_dir_path": results_dir,
           "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    html, md = render_html(ctx, Thumbs()), render_md(ctx, plot_files)
    # everything is made: now written, each file atomically
    write_csv(rows, out / "leaderboard.csv")
    if plot_files:
        (out / "plots").mkdir(exist_ok=True)
    for k, rel in plot_files.items():
        with atomic_path(out / rel, len(pngs[k])) as tmp:
            tmp.write_bytes(pngs[k])
    write_text_atomic(out / "report.html", html)
    write_text_atomic(out / "report.md", md)
    return {"csv": out / "leaderboard.csv", "html": out / "report.html", "md": out / "report.md",
            **{f"plot_{k}": out / v for k, v in plot_files.items()}}


def plot_bench(bench: dict, path: str | Path) -> Path:
    """Bar chart of a ``hardrank bench pipeline`` JSON at ``path`` (PNG): items/s per stage, engine vs
    naive, and end-to-end seconds. Needs matplotlib, like ``build_report``."""
    return _plots("the plot of `hardrank bench pipeline`").plot_bench(bench, path)
