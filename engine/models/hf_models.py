"""transformers dual encoders (CLIPModel, SiglipModel, ...), loaded offline, preprocessed by their own processor.

``--model hf:FOLDER`` (a ``save_pretrained`` folder) or ``--model hf:ORG/NAME`` (its snapshot in the local
Hugging Face cache, ``HF_HOME`` / ``HF_HUB_CACHE``; never downloaded) names the architecture, the image
processor and the tokenizer; the weights are the folder's, or each ``--checkpoint`` (a folder with its own
``config.json`` + weights, as a Trainer's ``checkpoint-N/``, or a weights file of the folder's config).

A model family is a small adapter registered by the config's ``model_type`` (``register_family``): the
transformers class to build, how it encodes pixels and tokens, how long its captions are padded, and, for a
processor that gives each image several arrays, their names and per-image shapes. CLIP, SigLIP and SigLIP 2
(NaFlex: patches padded to ``max_num_patches``, their mask and the image's patch grid) are registered; any
other model type whose class has ``get_image_features`` and ``get_text_features`` runs through the generic
adapter. A cross-encoder family (BLIP's ITM head) adds its own entry.

Exactness: images are preprocessed by the model's own image processor (rebuilt from its settings in each
decode worker) on ``Image.open``'s image, so pixels equal ``processor(images=...)``; captions are tokenised
as the model was trained: padded to ``text_config.max_position_embeddings`` (CLIP 77, SigLIP 64) and cut there,
with the tokenizer's own attention mask when it returns one (SigLIP: ids alone, as big_vision trained it;
SigLIP 2: ids and mask, as its ``Siglip2Processor`` gives them to the model).

``transformers`` is the ``hardrank[hf]`` extra, imported inside this module's functions only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.models.hf_text import snapshot
from hardrank.models.openclip import EMBED_VERSION, LoadedModel, ModelSpec, file_hash
from hardrank.openclip_import import import_transformers

__all__ = ["HF_PREFIX", "Family", "FAMILIES", "register_family", "is_hf", "load_hf_model", "hf_image_processor",
           "processor_preprocess_cfg", "HFDualEncoder", "HFTokenizer"]

HF_PREFIX = "hf:"
PROCESSOR_KEY = "hf_image_processor"  # the preprocess_cfg key that marks a transformers image processor
# weights a save_pretrained folder holds, in transformers' order of preference (sharded: the index names the parts)
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_FETCH = "hf download {repo}"  # a whole model repo: config, weights, processor and tokenizer files
_TEXT_INPUTS = ("input_ids", "attention_mask")
_NAFLEX_INPUTS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
_CONFIG_NOISE = ("transformers_version", "_name_or_path")  # config keys that change nothing an embedding reads


def _features(out) -> torch.Tensor:
    """(B, D) from ``get_*_features``: a tensor (transformers 4) or an output whose ``pooler_output`` is
    the projected embedding (transformers 5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _image_features(model, pixels: torch.Tensor) -> torch.Tensor:
    return _features(model.get_image_features(pixel_values=pixels))


def _text_features(model, tokens: dict) -> torch.Tensor:
    # what a text tower reads (a generic tokenizer also returns token_type_ids, which CLIP-style towers lack)
    return _features(model.get_text_features(**{k: tokens[k] for k in _TEXT_INPUTS if k in tokens}))


def _unmasked_text_features(model, tokens: dict) -> torch.Tensor:
    """SigLIP's text tower as trained (big_vision): the padded ids alone, no attention mask; it pools the
    last position, which then sees the padding it saw in training. transformers 5's SigLIP tokenizers
    also return a mask, which the tower would apply (other embeddings than the model was trained for)."""
    return _features(model.get_text_features(input_ids=tokens["input_ids"]))


def _naflex_image_features(model, pixels: dict) -> torch.Tensor:
    """SigLIP 2 (NaFlex): each image's patches padded to ``max_num_patches``, which of them are real, and its
    patch grid, the three arrays its processor gives the model."""
    return _features(model.get_image_features(**{k: pixels[k] for k in _NAFLEX_INPUTS}))


def _naflex_inputs(proc: dict, arch: str) -> dict:
    """Per image, the arrays Siglip2ImageProcessor gives (``max_num_patches`` rows whatever the aspect
    ratio, so a batch of them has one shape): name -> {"shape", "dtype"}."""
    n, p = proc.get("max_num_patches"), proc.get("patch_size")
    if not (isinstance(n, int) and isinstance(p, int) and n > 0 and p > 0):
        raise UsageError(f"--model {arch}: a SigLIP 2 model needs its variable-resolution image processor "
                         f"(Siglip2ImageProcessor, with max_num_patches and patch_size), got "
                         f"{proc.get('image_processor_type')} (max_num_patches {n!r}, patch_size {p!r}); save "
                         f"the model's own processor beside it (processor.save_pretrained)")
    return {"pixel_values": {"shape": [n, 3 * p * p], "dtype": "float32"},  # (patches, p * p * 3), padded
            "pixel_attention_mask": {"shape": [n], "dtype": "int32"},      # 1: a real patch, 0: padding
            "spatial_shapes": {"shape": [2], "dtype": "int64"}}            # (rows, columns) of its patch grid


def _trained_length(config) -> int:
    """The caption length the text tower was trained at: its position table's size."""
    text = getattr(config, "text_config", None) or config
    return int(text.max_position_embeddings)


@dataclass(frozen=True)
class Family:
    """How hardrank runs one transformers model type."""

    model_class: str | None = None   # transformers class name; None: AutoModel's class for the config
    image_features: Callable = _image_features  # (model, (B, 3, H, W) pixels, or image_inputs' arrays) -> (B, D)
    text_features: Callable = _text_features    # (model, tokenizer output on the device) -> (B, D)
    text_length: Callable = _trained_length     # config -> the length captions are padded and cut to
    image_inputs: Callable | None = None        # (processor settings, arch) -> {name: {"shape", "dtype"}} per
                                                # image, for a processor that gives several arrays (decoded as a
                                                # dict of (B, *shape) tensors); None: one (3, H, W) pixel array


FAMILIES: dict[str, Family] = {"clip": Family("CLIPModel"),
                               "siglip": Family("SiglipModel", text_features=_unmasked_text_features),
                               # text: the ids Siglip2Processor gives (padding="max_length", max_length=64), the
                               # tower unmasked as big_vision trained it and open_clip's SigLIP 2 runs it (as SigLIP)
                               "siglip2": Family("Siglip2Model", image_features=_naflex_image_features,
                                                 image_inputs=_naflex_inputs, text_features=_unmasked_text_features)}
_GENERIC = Family()  # any model type whose class has get_image_features and get_text_features


def register_family(model_type: str, family: Family) -> None:
    """Run transformers models of ``model_type`` (``config.json``'s) with ``family``."""
    FAMILIES[model_type] = family


def is_hf(arch: str) -> bool:
    return arch.startswith(HF_PREFIX)


def _transformers(what: str):
    try:
        return import_transformers()  # not `import transformers`: a Ray actor's two threads first use it at once
    except ImportError as exc:
        raise MissingExtra(what, "hf", "transformers") from exc


def _folder(arch: str) -> Path:
    """The folder ``hf:FOLDER`` or ``hf:ORG/NAME`` names (a cached snapshot, never downloaded)."""
    name = arch[len(HF_PREFIX):]
    if not name:
        raise UsageError("--model hf: needs a folder or a repo id after it: hf:FOLDER or hf:ORG/NAME")
    if Path(name).is_dir():
        folder = Path(name)
    elif Path(name).exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise DataError(f"--model {arch}: {name} is no folder and no Hugging Face repo id (ORG/NAME); pass the "
                        f"folder save_pretrained wrote, or a repo id from the local Hugging Face cache")
    else:
        folder = snapshot(name, f"--model {arch}", lambda f: True, "model files", fetch=_FETCH.format(repo=name))
    if not (folder / "config.json").is_file():
        hint = (f"it is an open_clip folder: pass --model local-dir:{folder}" if (folder / "open_clip_config.json")
                .is_file() else "hardrank takes a transformers folder (config.json + weights, as save_pretrained "
                "writes it) as --model hf:FOLDER, an open_clip folder (open_clip_config.json) as --model "
                "local-dir:FOLDER")
        raise DataError(f"--model {arch}: {folder} holds no config.json, so it is no transformers model; {hint}")
    return folder


def _config(folder: Path, arch: str):
    tf = _transformers(f"--model {arch}")
    try:
        return tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"--model {arch}: {folder}/config.json does not load in transformers "
                        f"{tf.__version__} ({type(exc).__name__}: {str(exc)[:300]}); save the model again with "
                        f"save_pretrained, or upgrade transformers") from exc


