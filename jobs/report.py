"""`hardrank report`: a results folder -> leaderboard.csv, a self-contained report.html and report.md with plots."""
from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import json
import logging
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["build_report", "parse_step", "add_report_parser", "plot_bench"]

log = logging.getLogger("hardrank.report")

# "step0200", "epoch_3", "iter-1000", "global_step5": the unit and the number. Checkpoint names
# without one are placed in name order instead.
_STEP = re.compile(r"(?<![a-z])(global_step|step|epoch|iteration|iter|it|ckpt|checkpoint)[_\-]?(\d+)", re.I)
_IMAGE_EXT = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
_CHOICE_KEYS = ("accuracy", "original_accuracy", "augmented_accuracy", "group_score", "text_score", "image_score")
_MAIN_CHOICE = ("accuracy", "augmented_accuracy", "group_score", "i2t_accuracy")
_REQUIRED = ("suite", "checkpoint", "task_type", "metrics")


def parse_step(name: str) -> tuple[str, int] | None:
    """``("step", 200)`` for ``toy-clip_step0200``, ``("epoch", 3)`` for ``epoch_3``; None if the name
    holds no step (the last match wins: ``run2_epoch_3`` is epoch 3)."""
    found = _STEP.findall(name)
    if not found:
        return None
    unit, num = found[-1]
    return unit.lower(), int(num)


def _natural(s: str):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s)]


@dataclass
class _Result:
    path: Path            # the result JSON
    data: dict            # its content
    label: str            # checkpoint label shown in the report

    @property
    def suite(self) -> str:
        return self.data["suite"]

    @property
    def ranking(self) -> bool:
        return self.data["task_type"] == "ranking"


# -- loading ---------------------------------------------------------------------------------
def _load(results_dir: Path, skip: Path | None) -> list[_Result]:
    if not results_dir.is_dir():
        raise FileNotFoundError(f"results folder {results_dir} does not exist; pass the --out folder of "
                                f"`hardrank eval` (it holds <checkpoint>/<suite>.json)")
    found: list[_Result] = []
    for p in sorted(results_dir.rglob("*.json")):
        if p.name.startswith(".") or (skip is not None and skip in p.resolve().parents):
            continue
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            log.warning("skipping %s: not readable JSON (%s)", p, exc)
            continue
        if isinstance(data, dict) and all(k in data for k in _REQUIRED):
            found.append(_Result(p, data, str(data["checkpoint"])))
    if not found:
        raise FileNotFoundError(f"no result files under {results_dir}: expected <checkpoint>/<suite>.json files "
                                f"with keys {list(_REQUIRED)}, as written by `hardrank eval --out {results_dir}`")
    seen: dict[tuple[str, str], int] = {}
    for r in found:
        seen[(r.label, r.suite)] = seen.get((r.label, r.suite), 0) + 1
    if any(n > 1 for n in seen.values()):  # several runs under one folder: label by their folder
        for r in found:
            r.label = r.path.parent.relative_to(results_dir).as_posix()
    return found


def _checkpoint_axis(labels: list[str]) -> tuple[list[str], dict[str, float], str]:
    """Checkpoints in step order, their x positions, and the axis name ("step", "epoch" or "order")."""
    steps = {l: parse_step(l) for l in labels}
    units = {s[0] for s in steps.values() if s is not None}
    if all(s is not None for s in steps.values()) and len(units) == 1:
        order = sorted(labels, key=lambda l: (steps[l][1], _natural(l)))
        return order, {l: float(steps[l][1]) for l in order}, units.pop()
    order = sorted(labels, key=_natural)
    return order, {l: float(i) for i, l in enumerate(order)}, "order"


# -- metrics ---------------------------------------------------------------------------------
def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _directions(view_metrics: dict) -> list[str]:
    return [d for d, v in view_metrics.items() if d != "mean" and isinstance(v, dict) and "R@1" in v]


def _top_level(metrics: dict) -> list[str]:
    """Entries to show, aggregates replacing their members: ``mix_0.9`` for its seeds' views,
    ``replace`` for its two hard-positive sets, SugarCrepe ``overall`` for its tasks."""
    members = {m for v in metrics.values() if isinstance(v, dict) for m in v.get("members", [])}
    return [v for v, d in metrics.items() if v != "original" and v not in members and isinstance(d, dict)]


