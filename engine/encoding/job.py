"""An embed job as plain data, the two stages every executor runs on it, and the sink results go to.

A batch moves through the stages as a plain dict, the same under every executor:

    source  {"modality", "rows" (n,) int64, "items": [ImageRef] | [str]}
    decoded images gain "pixels" (n, 3, H, W) float32, "ok" (n,) bool, "error" [str | None], and with
            ``key_by="id"`` "keys" [content key | None] (the hash of the bytes decoded); texts pass.
            A transformers processor that gives several arrays per image (SigLIP 2: patches, patch mask,
            patch grid) makes "pixels" a dict name -> (n, *shape) tensor, fixed shapes per model, which the
            model's family adapter takes whole (``hardrank.models.hf_models.Family.image_inputs``)
    encoded {"modality", "rows", "ok", "error", "emb": [K arrays (n_ok, D) float32], "keys"?}   (K checkpoints)

and ``EmbedSink.deliver`` records the failed rows and commits the embeddings of the others (under the
content keys the decoders computed, for rows whose key was provisional: ``hardrank.store.idkeys``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from hardrank import urls
from hardrank.encoding.decoders import make_decoder
from hardrank.encoding.encode import ImageEncoder, TextEncoder
from hardrank.errors import DataError, TooManyFailures
from hardrank.items import ItemTable, bytes_key, prefetched, read_image_bytes
from hardrank.models.load import load_model
from hardrank.models.spec import LoadedModel
from hardrank.store.embedding_store import EmbeddingStore
from hardrank.store.idkeys import IdIndex, is_provisional

__all__ = ["EmbedJob", "EmbedStats", "EmbedSink", "DecodeStage", "EncodeStage", "check_failures"]

log = logging.getLogger("hardrank.embed")


@dataclass(frozen=True, eq=False)
class EmbedJob:
    """One modality's missing work as plain data (no live models): what a runner executes.
    Workers rebuild the models from ``specs`` and must arrive at ``fingerprints``."""

    modality: str                      # "image" | "text"
    rows: np.ndarray                   # (N,) table rows to embed, one per distinct missing key
    items: tuple                       # (N,) ImageRef (images) or str (texts), aligned with rows
    specs: tuple                       # ModelSpec per checkpoint, precision resolved
    fingerprints: tuple                # expected model fingerprint per checkpoint
    preprocess_cfg: dict               # the checkpoints' shared eval transform
    decoder: str = "pillow"            # "pillow" | "dali" | "pillow-draft" (images only)
    batch_size: int = 256              # rows per encoder batch
    decode_threads: int = 2            # decoder threads per decoder
    segments: tuple = ()               # ((n_rows, checkpoint indices), ...) consecutive runs of rows that
                                       # the same checkpoints lack; () = every row, every checkpoint
    key_by: str = "content"            # "id": decoders also hash the bytes they decode (provisional keys)

    def batches(self):
        """Source batches, one per encoder batch; ``models`` names the checkpoints that encode it (a
        batch never mixes rows that different checkpoints lack). Every executor encodes exactly
        these batches, so the floating point (batch-size dependent GEMM paths) is identical across
        executors."""
        segments = self.segments or ((len(self.rows), tuple(range(len(self.specs)))),)
        start = 0
        for n, models in segments:
            for s in range(start, start + n, self.batch_size):
                e = min(s + self.batch_size, start + n)
                yield {"modality": self.modality, "rows": self.rows[s:e], "items": list(self.items[s:e]),
                       "models": tuple(models)}
            start += n


class DecodeStage:
    """Stage: source batch -> decoded batch (images decoded, texts passed through). Built from the
    job's configs inside the worker that runs it; ``threads`` overrides the job's decode threads."""

    def __init__(self, job: EmbedJob | None, threads: int | None = None):
        self.decoder = None if job is None else make_decoder(
            job.preprocess_cfg, job.decoder, threads=threads or job.decode_threads, batch_size=job.batch_size)
        self.hash = job is not None and job.key_by == "id"
        self.threads = threads or (job.decode_threads if job is not None else 2)

    def __call__(self, batch: dict) -> dict:
        if batch["modality"] != "image":
            return batch
        refs = batch["items"]
        got: dict[str, bytes] = {}
        if self.hash or any(urls.is_member_uri(r.uri) or urls.is_url(r.uri) for r in refs):
            # the batch's bytes in one go (a few range requests for runs of tar members), decoded from memory;
            # local files in a content-keyed run are read by the decoder's own threads, as before
            data = urls.read_many([r.uri for r in refs], threads=max(2, self.threads))
            got = {r.uri: b for r, b in zip(refs, data) if isinstance(b, bytes) and b}
        with prefetched(got):
            d = self.decoder({"ref": refs})
        out = {"modality": "image", "rows": batch["rows"], "models": batch.get("models"), "pixels": d["pixels"],
               "ok": np.asarray(d["ok"], dtype=bool), "error": list(d["error"])}
        if self.hash:  # the bytes just decoded, hashed: the content key of a provisionally keyed row
            out["keys"] = [bytes_key(got.get(r.uri) or read_image_bytes(r.uri), r.recipe) if ok else None
                           for r, ok in zip(refs, out["ok"])]
        return out


class EncodeStage:
    """Stage: decoded batch -> encoded batch, K checkpoints per batch. Rows that failed to decode
    are left out of the encoder batch (every executor feeds the encoder exactly the same rows).

    ``models``: live models to use (the in-process executor); otherwise they are loaded from the
    job's specs, as a remote worker must, and checked against the driver's fingerprints."""

    def __init__(self, job: EmbedJob, models: list[LoadedModel] | None = None, threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        if models is None:
            models = [load_model(s) for s in job.specs]
        for m, fp in zip(models, job.fingerprints):
            if m.fingerprint != fp:
                raise RuntimeError(f"worker built model {m.fingerprint} but the driver expects {fp} "
                                   f"({m.spec.checkpoint}): the worker runs a different open_clip/hardrank "
                                   f"or sees a different file")
        self.k = len(models)
        self.image, self.text = ImageEncoder(models), TextEncoder(models)

    def prepare(self, batch: dict) -> dict:
        """The batch with its texts tokenised (``tokens``) ahead of ``__call__``: an executor may run it in
        the thread that reads the next batch. Image batches pass unchanged."""
        if batch["modality"] == "image":
            return batch
        texts = self._texts(batch)
        if not texts:
            return batch
        return {**batch, "tokens": self.text.tokenize(texts, tuple(batch.get("models") or range(self.k)))}

    @staticmethod
    def _texts(batch: dict) -> list[str]:
        ok = batch.get("ok")
        return list(batch["items"]) if ok is None else [t for t, good in zip(batch["items"], ok) if good]

    def __call__(self, batch: dict) -> dict:
        n = len(batch["rows"])
        ok = batch.get("ok")
        ok = np.ones(n, dtype=bool) if ok is None else ok
        error = batch.get("error") or [None] * n
        models = tuple(batch.get("models") or range(self.k))
        sel = np.nonzero(ok)[0]
        emb: list = []
        if len(sel) and batch["modality"] == "image":
            pixels = batch["pixels"]
            if len(sel) < n:
                idx = torch.from_numpy(sel)
                pixels = {k: v[idx] for k, v in pixels.items()} if isinstance(pixels, dict) else pixels[idx]
            enc = self.image({"pixels": pixels, "models": models})
            emb = [enc.get(f"emb{i}") for i in range(self.k)]
        elif len(sel):
            enc = self.text({"text": self._texts(batch), "models": models, "tokens": batch.get("tokens")})
            emb = [enc.get(f"emb{i}") for i in range(self.k)]
        out = {"modality": batch["modality"], "rows": batch["rows"], "ok": ok, "error": error, "emb": emb}
        if batch.get("keys") is not None:
            out["keys"] = batch["keys"]
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
    per_checkpoint: list = field(default_factory=list)  # per model of the pass: {"from_store", "encoded"}

    @property
    def per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        """The pass: ``from_store`` rows no checkpoint lacked, ``encoded`` distinct items encoded for at
        least one checkpoint; ``per_checkpoint`` the same two counts for each checkpoint alone."""
        return {"total": self.total, "from_store": self.from_store, "encoded": self.encoded,
                "failed": self.failed, "seconds": round(self.seconds, 3),
                "items_per_s": round(self.per_second, 2),
                "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
                "per_checkpoint": [dict(c) for c in self.per_checkpoint]}

    def for_checkpoint(self, i: int) -> dict:
        """What checkpoint ``i`` of the pass got: its own store hits and encodes; the seconds are
        the pass's, shared by its checkpoints (one decode feeds them all)."""
        c = self.per_checkpoint[i] if i < len(self.per_checkpoint) else {"from_store": self.from_store,
                                                                          "encoded": self.encoded}
        return {"total": self.total, "from_store": c["from_store"], "encoded": c["encoded"], "failed": self.failed,
                "seconds": round(self.seconds, 3),
                "items_per_s": round(c["encoded"] / self.seconds, 2) if self.seconds > 0 else 0.0,
                "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
                "pass": {"checkpoints": max(1, len(self.per_checkpoint)), "from_store": self.from_store,
                         "encoded": self.encoded}}


