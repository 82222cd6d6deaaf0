"""Lite subsets (``--subset N --seed S``): a stratified sample of each suite's units, and only their items to embed.

The units are those the intervals resample (``hardrank.scoring.statistics.UNITS``): a retrieval suite keeps N
images with their captions, perturbed captions and altered copies (queries and galleries both shrink: the
subset is a smaller suite of the same protocol, as COCO 1k is of COCO 5k); a choice suite N items, drawn
within each (task, subset) in proportion to its size; a classification suite N images, drawn within each
class. The item tables are rebuilt with the kept rows only, so the run embeds nothing else.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from hardrank.errors import UsageError
from hardrank.items import ItemTable, Tables
from hardrank.scoring.statistics import stratified_sample
from hardrank.tasks import ClassifyTask, Suite

__all__ = ["subset_suites"]


def _ranking(suite: Suite, n: int, seed: int) -> tuple[Suite, dict]:
    units = {len(t.unit_ids) if t.unit_ids is not None else -1 for t in suite.ranking}
    if len(units) != 1 or -1 in units:
        raise UsageError(f"--subset: suite {suite.name}'s retrieval tasks record no shared image units; run it "
                         f"without --subset")
    total = units.pop()
    keep = np.zeros(total, dtype=bool)
    keep[stratified_sample([""] * total, n, seed)] = True
    suite = replace(suite, ranking=[t.keep_units(keep) for t in suite.ranking])
    return suite, {"units": int(keep.sum()), "of": total, "unit": "image", "strata": "none (images drawn "
                   "uniformly; each keeps its captions, perturbed captions and altered copies)"}


def _choice(suite: Suite, n: int, seed: int) -> tuple[Suite, dict]:
    strata = [f"{t.name}/{t.subset[i] if t.subset is not None else ''}"
              for t in suite.choice for i in range(len(t.ids))]
    picked = np.zeros(len(strata), dtype=bool)
    picked[stratified_sample(strata, n, seed)] = True
    out, at = [], 0
    for t in suite.choice:
        keep = picked[at:at + len(t.ids)]
        at += len(t.ids)
        out.append(t.keep_rows(keep))
    return replace(suite, choice=out), {"units": int(picked.sum()), "of": len(strata), "unit": "item",
                                        "strata": "task and subset"}


def _classify(suite: Suite, n: int, seed: int) -> tuple[Suite, dict]:
    out, kept, total = [], 0, 0
    for t in suite.classify:
        keep = stratified_sample(t.labels.tolist(), n, seed)
        out.append(_keep_images(t, keep))
        kept, total = kept + len(keep), total + t.num_queries
    return replace(suite, classify=out), {"units": kept, "of": total, "unit": "image", "strata": "class"}


def _keep_images(t: ClassifyTask, keep: np.ndarray) -> ClassifyTask:
    return replace(t, query_items=t.query_items[:, keep], query_ids=[t.query_ids[i] for i in keep],
                   labels=t.labels[keep], valid=None if t.valid is None else t.valid[:, keep])


def _subset(suite: Suite, n: int, seed: int) -> tuple[Suite, dict]:
    if suite.mask:
        raise UsageError(f"--subset: suite {suite.name} scores masks, which have no lite subset; evaluate it "
                         f"without --subset (or in a run of its own)")
    if suite.ranking:
        suite, rec = _ranking(suite, n, seed)
    elif suite.choice:
        suite, rec = _choice(suite, n, seed)
    else:
        suite, rec = _classify(suite, n, seed)
    return suite, {**rec, "seed": seed, "asked": n}


class _Remap:
    """Old table rows -> rows of a new table holding only the rows asked for (in their old order)."""

    def __init__(self, table: ItemTable, used: np.ndarray):
        rows = np.unique(used[used >= 0]) if len(used) else np.zeros(0, dtype=np.int64)
        self.table = ItemTable(table.modality)
        known = table.known_keys()
        for r in rows.tolist():
            self.table.add(table.entries[r], table.ids[r], known.get(r))
        self.map = np.full(len(table), -1, dtype=np.int64)
        self.map[rows] = np.arange(len(rows))

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.map[rows]


def _used(suites: list[Suite], modality: str) -> np.ndarray:
    parts = [np.zeros(0, dtype=np.int64)]
    for s in suites:
        for t in s.ranking:
            parts += [t.query_items] if t.query_modality == modality else [t.gallery_items]
        for c in s.choice:
            parts += [c.left.ravel()] if c.left_modality == modality else []
            parts += [c.right.ravel()] if c.right_modality == modality else []
        for k in s.classify:
            parts.append(k.query_items.ravel() if modality == "image" else k.prompt_rows)
    return np.concatenate(parts).astype(np.int64)


def subset_suites(suites: list[Suite], tables: Tables, n: int, seed: int) -> tuple[list[Suite], Tables, dict]:
    """Each suite cut to a stratified sample of ``n`` of its units (seeded), and new tables holding only the
    items those samples use. Returns (suites, tables, {suite name: its record for the results' ``subset``})."""
    if n < 1:
        raise UsageError(f"option subset (--subset) must be at least 1 unit, got {n}")
    cut, records = [], {}
    for s in suites:
        s2, rec = _subset(s, n, seed)
        cut.append(s2)
        records[s.name] = rec
    img, txt = _Remap(tables.images, _used(cut, "image")), _Remap(tables.texts, _used(cut, "text"))
    remap = {"image": img, "text": txt}
    out = []
    for s in cut:
        out.append(replace(
            s,
            ranking=[replace(t, query_items=remap[t.query_modality](t.query_items),
                             gallery_items=remap[t.gallery_modality](t.gallery_items)) for t in s.ranking],
            choice=[replace(c, left=remap[c.left_modality](c.left), right=remap[c.right_modality](c.right))
                    for c in s.choice],
            classify=[replace(k, query_items=img(k.query_items), prompt_rows=txt(k.prompt_rows)) for k in s.classify]))
    for s in out:
        for t in s.ranking:
            t.validate()
    return out, Tables(img.table, txt.table), records
