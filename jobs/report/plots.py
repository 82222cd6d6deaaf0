"""Every figure of the report and of `hardrank bench pipeline`, as PNGs: the one module importing matplotlib."""
from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from hardrank.atomic import atomic_path
from hardrank.jobs.report.load import Axis, Result
from hardrank.jobs.report.tables import MASK_ROLES, directions, drop, main_metric, num, top_level
from hardrank.scoring.metrics import corruption_severity, variant_entries
from hardrank.suites.collections import COLLECTION_TASK_TYPE

__all__ = ["report_plots", "plot_bench", "plot_transfer", "run_colours", "vs_step_lines"]

_CHOICE_KEYS = ("accuracy", "original_accuracy", "augmented_accuracy", "group_score", "text_score", "image_score")


def report_plots(results: list[Result], by_suite: dict[str, list[Result]], axis: Axis,
                 suites: list[str]) -> dict[str, bytes | None]:
    """The report's PNGs: ``vs_step`` (metrics per suite vs checkpoint), ``drops`` (per-variant drop
    bars; None without ranking results), ``heatmap`` (main metric, checkpoint x suite) and ``severity``
    (classification top-1 vs corruption severity per checkpoint; None without ``<corruption>_<severity>``
    variants)."""
    return {"vs_step": _plot_vs_step(by_suite, axis), "drops": _plot_drops(by_suite, axis.order),
            "heatmap": _plot_heatmap(results, axis.order, suites), "severity": _plot_severity(by_suite, axis.order)}


def _figure(w: float, h: float) -> Figure:
    return Figure(figsize=(w, h), dpi=100, layout="constrained")


def _panel_grid(n: int):
    """A figure of ``n`` panels, two a row: (figure, flat axes, the colour map of checkpoints)."""
    ncol = min(2, n)
    nrow = math.ceil(n / ncol)
    fig = _figure(6.2 * ncol, 3.4 * nrow)
    return fig, fig.subplots(nrow, ncol, squeeze=False).ravel(), matplotlib.colormaps["viridis"]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _series(r: Result) -> list[tuple[str, float | None, dict]]:
    """(name, value, line style) of every curve one result contributes to its suite's panel."""
    m = r.data["metrics"]
    out = []
    if r.ranking:
        for d in directions(m.get("original", {})):
            if "@" in d:  # i2t@<variant>: that variant's images as the queries, against the clean captions
                out.append((d, num(m["original"][d].get("R@1")), {"lw": 1.2, "ls": ":"}))
            else:
                out.append((f"{d} clean", num(m["original"][d].get("R@1")), {"lw": 2.6}))
        for v in top_level(m):
            for d in directions(m[v]):
                out.append((f"{d} {v}", num(m[v][d].get("R@1")), {"lw": 1.2, "ls": "--"}))
    elif r.data["task_type"] == "classification":
        for t, groups in m.items():
            prefix = "" if len(m) == 1 else f"{t} "
            out.append((f"{prefix}top-1 clean", num(groups.get("clean", {}).get("acc1")), {"lw": 2.6}))
            shown = groups.get("corruptions") or variant_entries(groups)
            for g, gm in shown.items():
                out.append((f"{prefix}top-1 {g}", num(gm.get("acc1")), {"lw": 1.2, "ls": "--"}))
    elif r.data["task_type"] == COLLECTION_TASK_TYPE:  # the aggregates: the average drawn thickest
        for k, v in m.items():
            out.append((k, num(v), {"lw": 2.6 if k == "Average" else 1.2, "ls": "-" if k == "Average" else "--"}))
    elif r.mask:
        for role in MASK_ROLES:
            for k, style in (("gIoU", {"lw": 2.2}), ("cIoU", {"lw": 1.2, "ls": "--"})):
                out.append((f"{role} {k}", num(m.get(role, {}).get(k)), style))
    else:
        for t in top_level(m):
            all_ = m[t].get("all", {}) if isinstance(m[t], dict) else {}
            for k in _CHOICE_KEYS:
                if k in all_:
                    out.append((f"{t} {k.replace('_accuracy', '').replace('_score', '')}", num(all_[k]), {"lw": 1.6}))
    return out


_YLABEL = {"ranking": "R@1 (%)", "choice": "accuracy / score (%)", "mask": "IoU (%)", "classification": "top-1 (%)",
           COLLECTION_TASK_TYPE: "main metrics' mean (%)"}


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p")


def run_colours(results: list[Result]) -> dict[str, tuple]:
    """One colour per training run (``Result.run``), the same in every plot: tab10's, in run-name order."""
    runs = sorted({r.run for r in results})
    cmap = matplotlib.colormaps["tab10"]
    return {run: cmap(i % 10) for i, run in enumerate(runs)}


