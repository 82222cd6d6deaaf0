"""open_clip models as their authors preprocess them, loaded offline and fingerprinted.

A model is an architecture plus weights:

- an open_clip name (``ViT-B-32``) or a model config JSON, with an optional pretrained tag
  (``--pretrained laion2b_s34b_b79k``). The tag sets what ``open_clip.create_model_and_transforms(name,
  pretrained=TAG)`` would (mean, std, interpolation, resize mode) and the activation its weights were
  trained with (QuickGELU for OpenAI's: open_clip 3 only warns about the mismatch, we apply it). The
  weights are ``--checkpoint FILE`` when given, else the tag's file from the local Hugging Face or
  open_clip cache: hardrank never downloads.
- ``hf-hub:ORG/NAME`` (a snapshot in the local Hugging Face cache) or ``local-dir:FOLDER``, each with
  its ``open_clip_config.json`` (model and preprocess config) and its weights file.

Checkpoint files load with ``weights_only``: safetensors, state dicts and open_clip training
checkpoints; OpenAI's original TorchScript archives (a zip with constants.pkl) with ``torch.jit.load``
alone, with QuickGELU. No file ever reaches a full unpickle (``weights_only=False``).
Every failure says which kind of file it met and what to do.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import warnings
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import open_clip
import torch
from huggingface_hub import hf_hub_download, snapshot_download
from open_clip.model import resize_pos_embed, resize_text_pos_embed
from open_clip.transform import PreprocessCfg
from safetensors import SafetensorError

from hardrank.config import DATA_DIR
from hardrank.errors import DataError, UsageError
from hardrank.models.boundary import check_size, open_clip_params, open_folder, pickle_refusal, vet_config
from hardrank.models.hf_text import hf_text
from hardrank.models.spec import Kind, LoadedModel, ModelSpec, forms_help, kind_of, safe_name

__all__ = ["NAME_KIND", "CONFIG_KIND", "HUB_KIND", "FOLDER_KIND", "load_model", "resolve_arch", "file_hash",
           "tag_preprocess"]

log = logging.getLogger("hardrank.models.openclip")
_BUNDLED = DATA_DIR / "models"
_registered: set[str] = set()
_config_files: dict[str, str] = {}  # model name -> the config .json registered under it (for messages)
EMBED_VERSION = 2  # bump when encoding semantics change: it is part of every fingerprint
# 2: images reach the transform in the mode Image.open gives (1, P, RGBA, CMYK, 16-bit ... resized before
#    their RGB conversion, as open_clip does): embeddings of such images stored under 1 are not reused
_PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")  # what a pretrained tag may set
# weights file names in a hub snapshot or local-dir folder, in open_clip's order of preference
_WEIGHT_NAMES = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
                 "open_clip_pytorch_model.pth", "model.safetensors", "pytorch_model.bin", "pytorch_model.pth",
                 "model.pth")
_DEFAULT_PREPROCESS = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(PreprocessCfg()).items()
                       if k in _PREPROCESS_KEYS}


def _register_bundled() -> None:
    if "__bundled__" in _registered:
        return
    if _BUNDLED.is_dir():
        open_clip.add_model_config(_BUNDLED)
    _registered.add("__bundled__")


def resolve_arch(arch: str) -> str:
    """Return an open_clip model name for ``arch`` (registering a config JSON if given a path)."""
    kind = kind_of(arch)
    return _open_clip_name(kind.name, arch[len(kind.prefix):] if kind.prefix else arch, arch)


def _open_clip_name(kind: str, name: str, arch: str) -> str:
    """The name open_clip creates a model of ``kind`` by: its own ``hf-hub:`` / ``local-dir:`` spelling
    (``arch``), a config JSON's stem (the config registered under it), or a known model name."""
    _register_bundled()
    if kind in (HUB, FOLDER):
        return arch
    if kind == CONFIG:
        return _register_config(name)
    if kind != NAME:
        raise UsageError(f"{arch} is a {kind} model, not an open_clip one; pass an open_clip model name or config "
                         f".json")
    if name not in open_clip.list_models():
        raise UsageError(f"unknown model {name!r}: --model takes {forms_help()}. Known open_clip names "
                         f"include {open_clip.list_models()[:5]}...")
    return name


