"""The embed stage: decode -> encode (K checkpoints per decoded batch) -> Arrow store, in-process."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .items import ImageRef, ItemTable, Tables, decode_image
from .models import LoadedModel
from .store import EmbeddingStore

__all__ = ["table_embeddings", "PillowDecoder", "ImageEncoder", "TextEncoder", "EmbedStats", "EmbedJob", "EmbedSink", "embed_tables",
           "TooManyFailures", "make_transform", "encode_text", "DECODERS"]

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
    tokenizer, not once per checkpoint, and each batch runs at its longest caption's length where
    that is exact (see ``encode_text``)."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        out = dict(batch)
        tokens_by_tok: dict[tuple, torch.Tensor] = {}
        for i, m in enumerate(self.models):
            tid = _tokenizer_key(m.tokenizer)
            if tid not in tokens_by_tok:
                tokens_by_tok[tid] = m.tokenizer(batch["text"])
            tok = tokens_by_tok[tid].to(m.device)
            emb = encode_text(m.model, tok).float()
            out[f"emb{i}"] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out


def _tokenizer_key(tok) -> tuple:
    """Equal keys tokenise identically: each checkpoint gets its own tokenizer object, but K
    checkpoints of one architecture share the class, the context length and the vocabulary."""
    inner = getattr(tok, "tokenizer", None)
    return (type(tok).__module__, type(tok).__qualname__, getattr(tok, "context_length", None),
            getattr(inner, "name_or_path", None), len(getattr(tok, "encoder", ()) or ()))


def _pool_index(model, tokens: torch.Tensor) -> torch.Tensor | None:
    """(B,) position each row's text embedding is pooled from, when cutting the padding is exact:
    an open_clip ``CLIP`` text tower with a causal mask (position i never sees j > i) and argmax/eos/
    first pooling. None otherwise (no causal mask, 'last' pooling, custom/HF towers)."""
    import open_clip

    if not isinstance(model, open_clip.CLIP) or getattr(model, "attn_mask", None) is None:
        return None
    pool = model.text_pool_type
    if pool == "argmax":
        return tokens.argmax(dim=-1)
    if pool == "eos" and getattr(model, "text_eos_id", None) is not None:
        return (tokens == model.text_eos_id).int().argmax(dim=-1)
    if pool == "first":
        return torch.zeros(len(tokens), dtype=torch.long)
    return None


def encode_text(model, tokens: torch.Tensor) -> torch.Tensor:
    """``model.encode_text(tokens)`` run on ``tokens[:, :L]``, L = the batch's last pooled position + 1
    (its longest caption), where the tower allows it (``_pool_index``); equal to the full-length
    result up to float summation order. Falls back to ``model.encode_text`` otherwise."""
    from open_clip.transformer import text_global_pool

    pos = _pool_index(model, tokens) if len(tokens) else None
    if pos is None or int(pos.max()) + 1 >= tokens.shape[1]:
        return model.encode_text(tokens)
    n = int(pos.max()) + 1
    tokens = tokens[:, :n]  # (B, n)
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype)  # (B, n, width): mirrors CLIP.encode_text
    x = x + model.positional_embedding[:n].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:n, :n])
    x = model.ln_final(x)
    x = text_global_pool(x, tokens, model.text_pool_type, eos_token_id=getattr(model, "text_eos_id", None))
    if model.text_projection is not None:
        x = model.text_projection(x) if isinstance(model.text_projection, torch.nn.Linear) else x @ model.text_projection
    return x


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


DECODERS = ("pillow", "dali")


@dataclass(frozen=True, eq=False)
class EmbedJob:
    """One modality's missing work as plain data (no live models): what a runner executes.
    Workers rebuild the models from ``specs`` and must arrive at ``fingerprints``."""

    modality: str                      # "image" | "text"
    rows: np.ndarray                   # (N,) table rows to embed, one per distinct missing key
    items: tuple                       # (N,) ImageRef (images) or str (texts), aligned with rows
    specs: tuple                       # ModelSpec per checkpoint, precision resolved
    fingerprints: tuple                # expected fingerprint per checkpoint
    preprocess_cfg: dict               # the checkpoints' shared eval transform
    decoder: str = "pillow"            # "pillow" | "dali" (images only)
    batch_size: int = 256              # rows per encoder batch
    decode_threads: int = 2            # decoder threads per decoder

    def batches(self):
        """(rows, items) per encoder batch. Every executor encodes exactly these batches, so the
        floating point (batch-size dependent GEMM paths) is identical across executors."""
        for s in range(0, len(self.rows), self.batch_size):
            yield self.rows[s:s + self.batch_size], self.items[s:s + self.batch_size]

    def decoder_stage(self):
        """A fresh decode stage for this job (call inside the worker that runs it)."""
        if self.decoder == "dali":
            from .dali_decode import DaliDecoder

            return DaliDecoder(self.preprocess_cfg, threads=self.decode_threads, batch_size=self.batch_size,
                               device="auto")
        return PillowDecoder(self.preprocess_cfg, threads=self.decode_threads)


class EmbedSink:
    """Where a runner delivers results, in any order: records failures (stopping past
    ``max_failures``), buffers embeddings, and writes one atomic shard per store every
    ``flush_rows`` rows, so a killed run keeps what was flushed and a rerun does only the rest."""

    def __init__(self, table: ItemTable, keys: list[str], stores: list[EmbeddingStore], have: list[np.ndarray],
                 stats: EmbedStats, *, flush_rows: int, max_failures: int | None, bar=None):
        self.table, self.keys, self.stores, self.have = table, keys, stores, have
        self.stats, self.flush_rows, self.max_failures, self.bar = stats, max(1, flush_rows), max_failures, bar
        self._pending: list[list] = [[] for _ in stores]  # per store: (keys, (n, D) embeddings) chunks
        self._pending_rows = 0

    def time(self, stage: str, seconds: float) -> None:
        self.stats.stage_seconds[stage] = self.stats.stage_seconds.get(stage, 0.0) + seconds

    def fail(self, rows, errors) -> None:
        """Record rows that could not be decoded; raises TooManyFailures (after flushing) past the limit."""
        for r, why in zip(rows, errors):
            r = int(r)
            self.stats.failures.append((r, self.table.entries[r].uri, why))
            log.warning("skipping image %s: %s", self.table.entries[r].uri, why)
        if self.bar and len(rows):
            self.bar.update(len(rows))
        if self.max_failures is not None and len(self.stats.failures) > self.max_failures:
            self.flush()
            _check_failures(self.stats, self.max_failures)

    def add(self, rows, embeddings) -> None:
        """``embeddings[i]``: (len(rows), D) L2-normalised embeddings of model i for ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(embeddings) != len(self.stores):
            raise ValueError(f"got embeddings of {len(embeddings)} models for {len(self.stores)} stores")
        bkeys = [self.keys[r] for r in rows]
        for i, emb in enumerate(embeddings):
            need = ~self.have[i][rows]
            if need.any():
                self._pending[i].append(([k for k, n in zip(bkeys, need) if n], np.asarray(emb)[need]))
        self._pending_rows += len(rows)
        self.stats.encoded += len(rows)
        if self._pending_rows >= self.flush_rows:
            self.flush()
        if self.bar:
            self.bar.update(len(rows))

    def flush(self) -> None:
        t = time.perf_counter()
        for i, store in enumerate(self.stores):
            if self._pending[i]:
                ks = [k for part, _ in self._pending[i] for k in part]
                store.write(self.table.modality, ks, np.concatenate([e for _, e in self._pending[i]]))
                self._pending[i] = []
        self._pending_rows = 0
        self.time("write", time.perf_counter() - t)