def _family_and_class(config, arch: str, folder: Path):
    tf = _transformers(f"--model {arch}")
    family = FAMILIES.get(config.model_type, _GENERIC)
    if family.model_class is not None:
        cls = getattr(tf, family.model_class)
    else:
        try:
            cls = tf.AutoModel._model_mapping[type(config)]
        except KeyError:
            cls = None
    if cls is None or not (hasattr(cls, "get_image_features") and hasattr(cls, "get_text_features")):
        raise DataError(f"--model {arch}: {folder} is a transformers {config.model_type!r} model "
                        f"({getattr(cls, '__name__', 'no AutoModel class')}) without an image tower and a text "
                        f"tower (get_image_features / get_text_features); hardrank evaluates image-text dual "
                        f"encoders such as CLIPModel or SiglipModel: pass such a model's folder")
    return family, cls


def _weights(folder: Path) -> list[Path]:
    """The weight files of a save_pretrained folder (every shard of a sharded one)."""
    for name in _WEIGHTS:
        p = folder / name
        if p.is_file():
            if name.endswith(".index.json"):
                parts = sorted(set(json.loads(p.read_text(encoding="utf-8"))["weight_map"].values()))
                return [p, *(folder / s for s in parts)]
            return [p]
    return []


def _weights_hash(files: list[Path]) -> str:
    """The files' contents in order (their names aside: a checkpoint folder's model.safetensors and the
    same file copied elsewhere are the same weights; a sharded index names its parts in its content)."""
    h = hashlib.blake2b(digest_size=16)
    for p in files:
        h.update(file_hash(p).encode())
    return h.hexdigest()


