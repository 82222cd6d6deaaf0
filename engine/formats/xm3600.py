"""Crossmodal-3600's captions.jsonl: image keys and their captions per language."""
from __future__ import annotations

import json
from pathlib import Path

from hardrank.formats.annotations import SuiteFormatError

__all__ = ["read_xm3600", "entry_captions"]


def read_xm3600(path: str | Path) -> tuple[list[tuple[str, dict]], dict[str, int]]:
    """([(image key, {language: entry})] in file order, {image key: its line number}) from XM3600's
    captions.jsonl: one JSON object per line
    with ``image/key`` (the image is ``images/<key>.jpg``), ``image/locale`` and one object per language
    holding ``caption`` (a list; also ``caption/tokenized`` and ``caption/tokenized/lowercase``, unused)."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8-sig") as f:  # a byte-order mark is not JSON
        try:
            lines = list(enumerate(f, start=1))
        except UnicodeDecodeError as exc:
            raise SuiteFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); XM3600's "
                                   f"captions.jsonl is UTF-8: re-save it as UTF-8") from None
    for n, line in lines:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SuiteFormatError(f"{path}: line {n} is not valid JSON ({exc}); expected one object per line "
                                   f"as in XM3600's captions.jsonl") from None
        if not isinstance(item, dict) or not isinstance(item.get("image/key"), str) or not item["image/key"]:
            got = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise SuiteFormatError(f"{path}: line {n} has no 'image/key' string (got {got}); expected XM3600's "
                                   f"captions.jsonl: {{\"image/key\": ..., \"<language>\": {{\"caption\": [...]}}}}")
        out.append((item["image/key"], {k: v for k, v in item.items() if not k.startswith("image/")}, n))
    if not out:
        raise SuiteFormatError(f"{path}: holds no images (no JSON lines); expected XM3600's captions.jsonl")
    return [(key, langs) for key, langs, _ in out], {key: n for key, _, n in out}


def entry_captions(path: Path, line: int, key: str, lang: str, entry) -> list[str]:
    """The captions of one language entry of one line; an entry without captions raises naming both."""
    caps = entry.get("caption") if isinstance(entry, dict) else None
    if not isinstance(caps, list) or not caps or not all(isinstance(c, str) and c.strip() for c in caps):
        got = (f"'caption' = {caps!r}" if isinstance(entry, dict) and "caption" in entry else
               f"keys {sorted(entry)}" if isinstance(entry, dict) else f"a {type(entry).__name__}")
        raise SuiteFormatError(f"{path}: line {line} (image {key}), language {lang!r}: expected an object whose "
                               f"'caption' is a non-empty list of non-empty strings, got {got}; fix or drop the "
                               f"entry, or leave {lang!r} out of --language")
    return caps