def _register_config(arch: str) -> str:
    path = Path(arch)
    if not path.is_file():
        raise DataError(f"model config {arch} does not exist; pass an open_clip model name "
                        f"(python -c 'import open_clip; print(open_clip.list_models())' lists them) "
                        f"or the path of a config JSON")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not JSON, or not UTF-8
        raise DataError(f"{arch}: not a JSON model config ({exc}); pass an open_clip model name or the path "
                        f"of an open_clip config JSON (vision_cfg + text_cfg)") from None
    if not isinstance(cfg, dict) or "vision_cfg" not in cfg or "text_cfg" not in cfg:
        raise DataError(f"{arch}: not an open_clip model config (needs 'vision_cfg' and 'text_cfg')")
    vet_config(cfg, str(path), str(path), what=f"--model {arch}")
    open_clip.add_model_config(path)
    _config_files[path.stem] = str(path)
    return path.stem


def file_hash(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class _DropNoWeights(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "No pretrained weights loaded" not in msg and "initialized randomly" not in msg


@contextlib.contextmanager
def _quiet_open_clip():
    """open_clip warns "no pretrained weights" although we load the weights right after."""
    root, flt = logging.getLogger(), _DropNoWeights()
    handlers = [root, *root.handlers]
    for h in handlers:
        h.addFilter(flt)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="QuickGELU mismatch")
            yield
    finally:
        for h in handlers:
            h.removeFilter(flt)


# -- where the weights and settings come from ---------------------------------------------------------
@dataclass
class _WeightsSource:
    name: str                    # what open_clip.create_model gets
    model_cfg: dict              # the architecture config (fingerprinted)
    preprocess: dict             # overrides of the default preprocessing
    quick_gelu: bool             # force QuickGELU
    weights: str | None          # the weights file
    weights_format: str | None   # safetensors | torch | torchscript | numpy
    notes: list[str] = field(default_factory=list)  # warnings recorded in every result
    config_file: str = ""        # where model_cfg was read (for messages)


def _hub_file(repo: str, filenames, what: str) -> str:
    for fn in filenames:
        with contextlib.suppress(Exception):
            return hf_hub_download(repo, fn, local_files_only=True)
    raise DataError(f"{what}: {repo}/{filenames[0]} is not in the local Hugging Face cache "
                    f"({os.environ.get('HF_HUB_CACHE') or os.environ.get('HF_HOME') or '~/.cache/huggingface'}); "
                    f"hardrank never downloads. Fetch it once with `hf download {repo} {filenames[0]}` "
                    f"(huggingface_hub's CLI), or pass --checkpoint FILE")


def _tag_weights(name: str, tag: str, cfg: dict) -> str:
    """The tag's weights file from the local caches, or a DataError saying what to fetch."""
    hub = cfg.get("hf_hub", "")
    if hub:
        repo, filename = os.path.split(hub.rstrip("/")) if not hub.endswith("/") else (hub.rstrip("/"), "")
        names = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        if filename.endswith((".bin", ".pth")):
            names.insert(0, filename[:-4] + ".safetensors")
        return _hub_file(repo, names, f"weights of {name} --pretrained {tag}")
    url = cfg.get("url", "")
    cached = Path("~/.cache/clip").expanduser() / os.path.basename(url)
    if url and cached.is_file():
        return str(cached)
    raise DataError(f"weights of {name} --pretrained {tag} are not in the local cache: expected {cached} "
                    f"(hardrank never downloads). Download {url} there, or pass --checkpoint FILE")


def _weights_format(path: Path) -> str:
    if path.suffix in (".npz", ".npy"):
        return "numpy"
    with open(path, "rb") as f:
        head = f.read(9)
    if path.suffix == ".safetensors":
        return "safetensors"
    if zipfile.is_zipfile(path):
        # torch's own test: a zip whose records include constants.pkl is a TorchScript archive. Any other
        # zip (a torch.save file, whatever else it carries) is read with weights_only=True.
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
        if any(n.split("/", 1)[-1] == "constants.pkl" for n in names):
            return "torchscript"
        return "torch"
    if len(head) == 9 and int.from_bytes(head[:8], "little") < (1 << 28) and head[8:9] == b"{":
        return "safetensors"  # a safetensors file under another suffix: u64 header length, then JSON
    return "torch"


def tag_preprocess(name: str, tag: str) -> tuple[dict, bool]:
    """(preprocessing overrides, quick_gelu) a pretrained tag sets for ``name``."""
    cfg = open_clip.get_pretrained_cfg(name, tag)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(name)
        raise UsageError(f"unknown pretrained tag {tag!r} for {name}; its tags: {tags or 'none'} "
                         f"(open_clip.list_pretrained() lists all)")
    return {k: cfg[k] for k in _PREPROCESS_KEYS if k in cfg}, bool(cfg.get("quick_gelu", False))


def _default_mismatch(name: str) -> str | None:
    """A note when every published tag of ``name`` preprocesses (or activates) unlike the defaults."""
    tags = open_clip.list_pretrained_tags_by_model(name)
    if not tags:
        return None
    settings = [tag_preprocess(name, t) for t in tags]
    differs = [{**{k: v for k, v in pp.items() if _norm(v) != _norm(_DEFAULT_PREPROCESS.get(k))},
                **({"quick_gelu": True} if qg and not open_clip.get_model_config(name).get("quick_gelu") else {})}
               for pp, qg in settings]
    if all(differs):
        return (f"{name} was evaluated with open_clip's default preprocessing ({_DEFAULT_PREPROCESS}), but every "
                f"published {name} weight set ({', '.join(tags)}) uses other settings, e.g. {tags[0]}: {differs[0]}; "
                f"if the checkpoint was trained from one of them, pass --pretrained TAG")
    return None


def _norm(v):
    return [round(float(x), 8) for x in v] if isinstance(v, (list, tuple)) else v


def _source(spec: ModelSpec, name: str) -> _WeightsSource:
    notes: list[str] = []
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    if ckpt is not None and not ckpt.is_file():
        raise DataError(f"checkpoint {ckpt} does not exist")
    fmt = _weights_format(ckpt) if ckpt is not None else None
    if spec.kind in (HUB, FOLDER):
        if spec.pretrained:
            raise UsageError(f"--pretrained applies to open_clip model names; {spec.arch} brings its own config")
        if spec.kind == HUB:
            repo = spec.name
            try:
                folder = Path(snapshot_download(repo, local_files_only=True))
            except Exception as exc:
                raise DataError(f"{spec.arch}: {repo} is not in the local Hugging Face cache (hardrank never "
                                f"downloads; {type(exc).__name__}). Fetch it once with `hf download {repo}`, "
                                f"or point --model at the folder: local-dir:<folder>") from exc
        else:
            folder = Path(spec.name)
            if not folder.is_dir():
                raise DataError(f"{spec.arch}: no such folder")
        cfg_file = folder / "open_clip_config.json"
        if not cfg_file.is_file():
            hint = (f"; {folder} holds a config.json: a transformers model is --model hf:{folder}"
                    if (folder / "config.json").is_file() else "")
            raise DataError(f"{spec.arch}: {cfg_file} is missing; a hub snapshot or local-dir folder needs the "
                            f"open_clip_config.json (model_cfg + preprocess_cfg) that open_clip writes{hint}")
        vetted = open_folder(folder, f"--model {spec.arch}")  # settings, tokenizer and weights files vetted
        full = vetted.config("open_clip_config.json")
        if "model_cfg" not in full:
            raise DataError(f"{cfg_file}: no 'model_cfg' key (open_clip's format: model_cfg + preprocess_cfg)")
        weights = str(ckpt) if ckpt else next((str(vetted.file(n)) for n in _WEIGHT_NAMES if vetted.holds(n)), None)
        if weights and not ckpt:
            fmt = _weights_format(Path(weights))
        return _WeightsSource(FOLDER_KIND.prefix + str(folder), full, {}, bool(spec.quick_gelu), weights, fmt, notes,
                              str(cfg_file))
    model_cfg = dict(open_clip.get_model_config(name) or {"name": name})
    preprocess, quick_gelu = {}, False
    if spec.pretrained:
        preprocess, quick_gelu = tag_preprocess(name, spec.pretrained)
        weights = str(ckpt) if ckpt else _tag_weights(name, spec.pretrained,
                                                      open_clip.get_pretrained_cfg(name, spec.pretrained))
        fmt = fmt or _weights_format(Path(weights))
    else:
        weights = str(ckpt) if ckpt else None
        if fmt == "torchscript":
            quick_gelu = True  # OpenAI's archives hold QuickGELU models
        elif weights:
            mismatch = _default_mismatch(name)
            if mismatch:
                notes.append(mismatch)
    if spec.quick_gelu is not None:  # a training run says what it trained with
        quick_gelu = spec.quick_gelu
    if quick_gelu and not model_cfg.get("quick_gelu"):
        model_cfg["quick_gelu"] = True
    return _WeightsSource(name, model_cfg, preprocess, quick_gelu, weights, fmt, notes,
                          _config_files.get(name, f"open_clip's model config {name}"))


def _text_sequence_first(model: torch.nn.Module) -> bool:
    """Run an open_clip text tower's residual blocks sequence-first ``(L, B, D)``, as open_clip itself
    did before ``batch_first``; returns whether it applied (towers whose blocks use
    ``nn.MultiheadAttention``).

    Why: batch-first, ``nn.MultiheadAttention`` transposes its input to ``(L, B, D)`` and projects that
    non-contiguous view; with parameters that do not require grad (inference) ``matmul`` then runs a
    ``bmm`` against the in-projection weight expanded and copied once per token position. In bf16 on
    CPU that copy cost more than the GEMM. Sequence-first, the tower transposes once into a contiguous
    tensor and every projection is one flat GEMM: ``benchmarks/bench_encode_precision.py`` (ViT-B-32, 64
    captions) went from 186 to 263 texts/s in bf16 (49% -> 70% of the bf16 GEMM rate), embeddings
    unchanged (``benchmarks/README.md``). fp32 and the image tower are left as open_clip builds them."""
    tr = getattr(model, "transformer", None)
    blocks = getattr(tr, "resblocks", None)
    if not blocks or not hasattr(tr, "batch_first") \
            or not all(isinstance(getattr(b, "attn", None), torch.nn.MultiheadAttention) for b in blocks):
        return False
    tr.batch_first = False
    for b in blocks:
        b.attn.batch_first = False
    return True


def _load_torchscript(model: torch.nn.Module, path: str) -> None:
    """Load an OpenAI TorchScript archive's parameters with ``torch.jit.load`` alone: its unpickler
    resolves TorchScript types only, never Python globals (``torch.load(weights_only=False)`` would run
    any pickle in the archive). The state dict is then fitted as open_clip's loader fits it."""
    try:
        sd = torch.jit.load(path, map_location="cpu").state_dict()
    except RuntimeError as exc:
        raise DataError(f"checkpoint {path} is a zip with constants.pkl, the mark of a TorchScript archive, but "
                        f"torch.jit.load cannot read it ({str(exc).splitlines()[0][:200]}); it is corrupt or not "
                        f"TorchScript. Pass the weights as .safetensors or a state dict of tensors") from exc
    for key in ("input_resolution", "context_length", "vocab_size"):  # OpenAI's buffers, not weights
        sd.pop(key, None)
    resize_pos_embed(sd, model)
    resize_text_pos_embed(sd, model)
    model.load_state_dict(sd, strict=True)


def _load_weights(model: torch.nn.Module, path: str, fmt: str, name: str) -> None:
    """Load ``path`` into ``model`` (strict), or raise a DataError saying what the file is and what to do."""
    try:
        if fmt == "torchscript":
            _load_torchscript(model, path)
        else:  # open_clip's loader with its default, weights_only=True: never a full unpickle
            open_clip.load_checkpoint(model, path, strict=True, weights_only=True)
    except SafetensorError as exc:
        raise DataError(f"checkpoint {path} is not a readable .safetensors file ({exc}): it is truncated or "
                        f"corrupt; copy or save it again") from exc
    except pickle.UnpicklingError as exc:
        raise pickle_refusal(path, exc) from exc
    except (EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"checkpoint {path} ends early ({type(exc).__name__}): it is truncated; copy it again") from exc
    except (RuntimeError, AssertionError) as exc:  # open_clip asserts when embedding widths differ
        msg = str(exc) or type(exc).__name__
        if "PytorchStreamReader" in msg or "zip archive" in msg or "central directory" in msg:
            raise DataError(f"checkpoint {path} is a truncated or corrupt PyTorch archive ({msg[:200]}); copy it "
                            f"again") from exc
        raise DataError(f"checkpoint {path} does not fit model {name!r}: {msg[:600]}\n"
                        f"Fix: pass the --model (and --pretrained) this checkpoint was trained with.") from exc
    except (StopIteration, AttributeError, TypeError, KeyError) as exc:
        raise DataError(f"checkpoint {path} holds no model weights open_clip can read "
                        f"({type(exc).__name__}: {str(exc)[:200]})") from exc


_tokenizers: dict[tuple, object] = {}  # (name, context length, text config) -> open_clip's tokenizer


def _open_clip_tokenizer(name: str, context_length: int | None):
    """open_clip's tokenizer of a registered model name, built once per process: K checkpoints of one
    architecture share it (building one reads and parses the BPE vocabulary: ~0.3 s each, more than a
    toy checkpoint's whole load). Keyed by the registered text config too, so a config re-registered under
    the same name with another text side gets its own; hub and folder names are built every time."""
    cfg = open_clip.get_model_config(name) if name in open_clip.list_models() else None
    if cfg is None:
        return open_clip.get_tokenizer(name, context_length=context_length)
    key = (name, context_length, json.dumps(cfg.get("text_cfg", {}), sort_keys=True, default=str))
    if key not in _tokenizers:
        _tokenizers[key] = open_clip.get_tokenizer(name, context_length=context_length)
    return _tokenizers[key]


def load_model(spec: ModelSpec) -> LoadedModel:
    """Create the model offline as its source says (tag, hub snapshot, folder, config) and load its
    weights; refuse a model without weights unless ``spec.random_init``."""
    name = _open_clip_name(spec.kind, spec.name, spec.arch)
    device, precision = spec.resolved_device(), spec.resolved_precision()
    src = _source(spec, name)
    if src.weights is None and not spec.random_init:
        raise UsageError(f"model {spec.arch} has no weights: pass --checkpoint FILE, --pretrained TAG (tags of "
                         f"{name}: {open_clip.list_pretrained_tags_by_model(name)[:6] or 'none'}), or "
                         f"--random-init to evaluate random weights on purpose")
    force_pp = {**src.preprocess, **dict(spec.preprocess)}
    kwargs = {"init_logit_bias": -10.0} if spec.logit_bias else {}
    arch_cfg = src.model_cfg.get("model_cfg", src.model_cfg)  # hub snapshots and folders nest it
    own = Path(src.name[len(FOLDER_KIND.prefix):]) if spec.kind in (HUB, FOLDER) else None
    hf = hf_text(arch_cfg, name, own, spec.context_length, spec.arch, src.config_file)  # before the build: fail fast
    check_size(open_clip_params(arch_cfg, hf.tower_config), [Path(src.weights)] if src.weights else [],
               what=f"--model {spec.arch}", config=src.config_file, precision=precision)
    if hf.text_cfg is not None:
        kwargs["text_cfg"] = hf.text_cfg
    with _quiet_open_clip():
        # pretrained_hf=False (open_clip 3 reads it as pretrained_text=False): a transformers text tower is
        # built from its config, not downloaded with its pretrained weights; the checkpoint brings them all
        model = open_clip.create_model(src.name, pretrained=None, device="cpu", load_weights=False,
                                       force_quick_gelu=src.quick_gelu, force_preprocess_cfg=force_pp or None,
                                       force_image_size=spec.image_size, force_context_length=spec.context_length,
                                       pretrained_hf=False, **kwargs)
    ckpt_hash = None
    if src.weights is not None:
        ckpt_hash = file_hash(src.weights)
        _load_weights(model, src.weights, src.weights_format, name)
    for note in src.notes:
        log.warning("%s", note)
    model.eval().requires_grad_(False)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model.to(device=device, dtype=dtype)
    if precision != "fp32":
        _text_sequence_first(model)
    preprocess_cfg = dict(getattr(model.visual, "preprocess_cfg", {}))
    preprocess_cfg = {k: (list(v) if isinstance(v, tuple) else v) for k, v in preprocess_cfg.items()}
    tokenizer = hf.tokenizer if hf.tokenizer is not None else _open_clip_tokenizer(name, spec.context_length)
    embed_dim = int(src.model_cfg.get("embed_dim") or src.model_cfg.get("model_cfg", {}).get("embed_dim")
                    or model.text_projection.shape[-1])
    ident = {"arch": src.model_cfg, "checkpoint": ckpt_hash, "precision": precision,
             "preprocess": preprocess_cfg, "context_length": getattr(tokenizer, "context_length", None),
             "embed_version": EMBED_VERSION}
    if spec.logit_bias or spec.image_size:
        ident["overrides"] = {"logit_bias": spec.logit_bias, "image_size": spec.image_size}
    if hf.ident:  # the tokenizer's and tower config's content: the store never mixes two tokenizers
        ident["hf"] = hf.ident
    digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    info = {"pretrained": spec.pretrained, "weights": src.weights, "weights_format": src.weights_format,
            "quick_gelu": bool(src.model_cfg.get("quick_gelu") or src.model_cfg.get("model_cfg", {}).get("quick_gelu")),
            "random_init": src.weights is None, "warnings": list(src.notes), "spec": asdict(spec)}
    if hf.ident:
        info["hf"] = {k: {**v, "folder": hf.folders[k]} for k, v in hf.ident.items()}
    return LoadedModel(spec=spec, arch_name=name, model=model, tokenizer=tokenizer,
                       preprocess_cfg=preprocess_cfg, fingerprint=f"{safe_name(Path(name).name)}-{precision}-{digest}",
                       embed_dim=embed_dim, device=device, precision=precision, checkpoint_hash=ckpt_hash, info=info)


# -- the kinds open_clip loads (registered in hardrank.models) ----------------------------------------------
NAME, CONFIG, HUB, FOLDER = "open_clip", "open_clip_config", "open_clip_hub", "open_clip_folder"


def _is_config(spelling: str) -> bool:
    return Path(spelling).suffix == ".json" and not Path(spelling).is_dir()


def _is_folder(spelling: str) -> bool:
    return (Path(spelling) / "open_clip_config.json").is_file()


NAME_KIND = Kind(NAME, load_model, forms=(
    ("NAME", "an open_clip model name, e.g. ViT-B-32, with --pretrained TAG or --checkpoint FILE"),))
CONFIG_KIND = Kind(CONFIG, load_model, matches=_is_config, path="always", forms=(
    ("CONFIG.json", "an open_clip model config, with --checkpoint FILE"),))
HUB_KIND = Kind(HUB, load_model, prefix="hf-hub:", forms=(
    ("hf-hub:ORG/NAME", "an open_clip model in the local Hugging Face cache"),))
FOLDER_KIND = Kind(FOLDER, load_model, prefix="local-dir:", matches=_is_folder, path="always", forms=(
    ("local-dir:FOLDER", "an open_clip model folder: open_clip_config.json + weights"),),
    folder="an open_clip model (open_clip_config.json + weights, as open_clip's push_to_hf_hub saves one: --model "
           "local-dir:FOLDER)")
