"""The built-in toy world as suites: RoCOCO-style retrieval, hard positives, inpaint 2x2, zero-shot classification."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hardrank.config import cache_dir
from hardrank.errors import UsageError
from hardrank.items import Tables
from hardrank.suites._common import SuiteOptions
from hardrank.suites.classification import ClassificationOptions, load_classification
from hardrank.suites.hard_positives import load_hard_positives
from hardrank.suites.inpaintcoco import load_inpaintcoco
from hardrank.suites.karpathy import load_rococo
from hardrank.tasks import Suite
from hardrank.toyworld import world as toy_world

__all__ = ["load_toy", "default_world_dir", "pending_world", "TOY_SUITES"]

TOY_SUITES = ("toy-rococo", "toy-hard-positives", "toy-inpaint", "toy-classify")


def default_world_dir() -> Path:
    return cache_dir() / "toy_world"


def pending_world(opts: SuiteOptions) -> Path | None:
    """The world folder loading a toy suite would build first (absent, or of a stale generator), or
    None when it is there: dry runs report it instead of building it."""
    world = Path(opts.data) if opts.data else default_world_dir()
    try:
        manifest = json.loads((world / "world.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return world
    return None if isinstance(manifest, dict) and manifest.get("version") == toy_world.WORLD_VERSION else world


def ensure_world(opts: SuiteOptions) -> Path:
    """``--data`` (or the cached default world): a world built with any config is used as it is
    (rebuilt only when its generator version is stale); a missing one is built with the defaults."""
    world = Path(opts.data) if opts.data else default_world_dir()
    return Path(toy_world.build_world(world, toy_world.world_config(world) or toy_world.WorldConfig()))


def load_toy(tables: Tables, opts: SuiteOptions, name: str) -> Suite:
    """One toy suite (``name``, of ``TOY_SUITES``) from the world in ``--data`` (built first when missing)."""
    world = ensure_world(opts)
    if name == "toy-rococo":
        o = replace(opts, annotations=str(world / "karpathy_test.json"), data=str(world / "rococo"),
                    images=str(world / "images"),
                    image_variants=opts.image_variants or ("mix_0.9", "patch_0.9"), seeds=(1,))
        suite = load_rococo(tables, o, name=name)
    elif name == "toy-hard-positives":
        suite = load_hard_positives(tables, replace(opts, data=str(world / "hard_positives"),
                                                    images=str(world / "images")), name=name)
    elif name == "toy-classify":  # zero-shot: the left object's colour and shape, 24 classes (+ --image-variants)
        split = toy_world.classification_split(world)
        names, severities, seed = toy_world.CLASSIFY_CORRUPTIONS
        variants = opts.image_variants or tuple(f"{n}_{s}" for n in names for s in severities)
        suite = load_classification(tables, replace(opts, images=str(world / "images"), image_variants=variants,
                                                    seeds=opts.seeds if opts.image_variants else (seed,),
                                                    annotations=str(split / "labels.csv")),
                                    ClassificationOptions(classnames=str(split / "classnames.txt"),
                                                          templates=str(split / "templates.txt")), name=name)
    elif name == "toy-inpaint":
        suite = load_inpaintcoco(tables, replace(opts, data=str(world / "inpaint")), name=name)
    else:
        raise UsageError(f"unknown toy suite {name!r}; choose from {TOY_SUITES}")
    suite.meta["world"] = str(world)
    return suite
