"""The one path from (model specs, item tables, options) to embeddings through the store.

``EmbedPipeline`` loads K checkpoints of one architecture, opens one store folder per model
fingerprint (DALI-decoded embeddings in their own ``<fingerprint>-dali`` folder), encodes only the
items no store holds yet, with the executor and decoder the options name, and reads the matrices
back. Evaluation, mask baselines, mining, the benchmarks and dry-run plans all go through it.
"""
from __future__ import annotations

import importlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..config import DECODERS, EmbedOptions
from ..errors import MissingExtra, UsageError
from ..items import ItemTable, Tables
from ..models import LoadedModel, ModelSpec, load_model
from ..store import EmbeddingStore
from .job import EmbedJob, EmbedSink, EmbedStats, check_failures
from .local import LocalRunner

__all__ = ["EmbedPipeline", "embed_tables", "table_embeddings", "make_runner", "unique_labels"]

log = logging.getLogger("hardrank.embed")


def make_runner(options: EmbedOptions, models: list[LoadedModel]):
    """The executor ``options.executor`` names: in-process, or Ray Data actor pools (the Ray
    runner lives in ``hardrank.jobs``, the only package that imports Ray)."""
    if options.executor == "local":
        return LocalRunner(models)
    try:
        ray_executor = importlib.import_module("hardrank.jobs.ray_executor")
    except ImportError as exc:
        if "ray" not in str(exc):
            raise
        raise MissingExtra("--executor ray", "ray", "ray[data]") from exc
    return ray_executor.RayRunner(address=options.ray_address)


def embed_tables(tables: Tables, models: list[LoadedModel], stores: list[EmbeddingStore], *,
                 batch_size: int = 256, flush_rows: int = 8192, decode_threads: int = 2, decoder: str = "pillow",
                 max_failures: int | None = 100, progress=None, runner=None) -> dict[str, EmbedStats]:
    """Embed every table row missing from any model's store; K models share each decoded batch.
    Returns stats per modality. Failed images are recorded in ``tables.images.failed``.

    runner: a callable ``runner(work)`` that executes ``work``, a list of ``(EmbedJob, EmbedSink)``
    (one per modality with missing rows), delivers every encoded batch to its sink and adds its
    seconds to each sink's stats; None runs in-process on ``models`` (``LocalRunner``)."""
    if decoder not in DECODERS:
        raise UsageError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
    if len({json.dumps(m.preprocess_cfg, sort_keys=True) for m in models}) > 1:
        raise UsageError("models in one embed pass must share preprocessing; group checkpoints by architecture")
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
        rows, seen = [], set()  # one row per distinct key
        for r in np.nonzero(need_any)[0]:
            if keys[r] not in seen:
                seen.add(keys[r])
                rows.append(r)
        if modality == "text":  # similar lengths share a batch, so trimming padding pays off
            rows.sort(key=lambda r: len(table.entries[r]))
        rows = np.array(rows, dtype=np.int64)
        st.from_store = int(len(keys) - need_any.sum() - len(failed_rows))
        if failed_rows:
            st.failures.extend((r, table.entries[r].uri, table.failed[r]) for r in sorted(failed_rows))
            for r in sorted(failed_rows):
                log.warning("skipping image %s: %s", table.entries[r].uri, table.failed[r])
            check_failures(st, max_failures)
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
        if work:  # one call for both modalities: workers start once; runners add their time to the stats
            (runner or LocalRunner(models))(work)
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
    then the caller's); otherwise one is made for each ``run`` and closed after it.
    """

    def __init__(self, specs: Sequence[ModelSpec], options: EmbedOptions = EmbedOptions(), *, runner=None):
        if not specs:
            raise UsageError("an embed pipeline needs at least one model")
        self.options = options
        self.models = [load_model(s) for s in specs]
        self.labels = unique_labels([m.label for m in self.models])
        self.runner = runner
        self._stores: list[EmbeddingStore] | None = None

    @classmethod
    def from_checkpoints(cls, model: str, checkpoints: Sequence[str | None], options: EmbedOptions = EmbedOptions(),
                         *, pretrained: str | None = None, random_init: bool = False, runner=None) -> EmbedPipeline:
        """K checkpoints of ``model`` (``None``: the tag's / folder's weights, or random with ``random_init``)."""
        return cls([ModelSpec(model, c, options.precision, options.device, pretrained=pretrained,
                              random_init=random_init) for c in checkpoints or (None,)], options, runner=runner)

    def fingerprint(self, i: int) -> str:
        """Store folder of model i: DALI pixels differ from Pillow's (within a tested bound), so
        their embeddings never share a folder."""
        m, decoder = self.models[i], self.options.decoder
        return m.fingerprint if decoder == "pillow" else f"{m.fingerprint}-{decoder}"

    @property
    def stores(self) -> list[EmbeddingStore]:
        if self._stores is None:
            self._stores = [EmbeddingStore(self.options.store_root(), self.fingerprint(i), dim=m.embed_dim,
                                           dtype=m.store_dtype, meta=self._meta(m)) for i, m in enumerate(self.models)]
        return self._stores

    def _meta(self, m: LoadedModel) -> dict:
        return {"arch": m.arch_name, "checkpoint": m.spec.checkpoint, "precision": m.precision,
                "preprocess": m.preprocess_cfg, "decoder": self.options.decoder}

    def run(self, tables: Tables, *, progress=None, flush_rows: int = 8192) -> dict[str, EmbedStats]:
        """Encode every item of ``tables`` some store lacks; returns stats per modality."""
        o = self.options
        runner = self.runner or make_runner(o, self.models)
        try:
            return embed_tables(tables, self.models, self.stores, batch_size=o.batch_size, flush_rows=flush_rows,
                                decode_threads=o.decode_threads, decoder=o.decoder, max_failures=o.max_failures,
                                progress=progress, runner=runner)
        finally:
            if runner is not self.runner and hasattr(runner, "close"):
                runner.close()

    def embeddings(self, i: int, tables: Tables, dtype=None) -> dict[str, np.ndarray]:
        """Whole-table ``(rows, d)`` embeddings of model i per modality, in table-row order."""
        return {mod: table_embeddings(self.stores[i], tables.of(mod), dtype) for mod in ("image", "text")}

    def plan(self, tables: Tables) -> list[dict]:
        """What ``run`` would encode, per model, without encoding or creating anything: store hits
        and misses among the distinct readable items of each modality."""
        keys = {m: tables.of(m).keys() for m in ("image", "text")}
        rows = []
        for i, m in enumerate(self.models):
            fp = self.fingerprint(i)
            store = None
            if (Path(self.options.store_root()) / fp / "manifest.json").is_file():  # a dry run creates no store
                store = EmbeddingStore(self.options.store_root(), fp, dim=m.embed_dim, dtype=m.store_dtype)
            row = {"label": self.labels[i], "fingerprint": fp}
            for mod in ("image", "text"):
                good = list(dict.fromkeys(k for r, k in enumerate(keys[mod]) if k and r not in tables.of(mod).failed))
                hits = int(store.contains(mod, good).sum()) if store is not None else 0
                row[f"{mod}_unique"], row[f"{mod}_hits"], row[f"{mod}_to_encode"] = len(good), hits, len(good) - hits
            rows.append(row)
        return rows
