"""The report as text: a self-contained HTML page (plots and thumbnails embedded) and its Markdown twin."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from hardrank.jobs.report.failures import Thumbs, image_roots, is_image
from hardrank.jobs.report.tables import MASK_ROLES, num, pivot

__all__ = ["render_html", "render_md"]

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1320px;color:#222}
h1{margin-bottom:4px} h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:32px}
.meta{color:#666;font-size:13px} table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;vertical-align:middle} th{background:#f3f5f7;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} td.best{font-weight:bold;background:#e8f4e8}
td.tied{background:#f1f8f1}
img.plot{max-width:100%;border:1px solid #eee;margin:8px 0} img.thumb{width:64px;height:64px;
image-rendering:pixelated;display:block} .small{font-size:12px;color:#555} code{font-size:12px}
td.text{max-width:420px}
"""


_MAIN_NOTE = ("Main metric per suite: ranking, clean R@1 (mean of i2t and t2i); choice, accuracy (augmented "
              "accuracy for hard positives, group score for 2x2 suites); mask, amodal gIoU.")
_VS_STEP_NOTE = ("Ranking: R@1, solid the clean protocol, dashed with a variant's items added. Choice: accuracies. "
                 "Mask: gIoU solid, cIoU dashed. Checkpoints without a step in their name (diamonds) sit right of "
                 "the dotted line.")


_TIED_NOTE = ("shaded: no difference from the best that holds (paired test against it: exact McNemar or a "
              "permutation test; Holm over the suite's checkpoints; p >= 0.05). [low, high]: the 95% bootstrap "
              "interval.")


def _tied(mark: dict) -> bool:
    """Whether a checkpoint's gap to its suite's best was tested and does not hold."""
    return "p_holm" in mark and not mark.get("holds")


def _ckpts(axis) -> str:
    n, other = len(axis.order), len(axis.unstepped)
    return f"{n} checkpoints" + (f" ({other} without a {axis.unit})" if other and axis.unit != "order" else "")


def _step(axis, label: str) -> str:
    return "-" if axis.step[label] is None else str(axis.step[label])


def _unstepped_note(axis) -> str:
    names = ", ".join(axis.unstepped)
    return (f"No {axis.unit} in the name of {names}: listed after the checkpoints with one (a predictions folder "
            f"scored as it is, or a checkpoint named without its {axis.unit}).")


def _mask_tables(ctx: dict) -> dict[str, dict]:
    """Per mask suite: rows of (checkpoint, source, visible gIoU, visible cIoU, amodal gIoU, amodal cIoU)."""
    out = {}
    cols = [f"{role} {k}" for role in MASK_ROLES for k in ("gIoU", "cIoU")]
    for suite in ctx["suites"]:
        rs = sorted((r for r in ctx["results"] if r.suite == suite and r.mask),
                    key=lambda r: ctx["order"].index(r.label))
        if not rs:
            continue
        rows = []
        for r in rs:
            m = r.data["metrics"]
            source = (f"baseline {r.data['baseline']}" if r.data.get("baseline")
                      else "predictions" if r.data.get("predictions") else "")
            rows.append([r.label, source] + [num(m.get(c.split()[0], {}).get(c.split()[1])) for c in cols])
        best = {c: max((row[2 + i] for row in rows if row[2 + i] is not None), default=None)
                for i, c in enumerate(cols)}
        out[suite] = {"columns": ["checkpoint", "scored"] + cols, "rows": rows, "best": best}
    return out


def _fmt(v) -> str:
    n = num(v)
    return "-" if v is None or v == "" else (f"{n:.2f}" if n is not None and not isinstance(v, int) else str(v))


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _md_cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _cell_html(value: str, roots: list[Path], image: bool, thumbs: Thumbs) -> str:
    b64 = thumbs(value, roots) if image else None
    img = f'<img class="thumb" src="data:image/png;base64,{b64}" alt="">' if b64 else ""
    return f'{img}<code>{_esc(value)}</code>' if image else _esc(value)


def _transfer_sections(plots) -> list[tuple[str, str, str]]:
    """(key, title, note) of the attack transfer heat maps present in ``plots``."""
    return [(k, f"Attack transfer ({k.split('_', 1)[1]})",
             "R@1 drop of each evaluated checkpoint (columns) with the variants `hardrank attack` found against "
             "each checkpoint (rows): weak spots that persist through training stay dark off the diagonal.")
            for k in sorted(plots) if k.startswith("transfer_")]


