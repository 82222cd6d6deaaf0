"""The embed stage: decode -> encode (K checkpoints per decoded batch) -> Arrow store, in-process."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from .items import ImageRef, ItemTable, Tables, decode_image
from .models import LoadedModel
from .store import EmbeddingStore

__all__ = ["PillowDecoder", "ImageEncoder", "TextEncoder", "EmbedStats", "embed_tables",
           "TooManyFailures", "make_transform"]

log = logging.getLogger("hardrank.embed")


class TooManyFailures(RuntimeError):
    pass


def make_transform(preprocess_cfg: dict):
    """The model's own eval transform (resize mode, interpolation, crop, mean/std)."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = dict(preprocess_cfg)
    if isinstance(cfg.get("size"), list):
        cfg["size"] = tuple(cfg["size"])
    for k in ("mean", "std"):
        if isinstance(cfg.get(k), list):
            cfg[k] = tuple(cfg[k])
    return image_transform_v2(PreprocessCfg(**cfg), is_train=False)


class PillowDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels": (B, 3, H, W) float32, "ok": (B,) bool,
    "error": [str|None]}``. Decoding runs in a thread pool (Pillow releases the GIL)."""

    def __init__(self, preprocess_cfg: dict, threads: int = 2):
        self.transform = make_transform(preprocess_cfg)
        size = preprocess_cfg["size"]
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.pool = ThreadPoolExecutor(max(1, threads))

    def _one(self, ref: ImageRef):
        try:
            return self.transform(decode_image(ref)), None
        except Exception as exc:  # corrupt/truncated/missing: recorded, not fatal
            return None, f"{type(exc).__name__}: {exc}"

    def __call__(self, batch: dict) -> dict:
        out = list(self.pool.map(self._one, batch["ref"]))
        ok = np.array([t is not None for t, _ in out], dtype=bool)
        pixels = torch.zeros((len(out), 3, *self.size), dtype=torch.float32)
        for i, (t, _) in enumerate(out):
            if t is not None:
                pixels[i] = t
        return {**batch, "pixels": pixels, "ok": ok, "error": [e for _, e in out]}


class ImageEncoder:
    """Stage: pixels -> one L2-normalised embedding array per model (``emb0``, ``emb1``...)."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        out = dict(batch)
        for i, m in enumerate(self.models):
            x = batch["pixels"].to(m.device, non_blocking=True).to(m.dtype)
            emb = m.model.encode_image(x).float()
            out[f"emb{i}"] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out


