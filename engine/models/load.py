"""The one model loader: the loader of the spec's kind (``hardrank.models.spec.KINDS``)."""
from __future__ import annotations

from hardrank.models.spec import KINDS, LoadedModel, ModelSpec

__all__ = ["load_model"]


def load_model(spec: ModelSpec) -> LoadedModel:
    """``spec``'s model, offline and fingerprinted, by its kind's loader: open_clip names, configs and folders
    (``hardrank.models.openclip``), ``hf:`` transformers dual encoders (``hf_models``), ``blip:`` (``blip``), model
    objects given to the Python API (``live``), and any kind registered since."""
    return KINDS[spec.kind].load(spec)