_variant_views = _top_level


def _drop(metrics: dict, view: str, d: str) -> float | None:
    vm = metrics.get(view, {}).get(d, {})
    drop = vm.get("drop")
    if isinstance(drop, dict) and _num(drop.get("R@1")) is not None:
        return _num(drop["R@1"])
    if _num(drop) is not None:
        return _num(drop)
    clean, var = _num(metrics.get("original", {}).get(d, {}).get("R@1")), _num(vm.get("R@1"))
    return None if clean is None or var is None else clean - var


def _main_metric(res: dict) -> tuple[str, float | None]:
    """The one number per (checkpoint, suite) of the heatmap and the pivot table."""
    m = res["metrics"]
    if res["task_type"] == "ranking":
        o = m.get("original", {})
        if isinstance(o.get("mean"), dict) and _num(o["mean"].get("R@1")) is not None:
            return "R@1 mean", _num(o["mean"]["R@1"])
        vals = [_num(o[d]["R@1"]) for d in _directions(o)]
        vals = [v for v in vals if v is not None]
        return "R@1", (sum(vals) / len(vals) if vals else None)
    for key in _MAIN_CHOICE:
        vals = [_num(m[t]["all"].get(key)) for t in _top_level(m) if isinstance(m[t].get("all"), dict)
                and key in m[t]["all"]]
        vals = [v for v in vals if v is not None]
        if vals:
            return key, sum(vals) / len(vals)
    return "-", None


def _leaderboard(results: list[_Result], order: list[str], suites: list[str], x: dict[str, float],
                 unit: str) -> list[dict]:
    from hardrank.results import summary_row

    rows = []
    for r in sorted(results, key=lambda r: (order.index(r.label), suites.index(r.suite))):
        name, value = _main_metric(r.data)
        row = {"checkpoint": r.label, unit: int(x[r.label]),
               "suite": r.suite, "task_type": r.data["task_type"], "main_metric": name,
               "main": None if value is None else round(value, 4)}
        if r.ranking and _num(r.data["metrics"].get("original", {}).get("rsum")) is not None:
            row["rsum"] = round(r.data["metrics"]["original"]["rsum"], 4)
        for k, v in summary_row(r.data).items():
            row[k] = round(v, 4) if _num(v) is not None else None
        row.update({"model_fingerprint": r.data.get("model_fingerprint"), "tie_rule": r.data.get("tie_rule"),
                    "failed_items": r.data.get("failed_items", 0), "result": r.path.as_posix()})
        rows.append(row)
    return rows


def _write_csv(rows: list[dict], path: Path) -> None:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    tail = ["model_fingerprint", "tie_rule", "failed_items", "result"]
    cols = [c for c in cols if c not in tail] + tail
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    tmp.replace(path)


# -- plots (matplotlib lives only in this module) --------------------------------------------
def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _plot_vs_step(by_suite: dict[str, list[_Result]], order, x, unit) -> bytes:
    suites = list(by_suite)
    ncol = 2 if len(suites) > 1 else 1
    nrow = math.ceil(len(suites) / ncol)
    fig = _figure(6.2 * ncol, 3.6 * nrow)
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax, suite in zip(axes, suites):
        rs = sorted(by_suite[suite], key=lambda r: order.index(r.label))
        xs = [x[r.label] for r in rs]
        series: dict[str, list] = {}
        style: dict[str, dict] = {}
        for i, r in enumerate(rs):
            m = r.data["metrics"]
            if r.ranking:
                for d in _directions(m.get("original", {})):
                    series.setdefault(f"{d} clean", [None] * len(rs))[i] = _num(m["original"][d].get("R@1"))
                    style[f"{d} clean"] = {"lw": 2.6}
                for v in _variant_views(m):
                    for d in _directions(m[v]):
                        series.setdefault(f"{d} {v}", [None] * len(rs))[i] = _num(m[v][d].get("R@1"))
                        style.setdefault(f"{d} {v}", {"lw": 1.2, "ls": "--"})
                ax.set_ylabel("R@1 (%)")
            else:
                for t in _top_level(m):
                    all_ = m[t].get("all", {}) if isinstance(m[t], dict) else {}
                    for k in _CHOICE_KEYS:
                        if k in all_:
                            series.setdefault(f"{t} {k.replace('_accuracy', '').replace('_score', '')}",
                                              [None] * len(rs))[i] = _num(all_[k])
                ax.set_ylabel("%")
        top = 0.0
        for name, ys in series.items():
            pts = [(a, b) for a, b in zip(xs, ys) if b is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=4, label=name, **style.get(name, {"lw": 1.6}))
                top = max([top] + [b for _, b in pts])
        ax.set_title(suite, fontsize=11)
        ax.set_xlabel(unit if unit != "order" else "checkpoint (name order)")
        if unit == "order":
            ax.set_xticks(xs, [r.label for r in rs], rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 102 if top > 60 else max(top * 1.25, 1.0))  # near-chance checkpoints stay readable
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7, ncol=2, loc="best")
    for ax in axes[len(suites):]:
        ax.set_visible(False)
    return _png(fig)


