"""transformers dual encoders (CLIPModel, SiglipModel, ...), loaded offline, preprocessed by their own processor.

``--model hf:FOLDER`` (a ``save_pretrained`` folder) or ``--model hf:ORG/NAME`` (its snapshot in the local
Hugging Face cache, ``HF_HOME`` / ``HF_HUB_CACHE``; never downloaded) names the architecture, the image
processor and the tokenizer; the weights are the folder's, or each ``--checkpoint`` (a folder with its own
``config.json`` + weights, as a Trainer's ``checkpoint-N/``, or a weights file of the folder's config). Every
file is read through ``hardrank.models.boundary``: settings that would run the folder's code, paths leading out
of it, configs implying more than their weights hold and tokenizers that cannot be the model's are refused
before transformers builds anything; every ``from_pretrained`` passes ``trust_remote_code=False``. Both
processor layouts load: transformers 5's ``processor_config.json`` (the image processor nested) and 4's
``preprocessor_config.json``.

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

from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.models.boundary import (
    WEIGHTS,
    ModelFolder,
    check_size,
    check_tokenizer,
    estimate_params,
    is_safetensors,
    open_folder,
    quote,
    read_state_dict,
    vet_pickle,
)
from hardrank.models.hf_text import snapshot
from hardrank.models.openclip import EMBED_VERSION, file_hash
from hardrank.models.spec import Kind, LoadedModel, ModelSpec, safe_name
from hardrank.openclip_import import import_transformers

__all__ = ["KIND", "Family", "FAMILIES", "register_family", "family_of", "load_hf_model", "hf_image_processor",
           "processor_preprocess_cfg", "image_processor_cfg", "tokenizer_of", "weights_of", "build_model",
           "weights_hash", "text_vocab_size", "config_ident", "HFDualEncoder", "HFTokenizer"]

PROCESSOR_KEY = "hf_image_processor"  # the preprocess_cfg key that marks a transformers image processor
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


def family_of(config) -> Family:
    """The family that runs a transformers config's ``model_type`` (the generic adapter for any other)."""
    return FAMILIES.get(config.model_type, _GENERIC)


def _transformers(what: str):
    try:
        return import_transformers()  # not `import transformers`: a Ray actor's two threads first use it at once
    except ImportError as exc:
        raise MissingExtra(what, "hf", "transformers") from exc


def _folder(spec: ModelSpec) -> ModelFolder:
    """The folder ``hf:FOLDER`` or ``hf:ORG/NAME`` names (a cached snapshot, never downloaded), vetted."""
    arch, name = spec.arch, spec.name
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
    return open_folder(folder, f"--model {arch}")


