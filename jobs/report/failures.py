"""Worst failures: the last checkpoint's queries whose top-1 is a perturbed item, and thumbnails of their images."""
from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

import pyarrow.compute as pc
from PIL import Image

from hardrank.jobs.report.load import OUTCOME_COLUMNS, Result

__all__ = ["worst_failures", "image_roots", "is_image", "Thumbs"]

log = logging.getLogger("hardrank.report")

_IMAGE_EXT = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def worst_failures(by_suite: dict[str, list[Result]], order: list[str], top: int,
                   unreadable: list[tuple[Path, str]] | None = None) -> dict[str, dict]:
    """Per ranking suite: the last checkpoint's queries whose top-1 is a perturbed item, the most
    persistent first (failing in most checkpoints), then the worst rank of the true match. A per-query
    Parquet that cannot be read (truncated, overwritten, columns missing) is logged, appended to
    ``unreadable`` as (path, why), and left out, as a checkpoint without one is."""
    out = {}
    for suite, rs in by_suite.items():
        rs = sorted([r for r in rs if r.ranking], key=lambda r: order.index(r.label))
        per_ckpt = []
        for r in rs:
            t = r.outcomes()  # a damaged one is logged once (Result.outcomes) and left out here
            if t is None:
                if r.unreadable is not None and unreadable is not None:
                    unreadable.append((r.path.with_suffix(".parquet"), r.unreadable))
                continue
            t = t.select(list(OUTCOME_COLUMNS))
            mask = pc.and_(pc.and_(pc.equal(t["kind"], "ranking"), pc.not_equal(t["view"], "original")),
                           pc.not_equal(t["top1_group"], "original"))
            per_ckpt.append((r, t.filter(pc.fill_null(mask, False)).to_pylist()))
        if not per_ckpt:
            continue
        # checkpoints failing each query: a set, since a caption written twice for one image (as in
        # COCO) has two rows with one query id, and must count once per checkpoint
        failing: dict[tuple, set[int]] = {}
        for i, (_, rows) in enumerate(per_ckpt):
            for row in rows:
                failing.setdefault((row["task"], row["view"], row["query_id"]), set()).add(i)
        last, rows = per_ckpt[-1]
        by_task: dict[str, list] = {}
        for row in rows:
            row["fails_in"] = len(failing[(row["task"], row["view"], row["query_id"])])
            by_task.setdefault(row["task"], []).append(row)
        for task_rows in by_task.values():
            task_rows.sort(key=lambda r: (-r["fails_in"], -(r["rank"] or 0), r["view"], r["query_id"]))
        shown = []  # take from each direction in turn, so i2t and t2i failures both show
        for i in range(max((len(v) for v in by_task.values()), default=0)):
            shown.extend(v[i] for _, v in sorted(by_task.items()) if i < len(v))
        out[suite] = {"checkpoint": last.label, "checkpoints": len(per_ckpt), "total": len(rows),
                      "rows": shown[:top], "result": last}
    return out


def image_roots(res: dict, results_dir: Path) -> list[Path]:
    """Folders a result's image ids may be relative to: its suite's image roots, then the results folder."""
    meta = res.get("suite_meta") or {}
    opts = (res.get("provenance") or {}).get("suite_options") or {}
    roots = [meta.get("images_root"), meta.get("images"), opts.get("images")]
    out = [Path(r) for r in roots if isinstance(r, str) and r]
    if isinstance(meta.get("world"), str):
        out.append(Path(meta["world"]) / "images")
    out.append(results_dir)
    return out


def is_image(task: str, role: str, value: str) -> bool:
    """Whether the ``role`` ("query" or "top1") id of a ``task`` row names an image."""
    if task.lower() in ("i2t", "t2i"):
        return (task.lower()[0] == "i") if role == "query" else (task.lower()[-1] == "i")
    return value.lower().endswith(_IMAGE_EXT)


class Thumbs:
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
            with Image.open(p) as im:
                im = im.convert("RGB")
                im.thumbnail((self.size, self.size))
                buf = io.BytesIO()
                im.save(buf, format="PNG")
            return base64.b64encode(buf.getvalue()).decode()
        except Exception as exc:  # a broken image must not break the report
            log.warning("no thumbnail for %s: %s", p, exc)
            return None
