"""Caption normalisation exactly as the RoCOCO/BLIP reference code does it (`pre_caption`)."""
from __future__ import annotations

import re

__all__ = ["pre_caption"]

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
