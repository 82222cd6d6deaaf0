"""Models: an architecture plus weights, built offline exactly as their authors preprocess them."""
from hardrank.models.openclip import PRECISIONS, LoadedModel, ModelSpec, file_hash, load_model, resolve_arch

__all__ = ["ModelSpec", "LoadedModel", "load_model", "resolve_arch", "file_hash", "PRECISIONS"]
