"""Helpers shared by suite loaders: JSON reading with errors that name the file and the item."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from hardrank.config import SuiteOptions
from hardrank.errors import DataError, UsageError
from hardrank.text import caption_normaliser

__all__ = ["SuiteOptions", "read_json", "read_jsonl", "require_keys", "read_bbox", "SuiteFormatError", "BBOX_KEYS",
           "release_folder", "caption_protocol", "IMAGE_CORRUPTIONS", "is_corruption_variant", "variant_hint",
           "variants_beside"]

# The ImageNet-C corruptions `hardrank perturb images --method corrupt:...` writes as <name>_<severity>_s<seed>
# (hardrank.perturb.corruptions.CORRUPTIONS, which a test pins equal: suites cannot import perturb, which imports
# them). Such a variant is both a gallery distractor and a query: its own i2t task against the clean captions.
IMAGE_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
                     "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
                     "jpeg_compression")


def _corruption_of(variant: str) -> str | None:
    """The corruption of ``<corruption>_<severity>[_s<seed>]``, else None."""
    base = variant.rsplit("_s", 1)[0] if variant.rsplit("_s", 1)[-1].isdigit() else variant
    name, _, sev = base.rpartition("_")
    return name if name in IMAGE_CORRUPTIONS and sev in ("1", "2", "3", "4", "5") else None


def is_corruption_variant(variant: str) -> bool:
    """``gaussian_noise_3_s0`` (or ``gaussian_noise_3``) is an ImageNet-C variant; ``mix_0.9_s1`` is not."""
    return _corruption_of(variant) is not None


def variant_hint(variant: str) -> str:
    """The command that writes an image variant folder ``variant`` (``<name>_s<seed>``)."""
    base, _, seed = variant.rpartition("_s")
    c = _corruption_of(variant)
    if c is not None:
        return f"hardrank perturb images --method corrupt:{c} --severity {base.rpartition('_')[2]} --seed {seed} ..."
    method, _, lam = base.partition("_")
    return f"hardrank perturb images --method {method} --lam {lam} --seed {seed} ..."


def variants_beside(images: str) -> str:
    """Where the variant folders of a folder of images go when they must not go inside it (an ImageFolder root,
    whose every subfolder torchvision and CLIP_benchmark count as a class): ``<images>-variants`` beside it."""
    return str(images).rstrip("/") + "-variants"


class SuiteFormatError(DataError):
    """An annotation file does not have the published format."""


def read_json(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not JSON
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise SuiteFormatError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start}, "
            f"line {line}); "
            f"JSON annotation files must be UTF-8: re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8 "
            f"{path.name} > fixed.json") from None
    except json.JSONDecodeError as exc:
        raise SuiteFormatError(f"{path}: not valid JSON ({exc})") from exc


def read_jsonl(path: Path, keys: dict[str, type], release: str) -> list[dict]:
    """The objects of a JSON Lines file (blank lines skipped), each checked for ``keys`` and their types;
    errors name the file, the line and, for a file of another version, the keys it has."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SuiteFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); use the file of "
                               f"the {release} release as downloaded") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteFormatError(f"{path}: line {no} is not valid JSON ({exc.msg} at column {exc.colno}); "
                                   f"each line must be one JSON object, as in the {release} release") from None
        if not isinstance(item, dict):
            raise SuiteFormatError(f"{path}: line {no} is a JSON {type(item).__name__}, expected an object "
                                   f"with keys {list(keys)}")
        missing = [k for k in keys if k not in item]
        if missing:
            raise SuiteFormatError(f"{path}: line {no} lacks key(s) {missing}; it has {sorted(item)}: a file of "
                                   f"another version? hardrank reads the {release} release")
        for k, t in keys.items():
            v = item[k]
            if isinstance(v, bool) or not isinstance(v, t):
                raise SuiteFormatError(f"{path}: line {no} key {k!r} is {v!r} ({type(v).__name__}), "
                                       f"expected {t.__name__}")
        out.append(item)
    return out


def require_keys(path, index: int, item, keys: tuple[str, ...], types: dict | None = None) -> None:
    if not isinstance(item, dict):
        raise SuiteFormatError(f"{path}: item {index} is a {type(item).__name__}, "
                               f"expected an object with keys {list(keys)}")
    missing = [k for k in keys if k not in item]
    if missing:
        raise SuiteFormatError(f"{path}: item {index} lacks key(s) {missing}; it has {sorted(item)}")
    for k, t in (types or {}).items():
        if k in item and not isinstance(item[k], t):
            raise SuiteFormatError(f"{path}: item {index} key {k!r} is a {type(item[k]).__name__}, expected {t}")


BBOX_KEYS = ("bbox_x", "bbox_y", "bbox_w", "bbox_h")


def read_bbox(path, index, item: dict, *, required: bool) -> tuple[float, float, float, float] | None:
    """The item's (x, y, w, h) crop box in pixels, or None when it has no bbox keys and none is required.
    Partial boxes, non-numbers and empty boxes raise naming the file and the item."""
    present = [k for k in BBOX_KEYS if k in item]
    if not present and not required:
        return None
    if len(present) != len(BBOX_KEYS):
        missing = [k for k in BBOX_KEYS if k not in item]
        raise SuiteFormatError(f"{path}: item {index} lacks bbox key(s) {missing}; "
                               f"expected all of {list(BBOX_KEYS)} (the crop box in pixels)")
    box = []
    for k in BBOX_KEYS:
        v = item[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SuiteFormatError(f"{path}: item {index} key {k!r} is {v!r} ({type(v).__name__}), "
                                   f"expected a number of pixels")
        box.append(float(v))
    if box[2] <= 0 or box[3] <= 0:
        raise SuiteFormatError(f"{path}: item {index} has an empty crop box (w={box[2]:g}, h={box[3]:g}); "
                               f"bbox_w and bbox_h must be > 0")
    return tuple(box)


def release_folder(root: Path, candidates: tuple[str, ...], names) -> Path:
    """The folder holding a benchmark's files under ``--data``: the first of ``candidates`` (paths under
    ``root``, ``"."`` for ``root`` itself: the release's own folder names, a repository's ``data/``) that
    holds any of ``names``; ``root`` when none does (its errors then name ``root``). So one ``--data``
    folder can hold several benchmarks, each in its release layout under its own name."""
    names = list(names)
    for cand in (root / c for c in candidates):
        if any((cand / n).exists() for n in names):
            return cand
    return root


def find_annotation(opts: SuiteOptions, default_name: str, suite: str = "this suite") -> Path:
    """The annotation file: ``--annotations`` (a file, or a folder holding ``default_name``), else ``--data``."""
    cand = opts.annotations or opts.data
    if cand is None:
        raise UsageError(f"{suite} needs --annotations (a Karpathy-format JSON such as {default_name})")
    p = Path(cand)
    if p.is_dir():
        p = p / default_name
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist; pass --annotations FILE (e.g. {default_name})")
    return p


def caption_protocol(opts: SuiteOptions, default: str = "blip") -> tuple[str, Callable[[str], str]]:
    """(protocol name, the function it applies to each caption): ``--caption-protocol``, else the suite's
    ``default``. The name goes into the suite's meta (``caption_protocol``), which results carry on top."""
    name = opts.caption_protocol or default
    return name, caption_normaliser(name)