def _sample(order: list[str], n: int = 6) -> list[str]:
    if len(order) <= n:
        return order
    return [order[round(i * (len(order) - 1) / (n - 1))] for i in range(n)]


def _plot_drops(by_suite: dict[str, list[_Result]], order) -> bytes | None:
    panels = []  # (suite, direction, views, {label: [drop per view]})
    for suite, rs in by_suite.items():
        rs = [r for r in rs if r.ranking]
        if not rs:
            continue
        shown = [l for l in _sample([l for l in order if any(r.label == l for r in rs)])]
        by_label = {r.label: r.data["metrics"] for r in rs}
        dirs: dict[str, list[str]] = {}
        for m in by_label.values():
            for v in _variant_views(m):
                for d in _directions(m[v]):
                    if v not in dirs.setdefault(d, []):
                        dirs[d].append(v)
        for d, views in sorted(dirs.items()):
            panels.append((suite, d, views, {l: [_drop(by_label[l], v, d) for v in views] for l in shown}))
    if not panels:
        return None
    ncol = min(2, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig = _figure(6.2 * ncol, 3.4 * nrow)
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    import numpy as np

    for ax, (suite, d, views, vals) in zip(axes, panels):
        n = max(len(vals), 1)
        w = 0.8 / n
        cmap = _cmap("viridis")
        for j, (label, ys) in enumerate(vals.items()):
            pos = np.arange(len(views)) + (j - (n - 1) / 2) * w
            ax.bar(pos, [0 if y is None else y for y in ys], w, label=label,
                   color=cmap(j / max(n - 1, 1) * 0.85))
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(views)), views, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("drop in R@1 (points)")
        ax.set_title(f"{suite}: {d} (clean - variant)", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, title="checkpoint", title_fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _png(fig)


def _cmap(name: str):
    import matplotlib

    return matplotlib.colormaps[name]


def _plot_heatmap(results: list[_Result], order: list[str], suites: list[str]) -> bytes:
    import numpy as np

    grid = np.full((len(order), len(suites)), np.nan)
    names = {}
    for r in results:
        name, v = _main_metric(r.data)
        names[r.suite] = name
        if v is not None:
            grid[order.index(r.label), suites.index(r.suite)] = v
    fig = _figure(1.6 + 1.7 * len(suites), 1.2 + 0.42 * len(order))
    ax = fig.subplots()
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(suites)), [f"{s}\n{names.get(s, '')}" for s in suites], fontsize=8)
    ax.set_yticks(range(len(order)), order, fontsize=8)
    for i in range(len(order)):
        for j in range(len(suites)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if grid[i, j] < 60 else "black")
    fig.colorbar(im, ax=ax, label="%")
    ax.set_title("main metric per checkpoint and suite", fontsize=11)
    return _png(fig)