def _state_dict(path: Path) -> dict:
    """A weights file's tensors: safetensors, else a state dict read with ``weights_only`` (never a full unpickle)."""
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path))
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors' and torch's errors for a truncated/foreign file differ by release
        raise DataError(f"checkpoint {path}: not a readable weights file ({type(exc).__name__}: {str(exc)[:200]}); "
                        f"pass a save_pretrained folder or its model.safetensors") from exc
    sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise DataError(f"checkpoint {path} holds no state dict of tensors")
    return sd


def _build(cls, folder: Path, config, spec: ModelSpec):
    """(model, weight files) of ``spec``: the folder's weights, a checkpoint folder's, or a weights file
    loaded into the folder's architecture."""
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    if ckpt is not None and not ckpt.exists():
        raise DataError(f"checkpoint {ckpt} does not exist")
    source = ckpt if ckpt is not None and ckpt.is_dir() else folder
    files = _weights(source)
    if ckpt is not None and ckpt.is_dir() and not files:
        raise DataError(f"checkpoint {ckpt} holds no transformers weights ({', '.join(_WEIGHTS)})")
    if ckpt is not None and ckpt.is_file():
        files = [ckpt]
    if not files:
        if not spec.random_init:
            raise UsageError(f"model {spec.arch}: {folder} holds no weights ({', '.join(_WEIGHTS)}); pass "
                             f"--checkpoint FILE_OR_FOLDER, or --random-init to evaluate random weights on purpose")
        with torch.random.fork_rng():
            torch.manual_seed(0)  # one random model per config: its store folder stays meaningful
            return cls._from_config(config), []
    if ckpt is not None and ckpt.is_dir():
        own = _config(ckpt, spec.arch) if (ckpt / "config.json").is_file() else config
        if own.model_type != config.model_type:
            raise DataError(f"checkpoint {ckpt} is a {own.model_type!r} model, --model {spec.arch} a "
                            f"{config.model_type!r} one; pass the --model this checkpoint was trained from")
        config = own
    try:
        with _no_progress_bars():  # transformers draws a bar per load; hardrank's own progress says more
            # in the file's dtype (transformers 5's default) and cast below: a widening cast is exact
            model = cls.from_pretrained(str(source), config=config, local_files_only=True) \
                if ckpt is None or ckpt.is_dir() else cls._from_config(config)
        if ckpt is not None and ckpt.is_file():
            model.load_state_dict(_state_dict(ckpt), strict=True)
    except DataError:
        raise
    except (OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"checkpoint {ckpt or source} does not fit model {spec.arch} ({type(exc).__name__}: "
                        f"{str(exc)[:400]}); pass the --model this checkpoint was trained from") from exc
    return model, files


