"""hardrank: exact, fast retrieval benchmarks and hard-negative mining for CLIP-style models.

The public API (``help(hardrank)``). Options are the names of the command line's flags:

    import hardrank

    model, checkpoints, world = hardrank.toy_inputs("/tmp/toy_world")  # the built-in toy world
    report = hardrank.evaluate(model=model, checkpoints=checkpoints, suites=["toy"], data=world,
                               out="/tmp/results", store="/tmp/store")
    for r in hardrank.read_results("/tmp/results"):
        print(r.data["checkpoint"], r.data["suite"], r.data["metrics"].get("original", {}).get("i2t"))

- ``evaluate(**options)`` / ``evaluate(EvalConfig(...))``: checkpoints (or precomputed embeddings)
  on suites; writes ``out/<checkpoint>/<suite>.json`` + ``.parquet``; returns an ``EvalReport``.
  ``plan(**options)`` says what it would encode, doing nothing.
- ``mine(**options)`` / ``mine(MineConfig(...))``: hard negatives per query from a corpus.
- ``load_model(ModelSpec(...))``: an open_clip model loaded offline and fingerprinted;
  ``EmbedPipeline``: K checkpoints -> embeddings of item ``Tables`` through the store.
- ``EmbeddingStore`` / ``open_store(folder)``: the Arrow embedding store; ``export_embeddings(...)``
  writes a store's embeddings under the suites' ids (the ``--embeddings`` format).
- ``read_results(folder)``: the written results (``ResultFile.data``, ``.outcomes()``).
- Errors: ``HardrankError`` and its kinds ``UsageError``, ``DataError``, ``TooManyFailures``,
  ``MissingExtra``.
"""
import os as _os

# OpenMP threads must sleep, not spin, between parallel regions. libgomp's default spins 300,000
# rounds first, and on shared cores those spinning threads starve the main thread: every small torch
# op then costs a scheduler time slice, so a run's time follows its op count (K checkpoints x layers
# x batches), not its work (400 captions x 6 toy checkpoints at --batch-size 8: 108 s, 4.6 s with
# PASSIVE; 2 cores at load 20). libgomp reads this once, when torch loads it: hence here, before any
# import of torch. A policy the user set is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .config import EmbedOptions, EvalConfig, MineConfig, MineOptions, SearchSpec, SuiteOptions
from .embed import EmbedPipeline
from .errors import DataError, HardrankError, MissingExtra, TooManyFailures, UsageError
from .evaluate import EvalReport, evaluate, plan
from .items import ImageRef, Tables
from .mining import mine
from .models import LoadedModel, ModelSpec, load_model
from .results import ResultFile, read_results
from .store import EmbeddingStore, open_store
from .store_export import export_embeddings
from .toyworld import demo_inputs as toy_inputs

__all__ = [
    "evaluate", "plan", "EvalConfig", "EvalReport", "SuiteOptions", "EmbedOptions", "SearchSpec",
    "mine", "MineConfig", "MineOptions",
    "load_model", "ModelSpec", "LoadedModel", "EmbedPipeline", "Tables", "ImageRef",
    "EmbeddingStore", "open_store", "export_embeddings", "read_results", "ResultFile", "toy_inputs",
    "HardrankError", "UsageError", "DataError", "TooManyFailures", "MissingExtra",
]