def plot_bench(bench: dict, path: str | Path) -> Path:
    """Bar chart of a ``hardrank bench pipeline`` JSON: items/s per stage, engine vs naive, and
    end-to-end seconds."""
    import numpy as np

    stages = [s for s in bench["stages"] if s.get("engine_items_per_s")]
    fig = _figure(12, 4.2)
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[2.2, 1])
    pos = np.arange(len(stages))
    ax1.bar(pos - 0.2, [s["engine_items_per_s"] for s in stages], 0.4, label="hardrank", color="#2a7ab0")
    ax1.bar(pos + 0.2, [s.get("naive_items_per_s") or 0 for s in stages], 0.4, label="naive", color="#c0504d")
    ax1.set_yscale("log")
    ax1.set_xticks(pos, [s["stage"] for s in stages], rotation=25, ha="right", fontsize=8)
    ax1.set_ylabel("items/s (log)")
    ax1.set_title("per-stage throughput", fontsize=11)
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)
    e2e = bench["end_to_end"]
    labels = ["hardrank (cold)", "hardrank (warm)", "naive"]
    vals = [e2e.get("engine_cold_s"), e2e.get("engine_warm_s"), e2e.get("naive_s")]
    ax2.bar(range(3), [v or 0 for v in vals], color=["#2a7ab0", "#7fb2d6", "#c0504d"])
    ax2.set_xticks(range(3), labels, rotation=15, fontsize=8)
    ax2.set_ylabel("seconds")
    sp = e2e.get("speedup")
    ax2.set_title(f"end to end ({sp:.1f}x vs naive)" if sp else "end to end", fontsize=11)
    path = Path(path)
    path.write_bytes(_png(fig))
    return path


# -- failures --------------------------------------------------------------------------------
def _image_roots(res: dict, results_dir: Path) -> list[Path]:
    meta = res.get("suite_meta") or {}
    opts = (res.get("provenance") or {}).get("suite_options") or {}
    roots = [meta.get("images_root"), meta.get("images"), opts.get("images")]
    out = [Path(r) for r in roots if isinstance(r, str) and r]
    if isinstance(meta.get("world"), str):
        out.append(Path(meta["world"]) / "images")
    out.append(results_dir)
    return out


def _is_image(task: str, role: str, value: str) -> bool:
    if task.lower() in ("i2t", "t2i"):
        return (task.lower()[0] == "i") if role == "query" else (task.lower()[-1] == "i")
    return value.lower().endswith(_IMAGE_EXT)


class _Thumbs:
    """Small base64 PNG thumbnails of image ids that exist on disk (cached by path)."""

    def __init__(self, size: int = 96):
        self.size = size
        self.cache: dict[Path, str | None] = {}

    def __call__(self, value: str, roots: list[Path]) -> str | None:
        cands = [Path(value)] if Path(value).is_absolute() else [r / value for r in roots]
        for p in cands:
            if p in self.cache:
                return self.cache[p]
            if p.is_file():
                self.cache[p] = self._encode(p)
                return self.cache[p]
        return None

    def _encode(self, p: Path) -> str | None:
        try:
            from PIL import Image

            with Image.open(p) as im:
                im = im.convert("RGB")
                im.thumbnail((self.size, self.size))
                buf = io.BytesIO()
                im.save(buf, format="PNG")
            return base64.b64encode(buf.getvalue()).decode()
        except Exception as exc:  # a broken image must not break the report
            log.warning("no thumbnail for %s: %s", p, exc)
            return None


