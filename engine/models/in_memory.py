"""Model objects given to the Python API (an open_clip model, a transformers dual encoder), encoded in this process
and left exactly as they were found.

``hardrank.evaluate(model=model, tokenizer=tokenizer, ...)`` takes the model a training loop holds: an open_clip
model (anything with ``encode_image`` / ``encode_text``, preprocessed by ``model.visual.preprocess_cfg`` as
open_clip's eval transform, which the Pillow decoder reproduces bit for bit) with its tokenizer, and optionally its
eval transform (``preprocess``, checked to be that transform); or a transformers dual encoder (``CLIPModel``,
``SiglipModel``, anything with ``get_image_features`` / ``get_text_features``) with its ``processor`` (or an image
processor as ``preprocess`` and a ``tokenizer``), run by the family adapters of ``hf_models`` as ``hf:`` folders
are. Both encode exactly as the same weights loaded from files do.

The caller's model is borrowed, never changed: it is encoded where it is and in its dtype (``--device`` /
``--precision`` other than that are refused), in eval mode, its parameters not requiring grad, under
``torch.inference_mode`` while it encodes (no gradient is recorded), and every submodule's train/eval mode and
every parameter's ``requires_grad`` are restored after, also on an error; its values and ``.grad`` are never
touched. Its embeddings are stored only under a ``fingerprint`` the
caller gives (the weights' name: a training step); without one nothing is read from or written to a store.
"""
from __future__ import annotations

import contextlib
import hashlib
import json

import numpy as np
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from hardrank.devices import resolve_device
from hardrank.errors import UsageError
from hardrank.models.boundary import check_tokenizer
from hardrank.models.hf_models import (
    HFDualEncoder,
    HFTokenizer,
    config_ident,
    family_of,
    image_processor_cfg,
    text_vocab_size,
)
from hardrank.models.openclip import EMBED_VERSION
from hardrank.models.spec import Kind, LoadedModel, ModelSpec, safe_name

__all__ = ["KIND", "accepts", "load_in_memory", "as_found"]

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _is_transformers(obj) -> bool:
    return (isinstance(obj, torch.nn.Module) and callable(getattr(obj, "get_image_features", None))
            and callable(getattr(obj, "get_text_features", None)) and hasattr(getattr(obj, "config", None),
                                                                             "model_type"))


def _is_open_clip(obj) -> bool:
    return (isinstance(obj, torch.nn.Module) and callable(getattr(obj, "encode_image", None))
            and callable(getattr(obj, "encode_text", None)))


def accepts(obj) -> bool:
    """Whether ``obj`` is a model object this kind runs: an open_clip model or a transformers dual encoder."""
    return _is_transformers(obj) or _is_open_clip(obj)


@contextlib.contextmanager
def as_found(module: torch.nn.Module):
    """Hold ``module`` as a loaded model is held while it encodes: in eval mode, its parameters not requiring
    grad (torch then takes the same kernels as for the same weights loaded from files, which the loaders set so:
    equal embeddings bit for bit), and this thread in inference mode; every submodule's train/eval mode and every
    parameter's ``requires_grad`` are set back after, also on an error, each as it was."""
    modes = [(m, m.training) for m in module.modules()]
    flags = [(p, p.requires_grad) for p in module.parameters()]
    try:
        module.eval()
        module.requires_grad_(False)
        with torch.inference_mode():
            yield
    finally:
        for m, training in modes:
            m.training = training
        for p, flag in flags:
            p.requires_grad_(flag)


def _placed(spec: ModelSpec, model: torch.nn.Module) -> tuple[str, str]:
    """(device, precision) of the model as it is; a --device or --precision naming others is refused."""
    p = next((t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()), None)
    if p is None:
        raise UsageError(f"model {spec.arch} has no floating point parameters: no model hardrank can run")
    if p.dtype not in _DTYPES:
        raise UsageError(f"model {spec.arch} holds {p.dtype} parameters; hardrank runs fp32, fp16 and bf16 models: "
                         f"cast it (model.float()) before evaluating")
    device, precision = str(p.device), _DTYPES[p.dtype]
    if spec.device != "auto":
        want = torch.device(resolve_device(spec.device))
        if want.type != p.device.type or want.index not in (None, p.device.index):
            raise UsageError(f"option device is {spec.device!r}, but the model object is on {device}; a model object "
                             f"is evaluated where it is: drop the option, or move the model first")
    if spec.precision not in ("auto", precision):
        raise UsageError(f"option precision is {spec.precision!r}, but the model object is {precision}; a model "
                         f"object is evaluated in its own dtype: drop the option, or cast the model first")
    return device, precision


