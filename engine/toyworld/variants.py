"""Toy perturbations: RoCOCO word substitutions, hard-positive triplets and inpaint-style edits."""

from __future__ import annotations

import numpy as np

from hardrank.formats.variants import N_PERTURBED, TEXT_VARIANTS
from hardrank.toyworld.scenes import (
    ANCHOR_TEMPLATE,
    BACKGROUNDS,
    COLOURS,
    RELATION_WORDS,
    REWORDED_TEMPLATE,
    SHAPES,
    SIZES,
    Scene,
)

# Replacement sources, as in RoCOCO: same concept class, another concept class, random vocabulary,
# danger words. None of these words occurs in a clean toy caption.
OTHER_CONCEPT = ("dog", "cat", "horse", "cow", "bird", "sheep", "elephant", "giraffe", "car", "bus",
                 "truck", "train", "bicycle", "boat", "airplane", "motorcycle", "apple", "banana",
                 "pizza", "chair", "table", "bed")
RANDOM_VOCAB = ("window", "running", "quickly", "paper", "music", "seven", "garden", "under", "bright",
                "soup", "letter", "mountain", "sleeping", "across", "kitchen", "silver", "yesterday",
                "bottle", "wooden", "street", "happy", "cloud", "ticket", "sand", "clock", "open")
DANGER_WORDS = ("weapon", "criminal", "minefield", "bomb", "gun", "knife", "grenade", "explosive",
                "poison", "terrorist", "rifle", "thief")

_ROLE = {**{w: "colour" for w in COLOURS}, **{w: "shape" for w in SHAPES}, **{w: "size" for w in SIZES},
         **{w: "background" for w in BACKGROUNDS}, **{w: "relation" for w in RELATION_WORDS}}
_CLASS_WORDS = {"colour": tuple(COLOURS), "shape": SHAPES}
# Which word roles each variant may replace.
_TARGETS = {
    "same_concept": ("colour", "shape"),
    "diff_concept": ("colour", "shape"),
    "rand_voca": ("colour", "shape", "size", "background", "relation"),
    "danger": ("colour", "shape", "size", "background"),
}


def perturb_caption(caption: str, variant: str, rng: np.random.Generator) -> str:
    """Replace ONE word of a clean toy caption, choosing the word and its replacement per variant."""
    words = caption.split(" ")
    slots = [i for i, w in enumerate(words) if _ROLE.get(w) in _TARGETS[variant]]
    if not slots:
        raise ValueError(f"caption {caption!r} has no word of roles {_TARGETS[variant]} to perturb")
    i = slots[rng.integers(len(slots))]
    word = words[i]
    if variant == "same_concept":
        pool = [w for w in _CLASS_WORDS[_ROLE[word]] if w != word]
    elif variant == "diff_concept":
        pool = list(OTHER_CONCEPT)
    elif variant == "rand_voca":
        pool = list(RANDOM_VOCAB)
    elif variant == "danger":
        pool = list(DANGER_WORDS)
    else:
        raise ValueError(f"unknown text variant {variant!r}; expected one of {TEXT_VARIANTS}")
    words[i] = pool[rng.integers(len(pool))]
    return " ".join(words)


def rococo_variant(items: list[dict], variant: str, rng: np.random.Generator) -> list[dict]:
    """A RoCOCO file: each item's originals unchanged, then one perturbed caption per original 1..5."""
    out = []
    for it in items:
        caps = list(it["caption"])
        perturbed = [perturb_caption(c, variant, rng) for c in caps[:N_PERTURBED]]
        out.append({"image": it["image"], "caption": caps + perturbed})
    return out


def _differing_attrs(scene: Scene) -> list[str]:
    return [a for a in ("colour", "shape", "size") if getattr(scene.left, a) != getattr(scene.right, a)]


def _other_value(attr: str, current: str, rng: np.random.Generator, avoid: tuple[str, ...] = ()) -> str:
    values = {"colour": tuple(COLOURS), "shape": SHAPES, "size": tuple(SIZES)}[attr]
    pool = [v for v in values if v != current and v not in avoid]
    return pool[rng.integers(len(pool))]


def swap_negative(scene: Scene, rng: np.random.Generator) -> Scene:
    """The scene with one attribute exchanged between its two objects (colours always differ)."""
    attrs = _differing_attrs(scene)
    attr = attrs[rng.integers(len(attrs))]
    a, b = getattr(scene.left, attr), getattr(scene.right, attr)
    return scene.with_obj("left", **{attr: b}).with_obj("right", **{attr: a})


def replace_edit(scene: Scene, rng: np.random.Generator, attr: str | None = None,
                 side: str | None = None) -> tuple[Scene, str, str]:
    """The scene with one attribute of one object changed; returns (scene, attr, side)."""
    attr = attr or ("colour", "shape", "size")[rng.integers(3)]
    side = side or ("left", "right")[rng.integers(2)]
    other = scene.right if side == "left" else scene.left
    obj = getattr(scene, side)
    # a new colour also differs from the other object's, so the edited scene stays two-coloured
    avoid = (other.colour,) if attr == "colour" else ()
    return scene.with_obj(side, **{attr: _other_value(attr, getattr(obj, attr), rng, avoid)}), attr, side


def hard_positive_sets(scenes: list[Scene], image_paths: list[str],
                       rng: np.random.Generator) -> dict[str, tuple[list[dict], list[dict]]]:
    """{set name: (data items (c, c_N), swapped_data items (c_P, c_N))}, index-aligned, one per scene."""
    sets = {}
    for name in ("toy_swap", "toy_replace"):
        data, swapped = [], []
        for i, (scene, path) in enumerate(zip(scenes, image_paths)):
            neg = swap_negative(scene, rng) if name == "toy_swap" else replace_edit(scene, rng)[0]
            c, c_p, c_n = scene.caption(ANCHOR_TEMPLATE), scene.caption(REWORDED_TEMPLATE), neg.caption(ANCHOR_TEMPLATE)
            data.append({"image_id": str(i), "true_caption": c, "false_caption": c_n, "image_path": path})
            swapped.append({"image_id": str(i), "true_caption": c_p, "false_caption": c_n, "image_path": path})
        sets[name] = (data, swapped)
    return sets