def _failures(by_suite: dict[str, list[_Result]], order: list[str], top: int) -> dict[str, dict]:
    """Per ranking suite: the last checkpoint's queries whose top-1 is a perturbed item, the most
    persistent first (failing in most checkpoints), then the worst rank of the true match."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    out = {}
    cols = ["kind", "task", "view", "query_id", "rank", "top1_id", "top1_group"]
    for suite, rs in by_suite.items():
        rs = sorted([r for r in rs if r.ranking], key=lambda r: order.index(r.label))
        per_ckpt = []
        for r in rs:
            p = r.path.with_suffix(".parquet")
            if not p.is_file():
                continue
            t = pq.read_table(p, columns=cols)
            mask = pc.and_(pc.and_(pc.equal(t["kind"], "ranking"), pc.not_equal(t["view"], "original")),
                           pc.not_equal(t["top1_group"], "original"))
            per_ckpt.append((r, t.filter(pc.fill_null(mask, False)).to_pylist()))
        if not per_ckpt:
            continue
        counts: dict[tuple, int] = {}
        for _, rows in per_ckpt:
            for row in rows:
                k = (row["task"], row["view"], row["query_id"])
                counts[k] = counts.get(k, 0) + 1
        last, rows = per_ckpt[-1]
        by_task: dict[str, list] = {}
        for row in rows:
            row["fails_in"] = counts[(row["task"], row["view"], row["query_id"])]
            by_task.setdefault(row["task"], []).append(row)
        for task_rows in by_task.values():
            task_rows.sort(key=lambda r: (-r["fails_in"], -(r["rank"] or 0), r["view"], r["query_id"]))
        shown = []  # take from each direction in turn, so i2t and t2i failures both show
        for i in range(max((len(v) for v in by_task.values()), default=0)):
            shown.extend(v[i] for _, v in sorted(by_task.items()) if i < len(v))
        out[suite] = {"checkpoint": last.label, "checkpoints": len(per_ckpt), "total": len(rows),
                      "rows": shown[:top], "result": last}
    return out


# -- rendering -------------------------------------------------------------------------------
_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1320px;color:#222}
h1{margin-bottom:4px} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
.meta{color:#666;font-size:13px} table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;vertical-align:middle} th{background:#f3f5f7;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} td.best{font-weight:bold;background:#e8f4e8}
img.plot{max-width:100%;border:1px solid #eee;margin:8px 0} img.thumb{width:64px;height:64px;
image-rendering:pixelated;display:block} .small{font-size:12px;color:#555} code{font-size:12px}
td.text{max-width:420px}
"""


def _fmt(v) -> str:
    n = _num(v)
    return "-" if v is None or v == "" else (f"{n:.2f}" if n is not None and not isinstance(v, int) else str(v))


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _md_cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _pivot(results: list[_Result], order: list[str], suites: list[str]):
    cell = {(r.label, r.suite): _main_metric(r.data) for r in results}
    best = {}
    for s in suites:
        vals = [cell[(l, s)][1] for l in order if (l, s) in cell and cell[(l, s)][1] is not None]
        best[s] = max(vals) if vals else None
    return cell, best


def _cell_html(value: str, roots: list[Path], image: bool, thumbs: _Thumbs) -> str:
    b64 = thumbs(value, roots) if image else None
    img = f'<img class="thumb" src="data:image/png;base64,{b64}" alt="">' if b64 else ""
    return f'{img}<code>{_esc(value)}</code>' if image else _esc(value)


