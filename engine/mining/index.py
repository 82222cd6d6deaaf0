"""Mining's FAISS index kept in a folder: built once (`hardrank index build`, `mine --index-out`), reused by
`mine --index` after checking it was built from this corpus (fingerprint, rows, dimension, sampled vectors, ids).

The folder's layout and its build (sampled training, blocks committed as they finish, lists memory-mapped when
larger than half the budget) are ``hardrank.scoring.faiss_index.ondisk``'s; the corpus's ids and keys
(``mining.catalog``) are written there too, so the next run reads neither the metadata nor the ids again.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from hardrank.config import IndexBuildConfig, MineOptions, check_writable_dir
from hardrank.errors import UsageError
from hardrank.inputs import registry
from hardrank.inputs.kind import InputOptions
from hardrank.mining.catalog import CATALOG, SIDECAR, Catalog, digest
from hardrank.mining.problem import MineProblem
from hardrank.scoring import corpus_io
from hardrank.scoring.backends.auto import size_index
from hardrank.scoring.backends.faiss import faiss_searcher
from hardrank.settings import RunSettings, start_run

__all__ = ["identity", "corpus_identity", "index_searcher", "build_index", "built_factory", "check_index"]


def identity(xb, modality: str, fingerprint: str | None, ids_digest: str) -> dict:
    """What a corpus is, for an index built from it: its rows, dimension, modality, its source's fingerprint,
    the digest of its ids, and a hash of 64 rows sampled evenly (the vectors as search reads them)."""
    nb, d = xb.shape
    rows = np.unique(np.linspace(0, nb - 1, min(nb, 64)).astype(np.int64)) if nb else np.zeros(0, np.int64)
    sample = corpus_io.gather(xb, rows) if nb else np.zeros((0, d), np.float32)
    corpus_io.release(xb)
    h = hashlib.blake2b(np.ascontiguousarray(sample, np.float32).tobytes(), digest_size=12).hexdigest()
    return {"rows": int(nb), "dim": int(d), "modality": modality, "fingerprint": fingerprint, "vectors": h,
            "ids": ids_digest}


def corpus_identity(problem: MineProblem) -> dict:
    """``identity`` of a mining problem's corpus (its source's fingerprint from its inputs, when known)."""
    meta = problem.meta.get("corpus", {}) if isinstance(problem.meta.get("corpus"), dict) else {}
    ids = meta.get("ids_digest") or digest(problem.corpus_ids)
    return identity(problem.xb, problem.modality, meta.get("fingerprint"), ids)


def built_factory(folder) -> str:
    """The factory of the complete index in ``folder`` (one line when there is none, or it is damaged)."""
    from hardrank.scoring.faiss_index import ondisk  # faiss: imported by that package alone

    m = ondisk.manifest(folder)
    if m is None:
        ondisk.check(folder, {})  # raises the line saying what is there (an unfinished build, nothing)
    return m["factory"]


def check_index(problem: MineProblem, folder) -> None:
    """The index in ``folder`` is complete, undamaged and built from this problem's corpus (else one line)."""
    from hardrank.scoring.faiss_index import ondisk  # faiss: imported by that package alone

    ondisk.check(folder, corpus_identity(problem))


def index_searcher(problem: MineProblem, opts: MineOptions, factory: str, folder, *, build: bool, echo=None):
    """The searcher of the IVF index ``factory`` in ``folder``: built there first (or its build resumed, or a
    complete one found) when ``build``, else only opened; checked against this corpus either way."""
    from hardrank.scoring.faiss_index import ondisk  # faiss: imported by that package alone

    folder = Path(folder)
    ident = corpus_identity(problem)
    if build:
        extra = tuple(f for f in (CATALOG, SIDECAR) if (folder / f).exists())
        ondisk.build(folder, problem.xb, factory, ident, budget_bytes=opts.budget_mb << 20, seed=opts.seed,
                     echo=echo, catalog_files=extra)
    t0 = time.perf_counter()
    index, m = ondisk.open_index(folder, ident)
    if m["factory"] != factory:
        raise UsageError(f"{folder} holds a {m['factory']} index, but --search asks for {factory}: use --search auto "
                         f"(or faiss:{m['factory']}) with --index {folder}, or build {factory} in another folder")
    search = faiss_searcher(problem.xb, factory, opts, index=index, where=f"{folder} (lists {m['lists']})")
    search.info["index_folder"] = str(folder)
    search.info["index_open_seconds"] = round(time.perf_counter() - t0, 3)
    return search


def build_index(cfg: IndexBuildConfig, echo=None, settings: RunSettings | None = None) -> dict:
    """Build the index ``cfg`` describes (``hardrank index build``); returns its manifest. ``settings``: the
    run's threads (None: a run of its own, on all the cores this process may use, as mining's)."""
    echo = echo or (lambda s: None)
    settings = settings or start_run(probe=False)  # a long GEMM-bound build: no look at the idle cores
    echo(f"threads: {settings.budget.describe()}")
    check_writable_dir(cfg.out, "out (--out)")
    src = registry.open_input(cfg.corpus, InputOptions())
    if src.embeddings is None:
        raise UsageError(f"index build needs a corpus holding embeddings, and {cfg.corpus} ({src.kind}) holds items "
                         f"to embed; embed them first (hardrank mine --model ... --store DIR), then index the store "
                         f"folder or its export ({registry.describe('embeddings')})")
    if cfg.modality not in src.embeddings.modalities:
        raise UsageError(f"{cfg.corpus} holds no {cfg.modality} embeddings (it has {list(src.embeddings.modalities)}); "
                         f"pass --modality {src.embeddings.modalities[0]}")
    out = Path(cfg.out)
    fp = getattr(src.embeddings, "content_id", "") or src.embeddings.fingerprint
    source = {"fingerprint": fp, "modality": cfg.modality, "paired": bool(src.paired)}
    t0 = time.perf_counter()
    catalog = Catalog.of_chunks(src.embeddings.columns(cfg.modality, paired=src.paired), out, source)
    echo(f"corpus ids: {len(catalog):,} rows in {catalog.path} ({time.perf_counter() - t0:.1f}s)")
    xb = src.embeddings.read(cfg.modality, range(len(catalog)))
    budget = cfg.budget_mb << 20
    factory = size_index(len(catalog), xb.shape[1], budget).factory if cfg.factory == "auto" else cfg.factory.strip()
    from hardrank.scoring.faiss_index import ondisk  # faiss: imported by that package alone

    ident = identity(xb, cfg.modality, fp, catalog.ids_digest)
    return ondisk.build(out, xb, factory, ident, budget_bytes=budget, seed=cfg.seed, echo=echo,
                        catalog_files=(CATALOG, SIDECAR))
