"""The one path from (model specs, item tables, options) to embeddings through the store.

``EmbedPipeline`` loads K checkpoints of one architecture, opens one store folder per model
fingerprint (DALI-decoded embeddings in their own ``<fingerprint>-dali`` folder), encodes only the
items no store holds yet, with the executor and decoder the options name, and reads the matrices
back. Evaluation, mask baselines, mining, the benchmarks and dry-run plans all go through it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from hardrank import executors, urls
from hardrank.config import DECODERS, EmbedOptions
from hardrank.encoding.decode import is_processor_cfg
from hardrank.encoding.job import EmbedJob, EmbedSink, EmbedStats, check_failures
from hardrank.errors import UsageError
from hardrank.items import ItemTable, Tables
from hardrank.models.load import load_model
from hardrank.models.runs import user_specs
from hardrank.models.spec import LoadedModel, ModelSpec
from hardrank.settings import RunSettings, start_run
from hardrank.store.embedding_store import EmbeddingStore, is_store_folder
from hardrank.store.idkeys import IdIndex, table_keys
from hardrank.store.memory import MemoryStore

__all__ = ["EmbedPipeline", "embed_tables", "table_embeddings", "make_runner", "make_scan_mapper", "unique_labels"]

log = logging.getLogger("hardrank.embed")


def make_runner(options: EmbedOptions, models: list[LoadedModel], settings: RunSettings | None = None):
    """The embed runner of the executor ``options.executor`` names (``hardrank.executors``), for the run
    ``settings`` describe (None: its threads from ``options``)."""
    return executors.executor(options, settings).embed_runner(models)


def make_scan_mapper(options: EmbedOptions, settings: RunSettings | None = None):
    """How tar shards are scanned (``hardrank.inputs.scan_with``): None (threads here) for the local
    executor; with ``ray``, Ray tasks, so the workers read the shards and the driver reads none."""
    return executors.executor(options, settings).scan_mapper()


def embed_tables(tables: Tables, models: list[LoadedModel], stores: list[EmbeddingStore], *,
                 batch_size: int = 256, flush_rows: int = 8192, decode_threads: int = 2, decoder: str = "pillow",
                 max_failures: int | None = 100, progress=None, runner=None, key_by: str = "content",
                 ids: IdIndex | None = None) -> dict[str, EmbedStats]:
    """Embed every table row some model's store lacks, each only for the models that lack it; the
    models that lack a row share its decode. Returns stats per modality (``per_checkpoint`` holds
    each model's store hits and encodes). Failed images are recorded in ``tables.images.failed``,
    every row of a failed image's content included.

    The stores' writer locks are held from deciding what is missing until the last shard is
    committed, so a concurrent run on the same store waits and then finds the items stored; the
    shards read are verified first (a shard failing its checksum is quarantined and re-encoded).

    runner: a callable ``runner(work)`` that executes ``work``, a list of ``(EmbedJob, EmbedSink)``
    (one per modality with missing rows), delivers every encoded batch to its sink and adds its
    seconds to each sink's stats; None runs in-process on ``models`` (``LocalRunner``).

    key_by: ``content`` hashes every image's bytes here before deciding; ``id`` decides from identities
    recorded in ``ids`` and lets the decoders hash the new ones (``hardrank.store.idkeys``). Either way the
    store is keyed by content and ``ids`` records each image's identity."""
    if decoder not in DECODERS:
        raise UsageError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
    if len({json.dumps(m.preprocess_cfg, sort_keys=True) for m in models}) > 1:
        raise UsageError("models in one embed pass must share preprocessing; group checkpoints by architecture")
    if decoder != "pillow" and any(is_processor_cfg(m.preprocess_cfg) for m in models):
        raise UsageError(f"--decoder {decoder}: transformers models (hf:, blip:) are preprocessed by their own "
                         f"image processor on Pillow-decoded images; use --decoder pillow (the default)")
    stats: dict[str, EmbedStats] = {}
    keys_of: dict[str, list[str]] = {}
    for modality in ("image", "text"):
        table: ItemTable = tables.of(modality)
        st = stats[modality] = EmbedStats(total=len(table))
        t0 = time.perf_counter()
        keys_of[modality] = table_keys(table, key_by, ids)
        st.stage_seconds["key"] = time.perf_counter() - t0
        st.seconds = time.perf_counter() - t0
    work: list[tuple[EmbedJob, EmbedSink]] = []
    writable = [s for s in stores if not s.readonly]  # a folder this user cannot write serves reads only
    with contextlib.ExitStack() as held:
        folders = [s for s in writable if s.dir is not None]  # (a MemoryStore has nothing to lock)
        for store in sorted(folders, key=lambda s: os.path.realpath(s.dir)):  # one order: no deadlock
            held.enter_context(store.lock())
        for store in stores:
            store.refresh()  # shards another run committed while this one waited or hashed
        for store in writable:
            store.remove_stale_temporaries()
            store.write_manifest()  # every writer's shards, also after a manifest was lost
        _refuse_unwritable_gaps(tables, keys_of, stores, key_by)
        for modality in ("image", "text"):
            job_sink = _plan_modality(tables.of(modality), keys_of[modality], models, stores, stats[modality],
                                      batch_size=batch_size, flush_rows=flush_rows, decode_threads=decode_threads,
                                      decoder=decoder, max_failures=max_failures, progress=progress,
                                      key_by=key_by, ids=ids)
            if job_sink is not None:
                work.append(job_sink)
        try:
            if work:  # one call for both modalities: workers start once; runners add their time to the stats
                (runner or executors.LocalRunner(models))(work)
        finally:  # also on errors and interrupts: whatever was encoded is committed
            for _, sink in work:
                sink.flush()
                if sink.bar:
                    sink.bar.close()
    for modality, st in stats.items():
        table = tables.of(modality)
        _same_content_fails_alike(table, keys_of[modality], st)
        st.failures.sort(key=lambda f: f[0])  # by row: the same list whichever executor ran
        st.failed = len(st.failures)
        for r, _, why in st.failures:
            table.failed[r] = why
        check_failures(st, max_failures)
    return stats


def _refuse_unwritable_gaps(tables: Tables, keys_of: dict[str, list[str]], stores: list[EmbeddingStore],
                            key_by: str) -> None:
    """A store folder this process cannot write (``unwritable``: a shared store of another user, a read-only
    cache; or opened ``readonly``) must hold every readable item of the run: otherwise a UsageError naming
    the folder, what it lacks and the fix, before anything is encoded."""
    for store in stores:
        if not store.readonly:
            continue
        lacks = {}
        for modality in ("image", "text"):
            failed = tables.of(modality).failed
            wanted = list(dict.fromkeys(k for r, k in enumerate(keys_of[modality]) if k and r not in failed))
            store.verify(modality, wanted)  # (read-only: a bad shard is ignored, not moved)
            lacks[modality] = len(wanted) - int(store.contains(modality, wanted).sum()) if wanted else 0
        if any(lacks.values()):
            hint = (" (with --key-by id an image whose identity the store has not recorded counts as lacking; "
                    "--key-by content finds it by its bytes)" if key_by == "id" and lacks["image"] else "")
            why = store.unwritable or "opened read-only"
            raise UsageError(f"store folder {store.dir} cannot be written ({why}) and lacks {lacks['image']} images "
                             f"and {lacks['text']} texts of this run{hint}; a store that cannot be written serves "
                             f"only what it holds: pass a --store this user can write, or have the folder's owner "
                             f"run this first (or grant write access)")


def _plan_modality(table: ItemTable, keys: list[str], models: list[LoadedModel], stores: list[EmbeddingStore],
                   st: EmbedStats, *, batch_size: int, flush_rows: int, decode_threads: int, decoder: str,
                   max_failures: int | None, progress, key_by: str = "content",
                   ids: IdIndex | None = None) -> tuple[EmbedJob, EmbedSink] | None:
    """What one modality needs: verify the shards holding its keys, find per model which rows it
    lacks, and make the job (rows grouped by the set of models lacking them) and its sink."""
    t0 = time.perf_counter()
    modality = table.modality
    failed_rows = set(table.failed)
    good = np.ones(len(keys), dtype=bool)
    good[list(failed_rows)] = False
    wanted = list({k for k, g in zip(keys, good) if g})
    for store in stores:
        store.verify(modality, wanted)  # once per shard per process; bad shards are quarantined
    have = [s.contains(modality, keys) for s in stores]
    need = np.stack([~h & good for h in have]) if have else np.zeros((0, len(keys)), dtype=bool)  # (K, N)
    need_any = need.any(0)
    rows, seen = [], set()  # one row per distinct key
    for r in np.nonzero(need_any)[0]:
        if keys[r] not in seen:
            seen.add(keys[r])
            rows.append(r)
    rows = np.array(rows, dtype=np.int64)
    st.from_store = int(len(keys) - need_any.sum() - len(failed_rows))
    st.per_checkpoint = [{"from_store": int((h & good).sum()), "encoded": 0} for h in have]
    if failed_rows:
        st.failures.extend((r, table.entries[r].uri, table.failed[r]) for r in sorted(failed_rows))
        for r in sorted(failed_rows):
            log.warning("skipping image %s: %s", table.entries[r].uri, table.failed[r])
        check_failures(st, max_failures)
    st.seconds += time.perf_counter() - t0
    if not len(rows):
        return None
    # rows that the same models lack form one segment; texts of similar length share a batch
    patterns, inverse = np.unique(np.packbits(need[:, rows].T, axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if modality == "text":
        order = np.lexsort((np.fromiter((len(table.entries[r]) for r in rows), np.int64, len(rows)), inverse))
    else:
        order = np.argsort(inverse, kind="stable")
    rows = rows[order]
    counts = np.bincount(inverse, minlength=len(patterns))
    segments = tuple((int(counts[p]), tuple(int(i) for i in np.nonzero(np.unpackbits(patterns[p])[:len(models)])[0]))
                     for p in range(len(patterns)) if counts[p])
    job = EmbedJob(modality=modality, rows=rows, items=tuple(table.entries[r] for r in rows),
                   specs=tuple(replace(m.spec, precision=m.precision) for m in models),
                   fingerprints=tuple(m.fingerprint for m in models),
                   preprocess_cfg=dict(models[0].preprocess_cfg), decoder=decoder,
                   batch_size=batch_size, decode_threads=decode_threads, segments=segments,
                   key_by=key_by if modality == "image" else "content")
    bar = progress(total=len(rows), desc=f"embed {modality}s") if progress else None
    return job, EmbedSink(table, keys, stores, have, st, flush_rows=flush_rows, max_failures=max_failures, bar=bar,
                          ids=ids if modality == "image" else None)


def _same_content_fails_alike(table: ItemTable, keys: list[str], st: EmbedStats) -> None:
    """An image is decoded once per distinct content: when it fails, every other row with the same
    bytes (two zero-byte downloads, two copies of one error page) fails too, and is recorded."""
    if not st.failures:
        return
    first = {}
    for r, uri, why in st.failures:
        if keys[r]:
            first.setdefault(keys[r], (uri, why))
    if not first:
        return
    recorded = {r for r, _, _ in st.failures}
    for r, k in enumerate(keys):
        if k in first and r not in recorded:
            uri, why = first[k]
            st.failures.append((r, table.entries[r].uri, f"{why} (same bytes as {uri})"))
            log.warning("skipping image %s: same bytes as %s, which failed", table.entries[r].uri, uri)


def table_embeddings(store: EmbeddingStore, table: ItemTable, dtype=None) -> np.ndarray:
    """(rows, d) embeddings of a whole table in row order; rows that failed to load are zeros
    (callers drop the task rows that use them)."""
    keys = table.keys()
    good = [i for i, k in enumerate(keys) if k and i not in table.failed]
    out = np.zeros((len(keys), store.dim), dtype=dtype or store.dtype)
    if good:
        out[good] = store.read(table.modality, [keys[i] for i in good])
    return out


def unique_labels(labels: list[str]) -> list[str]:
    """Labels made unique in order: a repeated label gets ``-1``, ``-2``... appended."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label if n == 0 else f"{label}-{n}")
    return out


class EmbedPipeline:
    """K checkpoints of one architecture, their stores, and the executor that fills them.

    >>> pipe = EmbedPipeline.from_checkpoints("ViT-B-32", ["a.pt", "b.pt"], EmbedOptions(store="/tmp/s"))
    >>> stats = pipe.run(tables)            # encodes only what the stores lack
    >>> emb = pipe.embeddings(0, tables)    # {"image": (n_img, d), "text": (n_txt, d)}

    ``runner``: an executor to use instead of the one ``options.executor`` names (its lifetime is
    then the caller's); otherwise one is made for each ``run`` and closed after it. ``settings``: the
    threads of the run this pipeline serves (``hardrank.settings.start_run``); None: each ``run`` is a run
    of its own, its threads decided from ``options`` (``threads``, ``decode_threads``) when it starts.
    """

    def __init__(self, specs: Sequence[ModelSpec], options: EmbedOptions = EmbedOptions(), *, runner=None,
                 settings: RunSettings | None = None):
        if not specs:
            raise UsageError("an embed pipeline needs at least one model")
        bound = [s for s in specs if not s.spec_kind.portable]
        if bound and runner is None and not executors.executor(options, settings).live_models:
            raise UsageError(f"model {bound[0].arch} encodes in this process only (a model object cannot travel to "
                             f"--executor {options.executor}'s workers): use the local executor (the default)")
        self.options = options
        self.settings = settings
        self.models = [load_model(s) for s in specs]
        self.labels = unique_labels([m.label for m in self.models])
        self.runner = runner
        self._stores: list[EmbeddingStore] | None = None
        self._mirror: urls.RemoteDir | None = None
        self._ids: IdIndex | None = None

    @classmethod
    def from_checkpoints(cls, model: str, checkpoints: Sequence[str | None], options: EmbedOptions = EmbedOptions(),
                         *, pretrained: str | None = None, random_init: bool = False, runner=None,
                         settings: RunSettings | None = None) -> EmbedPipeline:
        """K checkpoints of ``model`` (``None``: the tag's / folder's weights, or random with ``random_init``)."""
        return cls(user_specs(model, checkpoints, precision=options.precision, device=options.device,
                              pretrained=pretrained, random_init=random_init), options, runner=runner,
                   settings=settings)

    def fingerprint(self, i: int) -> str | None:
        """Store folder of model i: DALI pixels differ from Pillow's (within a tested bound), so
        their embeddings never share a folder. None: a model without one (a model object given without a
        fingerprint), whose embeddings are held in memory only."""
        m, decoder = self.models[i], self.options.decoder
        if m.fingerprint is None:
            return None
        return m.fingerprint if decoder == "pillow" else f"{m.fingerprint}-{decoder}"

    def _stored(self) -> list[int]:
        """The models whose embeddings go through the store (those with a fingerprint)."""
        return [i for i, m in enumerate(self.models) if m.fingerprint is not None]

    def store_root(self) -> str:
        """The local store root: ``--store`` itself, or for a URL (``s3://bucket/store``) its local mirror
        (``$HARDRANK_CACHE/remote/mirrors/<hash>``), filled with this run's fingerprint folders and the id
        index from the remote first; ``push`` uploads what the run added."""
        root = self.options.store_root()
        if not urls.is_url(root):
            return root
        if self._mirror is None:
            self._mirror = urls.RemoteDir(root)
            for i in self._stored():
                self._mirror.pull(self.fingerprint(i))  # (its id records included)
        return str(self._mirror.local)

    def push(self) -> None:
        """Upload what this pipeline added to a URL store (shards first, each manifest after its shards)."""
        if self._mirror is not None:
            self._mirror.push()

    @property
    def ids(self) -> IdIndex | None:
        """The store root's identity -> content key records (``hardrank.store.idkeys``); None when no model of the
        pipeline is stored (nothing of the store root is read)."""
        if self._ids is None and self._stored():
            self._ids = IdIndex(self.store_root(), [self.fingerprint(i) for i in self._stored()])
        return self._ids

    @property
    def stores(self) -> list[EmbeddingStore | MemoryStore]:
        """One store per model: its fingerprint's folder, or (no fingerprint) memory."""
        if self._stores is None:
            self._stores = [MemoryStore(dim=m.embed_dim, dtype=m.store_dtype, meta=self._meta(m))
                            if m.fingerprint is None else
                            EmbeddingStore(self.store_root(), self.fingerprint(i), dim=m.embed_dim,
                                           dtype=m.store_dtype, meta=self._meta(m)) for i, m in enumerate(self.models)]
        return self._stores

    def _meta(self, m: LoadedModel) -> dict:
        ck = m.spec.checkpoint  # absolute: `hardrank store list` runs from other folders and checks it is there
        ck = os.path.abspath(ck) if ck and not urls.is_url(ck) else ck
        return {"arch": m.arch_name, "checkpoint": ck, "precision": m.precision,
                "preprocess": m.preprocess_cfg, "decoder": self.options.decoder}

    def run(self, tables: Tables, *, progress=None, flush_rows: int = 8192) -> dict[str, EmbedStats]:
        """Encode every item of ``tables`` some store lacks; returns stats per modality."""
        o = self.options
        settings = self.settings or start_run(o.threads, o.decode_threads)
        runner = self.runner or make_runner(o, self.models, settings)
        try:
            with contextlib.ExitStack() as held:  # a model object: in inference mode while it encodes, then as found
                for m in self.models:
                    if m.session is not None:
                        held.enter_context(m.session())
                return embed_tables(tables, self.models, self.stores, batch_size=o.batch_size, flush_rows=flush_rows,
                                    decode_threads=settings.decode_threads, decoder=o.decoder,
                                    max_failures=o.max_failures, progress=progress, runner=runner, key_by=o.key_by,
                                    ids=self.ids)
        finally:
            if runner is not self.runner and hasattr(runner, "close"):
                runner.close()
            self.push()  # also after an error or Ctrl-C: committed shards reach the remote store

    def embeddings(self, i: int, tables: Tables, dtype=None) -> dict[str, np.ndarray]:
        """Whole-table ``(rows, d)`` embeddings of model i per modality, in table-row order."""
        return {mod: table_embeddings(self.stores[i], tables.of(mod), dtype) for mod in ("image", "text")}

    def plan(self, tables: Tables) -> list[dict]:
        """What ``run`` would encode, per model, without encoding or creating anything: store hits
        and misses among the distinct readable items of each modality."""
        root = self.store_root() if self._stored() else None
        ids = IdIndex(root, readonly=True) if root is not None else None
        keys = {"image": table_keys(tables.images, self.options.key_by, ids), "text": tables.texts.keys()}
        rows = []
        for i, m in enumerate(self.models):
            fp = self.fingerprint(i)
            store = None
            if fp is not None and is_store_folder(Path(root) / fp):  # a dry run creates and moves nothing
                store = EmbeddingStore(root, fp, dim=m.embed_dim, dtype=m.store_dtype, readonly=True)
            row = {"label": self.labels[i], "fingerprint": fp}
            for mod in ("image", "text"):
                good = list(dict.fromkeys(k for r, k in enumerate(keys[mod]) if k and r not in tables.of(mod).failed))
                if store is not None:
                    store.verify(mod, good)  # a shard failing its checksum counts as missing
                hits = int(store.contains(mod, good).sum()) if store is not None else 0
                row[f"{mod}_unique"], row[f"{mod}_hits"], row[f"{mod}_to_encode"] = len(good), hits, len(good) - hits
            rows.append(row)
        return rows