def _render_html(ctx: dict, thumbs: _Thumbs) -> str:
    order, suites, results = ctx["order"], ctx["suites"], ctx["results"]
    cell, best = _pivot(results, order, suites)
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         "<title>hardrank report</title>", f"<style>{_CSS}</style></head><body>",
         "<h1>hardrank report</h1>",
         f'<p class="meta">{_esc(ctx["results_dir"])} &middot; {len(results)} results, {len(order)} checkpoints, '
         f'{len(suites)} suites &middot; generated {_esc(ctx["generated"])}</p>',
         "<h2>Leaderboard</h2>",
         '<p class="small">Main metric per suite (ranking: clean R@1, mean of i2t and t2i; choice: accuracy). '
         'Best per suite in bold. All headline numbers are in <code>leaderboard.csv</code>.</p>',
         "<table><tr><th>checkpoint</th>" + "".join(
             f"<th>{_esc(s)}<br><span class='small'>{_esc(next((cell[(l, s)][0] for l in order if (l, s) in cell), ''))}"
             f"</span></th>" for s in suites) + "</tr>"]
    for l in order:
        tds = []
        for s in suites:
            v = cell.get((l, s), (None, None))[1]
            cls = "num best" if v is not None and v == best[s] else "num"
            tds.append(f'<td class="{cls}">{_fmt(v)}</td>')
        h.append(f"<tr><td>{_esc(l)}</td>{''.join(tds)}</tr>")
    h.append("</table>")
    for key, title, note in (
            ("vs_step", "Metrics vs checkpoint", "Solid: clean protocol; dashed: with the variant's items added."),
            ("drops", "Per-variant drop", "Clean R@1 minus R@1 with the variant's perturbed items in the gallery."),
            ("heatmap", "Checkpoint x suite", "")):
        if ctx["plots"].get(key):
            b64 = base64.b64encode(ctx["plots"][key]).decode()
            h.append(f"<h2>{title}</h2>" + (f'<p class="small">{note}</p>' if note else "")
                     + f'<img class="plot" alt="{_esc(title)}" src="data:image/png;base64,{b64}">')
    h.append("<h2>Worst failures</h2>")
    if not ctx["failures"]:
        h.append('<p class="small">No ranking results with per-query outcomes (Parquet) found.</p>')
    for suite, f in ctx["failures"].items():
        roots = _image_roots(f["result"].data, ctx["results_dir_path"])
        h.append(f"<h3>{_esc(suite)} &middot; checkpoint {_esc(f['checkpoint'])}</h3>"
                 f'<p class="small">{f["total"]} queries whose top-1 is a perturbed item; showing {len(f["rows"])}, '
                 f"per direction those failing in the most of the {f['checkpoints']} checkpoints first, then by the "
                 f"rank of the true match.</p>")
        h.append('<table class="failures"><tr><th>task</th><th>view</th><th>query</th><th>top-1 (perturbed)</th>'
                 "<th>group</th><th>true rank</th><th>fails in</th></tr>")
        for r in f["rows"]:
            q = _cell_html(r["query_id"], roots, _is_image(r["task"], "query", r["query_id"]), thumbs)
            t = _cell_html(r["top1_id"], roots, _is_image(r["task"], "top1", r["top1_id"]), thumbs)
            h.append(f'<tr><td>{_esc(r["task"])}</td><td>{_esc(r["view"])}</td><td class="text">{q}</td>'
                     f'<td class="text">{t}</td><td>{_esc(r["top1_group"])}</td><td class="num">{r["rank"] + 1}</td>'
                     f'<td class="num">{r["fails_in"]}/{f["checkpoints"]}</td></tr>')
        h.append("</table>")
    h.append("<h2>All headline metrics</h2><details><summary>show table</summary><table><tr>")
    cols = [c for c in ctx["columns"] if c not in ("result", "model_fingerprint")]
    h.append("".join(f"<th>{_esc(c)}</th>" for c in cols) + "</tr>")
    for row in ctx["rows"]:
        h.append("<tr>" + "".join(f'<td class="num">{_fmt(row.get(c))}</td>' if _num(row.get(c)) is not None
                                  else f"<td>{_esc(_fmt(row.get(c)))}</td>" for c in cols) + "</tr>")
    h.append("</table></details></body></html>")
    return "\n".join(h)


