"""Annotation files read with errors that name the file and the item: JSON, JSON Lines, required keys, crop boxes."""
from __future__ import annotations

import json
from pathlib import Path

from hardrank.errors import DataError

__all__ = ["SuiteFormatError", "read_json", "read_jsonl", "require_keys", "read_bbox", "BBOX_KEYS"]


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