def check_failures(st: EmbedStats, max_failures: int | None) -> None:
    """Raise TooManyFailures once more images failed than ``max_failures`` allows."""
    if max_failures is not None and len(st.failures) > max_failures:
        first = "\n".join(f"  {u}: {w}" for _, u, w in st.failures[:5])
        raise TooManyFailures(
            f"{len(st.failures)} images could not be read or decoded (limit --max-failures {max_failures}); "
            f"first ones:\n{first}\nFix or remove the files, or raise --max-failures; finished work is kept "
            f"in the store and a rerun resumes.")


class EmbedSink:
    """Where a runner delivers encoded batches, in any order: records failures (stopping past
    ``max_failures``), buffers embeddings, and writes one atomic shard per store every
    ``flush_rows`` rows, so a killed run keeps what was flushed and a rerun does only the rest."""

    def __init__(self, table: ItemTable, keys: list[str], stores: list[EmbeddingStore], have: list[np.ndarray],
                 stats: EmbedStats, *, flush_rows: int, max_failures: int | None, bar=None,
                 ids: IdIndex | None = None):
        self.table, self.keys, self.stores, self.have, self.ids = table, keys, stores, have, ids
        self.stats, self.flush_rows, self.max_failures, self.bar = stats, max(1, flush_rows), max_failures, bar
        self._pending: list[list] = [[] for _ in stores]  # per store: (keys, (n, D) embeddings) chunks
        self._pending_rows = 0

    def time(self, stage: str, seconds: float) -> None:
        self.stats.stage_seconds[stage] = self.stats.stage_seconds.get(stage, 0.0) + seconds

    def deliver(self, out: dict) -> None:
        """Take one encoded batch (see the module docstring)."""
        rows = np.asarray(out["rows"], dtype=np.int64)
        ok = np.asarray(out["ok"], dtype=bool)
        if out.get("keys") is not None:
            self.learn(rows, out["keys"])
        if not ok.all():
            self.fail(rows[~ok], [e for e, good in zip(out["error"], ok) if not good])
        if ok.any():
            self.add(rows[ok], out["emb"])

    def learn(self, rows, keys) -> None:
        """Content keys the decoders computed: a provisional key (``--key-by id``) becomes the real one
        (in the table's key list, which this sink shares), and its identity is recorded in the id index."""
        for r, k in zip(rows, keys):
            r = int(r)
            old = self.keys[r]
            if k and is_provisional(old):
                self.keys[r] = k
                if self.ids is not None:
                    self.ids.add(old[1:].split("@", 1)[0], k.split("@", 1)[0])

    def fail(self, rows, errors) -> None:
        """Record rows that could not be decoded; raises TooManyFailures (after flushing) past the limit."""
        for r, why in zip(rows, errors):
            r = int(r)
            self.stats.failures.append((r, self.table.entries[r].uri, why))
            log.warning("skipping image %s: %s", self.table.entries[r].uri, why)
        if self.bar and len(rows):  # progress, not throughput: a bar without skip() counts them as done
            getattr(self.bar, "skip", self.bar.update)(len(rows))
        if self.max_failures is not None and len(self.stats.failures) > self.max_failures:
            self.flush()
            check_failures(self.stats, self.max_failures)

    def add(self, rows, embeddings) -> None:
        """``embeddings[i]``: (len(rows), D) L2-normalised embeddings of model i for ``rows``, or None
        where model i did not encode them (it had them)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(embeddings) != len(self.stores):
            raise ValueError(f"got embeddings of {len(embeddings)} models for {len(self.stores)} stores")
        bkeys = [self.keys[r] for r in rows]
        for i, emb in enumerate(embeddings):
            if emb is None:  # this checkpoint has these rows already: not encoded for it
                continue
            self._check_finite(i, rows, emb)
            if i < len(self.stats.per_checkpoint):
                self.stats.per_checkpoint[i]["encoded"] += len(rows)
            need = ~self.have[i][rows]
            if need.any():
                self._pending[i].append(([k for k, n in zip(bkeys, need) if n], np.asarray(emb)[need]))
        self._pending_rows += len(rows)
        self.stats.encoded += len(rows)
        if self._pending_rows >= self.flush_rows:
            self.flush()
        if self.bar:
            self.bar.update(len(rows))

    def _check_finite(self, i: int, rows: np.ndarray, emb) -> None:
        """A checkpoint whose weights hold NaN/inf (a diverged run) encodes NaN: refused here, naming the
        checkpoint, before it reaches the store (where a rerun would read it back) or the ranking kernels."""
        finite = np.isfinite(np.asarray(emb)).all(1)
        if finite.all():
            return
        self.flush()  # what was encoded before is finite and kept
        entry = self.table.entries[int(rows[int(np.argmin(finite))])]
        ck = self.stores[i].meta.get("checkpoint") or self.stores[i].fingerprint
        raise DataError(f"checkpoint {ck} encodes NaN or infinite embeddings ({int((~finite).sum())} of {len(rows)} "
                        f"{self.table.modality}s in a batch, first {getattr(entry, 'uri', entry)!r}): its weights hold "
                        f"NaN/inf (a diverged training run?); evaluate another checkpoint")

    def flush(self) -> None:
        t = time.perf_counter()
        for i, store in enumerate(self.stores):
            if self._pending[i]:
                ks = [k for part, _ in self._pending[i] for k in part]
                store.write(self.table.modality, ks, np.concatenate([e for _, e in self._pending[i]]))
                self._pending[i] = []
        if self.ids is not None:  # after the shards: a recorded identity always has its embedding stored
            self.ids.commit()
        self._pending_rows = 0
        self.time("write", time.perf_counter() - t)
