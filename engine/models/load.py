"""The one model dispatch: ``--model blip:...`` to the BLIP loader, every other spelling to open_clip's."""
from __future__ import annotations

from hardrank.models.blip import is_blip, load_blip
from hardrank.models.openclip import LoadedModel, ModelSpec
from hardrank.models.openclip import load_model as load_open_clip

__all__ = ["load_model"]


def load_model(spec: ModelSpec) -> LoadedModel:
    """The model ``spec`` names, loaded offline (``hardrank.models.blip`` or ``hardrank.models.openclip``)."""
    return load_blip(spec) if is_blip(spec.arch) else load_open_clip(spec)
