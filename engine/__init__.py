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
  ``plan(**options)`` says what it would encode, doing nothing. ``model`` may be a model object: an
  open_clip model with ``tokenizer=`` (``preprocess=`` optional) or a transformers one with ``processor=``,
  stored only under ``fingerprint=`` and left as it was found (a training loop's evaluation).
- ``mine(**options)`` / ``mine(MineConfig(...))``: hard negatives per query from a corpus.
- ``perturb_texts(...)`` / ``perturb_images(...)``: RoCOCO-style caption and image variants;
  ``attack_texts(...)`` / ``attack_images(...)``: the variants that break each checkpoint, evaluated
  (each takes its config, e.g. ``AttackTextsConfig``, or the same options as keywords).
- ``load_model(ModelSpec(...))``: an open_clip, transformers (``hf:FOLDER``) or BLIP (``blip:FOLDER``) model
  loaded offline and fingerprinted;
  ``EmbedPipeline``: K checkpoints -> embeddings of item ``Tables`` through the store.
- ``EmbeddingStore`` / ``open_store(folder)``: the Arrow embedding store; ``export_embeddings(...)``
  writes a store's embeddings under the suites' ids (the ``--embeddings`` format).
- ``read_results(folder)``: the written results (``ResultFile.data``, ``.outcomes()``).
- Errors: ``HardrankError`` and its kinds ``UsageError``, ``DataError``, ``TooManyFailures``,
  ``MissingExtra``.

``import hardrank`` is light (the ``hardrank`` command's ``--help`` needs no torch): it sets OpenMP's wait
policy and makes open_clip's first import leave transformers out (``hardrank.openclip_import``); the names
above are imported on first use, all at once.
"""
from __future__ import annotations

import sys
import types

from hardrank import openclip_import as openclip_import  # open_clip's first import will leave transformers out
from hardrank import openmp as openmp  # OpenMP's wait policy, which must precede torch's import

__all__ = [
    "evaluate", "plan", "EvalConfig", "EvalReport", "SuiteOptions", "EmbedOptions", "SearchSpec",
    "mine", "MineConfig", "MineOptions",
    "perturb_texts", "PerturbTextsConfig", "perturb_images", "PerturbImagesConfig",
    "attack_texts", "AttackTextsConfig", "attack_images", "AttackImagesConfig",
    "load_model", "ModelSpec", "LoadedModel", "EmbedPipeline", "Tables", "ImageRef",
    "EmbeddingStore", "open_store", "export_embeddings", "read_results", "ResultFile", "toy_inputs",
    "HardrankError", "UsageError", "DataError", "TooManyFailures", "MissingExtra",
]


def _api() -> dict:
    """The public names (``__all__``), imported."""
    from hardrank.attack_run import AttackImagesConfig, AttackTextsConfig, attack_images, attack_texts
    from hardrank.config import EmbedOptions, EvalConfig, MineConfig, MineOptions, SuiteOptions
    from hardrank.embed import EmbedPipeline
    from hardrank.errors import DataError, HardrankError, MissingExtra, TooManyFailures, UsageError
    from hardrank.evaluate import EvalReport, evaluate, plan
    from hardrank.exports.store_ids import export_embeddings
    from hardrank.items import ImageRef, Tables
    from hardrank.mining import mine
    from hardrank.models.load import load_model
    from hardrank.models.spec import LoadedModel, ModelSpec
    from hardrank.perturb import PerturbImagesConfig, PerturbTextsConfig, perturb_images, perturb_texts
    from hardrank.scoring.backends import SearchSpec
    from hardrank.scoring.results import ResultFile, read_results
    from hardrank.store.embedding_store import EmbeddingStore, open_store
    from hardrank.toyworld import demo_inputs as toy_inputs
    return {"evaluate": evaluate, "plan": plan, "EvalConfig": EvalConfig, "EvalReport": EvalReport,
            "SuiteOptions": SuiteOptions, "EmbedOptions": EmbedOptions, "SearchSpec": SearchSpec, "mine": mine,
            "MineConfig": MineConfig, "MineOptions": MineOptions, "perturb_texts": perturb_texts,
            "PerturbTextsConfig": PerturbTextsConfig, "perturb_images": perturb_images,
            "PerturbImagesConfig": PerturbImagesConfig, "attack_texts": attack_texts,
            "AttackTextsConfig": AttackTextsConfig, "attack_images": attack_images,
            "AttackImagesConfig": AttackImagesConfig, "load_model": load_model, "ModelSpec": ModelSpec,
            "LoadedModel": LoadedModel, "EmbedPipeline": EmbedPipeline, "Tables": Tables, "ImageRef": ImageRef,
            "EmbeddingStore": EmbeddingStore, "open_store": open_store, "export_embeddings": export_embeddings,
            "read_results": read_results, "ResultFile": ResultFile, "toy_inputs": toy_inputs,
            "HardrankError": HardrankError, "UsageError": UsageError, "DataError": DataError,
            "TooManyFailures": TooManyFailures, "MissingExtra": MissingExtra}


def __getattr__(name: str):
    if name in __all__:
        globals().update(_api())
        return globals()[name]
    raise AttributeError(f"module 'hardrank' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """``hardrank.evaluate`` stays the function once its module (``hardrank/evaluate.py``) is imported: the
    import system then sets the package's attribute of that name to the module."""

    def __setattr__(self, name, value):
        if name == "evaluate" and isinstance(value, types.ModuleType):
            value = value.evaluate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