def vs_step_lines(rs: list[Result], axis: Axis) -> dict[tuple[str, str], dict]:
    """The lines of one suite's panel: {(run, series name): {"style", "stepped": [(x, y)], "other": [(x, y)]}},
    one line per run and series, points in checkpoint order (a run's steps never join another run's)."""
    lines: dict[tuple[str, str], dict] = {}
    for r in sorted(rs, key=lambda r: axis.order.index(r.label)):
        part = "stepped" if axis.step[r.label] is not None or axis.unit == "order" else "other"
        for name, value, style in _series(r):
            sr = lines.setdefault((r.run, name), {"style": style, "stepped": [], "other": []})
            if value is not None:
                sr[part].append((axis.x[r.label], value))
    return lines


def _plot_vs_step(by_suite: dict[str, list[Result]], axis: Axis) -> bytes:
    """One panel per suite: its metrics along the checkpoints' steps, joined by lines; checkpoints
    without a step (a predictions folder, ``final``) as separate markers to the right of a divider.
    Several runs (results in several run folders): one line per run and metric, each run in its colour
    (the same in every plot), each metric with its marker."""
    suites = list(by_suite)
    colours = run_colours([r for rs in by_suite.values() for r in rs])
    multi = len(colours) > 1
    ncol = 2 if len(suites) > 1 else 1
    nrow = math.ceil(len(suites) / ncol)
    fig = _figure(6.2 * ncol, 3.6 * nrow)
    axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
    for ax, suite in zip(axes, suites):
        rs = sorted(by_suite[suite], key=lambda r: axis.order.index(r.label))
        series = vs_step_lines(rs, axis)
        names = list(dict.fromkeys(name for _, name in series))
        top = 0.0
        for (run, name), sr in series.items():
            color = colours[run] if multi else None
            marker = _MARKERS[names.index(name) % len(_MARKERS)] if multi else "o"
            label = f"{run}: {name}" if multi else name
            if sr["stepped"]:
                (line,) = ax.plot(*zip(*sr["stepped"]), marker=marker, ms=4, label=label, color=color,
                                  **sr["style"])
                color = line.get_color()
            if sr["other"]:
                ax.plot(*zip(*sr["other"]), ls="none", marker="D", ms=6, color=color,
                        label=None if sr["stepped"] else label)
            top = max([top] + [v for _, v in sr["stepped"] + sr["other"]])
        ax.set_title(suite, fontsize=11)
        ax.set_ylabel(_YLABEL.get(rs[0].data["task_type"], "%") if rs else "%")
        shown = [r.label for r in rs]
        if axis.unit == "order":
            ax.set_xlabel("checkpoint (no step in the names: name order)")
            ax.set_xticks([axis.x[l] for l in shown], shown, rotation=30, ha="right", fontsize=7)
        else:
            ax.set_xlabel(axis.unit)
            others = [l for l in shown if axis.step[l] is None]
            if others:
                stepped_x = [axis.x[l] for l in shown if axis.step[l] is not None]
                lo, hi = (min(stepped_x), max(stepped_x)) if stepped_x else (0.0, 0.0)
                ticks = [t for t in ax.get_xticks() if lo <= t <= hi] if stepped_x else []
                first_other = min(axis.x[l] for l in others)
                ax.axvline((hi + first_other) / 2 if stepped_x else first_other - 0.5, color="0.6", lw=1, ls=":")
                ax.set_xticks(ticks + [axis.x[l] for l in others],
                              [f"{t:g}" for t in ticks] + [f"{l}\n(no {axis.unit})" for l in others], fontsize=7)
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


def _label_colours(by_suite: dict[str, list[Result]], order, cmap):
    """colour(label, j, n): a checkpoint's colour in the per-checkpoint plots. One run: position j of n along
    the colour map; several runs: its run's colour (``run_colours``, as in the plot against step), darker for
    later checkpoints of the run."""
    results = [r for rs in by_suite.values() for r in rs]
    runs = run_colours(results)
    if len(runs) < 2:
        return lambda label, j, n: cmap(j / max(n - 1, 1) * 0.85)
    run_of = {r.label: r.run for r in results}
    members = {run: [l for l in order if run_of.get(l) == run] for run in runs}

    def colour(label, j, n):
        run = run_of.get(label, "")
        mates = members.get(run, [label])
        k = mates.index(label) / max(len(mates) - 1, 1) if label in mates else 1.0
        base = np.array(runs.get(run, (0.5, 0.5, 0.5, 1.0))[:3])
        t = 0.45 + 0.55 * k  # early checkpoints: the run's colour blended with white
        return (*(base * t + (1.0 - t)).tolist(), 1.0)
    return colour