def _digest(ident: dict) -> str:
    return hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def _structure(model: torch.nn.Module) -> str:
    """The network's shape: every state tensor's name, shape and dtype (not its values)."""
    return _digest({"tensors": [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()]})


def _vocabulary(tok) -> str | None:
    """A tokenizer's vocabulary, hashed (a transformers tokenizer's ``get_vocab``, open_clip's ``encoder``)."""
    inner = getattr(tok, "tokenizer", tok)
    vocab = inner.get_vocab() if callable(getattr(inner, "get_vocab", None)) else getattr(inner, "encoder", None)
    return _digest({"vocab": sorted(vocab.items())}) if isinstance(vocab, dict) else None


def _probes() -> list[Image.Image]:
    """Images of awkward sizes and modes, for comparing a caller's transform with the model's own."""
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (37, 61, 3), dtype=np.uint8))
    tall = Image.fromarray(rng.integers(0, 256, (300, 90, 3), dtype=np.uint8))
    gray = Image.fromarray(rng.integers(0, 256, (50, 50), dtype=np.uint8), "L")
    rgba = Image.fromarray(rng.integers(0, 256, (40, 70, 4), dtype=np.uint8), "RGBA")
    return [rgb, tall, gray, rgba]


def _check_transform(preprocess, cfg: dict, arch: str) -> None:
    """The caller's ``preprocess`` must be the model's eval transform: equal output on every probe image."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}
    own = image_transform_v2(PreprocessCfg(**fields), is_train=False)
    try:
        same = all(torch.equal(torch.as_tensor(preprocess(im)), own(im)) for im in _probes())
    except Exception as exc:  # a transform that cannot take a PIL image
        same, why = False, f" (it failed on a PIL image: {type(exc).__name__}: {str(exc)[:120]})"
    else:
        why = ""
    if not same:
        raise UsageError(f"preprocess= is not model {arch}'s eval transform{why}: hardrank preprocesses as open_clip's "
                         f"eval transform of model.visual.preprocess_cfg ({cfg}), reproduced exactly by its decoder; "
                         f"pass the eval transform create_model_and_transforms returns (its third value), or leave "
                         f"preprocess out")


def _open_clip(spec: ModelSpec, model: torch.nn.Module) -> LoadedModel:
    live = spec.live
    cfg = getattr(getattr(model, "visual", None), "preprocess_cfg", None)
    if not isinstance(cfg, dict) or "size" not in cfg:
        raise UsageError(f"model {spec.arch} has no model.visual.preprocess_cfg (open_clip's models carry one: size, "
                         f"mean, std, interpolation, resize_mode): hardrank preprocesses images by it; set it to the "
                         f"PreprocessCfg fields the model was trained with")
    cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dict(cfg).items()}
    if live.processor is not None:
        raise UsageError("processor= goes with a transformers model; an open_clip model takes tokenizer= (and "
                         "preprocess=, its eval transform)")
    if live.preprocess is not None:
        _check_transform(live.preprocess, cfg, spec.arch)
    tok = live.tokenizer
    if not callable(tok):
        raise UsageError(f"an open_clip model object needs its tokenizer: tokenizer=open_clip.get_tokenizer(NAME) "
                         f"(got {type(tok).__name__})")
    device, precision = _placed(spec, model)
    check_tokenizer(tok, size=None, vocab_size=getattr(model, "vocab_size", None), what=f"model {spec.arch}",
                    source="tokenizer=", fix="pass the model's own tokenizer (open_clip.get_tokenizer(NAME))")
    with as_found(model):  # the width of its embeddings: one caption through the text side
        embed_dim = int(model.encode_text(tok(["a"]).to(device)).shape[-1])
    ident = {"kind": KIND.name, "class": spec.arch, "structure": _structure(model), "precision": precision,
             "preprocess": cfg, "context_length": getattr(tok, "context_length", None),
             "tokenizer": [type(tok).__qualname__, _vocabulary(tok)], "embed_version": EMBED_VERSION}
    return _loaded(spec, model, model, tok, cfg, ident, embed_dim, device, precision, {})


def _transformers(spec: ModelSpec, model: torch.nn.Module) -> LoadedModel:
    live = spec.live
    proc = live.processor
    image = getattr(proc, "image_processor", None) if proc is not None else live.preprocess
    tok = getattr(proc, "tokenizer", None) if proc is not None else live.tokenizer
    if not callable(getattr(image, "to_dict", None)) or not callable(tok):
        raise UsageError(f"a transformers model object needs its processor: processor=AutoProcessor (a CLIPProcessor, "
                         f"SiglipProcessor ...: its image processor and tokenizer), or preprocess=<image processor> "
                         f"and tokenizer=<tokenizer>; got processor={type(proc).__name__}, "
                         f"preprocess={type(live.preprocess).__name__}, tokenizer={type(live.tokenizer).__name__}")
    family = family_of(model.config)
    preprocess_cfg = image_processor_cfg(image, spec.arch, family)
    tokenizer = HFTokenizer(tok, family.text_length(model.config))
    check_tokenizer(tokenizer, size=len(tok), vocab_size=text_vocab_size(model.config), what=f"model {spec.arch}",
                    source="the processor given", fix="pass the model's own processor")
    device, precision = _placed(spec, model)
    with as_found(model):
        embed_dim = int(family.text_features(model, tokenizer(["a"]).to(device)).shape[-1])
    ident = {"kind": KIND.name, "hf": config_ident(model.config), "class": type(model).__name__,
             "structure": _structure(model), "precision": precision, "preprocess": preprocess_cfg,
             "context_length": tokenizer.context_length, "tokenizer": [type(tok).__qualname__, _vocabulary(tok)],
             "embed_version": EMBED_VERSION}
    info = {"transformers": {"class": type(model).__name__, "model_type": model.config.model_type, "folder": None}}
    return _loaded(spec, model, HFDualEncoder(model, family), tokenizer, preprocess_cfg, ident, embed_dim, device,
                   precision, info)


def _loaded(spec, model, encoder, tokenizer, preprocess_cfg, ident, embed_dim, device, precision, info):
    live = spec.live
    fingerprint = None
    if live.fingerprint is not None:  # the caller names the weights: the store folder is that name + the rest
        fingerprint = f"{safe_name(live.fingerprint)}-{precision}-{_digest({**ident, 'weights': live.fingerprint})}"
    info = {"pretrained": None, "weights": None, "weights_format": "in-memory", "quick_gelu": None,
            "random_init": False, "warnings": [], "spec": spec.record(),
            "in_memory": {"class": spec.arch, "fingerprint": live.fingerprint}, **info}
    return LoadedModel(spec=spec, arch_name=spec.arch, model=encoder, tokenizer=tokenizer,
                       preprocess_cfg=preprocess_cfg, fingerprint=fingerprint, embed_dim=embed_dim, device=device,
                       precision=precision, checkpoint_hash=None, info=info, session=lambda: as_found(model))


def load_in_memory(spec: ModelSpec) -> LoadedModel:
    """The model object ``spec.live`` holds, ready to encode in this process (see the module docstring)."""
    model = spec.live.model
    return _transformers(spec, model) if _is_transformers(model) else _open_clip(spec, model)


KIND = Kind("in_memory", load_in_memory, accepts=accepts, portable=False, forms=(
    ("an open_clip model", "with tokenizer=; preprocess=, its eval transform, optional"),
    ("a transformers dual encoder such as CLIPModel", "with processor=, or its image processor as preprocess= "
                                                      "with tokenizer=")))
