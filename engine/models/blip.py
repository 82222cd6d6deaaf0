"""BLIP (``transformers``' ``BlipForImageTextRetrieval``) as a dual encoder with its cross-encoder, loaded offline.

``--model blip:<folder>`` (or ``blip:ORG/NAME``, a snapshot in the local Hugging Face cache) names a folder
that ``save_pretrained`` wrote: ``config.json`` (model_type ``blip``), the weights, ``preprocessor_config.json``
and the tokenizer files. Encoded as BLIP's retrieval evaluation encodes (salesforce/BLIP
``train_retrieval.py``, RoCOCO's ``eval_blip_*.py``), which is what ``BlipForImageTextRetrieval(...,
use_itm_head=False)`` computes:

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
from safetensors.torch import load_file

from hardrank.errors import DataError, UsageError
from hardrank.models.hf_models import processor_preprocess_cfg
from hardrank.models.hf_text import _TOKENIZER_GLOBS, _files_hash, _holds_tokenizer, _require_transformers, snapshot
from hardrank.models.openclip import EMBED_VERSION, LoadedModel, ModelSpec, _safe, _weights_format, file_hash

__all__ = ["PREFIX", "MAX_LENGTH", "is_blip", "load_blip", "has_itm"]

PREFIX = "blip:"
MAX_LENGTH = 35       # the reference's tokenizer(..., padding='max_length', truncation=True, max_length=35)
_ENC = "[ENC]"        # BLIP's image-grounded encoder token (salesforce/BLIP models/blip.py init_tokenizer)
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def is_blip(arch: str | None) -> bool:
    """Whether ``--model`` names a BLIP model (``blip:<folder or ORG/NAME>``)."""
    return bool(arch) and arch.startswith(PREFIX)


def has_itm(model: LoadedModel) -> bool:
    """Whether a loaded model has a cross-encoder (an image-text matching head) for ``--rerank itm:K``."""
    return callable(getattr(model.model, "itm", None))


class BlipTokenizer:
    """Captions -> ``(B, 35) int64`` token ids, as the reference tokenizes them (padded on the right); the
    attention mask is ``ids != pad_id`` (BERT's [PAD] never comes out of a caption)."""

    def __init__(self, folder: Path):
        from transformers import AutoTokenizer
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise DataError(f"BLIP model {folder}: its tokenizer files do not load ({type(exc).__name__}: "
                            f"{str(exc)[:300]}); save the model's processor into the folder "
                            f"(BlipProcessor.save_pretrained)") from exc
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


def _folder(spec: ModelSpec) -> Path:
    name = spec.arch[len(PREFIX):]
    if not name:
        raise UsageError(f"--model {spec.arch}: name the BLIP folder (blip:<folder>) or its Hugging Face repo "
                         f"(blip:ORG/NAME, from the local cache)")
    return snapshot(name, f"BLIP model {spec.arch}", lambda f: (f / "config.json").is_file(), "config.json")


def _config(folder: Path, arch: str) -> dict:
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{folder / 'config.json'}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") != "blip":
        raise DataError(f"--model {arch}: {folder / 'config.json'} is not a BLIP config (model_type "
                        f"{cfg.get('model_type') if isinstance(cfg, dict) else None!r}, expected 'blip'); "
                        f"blip: takes a BlipForImageTextRetrieval folder (save_pretrained)")
    archs = cfg.get("architectures") or ["BlipForImageTextRetrieval"]
    if "BlipForImageTextRetrieval" not in archs:
        raise DataError(f"--model {arch}: {folder} holds a {', '.join(archs)}, not a BlipForImageTextRetrieval "
                        f"(BLIP's retrieval model with ITC and ITM heads, e.g. Salesforce/blip-itm-base-coco)")
    return cfg


def _preprocess(folder: Path, arch: str) -> dict:
    """BLIP's own image processor as the decode stage runs it (``hf_models.processor_preprocess_cfg``)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        raise DataError(f"--model {arch}: {path} is missing; save the model's processor into the folder "
                        f"(BlipProcessor.save_pretrained) so its images are preprocessed as it was trained")
    return processor_preprocess_cfg(folder, arch)


def _build(folder: Path, spec: ModelSpec, cfg: dict):
    """The network with its weights: --checkpoint FILE, else the folder's, else random (--random-init)."""
    from transformers import BlipConfig, BlipForImageTextRetrieval
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    if ckpt is not None and not ckpt.is_file():
        raise DataError(f"checkpoint {ckpt} does not exist")
    weights = ckpt or next((folder / n for n in _WEIGHTS if (folder / n).is_file()), None)
    if weights is None and not spec.random_init:
        raise UsageError(f"BLIP model {spec.arch}: {folder} holds no weights ({' or '.join(_WEIGHTS)}); pass "
                         f"--checkpoint FILE, or --random-init to evaluate random weights on purpose")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # random weights (and heads a checkpoint replaces) are the same in every process
        net = BlipForImageTextRetrieval(BlipConfig.from_dict(cfg))
    if weights is None:
        return net, None, None
    fmt = _weights_format(weights)
    try:
        if fmt == "safetensors":
            sd = load_file(str(weights))
        else:
            sd = torch.load(str(weights), map_location="cpu", weights_only=True)
            sd = sd.get("state_dict", sd.get("model", sd)) if isinstance(sd, dict) else sd
        net.load_state_dict(sd, strict=True)
    except Exception as exc:  # unreadable file, pickled objects, or keys/shapes of another model
        raise DataError(f"BLIP weights {weights} do not load into the BlipForImageTextRetrieval of {folder} "
                        f"({type(exc).__name__}: {str(exc)[:400]}); pass the model's own model.safetensors "
                        f"(save_pretrained) or a state dict of the same architecture") from exc
    return net, str(weights), fmt


def load_blip(spec: ModelSpec) -> LoadedModel:
    """A ``blip:`` model loaded offline as a ``LoadedModel`` whose ``model`` has ``encode_image``,
    ``encode_text`` (the ITC features), ``vision_states`` and ``itm`` (the cross-encoder)."""
    _require_transformers(f"BLIP model {spec.arch}")
    folder = _folder(spec)
    cfg = _config(folder, spec.arch)
    preprocess = _preprocess(folder, spec.arch)
    if not _holds_tokenizer(folder):
        raise DataError(f"--model {spec.arch}: {folder} holds no tokenizer files; save the model's processor into "
                        f"the folder (BlipProcessor.save_pretrained)")
    if spec.pretrained or spec.image_size or spec.context_length or spec.preprocess:
        raise UsageError(f"--model {spec.arch}: a BLIP folder brings its own preprocessing and weights; drop "
                         f"--pretrained (and a training run's image size / context length overrides)")
    tokenizer = BlipTokenizer(folder)
    device, precision = spec.resolved_device(), spec.resolved_precision()
    net, weights, fmt = _build(folder, spec, cfg)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model = BlipRetrieval(net, tokenizer.pad_id, tokenizer.enc_id).eval().requires_grad_(False)
    model.to(device=device, dtype=dtype)
    ckpt_hash = file_hash(weights) if weights else None
    hf = {"model": {"name": spec.arch[len(PREFIX):], "config": _files_hash(folder, ("config.json",)),
                    "preprocessor": _files_hash(folder, ("preprocessor_config.json",))},
          "tokenizer": {"name": spec.arch[len(PREFIX):], "files": _files_hash(folder, _TOKENIZER_GLOBS)}}
    ident = {"arch": "blip", "hf": hf, "checkpoint": ckpt_hash, "precision": precision, "preprocess": preprocess,
             "context_length": MAX_LENGTH, "itm_first_token": _ENC if tokenizer.enc_id is not None else "[CLS]",
             "embed_version": EMBED_VERSION}
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    info = {"pretrained": None, "weights": weights, "weights_format": fmt, "quick_gelu": False,
            "random_init": weights is None, "warnings": [], "spec": asdict(spec),
            "hf": {k: {**v, "folder": str(folder)} for k, v in hf.items()},
            "itm_first_token": ident["itm_first_token"]}
    return LoadedModel(spec=spec, arch_name=f"blip:{folder.name}", model=model, tokenizer=tokenizer,
                       preprocess_cfg=preprocess, fingerprint=f"blip-{_safe(folder.name)}-{precision}-{digest}",
                       embed_dim=int(cfg.get("image_text_hidden_size") or net.config.image_text_hidden_size),
                       device=device, precision=precision, checkpoint_hash=ckpt_hash, info=info)