def render_html(ctx: dict, thumbs: Thumbs) -> str:
    """The page: leaderboard pivot, the plots (embedded PNGs), worst failures with thumbnails, every
    headline metric. ``ctx`` is the report context ``build_report`` assembles."""
    order, suites, results, axis = ctx["order"], ctx["suites"], ctx["results"], ctx["axis"]
    cell, best = pivot(results, order, suites)
    metric_of = {s: next((cell[(l, s)][0] for l in order if (l, s) in cell), "") for s in suites}
    step_col = axis.unit != "order"
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         "<title>hardrank report</title>", f"<style>{_CSS}</style></head><body>",
         "<h1>hardrank report</h1>",
         f'<p class="meta">{_esc(ctx["results_dir"])} &middot; {len(results)} results, {_ckpts(axis)}, '
         f'{len(suites)} suites &middot; generated {_esc(ctx["generated"])}</p>',
         "<h2>Leaderboard</h2>",
         f'<p class="small">{_esc(_MAIN_NOTE)} Best per suite in bold; {_esc(_TIED_NOTE)} All headline '
         'numbers are in <code>leaderboard.csv</code>.</p>',
         "<table><tr><th>checkpoint</th>" + (f"<th>{_esc(axis.unit)}</th>" if step_col else "") + "".join(
             f"<th>{_esc(s)}<br><span class='small'>{_esc(metric_of[s])}</span></th>" for s in suites) + "</tr>"]
    marks = ctx.get("marks") or {}
    for l in order:
        tds = []
        for s in suites:
            v = cell.get((l, s), (None, None))[1]
            mk = marks.get((l, s), {})
            cls = "num best" if v is not None and v == best[s] else "num tied" if _tied(mk) else "num"
            ci = (f'<br><span class="small">[{mk["ci95"][0]:.1f}, {mk["ci95"][1]:.1f}]</span>'
                  if "ci95" in mk and v is not None else "")
            tds.append(f'<td class="{cls}">{_fmt(v)}{ci}</td>')
        step = f'<td class="num">{_step(axis, l)}</td>' if step_col else ""
        h.append(f"<tr><td>{_esc(l)}</td>{step}{''.join(tds)}</tr>")
    h.append("</table>")
    if step_col and axis.unstepped:
        h.append(f'<p class="small">{_esc(_unstepped_note(axis))}</p>')
    for suite, table in _mask_tables(ctx).items():
        h.append(f"<h2>Mask suite: {_esc(suite)}</h2>"
                 '<p class="small">gIoU: mean IoU over masks; cIoU: summed intersections over summed unions; '
                 "in percent, for the visible and the amodal (whole-object) masks. Best per column in bold.</p>"
                 "<table><tr>" + "".join(f"<th>{_esc(c)}</th>" for c in table["columns"]) + "</tr>")
        for row in table["rows"]:
            tds = []
            for c, v in zip(table["columns"], row):
                if c not in table["best"]:
                    tds.append(f"<td>{_esc(v)}</td>")
                else:
                    cls = "num best" if v is not None and v == table["best"][c] else "num"
                    tds.append(f'<td class="{cls}">{_fmt(v)}</td>')
            h.append("<tr>" + "".join(tds) + "</tr>")
        h.append("</table>")
    for key, title, note in (
            ("vs_step", "Metrics vs checkpoint", _VS_STEP_NOTE),
            ("drops", "Per-variant drop", "Clean R@1 minus R@1 with the variant's perturbed items in the gallery."),
            ("heatmap", "Checkpoint x suite", ""),
            ("severity", "Accuracy vs corruption severity", "Zero-shot top-1 per checkpoint under each corruption; "
             "severity 0 is the clean images."), *_transfer_sections(ctx["plots"])):
        if ctx["plots"].get(key):
            b64 = base64.b64encode(ctx["plots"][key]).decode()
            h.append(f"<h2>{title}</h2>" + (f'<p class="small">{note}</p>' if note else "")
                     + f'<img class="plot" alt="{_esc(title)}" src="data:image/png;base64,{b64}">')
    h.append("<h2>Worst failures</h2>")
    for p, why in ctx.get("unreadable", ()):
        h.append(f'<p class="small">Not read (its checkpoint is left out here): {_esc(str(p))}: {_esc(why)}</p>')
    if not ctx["failures"]:
        h.append('<p class="small">No ranking results with per-query outcomes (Parquet) found.</p>')
    for suite, f in ctx["failures"].items():
        roots = image_roots(f["result"].data, ctx["results_dir_path"])
        h.append(f"<h3>{_esc(suite)} &middot; checkpoint {_esc(f['checkpoint'])}</h3>"
                 f'<p class="small">{f["total"]} queries whose top-1 is a perturbed item; showing {len(f["rows"])}, '
                 f"per direction those failing in the most of the {f['checkpoints']} checkpoints first, then by the "
                 f"rank of the true match.</p>")
        h.append('<table class="failures"><tr><th>task</th><th>view</th><th>query</th><th>top-1 (perturbed)</th>'
                 "<th>group</th><th>true rank</th><th>fails in</th></tr>")
        for r in f["rows"]:
            q = _cell_html(r["query_id"], roots, is_image(r["task"], "query", r["query_id"]), thumbs)
            t = _cell_html(r["top1_id"], roots, is_image(r["task"], "top1", r["top1_id"]), thumbs)
            h.append(f'<tr><td>{_esc(r["task"])}</td><td>{_esc(r["view"])}</td><td class="text">{q}</td>'
                     f'<td class="text">{t}</td><td>{_esc(r["top1_group"])}</td><td class="num">{r["rank"] + 1}</td>'
                     f'<td class="num">{r["fails_in"]}/{f["checkpoints"]}</td></tr>')
        h.append("</table>")
    h.append("<h2>All headline metrics</h2><details><summary>show table</summary><table><tr>")
    cols = [c for c in ctx["columns"] if c not in ("result", "model_fingerprint")]
    h.append("".join(f"<th>{_esc(c)}</th>" for c in cols) + "</tr>")
    for row in ctx["rows"]:
        h.append("<tr>" + "".join(f'<td class="num">{_fmt(row.get(c))}</td>' if num(row.get(c)) is not None
                                  else f"<td>{_esc(_fmt(row.get(c)))}</td>" for c in cols) + "</tr>")
    h.append("</table></details></body></html>")
    return "\n".join(h)


