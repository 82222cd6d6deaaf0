"""Models: an architecture plus weights, built offline exactly as their authors preprocess them."""
from hardrank.models.load import load_model
from hardrank.models.openclip import PRECISIONS, LoadedModel, ModelSpec, file_hash, resolve_arch

__all__ = ["ModelSpec", "LoadedModel", "load_model", "resolve_arch", "file_hash", "PRECISIONS"]