def embed_tables(tables: Tables, models: list[LoadedModel], stores: list[EmbeddingStore], *,
                 batch_size: int = 256, flush_rows: int = 8192, decode_threads: int = 2, decoder: str = "pillow",
                 max_failures: int | None = 100, progress=None, runner=None) -> dict[str, EmbedStats]:
    """Embed every table row missing from any model's store; K models share each decoded batch.
    Returns stats per modality. Failed images are recorded in ``tables.images.failed``.

    runner: None runs in-process on ``models``; otherwise a callable ``runner(work)`` that executes
    ``work``, a list of ``(EmbedJob, EmbedSink)`` (one per modality with missing rows), elsewhere
    (``jobs.ray_executor.RayRunner``) and delivers every row to its sink's ``add`` or ``fail``."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    if len({m.preprocess_cfg.__repr__() for m in models}) > 1:
        raise ValueError("models in one embed pass must share preprocessing; group checkpoints by architecture")
    stats: dict[str, EmbedStats] = {}
    work: list[tuple[EmbedJob, EmbedSink]] = []
    for modality in ("image", "text"):
        table: ItemTable = tables.of(modality)
        st = stats[modality] = EmbedStats(total=len(table))
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
        if modality == "text":  # similar lengths share a batch, so trimming padding pays off
            rows.sort(key=lambda r: len(table.entries[r]))
        rows = np.array(rows, dtype=np.int64)
        st.from_store = int(len(keys) - need_any.sum() - len(failed_rows))
        if len(failed_rows):
            st.failures.extend((r, table.entries[r].uri, table.failed[r]) for r in sorted(failed_rows))
            for r in sorted(failed_rows):
                log.warning("skipping image %s: %s", table.entries[r].uri, table.failed[r])
            _check_failures(st, max_failures)
        if len(rows):
            job = EmbedJob(modality=modality, rows=rows, items=tuple(table.entries[r] for r in rows),
                           specs=tuple(replace(m.spec, precision=m.precision) for m in models),
                           fingerprints=tuple(m.fingerprint for m in models),
                           preprocess_cfg=dict(models[0].preprocess_cfg), decoder=decoder,
                           batch_size=batch_size, decode_threads=decode_threads)
            bar = progress(total=len(rows), desc=f"embed {modality}s") if progress else None
            work.append((job, EmbedSink(table, keys, stores, have, st, flush_rows=flush_rows,
                                        max_failures=max_failures, bar=bar)))
        st.seconds = time.perf_counter() - t0
    try:
        if runner is None:
            for job, sink in work:
                t = time.perf_counter()
                _run_local(job, sink, models)
                sink.stats.seconds += time.perf_counter() - t
        elif work:
            t = time.perf_counter()
            runner(work)  # one pipeline for both modalities: workers start once
            for _, sink in work:
                sink.stats.seconds += time.perf_counter() - t
    finally:  # also on errors and interrupts: whatever was encoded is committed
        for _, sink in work:
            sink.flush()
            if sink.bar:
                sink.bar.close()
    for modality, st in stats.items():
        st.failures.sort(key=lambda f: f[0])  # by row: the same list whichever executor ran
        st.failed = len(st.failures)
        for r, _, why in st.failures:
            tables.of(modality).failed[r] = why
    return stats


def _run_local(job: EmbedJob, sink: EmbedSink, models: list[LoadedModel]) -> None:
    """The in-process executor: decode batch i+1 in a thread while batch i encodes."""
    if job.modality == "image":
        decoder, encoder = job.decoder_stage(), ImageEncoder(models)
    else:
        decoder, encoder = None, TextEncoder(models)

    def load(batch_rows, batch_items):
        t = time.perf_counter()
        b = decoder({"ref": list(batch_items)}) if decoder else {"text": list(batch_items)}
        b["rows"] = batch_rows
        b["_decode_s"] = time.perf_counter() - t
        return b

    batches = list(job.batches())
    prefetch = ThreadPoolExecutor(1)
    try:
        fut = prefetch.submit(load, *batches[0]) if batches else None
        for bi in range(len(batches)):
            b = fut.result()
            if bi + 1 < len(batches):
                fut = prefetch.submit(load, *batches[bi + 1])  # decode next while encoding this one
            sink.time("decode" if decoder else "read", b["_decode_s"])
            ok = b.get("ok", np.ones(len(b["rows"]), dtype=bool))
            if not ok.all():
                sink.fail(b["rows"][~ok], [e for e, good in zip(b["error"], ok) if not good])
                sel = np.nonzero(ok)[0]
                if len(sel) == 0:
                    continue
                b = {**b, "pixels": b["pixels"][torch.from_numpy(sel)], "rows": b["rows"][sel]}
            t = time.perf_counter()
            out = encoder(b)
            sink.time("encode", time.perf_counter() - t)
            sink.add(out["rows"], [out[f"emb{i}"] for i in range(len(models))])
    finally:
        prefetch.shutdown(cancel_futures=True)


def table_embeddings(store: EmbeddingStore, table: ItemTable, dtype=None) -> np.ndarray:
    """(rows, d) embeddings of a whole table in row order; rows that failed to load are zeros
    (callers drop the task rows that use them)."""
    keys = table.keys()
    good = [i for i, k in enumerate(keys) if k and i not in table.failed]
    out = np.zeros((len(keys), store.dim), dtype=dtype or store.dtype)
    if good:
        out[good] = store.read(table.modality, [keys[i] for i in good])
    return out