@contextlib.contextmanager
def _no_progress_bars():
    bars = _transformers("loading").utils.logging
    was = bars.is_progress_bar_enabled()
    bars.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            bars.enable_progress_bar()


def _output_size(proc: dict, arch: str) -> list[int]:
    """(H, W) every image leaves the processor at: a center crop's size, else a fixed resize's."""
    crop, size = proc.get("crop_size") or {}, proc.get("size") or {}
    if proc.get("do_center_crop") and crop.get("height") and crop.get("width"):
        return [int(crop["height"]), int(crop["width"])]
    if proc.get("do_resize") and size.get("height") and size.get("width"):
        return [int(size["height"]), int(size["width"])]
    raise UsageError(f"--model {arch}: its image processor ({proc.get('image_processor_type')}) gives images of "
                     f"varying size (size {size}, crop {crop or 'none'}); hardrank batches fixed-size arrays: "
                     f"of the variable-resolution processors only SigLIP 2's (Siglip2Model, whose patches are "
                     f"padded to max_num_patches) is supported; save the model with a processor that resizes "
                     f"to a fixed size")


def processor_preprocess_cfg(folder: Path, arch: str, family: Family | None = None) -> dict:
    """The preprocess config of the folder's own image processor (``AutoImageProcessor.from_pretrained``):
    its settings under ``PROCESSOR_KEY``, from which each decode worker rebuilds it (``ProcessorDecoder``),
    and its output: one fixed ``size``, or (a family with ``image_inputs``, SigLIP 2) several arrays per image,
    shaped by the settings. The one way a transformers model's pixels are made (``hf:`` and ``blip:`` models);
    the settings are part of the model's fingerprint."""
    settings = json.loads(json.dumps(_processor(folder, arch).to_dict(), default=str))
    if family is not None and family.image_inputs is not None:
        return {PROCESSOR_KEY: settings, "inputs": family.image_inputs(settings, arch)}
    return {PROCESSOR_KEY: settings, "size": _output_size(settings, arch)}


def hf_image_processor(preprocess_cfg: dict):
    """The image processor ``preprocess_cfg`` records (rebuilt in each decode worker from plain settings)."""
    settings = dict(preprocess_cfg[PROCESSOR_KEY])
    tf = _transformers(f"the image processor {settings.get('image_processor_type')}")
    return getattr(tf, settings["image_processor_type"]).from_dict(settings)


class HFDualEncoder(torch.nn.Module):
    """A transformers dual encoder with open_clip's two calls: ``encode_image((B, 3, H, W))`` and
    ``encode_text(tokens)`` -> (B, D) unnormalised, as the encode stages call them."""

    def __init__(self, model: torch.nn.Module, family: Family):
        super().__init__()
        self.hf, self.family = model, family

    def encode_image(self, pixels) -> torch.Tensor:  # (B, 3, H, W), or {name: (B, ...)} (Family.image_inputs)
        return self.family.image_features(self.hf, pixels)

    def encode_text(self, tokens) -> torch.Tensor:
        return self.family.text_features(self.hf, tokens)


