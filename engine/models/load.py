"""The one model loader: open_clip, transformers (``hf:``) or BLIP (``blip:``), by the spec's architecture."""
from __future__ import annotations

from hardrank.models.blip import is_blip, load_blip
from hardrank.models.hf_models import is_hf, load_hf_model
from hardrank.models.openclip import LoadedModel, ModelSpec
from hardrank.models.openclip import load_model as load_open_clip

__all__ = ["load_model"]


def load_model(spec: ModelSpec) -> LoadedModel:
    """``spec``'s model, offline and fingerprinted: ``blip:FOLDER`` through ``hardrank.models.blip``, ``hf:FOLDER`` /
    ``hf:ORG/NAME`` through transformers (``hardrank.models.hf_models``), every other architecture through open_clip."""
    if is_blip(spec.arch):
        return load_blip(spec)
    return load_hf_model(spec) if is_hf(spec.arch) else load_open_clip(spec)
