"""Embeddings out of the store under human ids: the bring-your-own Parquet format, and a listing of stores.

The store is keyed by content (a hash of the image bytes or of the normalised caption), so the
names come from the suites: their item tables map each content key to the id the annotation file
writes (an image path, a caption as written). ``export_embeddings`` writes one row per item the
suites use, ``kind``, ``id``, ``embedding`` (``fixed_size_list<float32>[D]``) and ``key``, which
``hardrank eval --embeddings`` reads back to the same metrics and ``hardrank mine`` takes as an
input. The store is only read (``open_store``, ``contains``, ``read``). Items the store lacks (an
image that failed to decode is never stored) are left out and listed next to the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank import urls
from hardrank.atomic import atomic_path
from hardrank.config import EvalConfig, build, check_writable_dir
from hardrank.embed import EmbedPipeline
from hardrank.errors import DataError, UsageError
from hardrank.items import ItemTable, Tables
from hardrank.models.runs import model_specs
from hardrank.store.embedding_store import EmbeddingStore, open_store, reads_version
from hardrank.suites import load_suites

__all__ = ["export_embeddings", "export_schema", "list_stores", "image_id", "missing_path"]

_PARQUET = "parquet://"


def export_schema(dim: int) -> pa.Schema:
    """The exported file's schema: the bring-your-own columns plus the content key."""
    return pa.schema([pa.field("kind", pa.string(), nullable=False), pa.field("id", pa.string(), nullable=False),
                      pa.field("embedding", pa.list_(pa.field("item", pa.float32(), nullable=False), dim),
                               nullable=False),
                      pa.field("key", pa.string(), nullable=False)],
                     metadata={"hardrank_export": "1"})


def _relative(path: str, roots: list[Path]) -> str:
    p = Path(path).resolve()
    for root in roots:
        try:
            return p.relative_to(root).as_posix()
        except ValueError:
            continue
    return p.as_posix()


def image_id(table: ItemTable, row: int, roots: list[Path]) -> str:
    """The human id of image ``row``: the path the annotation file writes when the suite kept it,
    else the file's path below the deepest of ``roots`` holding it (a Parquet cell as
    ``<file>#<row>/<column>``), then ``@crop:x,y,w,h`` for a cropped region."""
    ref, tid = table.entries[row], table.ids[row]
    if tid != ref.uri:
        base = tid
    elif ref.uri.startswith(_PARQUET):
        file, _, cell = ref.uri[len(_PARQUET):].rpartition("#")
        base = f"{_relative(file, roots)}#{cell}"
    else:
        base = _relative(ref.uri, roots)
    return f"{base}@{ref.recipe}" if ref.recipe else base


def _roots(cfg: EvalConfig, suites) -> list[Path]:
    """Folders image paths are given relative to, deepest first: --images, the suites' image roots, --data (each
    suite's own, when given per suite)."""
    cands = [cfg.suite_options.images, cfg.suite_options.data]
    for s in suites:
        meta = s.meta or {}
        cands += [meta.get("images"), meta.get("images_root"), s.options.get("images"), s.options.get("data")]
        if isinstance(meta.get("world"), str):
            cands.append(os.path.join(meta["world"], "images"))
    roots = {Path(c).resolve() for c in cands if isinstance(c, str) and c and Path(c).is_dir()}
    return sorted(roots, key=lambda p: len(p.parts), reverse=True)


def _store_for(cfg: EvalConfig, folder: str | None) -> EmbeddingStore:
    if folder is not None:
        if cfg.model is not None or cfg.run is not None:
            raise UsageError("give a store fingerprint folder or --model/--run (which name the folder), not both")
        return open_store(folder)
    if cfg.model is None and cfg.run is None:
        raise UsageError("name the embeddings: a store fingerprint folder (hardrank store list shows them) or "
                         "--model with --checkpoint / --pretrained, or --run")
    specs = model_specs(cfg)
    if len(specs) != 1:
        raise UsageError(f"export one checkpoint at a time; got {len(specs)} ({[s.checkpoint for s in specs]})")
    pipe = EmbedPipeline(specs, cfg.embed)  # loads the model for its fingerprint; creates no store
    path = Path(pipe.store_root()) / pipe.fingerprint(0)
    if not (path / "manifest.json").is_file():
        raise DataError(f"store {cfg.embed.store_root()} holds no embeddings of this model (no folder "
                        f"{pipe.fingerprint(0)}); run `hardrank eval` with the same model, suites and --store "
                        f"first, or pass the --store it used")
    return open_store(path)