def _config(folder: ModelFolder, arch: str):
    tf = _transformers(f"--model {arch}")
    try:
        return tf.AutoConfig.from_pretrained(str(folder.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"--model {arch}: {folder.path / 'config.json'} does not load in transformers "
                        f"{tf.__version__} ({type(exc).__name__}: {quote(exc)}); save the model again with "
                        f"save_pretrained, or upgrade transformers") from None


def _family_and_class(config, arch: str, folder: ModelFolder):
    tf = _transformers(f"--model {arch}")
    family = family_of(config)
    if family.model_class is not None:
        cls = getattr(tf, family.model_class)
    else:
        try:
            cls = tf.AutoModel._model_mapping[type(config)]
        except KeyError:
            cls = None
    if cls is None or not (hasattr(cls, "get_image_features") and hasattr(cls, "get_text_features")):
        raise DataError(f"--model {arch}: {folder.path} is a transformers {config.model_type!r} model "
                        f"({getattr(cls, '__name__', 'no AutoModel class')}) without an image tower and a text "
                        f"tower (get_image_features / get_text_features); hardrank evaluates image-text dual "
                        f"encoders such as CLIPModel or SiglipModel: pass such a model's folder")
    return family, cls


def weights_hash(files: list[Path]) -> str:
    """The files' contents in order (their names aside: a checkpoint folder's model.safetensors and the
    same file copied elsewhere are the same weights; a sharded index names its parts in its content)."""
    h = hashlib.blake2b(digest_size=16)
    for p in files:
        h.update(file_hash(p).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class _Weights:
    """Where a model's weights come from: a vetted folder's files, or one weights file, with the config they fit."""

    files: list            # weight files (a sharded index, then its shards), or [] for random weights
    folder: Path | None    # the folder from_pretrained reads them from; None: files[0] is a state dict file
    config: object         # the transformers config the network is built from
    config_file: str       # where that config was read (for messages)


def weights_of(folder: ModelFolder, config, spec: ModelSpec, load_config: Callable) -> _Weights:
    """The weights ``spec`` names for the vetted ``folder`` (whose config is ``config``): the folder's, a
    checkpoint folder's (a Trainer's ``checkpoint-N/``, vetted and with its own config when it has one) or a
    weights file of the folder's config. Pickles are vetted here; nothing is built."""
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    cfg_file = str(folder.path / "config.json")
    if ckpt is not None and not ckpt.exists():
        raise DataError(f"checkpoint {ckpt} does not exist")
    if ckpt is not None and ckpt.is_file():
        if not is_safetensors(ckpt):
            vet_pickle(ckpt)
        return _Weights([ckpt], None, config, cfg_file)
    source = open_folder(ckpt, f"checkpoint {ckpt}") if ckpt is not None else folder
    files = source.weights()
    if ckpt is not None and not files:
        raise DataError(f"checkpoint {ckpt} holds no transformers weights ({', '.join(WEIGHTS)}); pass the folder "
                        f"save_pretrained (or a Trainer) wrote, or a weights file")
    if ckpt is not None and source.holds("config.json"):
        own = load_config(source, spec.arch)
        if own.model_type != config.model_type:
            raise DataError(f"checkpoint {ckpt} is a {own.model_type!r} model, --model {spec.arch} a "
                            f"{config.model_type!r} one; pass the --model this checkpoint was trained from")
        config, cfg_file = own, str(source.path / "config.json")
    for f in files:
        if f.suffix == ".bin":
            vet_pickle(f)
    return _Weights(files, source.path if files else None, config, cfg_file)


def build_model(cls, weights: _Weights, spec: ModelSpec, precision: str):
    """The network with its weights (random ones with ``--random-init`` and no weights), once the size its
    config implies is checked against the weights and the machine's memory."""
    what = f"--model {spec.arch}"
    check_size(estimate_params(weights.config.to_dict()), [f for f in weights.files if f.suffix != ".json"],
               what=what, config=weights.config_file, precision=precision)
    if not weights.files:
        if not spec.random_init:
            raise UsageError(f"model {spec.arch}: its folder holds no weights ({', '.join(WEIGHTS)}); pass "
                             f"--checkpoint FILE_OR_FOLDER, or --random-init to evaluate random weights on purpose")
        with torch.random.fork_rng():
            torch.manual_seed(0)  # one random model per config: its store folder stays meaningful
            return cls._from_config(weights.config)
    source = weights.folder or weights.files[0]
    try:
        with _quiet_loading():
            if weights.folder is not None:
                # in the file's dtype (transformers 5's default) and cast below: a widening cast is exact
                model, info = cls.from_pretrained(str(weights.folder), config=weights.config, local_files_only=True,
                                                  trust_remote_code=False, output_loading_info=True)
                # a tensor the network has but the files lack would stay random: refused (tensors the files hold
                # beyond the network, e.g. a training wrapper's heads, are left out, as transformers leaves them)
                wrong = {k: sorted(map(str, info[k]))[:3] for k in ("missing_keys", "mismatched_keys") if info.get(k)}
                if wrong or info.get("error_msgs"):
                    raise RuntimeError(f"tensors {wrong or info['error_msgs']}")
            else:
                model = cls._from_config(weights.config)
                model.load_state_dict(read_state_dict(weights.files[0]), strict=True)
    except DataError:
        raise
    except (OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"checkpoint {source} does not fit model {spec.arch} ({type(exc).__name__}: "
                        f"{quote(exc)}); pass the --model this checkpoint was trained from") from None
    return model


@contextlib.contextmanager
def _quiet_loading():
    """No bar per load (hardrank's own progress says more) and no load report on the terminal: a checkpoint
    that does not fit is refused in one line, and the report's advice to ignore mismatched sizes never shows."""
    logs = _transformers("loading").utils.logging
    was, level = logs.is_progress_bar_enabled(), logs.get_verbosity()
    logs.disable_progress_bar()
    logs.set_verbosity_error()
    try:
        yield
    finally:
        logs.set_verbosity(level)
        if was:
            logs.enable_progress_bar()


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


def processor_preprocess_cfg(folder: ModelFolder, arch: str, family: Family | None = None) -> dict:
    """The preprocess config of the vetted folder's own image processor (``AutoImageProcessor.from_pretrained``,
    from transformers 4's ``preprocessor_config.json`` or transformers 5's ``processor_config.json``)
    (``image_processor_cfg``). The one way a transformers model's pixels are made (``hf:`` and ``blip:`` models,
    and model objects); the settings are part of the model's fingerprint."""
    return image_processor_cfg(_processor(folder, arch), arch, family)


def image_processor_cfg(processor, arch: str, family: Family | None = None) -> dict:
    """An image processor's settings under ``PROCESSOR_KEY``, from which each decode worker rebuilds it
    (``ProcessorDecoder``), and its output: one fixed ``size``, or (a family with ``image_inputs``, SigLIP 2)
    several arrays per image, shaped by the settings."""
    settings = json.loads(json.dumps(processor.to_dict(), default=str))
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


_NO_PROCESSOR = ("holds no image processor settings (preprocessor_config.json, or processor_config.json with an "
                 "image_processor: what a processor's save_pretrained writes)")
_SAVE_PROCESSOR = ("save the model's processor beside it (processor.save_pretrained(folder)); for a Trainer "
                   "checkpoint-N/ saved without one, pass the model's own folder as --model and checkpoint-N/ as "
                   "--checkpoint")


def tokenizer_of(folder: ModelFolder, what: str):
    """The vetted folder's own tokenizer (``AutoTokenizer``, offline, no remote code); a folder without a
    vocabulary is refused before transformers builds an empty tokenizer for it."""
    tf = _transformers(what)
    if not folder.holds_tokenizer():
        raise DataError(f"{what}: {folder.path} holds no tokenizer files (tokenizer.json, or vocab.json + merges.txt, "
                        f"vocab.txt, a SentencePiece model); {_SAVE_PROCESSOR}")
    try:
        return tf.AutoTokenizer.from_pretrained(str(folder.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise DataError(f"{what}: the tokenizer files in {folder.path} do not load ({type(exc).__name__}: "
                        f"{quote(exc)}); {_SAVE_PROCESSOR}") from None


def _processor(folder: ModelFolder, arch: str):
    tf = _transformers(f"--model {arch}")
    file = folder.image_processor_file()
    if file is None:
        raise DataError(f"--model {arch}: {folder.path} {_NO_PROCESSOR}; {_SAVE_PROCESSOR}")
    try:
        return tf.AutoImageProcessor.from_pretrained(str(folder.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"--model {arch}: {folder.path / file} does not load ({type(exc).__name__}: "
                        f"{quote(exc)}); save the processor again with processor.save_pretrained") from None


def text_vocab_size(config) -> int | None:
    """The text tower's vocabulary size (``text_config.vocab_size``, or the config's own)."""
    text = getattr(config, "text_config", None) or config
    size = getattr(text, "vocab_size", None)
    return int(size) if isinstance(size, int) else None


def load_hf_model(spec: ModelSpec) -> LoadedModel:
    """A transformers dual encoder as ``spec`` names it (``hf:FOLDER`` / ``hf:ORG/NAME``, optional
    checkpoint), offline, fingerprinted by its config, weights, processor and tokenizer settings. Every
    file is vetted (``boundary``) and the tokenizer checked before the network is built."""
    if spec.pretrained:
        raise UsageError(f"--pretrained applies to open_clip model names; {spec.arch} brings its own weights and "
                         f"preprocessing")
    device, precision = spec.resolved_device(), spec.resolved_precision()
    folder = _folder(spec)
    config = _config(folder, spec.arch)
    family, cls = _family_and_class(config, spec.arch, folder)
    # fail before the weights load
    preprocess_cfg, tok = processor_preprocess_cfg(folder, spec.arch, family), tokenizer_of(folder,
                                                                                            f"--model {spec.arch}")
    weights = weights_of(folder, config, spec, _config)
    tokenizer = HFTokenizer(tok, family.text_length(weights.config))
    check_tokenizer(tokenizer, size=len(tok), vocab_size=text_vocab_size(weights.config), what=f"--model {spec.arch}",
                    source=folder.path, fix="save the model's own tokenizer beside it (processor.save_pretrained)")
    model = build_model(cls, weights, spec, precision)
    model.eval().requires_grad_(False)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model.to(device=device, dtype=dtype)
    files = weights.files
    w_hash = weights_hash(files) if files else None
    cfg = config_ident(model.config)
    tok_files = sorted(p for p in folder.path.iterdir() if p.is_file() and (
        p.name.startswith(("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "spiece"))))
    ident = {"hf": cfg, "class": cls.__name__, "weights": w_hash, "precision": precision,
             "preprocess": preprocess_cfg, "context_length": tokenizer.context_length,
             "tokenizer": weights_hash(tok_files), "embed_version": EMBED_VERSION}
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    with torch.inference_mode():  # the embedding width: one caption through the text side
        probe = tokenizer(["a"]).to(device)
        embed_dim = int(family.text_features(model, probe).shape[-1])
    info = {"pretrained": None, "weights": str(files[0]) if files else None, "weights_format": "transformers",
            "quick_gelu": False, "random_init": not files, "warnings": [], "spec": asdict(spec),
            "transformers": {"class": cls.__name__, "model_type": config.model_type, "folder": str(folder.path)}}
    shown = spec.name if not Path(spec.name).is_dir() else folder.path.resolve().name  # a repo id, else the folder's
    return LoadedModel(spec=spec, arch_name=f"{KIND.prefix}{shown}", model=HFDualEncoder(model, family),
                       tokenizer=tokenizer, preprocess_cfg=preprocess_cfg,
                       fingerprint=f"hf-{safe_name(shown.split('/')[-1])}-{precision}-{digest}", embed_dim=embed_dim,
                       device=device, precision=precision, checkpoint_hash=w_hash, info=info)


def config_ident(config) -> dict:
    """A transformers config as fingerprinted: its dict without the keys that say where or by which release it was
    saved."""
    return _without_noise(config.to_dict())


def _without_noise(cfg):
    """A config dict without the keys that say where or by which release it was saved (nested configs too)."""
    if isinstance(cfg, dict):
        return {k: _without_noise(v) for k, v in cfg.items() if k not in _CONFIG_NOISE}
    return cfg


def _is_folder(spelling: str) -> bool:
    return (Path(spelling) / "config.json").is_file()


KIND = Kind("hf", load_hf_model, prefix="hf:", matches=_is_folder, path="folder", forms=(
    ("hf:FOLDER or hf:ORG/NAME", "a transformers dual encoder such as CLIPModel or SiglipModel: a save_pretrained "
                                 "folder or a cached repo"),),
    folder="a transformers model (config.json + weights + the processor's and tokenizer's files, as save_pretrained "
           "writes them: --model hf:FOLDER)")
