"""Where model specs come from: the user's options (``user_specs``, the one place), or an open_clip training run.

open_clip's trainer (``open_clip_train.main``) writes ``<logs>/<name>/params.txt`` (one
``name: value`` line per argument) and ``<logs>/<name>/checkpoints/epoch_<N>.pt``. The model of a run
is rebuilt from params.txt exactly as the trainer built it (``create_model_and_transforms(model,
pretrained, force_quick_gelu=..., image_mean=..., ...)``), and every complete epoch checkpoint is
evaluated, named ``epoch_<N>``.
"""
from __future__ import annotations

import ast
import json
import re
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import open_clip

from hardrank.config import EvalConfig
from hardrank.errors import DataError, UsageError
from hardrank.models.openclip import resolve_arch
from hardrank.models.spec import LiveModel, ModelSpec

__all__ = ["read_params", "run_checkpoints", "run_spec", "model_specs", "user_specs", "object_spec",
           "checkpoint_complete", "checkpoint_step"]

_EPOCH = re.compile(r"^epoch_(\d+)\.(pt|pth|safetensors)$")
# "step0200", "epoch_3", "iter-1000", "global_step5", "checkpoint-500" (transformers' Trainer): the unit and
# the number
_STEP = re.compile(r"(?<![a-z])(global_step|step|epoch|iteration|iter|it|ckpt|checkpoint)[_\-]?(\d+)", re.I)


def checkpoint_step(name: str) -> tuple[str, int] | None:
    """``("step", 200)`` for ``toy-clip_step0200``, ``("epoch", 3)`` for ``epoch_3`` (open_clip's trainer),
    ``("checkpoint", 500)`` for ``checkpoint-500`` (transformers' Trainer); None if the name holds no step
    (the last match wins: ``run2_epoch_3`` is epoch 3)."""
    found = _STEP.findall(name)
    if not found:
        return None
    unit, num = found[-1]
    return unit.lower(), int(num)
# params.txt name -> the preprocessing key it overrides
_PREPROCESS = {"image_mean": "mean", "image_std": "std", "image_interpolation": "interpolation",
               "image_resize_mode": "resize_mode"}


def read_params(run_dir: str | Path) -> dict:
    """params.txt as a dict of Python values (``None``, numbers, lists parsed; other values strings)."""
    path = Path(run_dir) / "params.txt"
    if not path.is_file():
        raise DataError(f"{run_dir}: not an open_clip training run folder (no params.txt); --run takes the folder "
                        f"open_clip_train writes under --logs (params.txt, checkpoints/)")
    out = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(": ")
        if not sep:
            key, value = line.rstrip(":"), ""
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    if "model" not in out:
        raise DataError(f"{path}: no 'model: ...' line; is this an open_clip params.txt?")
    return out


def checkpoint_complete(path: str | Path) -> bool:
    """Whether a checkpoint file is whole: a torch zip archive has its central directory (written
    last), a safetensors file its full data after the header. (A legacy non-zip pickle cannot be
    told apart; the caller also waits for its size to settle.)"""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            with open(path, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            return path.stat().st_size == 8 + n + end
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":  # a zip archive (torch.save's format): whole once its central directory is
            with zipfile.ZipFile(path) as z:
                return bool(z.namelist())
        return path.stat().st_size > 0  # a legacy pickle: only its settled size tells
    except (OSError, ValueError, KeyError, struct.error, zipfile.BadZipFile):
        return False


def run_checkpoints(run_dir: str | Path) -> list[Path]:
    """``checkpoints/epoch_<N>.*`` in epoch order (``epoch_latest`` repeats the last one: skipped)."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _EPOCH.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def run_spec(run_dir: str | Path, *, precision: str = "auto", device: str = "auto",
             arch: str | None = None) -> ModelSpec:
    """The model of a run as its trainer built it (without a checkpoint). ``arch``: a config .json for
    a custom architecture whose name params.txt gives but open_clip does not know here."""
    params = read_params(run_dir)
    name = str(params["model"])
    if arch is not None:
        name = resolve_arch(arch)
    elif name not in open_clip.list_models():
        raise UsageError(f"{run_dir}/params.txt trains model {name!r}, which this open_clip does not know; pass its "
                         f"config with --model {name}.json")
    tag = params.get("pretrained") or None
    if tag is not None and not open_clip.get_pretrained_cfg(name, str(tag)):
        tag = None  # a file path (fine-tuning from a file): its preprocessing is the defaults
    preprocess = tuple((key, params[p]) for p, key in _PREPROCESS.items() if params.get(p) is not None)
    size = params.get("force_image_size")
    size = size[0] if isinstance(size, (list, tuple)) and len(size) == 1 else size
    return ModelSpec(name, None, precision, device, pretrained=str(tag) if tag else None,
                     quick_gelu=bool(params.get("force_quick_gelu", False)), preprocess=preprocess,
                     image_size=size if isinstance(size, int) else None,
                     context_length=params.get("force_context_length") or None,
                     logit_bias=bool(params.get("siglip", False)))


def user_specs(model: str, checkpoints: Sequence[str | None] = (None,), *, precision: str = "auto",
               device: str = "auto", pretrained: str | None = None, random_init: bool = False) -> list[ModelSpec]:
    """The specs the user's options name, one per checkpoint of ``model`` (``None``: the tag's or the
    folder's weights, or random ones with ``random_init``): every command that loads a model from its
    --model/--checkpoint/--pretrained/--random-init/--precision/--device flags builds its specs here (the
    spelling parsed once, by ``ModelSpec``: a bare folder becomes ``local-dir:`` or ``hf:`` by what it holds)."""
    first = ModelSpec(model, precision=precision, device=device, pretrained=pretrained, random_init=random_init)
    return [replace(first, checkpoint=c) for c in checkpoints or (None,)]


def object_spec(live: LiveModel, *, precision: str = "auto", device: str = "auto") -> ModelSpec:
    """The spec of a model object given to the Python API (``hardrank.models.spec.split_live``)."""
    return ModelSpec(live.describe(), precision=precision, device=device, live=live)


def model_specs(cfg: EvalConfig) -> list[ModelSpec]:
    """One spec per checkpoint of ``cfg``: its model + checkpoints + tag, or its run's epochs."""
    e = cfg.embed
    if cfg.run is not None:
        base = run_spec(cfg.run, precision=e.precision, device=e.device, arch=cfg.model)
        if cfg.checkpoints != (None,):
            ckpts = [Path(c) for c in cfg.checkpoints]
        else:
            ckpts = [p for p in run_checkpoints(cfg.run) if checkpoint_complete(p)]
            if not ckpts:
                raise DataError(f"{cfg.run}/checkpoints holds no complete epoch_<N>.pt checkpoint yet")
        return [replace(base, checkpoint=str(p)) for p in ckpts]
    if cfg.model is None:
        raise UsageError("give --model (with --checkpoint or --pretrained), --run RUN_DIR, or --embeddings FILE")
    return user_specs(cfg.model, cfg.checkpoints, precision=e.precision, device=e.device, pretrained=cfg.pretrained,
                      random_init=cfg.random_init)