def _plot_drops(by_suite: dict[str, list[Result]], order) -> bytes | None:
    panels = []  # (suite, direction, views, {label: [drop per view]})
    for suite, rs in by_suite.items():
        rs = [r for r in rs if r.ranking]
        if not rs:
            continue
        shown = _sample([l for l in order if any(r.label == l for r in rs)])
        by_label = {r.label: r.data["metrics"] for r in rs}
        dirs: dict[str, list[str]] = {}
        for m in by_label.values():
            for v in top_level(m):
                for d in directions(m[v]):
                    if v not in dirs.setdefault(d, []):
                        dirs[d].append(v)
        for d, views in sorted(dirs.items()):
            panels.append((suite, d, views, {l: [drop(by_label[l], v, d) for v in views] for l in shown}))
    if not panels:
        return None
    fig, axes, cmap = _panel_grid(len(panels))
    colour = _label_colours(by_suite, order, cmap)
    for ax, (suite, d, views, vals) in zip(axes, panels):
        n = max(len(vals), 1)
        w = 0.8 / n
        for j, (label, ys) in enumerate(vals.items()):
            pos = np.arange(len(views)) + (j - (n - 1) / 2) * w
            ax.bar(pos, [0 if y is None else y for y in ys], w, label=label,
                   color=colour(label, j, n))
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(views)), views, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("drop in R@1 (points)")
        ax.set_title(f"{suite}: {d} (clean - variant)", fontsize=11)
        ax.grid(axis="y", alpha=0.3)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + (hi - lo) * 0.35)  # headroom: the legend sits above the bars, not on them
        ax.legend(fontsize=7, title="checkpoint", title_fontsize=7, loc="upper left", ncol=3)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _png(fig)


def _severity_curves(metrics: dict) -> dict[str, dict[int, float]]:
    """{corruption: {severity: top-1}} of one classification result (seed means where there are several seeds;
    severity 0 = the clean images)."""
    out: dict[str, dict[int, float]] = {}
    for groups in metrics.values():
        if not isinstance(groups, dict):
            continue
        for g, gm in variant_entries(groups).items():
            cs = corruption_severity(g)
            if cs is not None and num(gm.get("acc1")) is not None:
                out.setdefault(cs[0], {0: num(groups.get("clean", {}).get("acc1"))})[cs[1]] = num(gm["acc1"])
    return out


def _plot_severity(by_suite: dict[str, list[Result]], order) -> bytes | None:
    """One panel per (classification suite, corruption): top-1 against severity (0 = clean), a line per checkpoint."""
    panels = []  # (suite, corruption, {label: {severity: top-1}})
    for suite, rs in by_suite.items():
        curves: dict[str, dict[str, dict[int, float]]] = {}
        for r in rs:
            if r.data["task_type"] == "classification":
                for c, pts in _severity_curves(r.data["metrics"]).items():
                    curves.setdefault(c, {})[r.label] = pts
        panels += [(suite, c, per) for c, per in sorted(curves.items())]
    if not panels:
        return None
    fig, axes, cmap = _panel_grid(len(panels))
    colour = _label_colours(by_suite, order, cmap)
    for ax, (suite, corruption, per) in zip(axes, panels):
        shown = _sample([l for l in order if l in per])
        for j, label in enumerate(shown):
            pts = sorted((s, v) for s, v in per[label].items() if v is not None)
            ax.plot(*zip(*pts), marker="o", ms=4, label=label, color=colour(label, j, len(shown)))
        ax.set_xlabel("severity (0 = clean)")
        ax.set_ylabel("top-1 (%)")
        ax.set_title(f"{suite}: {corruption}", fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="checkpoint", title_fontsize=7, loc="best")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    return _png(fig)


def _plot_heatmap(results: list[Result], order: list[str], suites: list[str]) -> bytes:
    grid = np.full((len(order), len(suites)), np.nan)
    names = {}
    for r in results:
        name, v = main_metric(r.data)
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


def plot_transfer(doc: dict) -> bytes:
    """Heat map of an attack's transfer matrix (``hardrank attack``): rows = the checkpoint the variants
    were found against, columns = the checkpoint evaluated; cells = R@1 drop (clean - adversarial), points."""
    grid = np.array([[np.nan if v is None else v for v in row] for row in doc["drop_R@1"]], dtype=float)
    rows, cols = doc["attackers"], doc["evaluated"]
    fig = _figure(2.2 + 0.9 * len(cols), 1.4 + 0.45 * len(rows))
    ax = fig.subplots()
    hi = max(float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0, 1.0)
    im = ax.imshow(grid, cmap="magma_r", vmin=0, vmax=hi, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, fontsize=8, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("evaluated checkpoint", fontsize=9)
    ax.set_ylabel("variants found against", fontsize=9)
    for i in range(len(rows)):
        for j in range(len(cols)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if grid[i, j] > hi * 0.6 else "black")
    fig.colorbar(im, ax=ax, label=f"{doc['direction']} R@1 drop, points")
    ax.set_title(f"attack transfer ({doc['modality']}): {doc['direction']} R@1 drop", fontsize=11)
    return _png(fig)


def plot_bench(bench: dict, path: str | Path) -> Path:
    """Bar chart of a ``hardrank bench pipeline`` JSON: items/s per stage, engine vs naive, and
    end-to-end seconds."""
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
    png = _png(fig)
    with atomic_path(path) as tmp:
        tmp.write_bytes(png)
    return path