def render_md(ctx: dict, plot_files: dict[str, str]) -> str:
    """The Markdown report: leaderboard, links to ``plot_files`` (relative paths), worst failures."""
    order, suites, results, axis = ctx["order"], ctx["suites"], ctx["results"], ctx["axis"]
    cell, best = pivot(results, order, suites)
    step_col = axis.unit != "order"
    md = ["# hardrank report", "", f"{ctx['results_dir']}: {len(results)} results, {_ckpts(axis)}, "
          f"{len(suites)} suites; generated {ctx['generated']}.", "", "## Leaderboard", "",
          f"{_MAIN_NOTE} Best in bold; ≈: {_TIED_NOTE}", "",
          "| checkpoint | " + (f"{axis.unit} | " if step_col else "") + " | ".join(_md_cell(s) for s in suites) + " |",
          "|---|" + ("---:|" if step_col else "") + "---:|" * len(suites)]
    marks = ctx.get("marks") or {}
    for l in order:
        vals = []
        for s in suites:
            v = cell.get((l, s), (None, None))[1]
            mk = marks.get((l, s), {})
            ci = f" [{mk['ci95'][0]:.1f}, {mk['ci95'][1]:.1f}]" if "ci95" in mk and v is not None else ""
            shown = f"**{_fmt(v)}**" if v is not None and v == best[s] else f"{_fmt(v)} ≈" if _tied(mk) else _fmt(v)
            vals.append(shown + ci)
        md.append(f"| {_md_cell(l)} | " + (f"{_step(axis, l)} | " if step_col else "") + " | ".join(vals) + " |")
    if step_col and axis.unstepped:
        md += ["", _unstepped_note(axis)]
    for suite, table in _mask_tables(ctx).items():
        md += ["", f"## Mask suite: {suite}", "", "gIoU / cIoU in percent, visible and amodal masks.", "",
               "| " + " | ".join(table["columns"]) + " |", "|---|" + "---:|" * (len(table["columns"]) - 1)]
        md += ["| " + " | ".join(_fmt(v) if c in table["best"] else _md_cell(v)
                                 for c, v in zip(table["columns"], row)) + " |" for row in table["rows"]]
    for key, title in (("vs_step", "Metrics vs checkpoint"), ("drops", "Per-variant drop"),
                       ("heatmap", "Checkpoint x suite"), ("severity", "Accuracy vs corruption severity"),
                       *[(k, t) for k, t, _ in _transfer_sections(plot_files)]):
        if key in plot_files:
            md += ["", f"## {title}", "", f"![{title}]({plot_files[key]})"]
    md += ["", "## Worst failures"]
    md += [f"\nNot read (its checkpoint is left out here): {_md_cell(str(p))}: {_md_cell(why)}"
           for p, why in ctx.get("unreadable", ())]
    for suite, f in ctx["failures"].items():
        md += ["", f"### {suite} (checkpoint {f['checkpoint']})", "",
               f"{f['total']} queries whose top-1 is a perturbed item; the {len(f['rows'])} most persistent:", "",
               "| task | view | query | top-1 (perturbed) | group | true rank | fails in |",
               "|---|---|---|---|---|---:|---:|"]
        for r in f["rows"]:
            md.append(f"| {r['task']} | {_md_cell(r['view'])} | {_md_cell(r['query_id'])} | "
                      f"{_md_cell(r['top1_id'])} | {_md_cell(r['top1_group'])} | {r['rank'] + 1} | "
                      f"{r['fails_in']}/{f['checkpoints']} |")
    return "\n".join(md) + "\n"