class TextEncoder:
    """Stage: ``{"text": [str]}`` -> embeddings per model. Texts are tokenised once per distinct
    tokenizer, not once per checkpoint."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        out = dict(batch)
        tokens_by_tok: dict[int, torch.Tensor] = {}
        for i, m in enumerate(self.models):
            tid = id(m.tokenizer)
            if tid not in tokens_by_tok:
                tokens_by_tok[tid] = m.tokenizer(batch["text"])
            tok = tokens_by_tok[tid].to(m.device)
            emb = m.model.encode_text(tok).float()
            out[f"emb{i}"] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out


@dataclass
class EmbedStats:
    total: int = 0
    from_store: int = 0
    encoded: int = 0
    failed: int = 0
    seconds: float = 0.0
    stage_seconds: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)  # (row, key/uri, reason)

    @property
    def per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        return {"total": self.total, "from_store": self.from_store, "encoded": self.encoded,
                "failed": self.failed, "seconds": round(self.seconds, 3),
                "items_per_s": round(self.per_second, 2),
                "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()}}


def _check_failures(st: EmbedStats, max_failures: int | None) -> None:
    if max_failures is not None and len(st.failures) > max_failures:
        first = "\n".join(f"  {u}: {w}" for _, u, w in st.failures[:5])
        raise TooManyFailures(
            f"{len(st.failures)} images could not be read or decoded (limit --max-failures {max_failures}); "
            f"first ones:\n{first}\nFix or remove the files, or raise --max-failures; finished work is kept "
            f"in the store and a rerun resumes.")


def _batches(rows: np.ndarray, size: int):
    for s in range(0, len(rows), size):
        yield rows[s:s + size]


def embed_tables(tables: Tables, models: list[LoadedModel], stores: list[EmbeddingStore], *,
                 batch_size: int = 256, flush_rows: int = 8192, decode_threads: int = 2,
                 max_failures: int | None = 100, progress=None) -> dict[str, EmbedStats]:
    """Embed every table row missing from any model's store; K models share each decoded batch.
    Returns stats per modality. Failed images are recorded in ``tables.images.failed``."""
    if len({m.preprocess_cfg.__repr__() for m in models}) > 1:
        raise ValueError("models in one embed pass must share preprocessing; group checkpoints by architecture")
    stats = {}
    for modality in ("image", "text"):
        table: ItemTable = tables.of(modality)
        st = EmbedStats(total=len(table))
        t0 = time.perf_counter()
        keys = table.keys()
        st.stage_seconds["key"] = time.perf_counter() - t0
        failed_rows = set(table.failed)
        have = [s.contains(modality, keys) for s in stores]
        need_any = np.zeros(len(keys), dtype=bool)
        for h in have:
            need_any |= ~h
        for r in failed_rows:
            need_any[r] = False
        # one row per distinct key
        rows, seen = [], set()
        for r in np.nonzero(need_any)[0]:
            if keys[r] not in seen:
                seen.add(keys[r])
                rows.append(r)
        rows = np.array(rows, dtype=np.int64)
        st.from_store = int(len(keys) - need_any.sum() - len(failed_rows))
        if len(failed_rows):
            st.failures.extend((r, table.entries[r].uri, table.failed[r]) for r in sorted(failed_rows))
            for r in sorted(failed_rows):
                log.warning("skipping image %s: %s", table.entries[r].uri, table.failed[r])
            _check_failures(st, max_failures)
        if len(rows):
            _run(table, keys, rows, models, stores, have, st, batch_size=batch_size, flush_rows=flush_rows,
                 decode_threads=decode_threads, max_failures=max_failures, progress=progress)
        st.failed = len(st.failures)
        for r, _, why in st.failures:
            table.failed[r] = why
        st.seconds = time.perf_counter() - t0
        stats[modality] = st
    return stats


def _run(table, keys, rows, models, stores, have, st, *, batch_size, flush_rows, decode_threads,
         max_failures, progress):
    modality = table.modality
    if modality == "image":
        decoder = PillowDecoder(models[0].preprocess_cfg, threads=decode_threads)
        encoder = ImageEncoder(models)
    else:
        decoder = None
        encoder = TextEncoder(models)
    pending: list[list] = [[] for _ in models]  # per model: (keys, emb) chunks
    pending_rows = 0

    def flush():
        nonlocal pending_rows
        for i, store in enumerate(stores):
            if pending[i]:
                ks = [k for part, _ in pending[i] for k in part]
                em = np.concatenate([e for _, e in pending[i]])
                store.write(modality, ks, em)
                pending[i] = []
        pending_rows = 0

    bar = progress(total=len(rows), desc=f"embed {modality}s") if progress else None
    prefetch = ThreadPoolExecutor(1)

    def load(batch_rows):
        t = time.perf_counter()
        if decoder is None:
            b = {"text": [table.entries[r] for r in batch_rows]}
        else:
            b = decoder({"ref": [table.entries[r] for r in batch_rows]})
        b["rows"] = batch_rows
        b["_decode_s"] = time.perf_counter() - t
        return b

    batches = list(_batches(rows, batch_size))
    fut = prefetch.submit(load, batches[0]) if batches else None
    for bi in range(len(batches)):
        b = fut.result()
        if bi + 1 < len(batches):
            fut = prefetch.submit(load, batches[bi + 1])  # decode next while encoding this one
        st.stage_seconds["decode" if decoder else "read"] = st.stage_seconds.get("decode" if decoder else "read", 0) + b["_decode_s"]
        ok = b.get("ok", np.ones(len(b["rows"]), dtype=bool))
        if not ok.all():
            for r, good, err in zip(b["rows"], ok, b["error"]):
                if not good:
                    st.failures.append((int(r), table.entries[r].uri, err))
                    log.warning("skipping image %s: %s", table.entries[r].uri, err)
            if max_failures is not None and len(st.failures) > max_failures:
                flush()
                prefetch.shutdown(cancel_futures=True)
                _check_failures(st, max_failures)
            sel = np.nonzero(ok)[0]
            if len(sel) == 0:
                continue
            b = {**b, "pixels": b["pixels"][torch.from_numpy(sel)], "rows": b["rows"][sel]}
        t = time.perf_counter()
        out = encoder(b)
        st.stage_seconds["encode"] = st.stage_seconds.get("encode", 0) + time.perf_counter() - t
        bkeys = [keys[r] for r in out["rows"]]
        for i in range(len(models)):
            need = ~have[i][out["rows"]]
            if need.any():
                pending[i].append(([k for k, n in zip(bkeys, need) if n], out[f"emb{i}"][need]))
        pending_rows += len(bkeys)
        st.encoded += len(bkeys)
        if pending_rows >= flush_rows:
            t = time.perf_counter()
            flush()
            st.stage_seconds["write"] = st.stage_seconds.get("write", 0) + time.perf_counter() - t
        if bar:
            bar.update(len(b["rows"]))
    t = time.perf_counter()
    flush()
    st.stage_seconds["write"] = st.stage_seconds.get("write", 0) + time.perf_counter() - t
    prefetch.shutdown()
    if bar:
        bar.close()
