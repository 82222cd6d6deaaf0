"""Toy scenes: two coloured shapes left and right, their vocabulary, rendering and template captions."""

from __future__ import annotations

import io
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageDraw

# Object colours (name -> RGB). Background names are disjoint from these, so a word has one role.
COLOURS = {
    "red": (220, 30, 35), "green": (35, 165, 50), "blue": (35, 70, 225), "yellow": (245, 215, 30),
    "purple": (135, 45, 180), "orange": (250, 135, 20), "pink": (250, 130, 195), "cyan": (40, 205, 215),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.22, "large": 0.40}  # side of the shape's bounding box, as a fraction of the image
BACKGROUNDS = {"white": (240, 240, 240), "gray": (125, 125, 125), "black": (20, 20, 20)}
RELATION_WORDS = ("left", "right")

# Caption templates; {L} / {R} expand to "<size> <colour> <shape>" of the left / right object.
# Every template names all six object attributes and the relation, so two test scenes with
# different objects never share a caption.
TEMPLATES = (
    "a {L} to the left of a {R}",
    "a {R} to the right of a {L}",
    "a {L} on the left and a {R} on the right",
    "a {R} on the right and a {L} on the left",
    "a {L} left of a {R} on a {bg} background",
    "on a {bg} background a {R} is right of a {L}",
    "there is a {L} on the left and a {R} on the right",
    "a {R} with a {L} to its left",
    "a {bg} picture with a {L} on the left and a {R} on the right",
)
# Hard-positive pairs use these two: the same scene from either side of the relation.
ANCHOR_TEMPLATE, REWORDED_TEMPLATE = 0, 1

_SUPERSAMPLE = 4  # draw at 4x and downsample, for anti-aliased edges


@dataclass(frozen=True)
class Obj:
    """One shape: attributes plus its centre as a fraction of the image side."""

    colour: str
    shape: str
    size: str
    cx: float
    cy: float

    def phrase(self) -> str:
        return f"{self.size} {self.colour} {self.shape}"

    def key(self) -> tuple[str, str, str]:
        return (self.size, self.colour, self.shape)


@dataclass(frozen=True)
class Scene:
    """A rendered image's content: left object, right object, background and its shade offset."""

    left: Obj
    right: Obj
    bg: str
    shade: int  # added to every background channel, for variety

    def key(self) -> tuple:
        """What captions can tell apart: both objects (background is only in some templates)."""
        return (self.left.key(), self.right.key())

    def caption(self, template: int) -> str:
        return TEMPLATES[template].format(L=self.left.phrase(), R=self.right.phrase(), bg=self.bg)

    def with_obj(self, side: str, **changes) -> Scene:
        return replace(self, **{side: replace(getattr(self, side), **changes)})


def sample_scene(rng: np.random.Generator, *, jitter: float) -> Scene:
    """Draw a scene: two objects with different colours, left and right halves, jittered centres."""
    colours = list(COLOURS)
    c1, c2 = rng.choice(len(colours), size=2, replace=False)
    objs = []
    for side, c in (("left", c1), ("right", c2)):
        shape = SHAPES[rng.integers(len(SHAPES))]
        size = list(SIZES)[rng.integers(len(SIZES))]
        cx = (0.25 if side == "left" else 0.75) + rng.uniform(-jitter, jitter)
        cy = 0.5 + rng.uniform(-2.5 * jitter, 2.5 * jitter)
        objs.append(Obj(colours[c], shape, size, float(cx), float(cy)))
    bg = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return Scene(objs[0], objs[1], bg, int(rng.integers(-12, 13)))


def object_box(obj: Obj, image_size: int) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of the object's bounding box in pixels of an image_size image."""
    half = SIZES[obj.size] * image_size / 2
    x, y = obj.cx * image_size, obj.cy * image_size
    return (x - half, y - half, x + half, y + half)


def render(scene: Scene, image_size: int) -> Image.Image:
    """Draw the scene as an RGB image of image_size x image_size."""
    s = image_size * _SUPERSAMPLE
    bg = tuple(int(np.clip(v + scene.shade, 0, 255)) for v in BACKGROUNDS[scene.bg])
    im = Image.new("RGB", (s, s), bg)
    draw = ImageDraw.Draw(im)
    for obj in (scene.left, scene.right):
        x0, y0, x1, y1 = (v * _SUPERSAMPLE for v in object_box(obj, image_size))
        fill = COLOURS[obj.colour]
        if obj.shape == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif obj.shape == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        elif obj.shape == "triangle":
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
        else:
            raise ValueError(f"unknown shape {obj.shape!r}; expected one of {SHAPES}")
    return im.resize((image_size, image_size), Image.BOX)


def object_mask(objs: list[Obj], image_size: int) -> Image.Image:
    """L-mode mask (0/255) covering the bounding boxes of objs, one pixel of margin."""
    m = Image.new("L", (image_size, image_size), 0)
    draw = ImageDraw.Draw(m)
    for obj in objs:
        x0, y0, x1, y1 = object_box(obj, image_size)
        draw.rectangle((int(x0) - 1, int(y0) - 1, int(np.ceil(x1)) + 1, int(np.ceil(y1)) + 1), fill=255)
    return m


def encode(im: Image.Image, fmt: str = "JPEG", quality: int = 95) -> bytes:
    """Image -> file bytes (JPEG at quality, or PNG)."""
    buf = io.BytesIO()
    if fmt == "JPEG":
        im.save(buf, format="JPEG", quality=quality)
    else:
        im.save(buf, format=fmt)
    return buf.getvalue()