class HFTokenizer:
    """captions -> the tokenizer's tensors (``input_ids``, and ``attention_mask`` where it returns one),
    padded to ``context_length`` and cut there, as the model was trained."""

    def __init__(self, tokenizer, context_length: int):
        self.tokenizer, self.context_length = tokenizer, context_length

    def __call__(self, texts):
        texts = [texts] if isinstance(texts, str) else list(texts)
        return self.tokenizer(texts, padding="max_length", truncation=True, max_length=self.context_length,
                              return_tensors="pt")


def _tokenizer(folder: Path, arch: str):
    tf = _transformers(f"--model {arch}")
    try:
        return tf.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise DataError(f"--model {arch}: the tokenizer files in {folder} do not load ({type(exc).__name__}: "
                        f"{str(exc)[:300]}); save the tokenizer beside the model (tokenizer.save_pretrained) or "
                        f"fetch the repo's files again") from exc


def _processor(folder: Path, arch: str):
    tf = _transformers(f"--model {arch}")
    if not (folder / "preprocessor_config.json").is_file():
        raise DataError(f"--model {arch}: {folder} holds no preprocessor_config.json (the image processor's "
                        f"settings); save the processor beside the model (processor.save_pretrained)")
    try:
        return tf.AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"--model {arch}: {folder}/preprocessor_config.json does not load "
                        f"({type(exc).__name__}: {str(exc)[:300]})") from exc


def load_hf_model(spec: ModelSpec) -> LoadedModel:
    """A transformers dual encoder as ``spec`` names it (``hf:FOLDER`` / ``hf:ORG/NAME``, optional
    checkpoint), offline, fingerprinted by its config, weights, processor and tokenizer settings."""
    if spec.pretrained:
        raise UsageError(f"--pretrained applies to open_clip model names; {spec.arch} brings its own weights and "
                         f"preprocessing")
    device, precision = spec.resolved_device(), spec.resolved_precision()
    folder = _folder(spec.arch)
    config = _config(folder, spec.arch)
    family, cls = _family_and_class(config, spec.arch, folder)
    # fail before the weights load
    preprocess_cfg, tok = processor_preprocess_cfg(folder, spec.arch, family), _tokenizer(folder, spec.arch)
    model, files = _build(cls, folder, config, spec)
    model.eval().requires_grad_(False)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model.to(device=device, dtype=dtype)
    tokenizer = HFTokenizer(tok, family.text_length(model.config))
    weights_hash = _weights_hash(files) if files else None
    cfg = _without_noise(model.config.to_dict())
    tok_files = sorted(p for p in folder.iterdir() if p.is_file() and (
        p.name.startswith(("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "spiece"))))
    ident = {"hf": cfg, "class": cls.__name__, "weights": weights_hash, "precision": precision,
             "preprocess": preprocess_cfg, "context_length": tokenizer.context_length,
             "tokenizer": _weights_hash(tok_files), "embed_version": EMBED_VERSION}
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    with torch.inference_mode():  # the embedding width: one caption through the text side
        probe = tokenizer(["a"]).to(device)
        embed_dim = int(family.text_features(model, probe).shape[-1])
    info = {"pretrained": None, "weights": str(files[0]) if files else None, "weights_format": "transformers",
            "quick_gelu": False, "random_init": not files, "warnings": [], "spec": asdict(spec),
            "transformers": {"class": cls.__name__, "model_type": config.model_type, "folder": str(folder)}}
    name = spec.arch[len(HF_PREFIX):]
    shown = name if not Path(name).is_dir() else folder.resolve().name  # a repo id, else the folder's name
    return LoadedModel(spec=spec, arch_name=f"{HF_PREFIX}{shown}", model=HFDualEncoder(model, family),
                       tokenizer=tokenizer, preprocess_cfg=preprocess_cfg,
                       fingerprint=f"hf-{_safe(shown.split('/')[-1])}-{precision}-{digest}", embed_dim=embed_dim,
                       device=device, precision=precision, checkpoint_hash=weights_hash, info=info)


def _without_noise(cfg):
    """A config dict without the keys that say where or by which release it was saved (nested configs too)."""
    if isinstance(cfg, dict):
        return {k: _without_noise(v) for k, v in cfg.items() if k not in _CONFIG_NOISE}
    return cfg


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)
