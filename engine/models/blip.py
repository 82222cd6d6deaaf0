"""BLIP (``transformers``' ``BlipForImageTextRetrieval``) as a dual encoder with its cross-encoder, loaded offline.

``--model blip:<folder>`` (or ``blip:ORG/NAME``, a snapshot in the local Hugging Face cache) names a folder
that ``save_pretrained`` wrote: ``config.json`` (model_type ``blip``), the weights (one file, shards with their
index, or a Trainer's ``checkpoint-N/``), and ``BlipProcessor.save_pretrained``'s files (transformers 5's
``processor_config.json`` or 4's ``preprocessor_config.json``, and the tokenizer's), every file read through
``hardrank.models.boundary`` (no code from the folder, no path outside it, sizes and tokenizer checked).
Encoded as BLIP's retrieval evaluation encodes (salesforce/BLIP ``train_retrieval.py``, RoCOCO's
``eval_blip_*.py``), which is what ``BlipForImageTextRetrieval(..., use_itm_head=False)`` computes:

- image: ``vision_proj(vision_model(pixels)[:, 0])``, pixels exactly as BLIP's own image processor makes them
  (``AutoImageProcessor.from_pretrained(folder)``, transformers 5's default torchvision backend): it runs in
  the decode workers on ``Image.open``'s image, as for ``hf:`` models (``hf_models.processor_preprocess_cfg``,
  ``ProcessorDecoder``), so its RGB conversion comes first (palette and alpha images included: alpha
  composited on white), then its resize, rescale and normalisation; the ITM stage decodes with it too;
- text: ``text_proj(text_encoder(ids, mask)[:, 0])``, the caption as the suites give it (BLIP's ``pre_caption``)
  tokenized with padding to ``max_length`` 35 and truncation, as the reference does;

both L2-normalised by the encode stage. The cross-encoder (``itm``) scores (text, image) pairs from the
image's vision states (``vision_states``) and the text's tokens, its first token replaced by ``[ENC]`` when
the tokenizer has one, as the reference does (``text_ids[:, 0] = tokenizer.enc_token_id``); transformers'
own forward keeps ``[CLS]``, which is what a tokenizer without ``[ENC]`` gets. ``transformers`` is the
``hardrank[hf]`` extra, imported inside this module's functions only.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from hardrank.errors import DataError, UsageError
from hardrank.models.boundary import ModelFolder, check_tokenizer, is_safetensors, open_folder, quote
from hardrank.models.hf_models import (
    build_model,
    processor_preprocess_cfg,
    text_vocab_size,
    tokenizer_of,
    weights_hash,
    weights_of,
)
from hardrank.models.hf_text import _TOKENIZER_GLOBS, _files_hash, _require_transformers, snapshot
from hardrank.models.openclip import EMBED_VERSION, file_hash
from hardrank.models.spec import Kind, LoadedModel, ModelSpec, safe_name

__all__ = ["KIND", "MAX_LENGTH", "load_blip", "has_itm"]

MAX_LENGTH = 35       # the reference's tokenizer(..., padding='max_length', truncation=True, max_length=35)
_ENC = "[ENC]"        # BLIP's image-grounded encoder token (salesforce/BLIP models/blip.py init_tokenizer)


def has_itm(model: LoadedModel) -> bool:
    """Whether a loaded model has a cross-encoder (an image-text matching head) for ``--rerank itm:K``."""
    return callable(getattr(model.model, "itm", None))


class BlipTokenizer:
    """Captions -> ``(B, 35) int64`` token ids, as the reference tokenizes them (padded on the right); the
    attention mask is ``ids != pad_id`` (BERT's [PAD] never comes out of a caption)."""

    def __init__(self, tokenizer, folder: Path):
        self.tokenizer = tokenizer
        if self.tokenizer.pad_token_id is None:
            raise DataError(f"BLIP model {folder}: its tokenizer has no pad token; BLIP's is BERT's [PAD]")
        self.context_length = MAX_LENGTH
        self.pad_id = int(self.tokenizer.pad_token_id)
        enc = self.tokenizer.convert_tokens_to_ids(_ENC)
        self.enc_id = None if enc is None or enc == self.tokenizer.unk_token_id else int(enc)
        if self.tokenizer.padding_side != "right":
            raise DataError(f"BLIP model {folder}: its tokenizer pads on the {self.tokenizer.padding_side}; BLIP's "
                            f"(BERT's) pads on the right")

    def __call__(self, texts) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.tokenizer(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH,
                              return_tensors="pt")["input_ids"]


class BlipRetrieval(torch.nn.Module):
    """The model's two encoders and its cross-encoder over a ``BlipForImageTextRetrieval``."""

    def __init__(self, net, pad_id: int, enc_id: int | None):
        super().__init__()
        self.net, self.pad_id, self.enc_id = net, pad_id, enc_id

    def vision_states(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 1 + patches, Dv): the vision tower's last hidden states (CLS first)."""
        return self.net.vision_model(pixel_values=pixels).last_hidden_state

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, D) ITC image features (not normalised)."""
        return self.net.vision_proj(self.vision_states(pixels)[:, 0, :])

    def _trim(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) cut to the batch's longest caption: the padding after it is masked out of every
        attention (its softmax weight is exactly 0), so the CLS state is that of the full 35 positions up
        to float summation order, at a fraction of the cost (captions are ~12 tokens of 35)."""
        mask = (ids != self.pad_id).long()
        n = max(1, int(mask.sum(1).max())) if len(ids) else ids.shape[1]
        return ids[:, :n], mask[:, :n]

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids -> (B, D) ITC text features (not normalised)."""
        ids, mask = self._trim(ids)
        out = self.net.text_encoder(input_ids=ids, attention_mask=mask)
        return self.net.text_proj(out.last_hidden_state[:, 0, :])

    def itm(self, ids: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """(B, L) token ids of texts and (B, 1 + patches, Dv) vision states of their paired images -> (B,)
        float32 ``itm_logit[:, 1]`` (the 'match' logit) of each pair."""
        ids, mask = self._trim(ids)
        if self.enc_id is not None:
            ids = ids.clone()
            ids[:, 0] = self.enc_id
        out = self.net.text_encoder(input_ids=ids, attention_mask=mask, encoder_hidden_states=states,
                                    encoder_attention_mask=torch.ones(states.shape[:-1], dtype=torch.long,
                                                                      device=states.device))
        return self.net.itm_head(out.last_hidden_state[:, 0, :])[:, 1].float()


def _folder(spec: ModelSpec) -> ModelFolder:
    name = spec.name
    if not name:
        raise UsageError(f"--model {spec.arch}: name the BLIP folder (blip:<folder>) or its Hugging Face repo "
                         f"(blip:ORG/NAME, from the local cache)")
    folder = snapshot(name, f"BLIP model {spec.arch}", lambda f: (f / "config.json").is_file(), "config.json")
    return open_folder(folder, f"--model {spec.arch}")


def _config(folder: ModelFolder, arch: str):
    """The folder's BlipConfig (its config.json, vetted), refused unless it is a BlipForImageTextRetrieval's."""
    from transformers import BlipConfig

    cfg = folder.config("config.json")
    if cfg is None or cfg.get("model_type") != "blip":
        raise DataError(f"--model {arch}: {folder.path / 'config.json'} is not a BLIP config (model_type "
                        f"{cfg.get('model_type') if cfg else None!r}, expected 'blip'); blip: takes a "
                        f"BlipForImageTextRetrieval folder (save_pretrained)")
    archs = cfg.get("architectures") or ["BlipForImageTextRetrieval"]
    if "BlipForImageTextRetrieval" not in archs:
        raise DataError(f"--model {arch}: {folder.path} holds a {', '.join(map(str, archs))}, not a "
                        f"BlipForImageTextRetrieval (BLIP's retrieval model with ITC and ITM heads, e.g. "
                        f"Salesforce/blip-itm-base-coco)")
    try:
        return BlipConfig.from_pretrained(str(folder.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"--model {arch}: {folder.path / 'config.json'} does not load as a BlipConfig "
                        f"({type(exc).__name__}: {quote(exc)}); save the model again with save_pretrained") from None


def load_blip(spec: ModelSpec) -> LoadedModel:
    """A ``blip:`` model loaded offline as a ``LoadedModel`` whose ``model`` has ``encode_image``,
    ``encode_text`` (the ITC features), ``vision_states`` and ``itm`` (the cross-encoder). Every file is vetted
    (``boundary``) and the tokenizer checked before the network is built."""
    _require_transformers(f"BLIP model {spec.arch}")
    from transformers import BlipForImageTextRetrieval

    folder = _folder(spec)
    config = _config(folder, spec.arch)
    if spec.pretrained or spec.image_size or spec.context_length or spec.preprocess:
        raise UsageError(f"--model {spec.arch}: a BLIP folder brings its own preprocessing and weights; drop "
                         f"--pretrained (and a training run's image size / context length overrides)")
    preprocess = processor_preprocess_cfg(folder, spec.arch)
    tokenizer = BlipTokenizer(tokenizer_of(folder, f"--model {spec.arch}"), folder.path)
    weights = weights_of(folder, config, spec, _config)
    check_tokenizer(tokenizer, size=len(tokenizer.tokenizer), vocab_size=text_vocab_size(weights.config),
                    what=f"--model {spec.arch}", source=folder.path,
                    fix="save the model's processor into the folder (BlipProcessor.save_pretrained)")
    device, precision = spec.resolved_device(), spec.resolved_precision()
    net = build_model(BlipForImageTextRetrieval, weights, spec, precision)
    files = [f for f in weights.files if not f.name.endswith(".index.json")]
    weights_file = str(weights.files[0]) if weights.files else None
    fmt = None if not files else "safetensors" if is_safetensors(files[0]) else "torch"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model = BlipRetrieval(net, tokenizer.pad_id, tokenizer.enc_id).eval().requires_grad_(False)
    model.to(device=device, dtype=dtype)
    # one file: its content hash, as before shards existed; shards: the hash of every part in order
    ckpt_hash = None if not weights.files else file_hash(weights.files[0]) if len(weights.files) == 1 \
        else weights_hash(weights.files)
    name = spec.name
    hf = {"model": {"name": name, "config": _files_hash(folder.path, ("config.json",)),
                    "preprocessor": _files_hash(folder.path, ("preprocessor_config.json",))},
          "tokenizer": {"name": name, "files": _files_hash(folder.path, _TOKENIZER_GLOBS)}}
    ident = {"arch": "blip", "hf": hf, "checkpoint": ckpt_hash, "precision": precision, "preprocess": preprocess,
             "context_length": MAX_LENGTH, "itm_first_token": _ENC if tokenizer.enc_id is not None else "[CLS]",
             "embed_version": EMBED_VERSION}
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    info = {"pretrained": None, "weights": weights_file, "weights_format": fmt, "quick_gelu": False,
            "random_init": not weights.files, "warnings": [], "spec": asdict(spec),
            "hf": {k: {**v, "folder": str(folder.path)} for k, v in hf.items()},
            "itm_first_token": ident["itm_first_token"]}
    return LoadedModel(spec=spec, arch_name=f"{KIND.prefix}{folder.path.name}", model=model, tokenizer=tokenizer,
                       preprocess_cfg=preprocess,
                       fingerprint=f"blip-{safe_name(folder.path.name)}-{precision}-{digest}",
                       embed_dim=int(weights.config.image_text_hidden_size), device=device, precision=precision,
                       checkpoint_hash=ckpt_hash, info=info)


KIND = Kind("blip", load_blip, prefix="blip:", path="folder", forms=(
    ("blip:FOLDER or blip:ORG/NAME", "a BLIP retrieval model, BlipForImageTextRetrieval, with its image-text "
                                     "matching cross-encoder"),))