def missing_path(out: str | os.PathLike) -> Path:
    """Where ``export_embeddings`` lists the items it left out: ``b32.parquet`` -> ``b32.missing.jsonl``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.missing.jsonl")


def export_embeddings(cfg: EvalConfig | None = None, *, out: str | os.PathLike, folder: str | None = None,
                      **options) -> dict:
    """Write every item the suites of ``cfg`` use, with its embedding from the store, to ``out``
    (Parquet, ``export_schema``). The embeddings are those of ``folder`` (a store fingerprint folder)
    or of ``cfg``'s one checkpoint in ``cfg``'s store. Items the store lacks (images that failed to
    decode, items no run embedded) are left out and listed in ``missing_path(out)``, one JSON line
    each (``kind``, ``id``); when the store lacks every item, nothing is written and DataError says
    so. Returns counts (per modality: ``rows`` written, ``unreadable``, ``missing``), the missing ids
    and the store's fingerprint. ``options``: EvalConfig keywords instead of ``cfg``."""
    if cfg is None:
        cfg = build(EvalConfig, options)
    elif options:
        raise UsageError(f"pass an EvalConfig or keyword options, not both (got {sorted(options)})")
    out = Path(out)
    if out.is_dir():
        raise UsageError(f"option file (--out) is {str(out)!r}, which is a folder; name the Parquet file to write "
                         f"(e.g. {str(out / 'embeddings.parquet')!r})")
    check_writable_dir(out.parent, "file (--out)")  # before the store is opened or an image hashed
    store = _store_for(cfg, folder)
    tables = Tables.empty()
    suites = load_suites(list(cfg.suites), tables, cfg.suite_options)
    for s in suites:  # content keys hash the image files
        s.check_images()
    roots = _roots(cfg, suites)
    kinds, ids, keys, parts = [], [], [], []
    counts, missing = {}, {}
    for modality in ("image", "text"):
        table = tables.of(modality)
        tkeys = table.keys()
        readable = [r for r, k in enumerate(tkeys) if k and r not in table.failed]
        have = store.contains(modality, [tkeys[r] for r in readable])
        rows = [r for r, h in zip(readable, have) if h]
        name = (lambda r: image_id(table, r, roots)) if modality == "image" else (lambda r: table.ids[r])
        missing[modality] = [name(r) for r, h in zip(readable, have) if not h]
        kinds += [modality] * len(rows)
        ids += [name(r) for r in rows]
        keys += [tkeys[r] for r in rows]
        parts.append(store.read(modality, [tkeys[r] for r in rows]).astype(np.float32))
        counts[modality] = {"rows": len(rows), "unreadable": len(tkeys) - len(readable),
                            "missing": len(missing[modality])}
    if not ids and any(missing.values()):
        raise DataError(f"store folder {store.dir} holds none of the {len(missing['image'])} images and "
                        f"{len(missing['text'])} texts these suites use, e.g. "
                        f"{(missing['image'] + missing['text'])[:3]}; run `hardrank eval` with this model on the "
                        f"same suites and --store first, or name the store folder that run filled")
    emb = np.concatenate(parts) if parts else np.zeros((0, store.dim), np.float32)  # (n, d) float32
    schema = export_schema(store.dim)
    table = pa.Table.from_arrays(
        [pa.array(kinds, pa.string()), pa.array(ids, pa.string()),
         pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1), pa.float32()), store.dim),
         pa.array(keys, pa.string())], schema=schema)
    meta = {"fingerprint": store.fingerprint, "suites": list(cfg.suites), "store": str(store.dir),
            "image_roots": [str(r) for r in roots], "missing": {m: len(v) for m, v in missing.items()}}
    table = table.replace_schema_metadata({**schema.metadata, b"hardrank_export": json.dumps(meta).encode()})
    listing = missing_path(out)
    if any(missing.values()):
        with atomic_path(listing) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for modality, names in missing.items():
                f.writelines(json.dumps({"kind": modality, "id": n}, ensure_ascii=False) + "\n" for n in names)
    else:
        listing.unlink(missing_ok=True)  # an earlier export's list no longer describes this file
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp)
    return {"out": str(out), "fingerprint": store.fingerprint, "dim": store.dim, "counts": counts,
            "missing": missing, "missing_list": str(listing) if any(missing.values()) else None,
            "image_roots": meta["image_roots"]}


def list_stores(root: str | os.PathLike) -> list[dict]:
    """Every fingerprint folder under a store root, from its manifest: what model, checkpoint,
    precision and decoder made it, and how many images and texts it holds. ``checkpoint_exists``:
    whether the checkpoint file is still there (None: no file was recorded, or a URL); ``readable``:
    whether its store format version (``schema_version``) is one this hardrank reads (``READS``)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"store root {root} does not exist (the default is $HARDRANK_CACHE/store or "
                        f"~/.cache/hardrank/store; `hardrank demo` keeps its store in <out>/store)")
    out = []
    for manifest in sorted(root.glob("*/manifest.json")):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        meta = m.get("meta") or {}
        ck = meta.get("checkpoint")
        out.append({"folder": str(manifest.parent), "fingerprint": m.get("fingerprint"), "arch": meta.get("arch"),
                    "checkpoint": ck, "checkpoint_exists": Path(ck).is_file() if _local_file(ck) else None,
                    "precision": meta.get("precision"), "decoder": meta.get("decoder"), "dim": m.get("dim"),
                    "rows": m.get("rows", {}), "schema_version": m.get("schema_version"),
                    "readable": reads_version(m.get("schema_version"))})
    return sorted(out, key=lambda r: (str(r["arch"]), str(r["checkpoint"]), str(r["fingerprint"])))


def _local_file(path) -> bool:
    return isinstance(path, str) and bool(path) and not urls.is_url(path)
