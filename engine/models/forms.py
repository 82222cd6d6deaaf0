"""The spellings ``--model`` takes, written once: every command's help and the unknown-model error read them here."""
from __future__ import annotations

__all__ = ["FORMS", "forms_help"]

# (spelling, what it names); the loaders: models.openclip (the first four), models.hf_models (hf:), models.blip
FORMS = (
    ("NAME", "an open_clip model name, e.g. ViT-B-32, with --pretrained TAG or --checkpoint FILE"),
    ("CONFIG.json", "an open_clip model config, with --checkpoint FILE"),
    ("hf-hub:ORG/NAME", "an open_clip model in the local Hugging Face cache"),
    ("local-dir:FOLDER", "an open_clip model folder: open_clip_config.json + weights"),
    ("hf:FOLDER or hf:ORG/NAME", "a transformers dual encoder such as CLIPModel or SiglipModel: a save_pretrained "
                                 "folder or a cached repo"),
    ("blip:FOLDER or blip:ORG/NAME", "a BLIP retrieval model, BlipForImageTextRetrieval, with its image-text "
                                     "matching cross-encoder"),
)


def forms_help() -> str:
    """Every spelling with what it names, for a help text or an error."""
    return "; ".join(f"{spelling} ({what})" for spelling, what in FORMS)