def _render_md(ctx: dict, plot_files: dict[str, str]) -> str:
    order, suites, results = ctx["order"], ctx["suites"], ctx["results"]
    cell, best = _pivot(results, order, suites)
    md = ["# hardrank report", "", f"{ctx['results_dir']}: {len(results)} results, {len(order)} checkpoints, "
          f"{len(suites)} suites; generated {ctx['generated']}.", "", "## Leaderboard", "",
          "Main metric per suite (ranking: clean R@1, mean of i2t and t2i; choice: accuracy); best in bold.", "",
          "| checkpoint | " + " | ".join(_md_cell(s) for s in suites) + " |",
          "|---|" + "---:|" * len(suites)]
    for l in order:
        vals = []
        for s in suites:
            v = cell.get((l, s), (None, None))[1]
            vals.append(f"**{_fmt(v)}**" if v is not None and v == best[s] else _fmt(v))
        md.append(f"| {_md_cell(l)} | " + " | ".join(vals) + " |")
    for key, title in (("vs_step", "Metrics vs checkpoint"), ("drops", "Per-variant drop"),
                       ("heatmap", "Checkpoint x suite")):
        if key in plot_files:
            md += ["", f"## {title}", "", f"![{title}]({plot_files[key]})"]
    md += ["", "## Worst failures"]
    for suite, f in ctx["failures"].items():
        md += ["", f"### {suite} (checkpoint {f['checkpoint']})", "",
               f"{f['total']} queries whose top-1 is a perturbed item; the {len(f['rows'])} most persistent:", "",
               "| task | view | query | top-1 (perturbed) | group | true rank | fails in |",
               "|---|---|---|---|---|---:|---:|"]
        for r in f["rows"]:
            md.append(f"| {r['task']} | {_md_cell(r['view'])} | {_md_cell(r['query_id'])} | {_md_cell(r['top1_id'])} "
                      f"| {_md_cell(r['top1_group'])} | {r['rank'] + 1} | {r['fails_in']}/{f['checkpoints']} |")
    return "\n".join(md) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def build_report(results_dir: str | Path, out: str | Path | None = None, *, top: int = 20) -> dict[str, Path]:
    """Write ``leaderboard.csv``, ``report.html`` (plots embedded) and ``report.md`` (+ ``plots/*.png``)
    for every ``<checkpoint>/<suite>.json`` under ``results_dir``. Returns their paths."""
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    results_dir = Path(results_dir)
    out = Path(out) if out is not None else results_dir / "report"
    results = _load(results_dir, skip=out.resolve() if out.exists() else None)
    out.mkdir(parents=True, exist_ok=True)
    order, x, unit = _checkpoint_axis(sorted({r.label for r in results}))
    suites = sorted({r.suite for r in results}, key=lambda s: (not any(r.ranking for r in results if r.suite == s), s))
    by_suite = {s: [r for r in results if r.suite == s] for s in suites}
    rows = _leaderboard(results, order, suites, x, unit)
    _write_csv(rows, out / "leaderboard.csv")
    plots = {"vs_step": _plot_vs_step(by_suite, order, x, unit), "drops": _plot_drops(by_suite, order),
             "heatmap": _plot_heatmap(results, order, suites)}
    (out / "plots").mkdir(exist_ok=True)
    plot_files = {}
    for k, png in plots.items():
        if png:
            (out / "plots" / f"{k}.png").write_bytes(png)
            plot_files[k] = f"plots/{k}.png"
    columns: list[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    ctx = {"results": results, "order": order, "suites": suites, "plots": plots, "rows": rows, "columns": columns,
           "failures": _failures(by_suite, order, top), "results_dir": str(results_dir),
           "results_dir_path": results_dir, "generated": time.strftime("%Y-%m-%d %H:%M:%S")}
    _atomic_write(out / "report.html", _render_html(ctx, _Thumbs()))
    _atomic_write(out / "report.md", _render_md(ctx, plot_files))
    return {"csv": out / "leaderboard.csv", "html": out / "report.html", "md": out / "report.md",
            **{f"plot_{k}": out / v for k, v in plot_files.items()}}


# -- CLI -------------------------------------------------------------------------------------
def _cmd_report(args) -> int:
    if args.top < 0:
        print(f"hardrank report: --top must be >= 0, got {args.top}", file=sys.stderr)
        return 2
    paths = build_report(args.results, args.out, top=args.top)
    for k in ("csv", "html", "md"):
        print(paths[k])
    return 0


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank report RESULTS_DIR [--out DIR] [--top N]``."""
    p = subparsers.add_parser(
        "report", help="leaderboard CSV + HTML/Markdown report with plots from a results folder",
        description="Turn a results folder (<checkpoint>/<suite>.json + .parquet, from `hardrank eval`) into "
                    "leaderboard.csv, a self-contained report.html (plots embedded) and report.md. Checkpoints are "
                    "ordered by the step in their name (step0200, epoch_3, ...), else by name.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hardrank report results/demo\n  hardrank report results/exp1 --out reports/exp1 --top 50\n"
               "  xdg-open results/demo/report/report.html")
    p.add_argument("results", metavar="RESULTS_DIR", help="the --out folder of `hardrank eval` / `hardrank run`")
    p.add_argument("--out", default=None, help="report folder (default: RESULTS_DIR/report)")
    p.add_argument("--top", type=int, default=20, help="worst failures listed per suite (default 20)")
    p.set_defaults(func=_cmd_report)
    return p
