"""Caption protocols: BLIP's normalisation exactly as the RoCOCO/BLIP reference code does it (`pre_caption`), or raw."""
from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["pre_caption", "CAPTION_PROTOCOLS", "caption_normaliser"]

# How a retrieval suite feeds captions to the text encoder: blip = BLIP's pre_caption (the RoCOCO / BLIP
# reference protocol), raw = as written (CLIP_benchmark's protocol: open_clip's tokenizer does its own cleaning).
CAPTION_PROTOCOLS = ("blip", "raw")

_PUNCT = re.compile(r"[.!\"()*#:;~]")
_SPACES = re.compile(r"\s{2,}")


def pre_caption(caption: str, max_words: int = 30) -> str:
    """Lowercase, replace each of ``.!"()*#:;~`` by a space, collapse whitespace, strip, keep
    the first ``max_words`` words. Mirrors BLIP's ``pre_caption`` (its regex also strips a
    trailing newline; ``str.strip`` covers that)."""
    caption = _PUNCT.sub(" ", caption.lower())
    caption = _SPACES.sub(" ", caption)
    caption = caption.rstrip("\n").strip(" ")
    words = caption.split(" ")
    if len(words) > max_words:
        caption = " ".join(words[:max_words])
    return caption


def _raw(caption: str) -> str:
    return caption


def caption_normaliser(protocol: str) -> Callable[[str], str]:
    """The function a caption protocol applies to each caption before it is encoded (and keyed in the store)."""
    if protocol == "blip":
        return pre_caption
    if protocol == "raw":
        return _raw
    raise ValueError(f"caption protocol {protocol!r} is not one of {CAPTION_PROTOCOLS}")
