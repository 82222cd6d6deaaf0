"""Models: an architecture plus weights, built offline exactly as their authors preprocess them.

The model kinds, one ``register_kind`` line each (``hardrank.models.spec``: the parser, the registry and the
central types). A new kind is its module here plus its line below: its spellings' help, its parsing and its
loading follow from that line.
"""
from hardrank.models import blip, hf_models, in_memory, openclip
from hardrank.models.load import load_model
from hardrank.models.openclip import file_hash, resolve_arch
from hardrank.models.spec import (
    KINDS,
    PRECISIONS,
    Kind,
    LiveModel,
    LoadedModel,
    ModelSpec,
    register_kind,
    unregister_kind,
)

__all__ = ["ModelSpec", "LoadedModel", "LiveModel", "Kind", "KINDS", "register_kind", "unregister_kind", "load_model",
           "resolve_arch", "file_hash", "PRECISIONS"]

# the registry: in the order of help texts (a folder holding both settings files is an open_clip one)
register_kind(openclip.NAME_KIND)    # ViT-B-32 (any spelling no other kind takes)
register_kind(openclip.CONFIG_KIND)  # a config .json
register_kind(openclip.HUB_KIND)     # hf-hub:ORG/NAME
register_kind(openclip.FOLDER_KIND)  # local-dir:FOLDER, or a folder holding open_clip_config.json
register_kind(hf_models.KIND)        # hf:FOLDER, hf:ORG/NAME, or a folder holding config.json
register_kind(blip.KIND)             # blip:FOLDER, blip:ORG/NAME
register_kind(in_memory.KIND)            # a model object given to the Python API
