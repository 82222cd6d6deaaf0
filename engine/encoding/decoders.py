"""The decode backends by name: Pillow (the reference), Pillow with JPEG draft decoding, DALI; a transformers
model's own image processor."""
from __future__ import annotations

from hardrank.config import DECODERS
from hardrank.encoding.decode import PillowDecoder, ProcessorDecoder, is_processor_cfg
from hardrank.errors import MissingExtra, UsageError

__all__ = ["make_decoder"]


def make_decoder(preprocess_cfg: dict, decoder: str = "pillow", *, threads: int = 2, batch_size: int = 256):
    """A decode stage ``{"ref": [ImageRef]} -> {"pixels", "ok", "error"}``: Pillow (the reference) or
    DALI (GPU when present, else its CPU-only mode). Build it inside the worker that runs it."""
    if decoder not in DECODERS:
        raise UsageError(f"decoder must be one of {list(DECODERS)}, got {decoder!r}")
    if is_processor_cfg(preprocess_cfg):
        if decoder != "pillow":  # its own processor is the transform: no DALI or draft twin of it
            raise UsageError(f"--decoder {decoder}: transformers models (hf:, blip:) are preprocessed by their own "
                             f"image processor on Pillow-decoded images; use --decoder pillow (the default)")
        return ProcessorDecoder(preprocess_cfg, threads=threads)
    if decoder == "pillow-draft":
        return PillowDecoder(preprocess_cfg, threads=threads, draft=True)
    if decoder == "dali":
        try:
            from hardrank.encoding.dali import DaliDecoder
        except ImportError as exc:
            raise MissingExtra("--decoder dali", "dali", "nvidia-dali-cuda130") from exc
        return DaliDecoder(preprocess_cfg, threads=threads, batch_size=batch_size, device="auto")
    return PillowDecoder(preprocess_cfg, threads=threads)
