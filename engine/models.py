"""open_clip models from names, config JSON files or local folders, loaded offline, fingerprinted."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import open_clip
import torch

from .config import DATA_DIR, PRECISIONS, resolve_device

__all__ = ["ModelSpec", "LoadedModel", "load_model", "resolve_arch", "file_hash", "PRECISIONS"]

_BUNDLED = DATA_DIR / "models"
_registered: set[str] = set()
EMBED_VERSION = 1  # bump when encoding semantics change: it is part of every fingerprint


@dataclass(frozen=True)
class ModelSpec:
    arch: str                 # open_clip model name, a config .json path, or "local-dir:<folder>"
    checkpoint: str | None    # weights file (.pt/.pth/.bin/.safetensors, training checkpoints ok); None = random init
    precision: str = "auto"   # auto = fp16 on CUDA, fp32 on CPU
    device: str = "auto"      # auto = cuda if available

    def resolved_device(self) -> str:
        return resolve_device(self.device)

    def resolved_precision(self) -> str:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "auto":
            return "fp16" if self.resolved_device().startswith("cuda") else "fp32"
        return self.precision


@dataclass
class LoadedModel:
    spec: ModelSpec
    arch_name: str
    model: torch.nn.Module
    tokenizer: object
    preprocess_cfg: dict
    fingerprint: str
    embed_dim: int
    device: str
    precision: str
    checkpoint_hash: str | None
    info: dict = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]

    @property
    def store_dtype(self) -> str:
        return "float32" if self.precision == "fp32" else "float16"

    @property
    def label(self) -> str:
        return Path(self.spec.checkpoint).stem if self.spec.checkpoint else f"{self.arch_name}-init"


def _register_bundled() -> None:
    if "__bundled__" in _registered:
        return
    if _BUNDLED.is_dir():
        open_clip.add_model_config(_BUNDLED)
    _registered.add("__bundled__")


def resolve_arch(arch: str) -> str:
    """Return an open_clip model name for ``arch`` (registering a config JSON if given a path)."""
    _register_bundled()
    if arch.startswith(("local-dir:", "hf-hub:")):
        return arch
    path = Path(arch)
    if path.suffix == ".json":
        if not path.is_file():
            raise FileNotFoundError(f"model config {arch} does not exist; pass an open_clip model name "
                                    f"(python -c 'import open_clip; print(open_clip.list_models())' lists them) "
                                    f"or the path of a config JSON")
        cfg = json.loads(path.read_text())
        if "vision_cfg" not in cfg or "text_cfg" not in cfg:
            raise ValueError(f"{arch}: not an open_clip model config (needs 'vision_cfg' and 'text_cfg')")
        open_clip.add_model_config(path)
        return path.stem
    if arch not in open_clip.list_models():
        raise ValueError(f"unknown model {arch!r}: not an open_clip model name, a config .json, or "
                         f"'local-dir:<folder>'. Known names include {open_clip.list_models()[:5]}...")
    return arch


def file_hash(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _arch_config(name: str) -> dict:
    if name.startswith("local-dir:"):
        cfg_path = Path(name[len("local-dir:"):]) / "open_clip_config.json"
        return json.loads(cfg_path.read_text()) if cfg_path.exists() else {"name": name}
    cfg = open_clip.get_model_config(name)
    return cfg if cfg is not None else {"name": name}


class _DropNoWeights(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "No pretrained weights loaded" not in record.getMessage()


@contextlib.contextmanager
def _quiet_open_clip():
    root, flt = logging.getLogger(), _DropNoWeights()
    handlers = [root, *root.handlers]
    for h in handlers:
        h.addFilter(flt)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(flt)


def load_model(spec: ModelSpec) -> LoadedModel:
    """Create the model offline and load its checkpoint with ``weights_only`` loading."""
    name = resolve_arch(spec.arch)
    device, precision = spec.resolved_device(), spec.resolved_precision()
    if name.startswith("hf-hub:"):
        raise ValueError(f"{spec.arch}: hardrank works offline; download the weights yourself and pass "
                         f"'local-dir:<folder>' or --checkpoint FILE")
    with _quiet_open_clip():  # it warns "no pretrained weights" although we load the checkpoint next
        model = open_clip.create_model(name, pretrained=None, device="cpu", load_weights=name.startswith("local-dir:"))
    ckpt_hash = None
    if spec.checkpoint is not None:
        path = Path(spec.checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        ckpt_hash = file_hash(path)
        try:
            open_clip.load_checkpoint(model, str(path), strict=True, weights_only=True)
        except RuntimeError as exc:
            raise ValueError(f"checkpoint {path} does not fit model {name!r}: {str(exc)[:600]}\n"
                             f"Fix: pass the --model this checkpoint was trained with.") from exc
        except Exception as exc:  # pickle refusals etc.
            if "weights_only" in str(exc) or "Unsupported global" in str(exc):
                raise ValueError(f"checkpoint {path} holds pickled objects that weights_only loading refuses; "
                                 f"re-save it as a plain state_dict or .safetensors") from exc
            raise
    model.eval().requires_grad_(False)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model.to(device=device, dtype=dtype)
    preprocess_cfg = dict(getattr(model.visual, "preprocess_cfg", {}))
    preprocess_cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in preprocess_cfg.items()}
    tokenizer = open_clip.get_tokenizer(name)
    arch_cfg = _arch_config(name)
    embed_dim = int(arch_cfg.get("embed_dim") or model.text_projection.shape[-1])
    ident = {"arch": arch_cfg, "checkpoint": ckpt_hash, "precision": precision,
             "preprocess": preprocess_cfg, "context_length": getattr(tokenizer, "context_length", None),
             "embed_version": EMBED_VERSION}
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).name)
    return LoadedModel(spec=spec, arch_name=name, model=model, tokenizer=tokenizer,
                       preprocess_cfg=preprocess_cfg, fingerprint=f"{safe}-{precision}-{digest}",
                       embed_dim=embed_dim, device=device, precision=precision, checkpoint_hash=ckpt_hash,
                       info={"spec": asdict(spec)})
