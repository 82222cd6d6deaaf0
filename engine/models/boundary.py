"""The one door for a model folder's files: no code runs, no path leads outside, sizes are checked first.

Every model kind reads its folder through here (``hf:`` and ``blip:`` folders, open_clip ``local-dir:`` /
``hf-hub:`` folders, the Hugging Face tokenizer and text-tower snapshots open_clip models name, checkpoint
folders), before transformers or open_clip see it:

- code: a config that would make transformers import a file of the folder (``auto_map``, a
  ``tokenizer_class`` / processor class transformers lacks), open_clip ``tokenizer_kwargs`` beyond
  ``TOKENIZER_KWARGS``, an attention implementation fetched from the hub's kernels, or a quantization
  config (whose kernels come from the hub too) is refused, naming the file and the key. Every
  ``from_pretrained`` call passes ``trust_remote_code=False`` as well (a static test checks it), so
  transformers never asks "run the custom code? [y/N]" and never waits on a terminal.
- paths: every file read, and every path a config names (``*_file`` keys, a sharded index's parts),
  resolves inside the folder; symlinks too, except a Hugging Face cache snapshot's links into its
  repo's ``blobs/``.
- weights: pickles are read with ``weights_only`` (their refusal names the object, never torch's
  advice); the parameter count a config implies (hidden sizes, layers, vocabulary) is checked against
  the tensors the safetensors headers hold, and against this machine's memory, before a network is built.
- tokenizers: one that cannot be the model's (a handful of tokens, ids past the text tower's
  vocabulary, every caption the same ids) is refused before anything is scored with it.

Refusals are ``DataError`` (exit 3): one line naming the model, the file, the key and the fix.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from hardrank.errors import DataError

__all__ = ["ModelFolder", "open_folder", "vet_config", "TOKENIZER_KWARGS", "WEIGHTS", "read_state_dict",
           "vet_pickle", "pickle_refusal", "is_safetensors", "estimate_params", "open_clip_params", "check_size",
           "check_tokenizer", "quote"]

# the JSON files of a folder that transformers or open_clip read as settings (vocabularies are data, not settings)
CONFIG_FILES = ("open_clip_config.json", "config.json", "processor_config.json", "preprocessor_config.json",
                "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                "video_preprocessor_config.json")
# a save_pretrained folder's weights, in transformers' order of preference (an index names the shards)
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# the files a tokenizer may read besides its settings
_TOKENIZER_READS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "*.model",
                   "chat_template*")
# open_clip's HFTokenizer arguments a config may set; anything else goes to AutoTokenizer.from_pretrained
TOKENIZER_KWARGS = frozenset({"clean", "strip_sep_token", "language"})
_CLASS_KEYS = ("tokenizer_class", "processor_class", "image_processor_type", "feature_extractor_type",
               "video_processor_type")
_ATTENTION_KEYS = ("attn_implementation", "_attn_implementation", "_attn_implementation_internal",
                   "experts_implementation", "_experts_implementation", "_experts_implementation_internal")
_ATTENTION_OK = ("eager", "sdpa")  # transformers' built-in attention; flash_attention_* may fall back to hub kernels
_PATH_KEY = re.compile(r"(_file|_files|_dir|_path)$")  # keys whose values are paths (vocab_file, tokenizer_file, ...)
_NOT_PATHS = ("name_or_path", "_name_or_path")         # where a folder was saved from: recorded, never opened
_REPO_KEYS = ("hf_tokenizer_name", "hf_model_name")    # open_clip: a Hugging Face repo id, or (open_clip) a path
_MAX_JSON = 64 << 20         # a settings file larger than this is no settings file
MIN_VOCAB = 32               # fewer tokens than this cannot tokenize captions (an empty tokenizer has 2 or 3)
_SLACK = 1 << 20             # parameters an estimate may miss (biases, norms, small heads)
# captions that any text tower's tokenizer splits into different ids
PROBES = ("a photo of a dog", "two red cars parked on a street", "A man riding a horse on the beach.", "zebra",
          "3 children, 1 kite")


@dataclass(frozen=True)
class ModelFolder:
    """A folder whose settings were read and vetted: what it holds, and the one way to name its files."""

    path: Path                                   # as the user or the cache named it
    what: str                                    # how errors name the model ("--model hf:FOLDER")
    configs: dict = field(default_factory=dict)  # settings file name -> its JSON object
    real: Path = Path()                          # the folder with symlinks resolved
    blobs: Path | None = None                    # a cache snapshot's blobs/ folder, where its links may point

    def file(self, name: str, *, named_by: str | None = None) -> Path:
        """``name`` inside the folder, or a DataError: absolute, ``..``, or a symlink leading out.
        ``named_by`` ("FILE key") says which setting named it."""
        where = f"{self.path / named_by.split(' ')[0]} sets {named_by.split(' ', 1)[1]} = {name!r}" if named_by \
            else f"{self.path / name}"
        if not isinstance(name, str) or not name or os.path.isabs(name) or name.startswith("~") \
                or ".." in Path(name).parts or "\\" in name:
            raise DataError(f"{self.what}: {where}, a path outside {self.path}; a model folder may only name its own "
                            f"files: {self._fix_path(named_by)}")
        full = self.path / name
        real = Path(os.path.realpath(full))
        if not (_under(real, self.real) or (self.blobs is not None and _under(real, self.blobs))):
            raise DataError(f"{self.what}: {where} leads outside {self.path} (a link to {real}); a model folder may "
                            f"only hold its own files: copy the file into the folder instead of linking it")
        return full

    @staticmethod
    def _fix_path(named_by: str | None) -> str:
        if named_by and "weight_map" in named_by:
            return "save the model again with save_pretrained, which names its shards by file name"
        if named_by:
            return "remove the key (save_pretrained never writes it) or save the files again with save_pretrained"
        return "name a file of the folder"

    def holds(self, name: str) -> bool:
        return (self.path / name).is_file()

    def config(self, name: str = "config.json") -> dict | None:
        return self.configs.get(name)

    def weights(self) -> list[Path]:
        """The weight files of a save_pretrained folder (the index first, then every shard it names), or []."""
        for name in WEIGHTS:
            if not self.holds(name):
                continue
            if not name.endswith(".index.json"):
                return [self.file(name)]
            index = _read_json(self, name)
            parts = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(parts, dict) or not parts or not all(isinstance(v, str) for v in parts.values()):
                raise DataError(f"{self.what}: {self.path / name} has no weight_map of tensor names to shard files; "
                                f"save the model again with save_pretrained")
            shards = [self.file(s, named_by=f"{name} weight_map") for s in sorted(set(parts.values()))]
            missing = [s.name for s in shards if not s.is_file()]
            if missing:
                raise DataError(f"{self.what}: {self.path / name} names shards the folder lacks "
                                f"({', '.join(missing[:3])}); copy every shard of the model into the folder")
            return [self.file(name), *shards]
        return []

    def image_processor_file(self) -> str | None:
        """Where the folder keeps its image processor's settings: ``preprocessor_config.json`` (transformers 4's
        processors, and an image processor saved on its own), else ``processor_config.json`` holding an
        ``image_processor`` (transformers 5's processors); None when it has neither."""
        if "preprocessor_config.json" in self.configs:
            return "preprocessor_config.json"
        nested = (self.configs.get("processor_config.json") or {}).get("image_processor")
        return "processor_config.json" if isinstance(nested, dict) else None

    def holds_tokenizer(self) -> bool:
        """Whether the folder holds a tokenizer's vocabulary (settings alone are none)."""
        return any(p.is_file() for g in ("tokenizer.json", "vocab*", "merges.txt", "*.model", "spiece*")
                   for p in self.path.glob(g))

    def refuse(self, file: str, problem: str, fix: str) -> DataError:
        return DataError(f"{self.what}: {self.path / file} {problem}; {fix}")


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _read_json(folder: ModelFolder, name: str):
    path = folder.file(name)
    try:
        if path.stat().st_size > _MAX_JSON:
            raise folder.refuse(name, f"is {path.stat().st_size >> 20} MiB, too large for a settings file",
                                "save the model again with save_pretrained")
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise folder.refuse(name, f"is not valid JSON ({str(exc)[:120]})",
                            "save the model again with save_pretrained") from None
    except OSError as exc:  # a link into the cache's blobs whose blob is gone (an interrupted download), ...
        raise folder.refuse(name, f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})",
                            "copy or download the model folder again") from None


def open_folder(path: str | os.PathLike, what: str) -> ModelFolder:
    """``path`` vetted as a model folder: each settings file it holds read and checked (``vet_config``), each
    tokenizer file and weight file (with a sharded index's parts) inside it. Raises ``DataError``."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{what}: {path} is no folder")
    real = Path(os.path.realpath(path))
    blobs = real.parent.parent / "blobs" if real.parent.name == "snapshots" else None
    folder = ModelFolder(path, what, {}, real, blobs)
    for name in CONFIG_FILES:
        if (path / name).exists() or (path / name).is_symlink():
            cfg = _read_json(folder, name)
            if not isinstance(cfg, dict):
                raise folder.refuse(name, f"holds a JSON {type(cfg).__name__}, not an object of settings",
                                    "save the model again with save_pretrained")
            vet_config(cfg, folder, name)
            folder.configs[name] = cfg
    for p in sorted({p for g in _TOKENIZER_READS for p in path.glob(g)}):
        folder.file(p.name)
    folder.weights()
    return folder


def _walk(obj, trail: str = "") -> Iterator[tuple[str, str, object]]:
    """(dotted key, key, value) of every entry of nested JSON objects (lists walked too)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{trail}.{k}" if trail else str(k)
            yield key, str(k), v
            yield from _walk(v, key)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{trail}[{i}]")


def vet_config(cfg: dict, folder: ModelFolder | str, name: str, what: str | None = None) -> None:
    """Refuse settings that would run code or read outside the folder (see the module's docstring).
    ``folder`` is the vetted folder, or a label (an open_clip config .json given on its own)."""
    def refuse(problem: str, fix: str) -> DataError:
        if isinstance(folder, ModelFolder):
            return folder.refuse(name, problem, fix)
        return DataError(f"{what}: {name} {problem}; {fix}")

    for key, leaf, value in _walk(cfg):
        if leaf == "auto_map" and value:
            raise refuse(f"sets {key} = {_short(value)}: classes from the folder's own Python files (custom code)",
                         "hardrank never runs a model folder's code: use a model whose classes ship with transformers "
                         "(save it with the built-in classes; drop auto_map)")
        if leaf in _CLASS_KEYS and value is not None and not _known_class(value):
            raise refuse(f"sets {key} = {_short(value)}, a class transformers does not have (custom code)",
                         "hardrank never runs a model folder's code: save the processor and tokenizer with the "
                         "transformers classes of the model (e.g. CLIPProcessor, BlipProcessor)")
        if leaf in _ATTENTION_KEYS and value is not None:
            experts = leaf.lstrip("_").startswith("experts")  # MoE kernels: any built-in name, no hub repo
            for v in (value.values() if isinstance(value, dict) else [value]):
                if v is not None and not (v in _ATTENTION_OK or experts and isinstance(v, str) and
                                          not re.search(r"[/:]", v)):
                    raise refuse(f"sets {key} = {_short(v)}: an attention implementation transformers would fetch "
                                 f"from the Hugging Face hub's kernels or an extra library",
                                 "hardrank runs the model's built-in attention (eager or sdpa): remove the key")
        if leaf in ("quantization_config", "use_kernels", "kernel_config") and value:
            raise refuse(f"sets {key}: a quantized or kernel-patched model, whose kernels come from outside "
                         f"transformers", "hardrank evaluates plain weights: save the model unquantized "
                                      "(save_pretrained of the full-precision model)")
        if leaf == "tokenizer_kwargs" and isinstance(value, dict):
            extra = sorted(set(value) - TOKENIZER_KWARGS)
            if extra:
                raise refuse(f"sets {key} {{{', '.join(f'{k!r}: {_short(value[k])}' for k in extra)}}}, beyond the "
                             f"tokenizer options hardrank passes on ({', '.join(sorted(TOKENIZER_KWARGS))})",
                             "remove them: the tokenizer comes from the folder's own files, as open_clip saves them")
        if leaf in _REPO_KEYS and isinstance(value, str) and isinstance(folder, ModelFolder) and (
                value.startswith(("/", ".", "~")) or value.count("/") != 1 or "\\" in value):
            raise refuse(f"sets {key} = {value!r}, a path outside the folder (open_clip would read it as a folder)",
                         "a model folder names its tokenizer and text tower by Hugging Face repo id (ORG/NAME, from "
                         "the local cache), or holds the tokenizer's files itself")
        if _PATH_KEY.search(leaf) and leaf not in _NOT_PATHS and value is not None:
            for v in (value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]):
                if isinstance(v, str) and isinstance(folder, ModelFolder):
                    folder.file(v, named_by=f"{name} {key}")
                elif isinstance(v, str) and (os.path.isabs(v) or ".." in Path(v).parts or v.startswith("~")):
                    raise refuse(f"sets {key} = {v!r}, a path outside the model", "remove the key")


def _short(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _known_class(name) -> bool:
    """Whether transformers itself has the class ``name`` (its 4.x ``...Fast`` and feature-extractor spellings
    included): a name it lacks could only come from the folder's code. Read from the names transformers exports
    (its lazy module's ``__all__``), importing none of them: a lazy attribute looked up while another thread
    imports the same submodule (a Ray actor decoding as it loads) can fail for a class transformers has."""
    if not isinstance(name, str) or not name.isidentifier():
        return False
    try:
        import transformers
    except ImportError:  # nothing can build it then; the loader names the missing extra
        return True
    names = {name, name.removesuffix("Fast"), name.replace("FeatureExtractor", "ImageProcessor")}
    # `import transformers` in one thread while another still runs its __init__ (a Ray actor loading a model as it
    # decodes) can give the half-made module, which exports nothing yet: then the finished one, if there is one
    exported = getattr(sys.modules.get("transformers") or transformers, "__all__", None)
    if exported is None:
        return True  # cannot tell yet: transformers itself (trust_remote_code=False) refuses a class it lacks
    return not names.isdisjoint(exported)


# -- weights ----------------------------------------------------------------------------------------
def pickle_refusal(path, exc: pickle.UnpicklingError) -> DataError:
    """torch's ``weights_only`` refusal as one line naming the object the pickle holds. torch words it
    differently across releases ("Unsupported global: GLOBAL x.y", "unsupported GLOBAL x.y whose module x is
    blocked") and advises turning safe loading off, which must never reach the user: only the name is quoted."""
    msg = str(exc)
    found = re.search(r"unsupported global:?\s+(?:GLOBAL\s+)?([\w.]+)", msg, re.IGNORECASE)
    if found:
        return DataError(f"checkpoint {path} is a pickle holding Python objects ({found.group(1)}), not only "
                         f"tensors; hardrank loads checkpoints with safe (weights_only) loading, which refuses "
                         f"them, because unpickling such objects can run arbitrary code. Ask its author for the "
                         f"weights as .safetensors or as a plain state dict of tensors")
    detail = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:Check the documentation|$)", msg, re.DOTALL)
    reason = (detail.group(1) if detail else msg.splitlines()[0] if msg else type(exc).__name__)[:200]
    return DataError(f"checkpoint {path} is not a PyTorch checkpoint ({quote(reason)}): the file is corrupt or of "
                     f"another format; pass a .pt/.pth/.bin state dict, a .safetensors file or an OpenAI "
                     f"TorchScript archive")


def vet_pickle(path: Path) -> None:
    """A torch pickle read with ``weights_only`` onto the meta device (no tensor data is read): refused,
    naming the object, when it holds anything but tensors and containers."""
    try:
        torch.load(str(path), map_location="meta", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise pickle_refusal(path, exc) from None
    except Exception as exc:  # truncated or foreign files: torch's errors differ by release
        raise DataError(f"checkpoint {path}: not a readable weights file ({type(exc).__name__}: {quote(exc)}); "
                        f"save the model again with save_pretrained (model.safetensors)") from None


def read_state_dict(path: Path) -> dict:
    """A weights file's tensors: safetensors, else a state dict read with ``weights_only`` (a training
    checkpoint's ``state_dict`` / ``model`` entry)."""
    try:
        if is_safetensors(path):
            return load_file(str(path))
        sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise pickle_refusal(path, exc) from None
    except Exception as exc:  # safetensors' and torch's errors for a truncated/foreign file differ by release
        raise DataError(f"checkpoint {path}: not a readable weights file ({type(exc).__name__}: {quote(exc)}); "
                        f"pass a save_pretrained folder or its model.safetensors") from None
    if isinstance(sd, dict):
        sd = sd.get("state_dict", sd.get("model", sd))
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise DataError(f"checkpoint {path} holds no state dict of tensors; pass a save_pretrained folder or its "
                        f"model.safetensors")
    return sd


def is_safetensors(path: Path) -> bool:
    """A safetensors file, by its suffix or its first bytes (u64 header length, then JSON)."""
    with open(path, "rb") as f:
        head = f.read(9)
    return path.suffix == ".safetensors" or (len(head) == 9 and int.from_bytes(head[:8], "little") < (1 << 28)
                                             and head[8:9] == b"{")


_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _held(files: list[Path]) -> tuple[int, int] | None:
    """(elements, bytes) the weight files hold, from safetensors headers and torch archives' record sizes,
    never their data (a torch archive's elements: at most one per byte); None when a file tells neither (a
    legacy pickle, a broken file: its loader names it)."""
    elements, nbytes = 0, 0
    for p in files:
        try:
            if is_safetensors(p):
                with open(p, "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                    header = json.loads(f.read(n)) if n < (100 << 20) else None
                if not isinstance(header, dict):
                    return None
                for k, v in header.items():
                    if k != "__metadata__" and isinstance(v, dict):
                        count = 1
                        for s in v.get("shape", []):
                            count *= int(s)
                        elements += count
                        nbytes += count * _DTYPE_BYTES.get(v.get("dtype"), 4)
            elif zipfile.is_zipfile(p):
                with zipfile.ZipFile(p) as z:
                    records = z.infolist()
                if not any(i.filename.endswith(("/data.pkl", "/constants.pkl")) for i in records):
                    return None  # a zip of another kind (numpy's .npz): its loader reads it
                size = sum(i.file_size for i in records if "/data/" in i.filename)
                elements, nbytes = elements + size, nbytes + size
            else:
                return None
        except (OSError, ValueError, TypeError, struct.error, zipfile.BadZipFile):
            return None
    return elements, nbytes


def _int(d: dict, keys) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


def _tower(d: dict) -> int:
    """Parameters of one transformer stack a (sub)config describes: its layers (attention 4h^2, MLP 2hi,
    cross-attention when it has an encoder_hidden_size), token and position tables, patch embedding."""
    h, n_layers = _int(d, ("hidden_size", "d_model", "n_embd")), _int(d, ("num_hidden_layers", "num_layers",
                                                                         "n_layer", "encoder_layers"))
    if not h or n_layers is None:
        return 0
    inner = _int(d, ("intermediate_size", "d_ff", "n_inner", "ffn_dim", "encoder_ffn_dim")) or 4 * h
    n = n_layers * (4 * h * h + 2 * h * inner)
    cross = _int(d, ("encoder_hidden_size",))
    if cross:
        n += n_layers * (2 * h * h + 2 * cross * h)
    n += ((_int(d, ("vocab_size",)) or 0) + (_int(d, ("max_position_embeddings",)) or 0)) * h
    patch, size = _int(d, ("patch_size",)), _int(d, ("image_size",))
    if patch:
        n += (_int(d, ("num_channels",)) or 3) * patch * patch * h
        n += ((size // patch) ** 2 if size else (_int(d, ("num_patches",)) or 0)) * h
    return n


def estimate_params(cfg: dict) -> int:
    """The parameters a transformers config implies (within a few percent for CLIP, SigLIP and BLIP), from its
    hidden sizes, layers, vocabulary and patches, without building anything: every (nested) config that
    describes a transformer stack counts."""
    total, todo = 0, [cfg]
    while todo:
        d = todo.pop()
        total += _tower(d)
        todo.extend(v for v in d.values() if isinstance(v, dict))
    return total


def open_clip_params(model_cfg: dict, tower_cfg: dict | None = None) -> int | None:
    """The parameters an open_clip model config implies (ViT and text transformer; a transformers text tower
    from ``tower_cfg``), or None for towers it does not describe (timm, ResNet)."""
    vision, text = model_cfg.get("vision_cfg") or {}, model_cfg.get("text_cfg") or {}
    total = 0
    for cfg, kind in ((vision, "vision"), (text, "text")):
        if kind == "text" and cfg.get("hf_model_name"):
            if tower_cfg is None:
                return None
            total += estimate_params(tower_cfg)
            continue
        if cfg.get("timm_model_name") or not isinstance(cfg.get("layers", 12), int):
            return None
        w, n_layers = _int(cfg, ("width",)) or (768 if kind == "vision" else 512), _int(cfg, ("layers",)) or 12
        ratio = cfg.get("mlp_ratio", 4.0)
        ratio = ratio if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) else 4.0
        total += n_layers * int(4 * w * w + 2 * w * w * ratio)
        if kind == "vision":
            patch, size = _int(cfg, ("patch_size",)) or 16, cfg.get("image_size", 224)
            size = size[0] if isinstance(size, list) and size else size
            total += 3 * patch * patch * w + ((size // patch) ** 2 if isinstance(size, int) else 0) * w
        else:
            total += ((_int(cfg, ("vocab_size",)) or 49408) + (_int(cfg, ("context_length",)) or 77)) * w
    return total


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} billion" if n >= 1e8 else f"{n / 1e6:.2f} million" if n >= 1e4 else str(n)


def check_size(implied: int | None, files: list[Path], *, what: str, config: str, precision: str) -> None:
    """Before a network is built: the parameters ``config`` implies against the tensors the weight files
    hold (a config asking for far more than its weights is refused: building it would allocate for nothing),
    and the larger of the two against this machine's memory."""
    held = _held(files) if files else None
    width = 4 if precision == "fp32" else 2
    if implied is not None and held is not None and implied > 2 * held[0] + _SLACK:
        raise DataError(f"{what}: {config} implies a network of {_count(implied)} parameters "
                        f"({_gb(implied * width)} in {precision}), but its weights ({files[0]}"
                        f"{f' and {len(files) - 1} more' if len(files) > 1 else ''}) hold {_count(held[0])}; "
                        f"the config does not describe these weights: save the model again with "
                        f"save_pretrained, or pass the config it was trained with")
    need = max(implied or 0, held[1] // width if held else 0) * width
    memory = _memory_bytes()
    if memory is not None and need > memory:
        raise DataError(f"{what}: {config} implies a network of {_count(need // width)} parameters, "
                        f"{_gb(need)} in {precision}, more than this machine's {_gb(memory)} of memory; "
                        f"check the config's sizes (hidden_size, num_hidden_layers, vocab_size), or run it where "
                        f"it fits")


# -- tokenizers -------------------------------------------------------------------------------------
def check_tokenizer(tokenize: Callable, *, size: int | None, vocab_size: int | None, what: str, source,
                    fix: str) -> None:
    """Refuse a tokenizer that cannot be the model's: fewer than ``MIN_VOCAB`` tokens (``size``), ids at or
    past the text tower's ``vocab_size``, or every probe caption tokenized to the same ids (as the model
    gets them: padded). ``tokenize(list of str)`` returns ids (B, L) or a dict holding ``input_ids``."""
    if size is not None and size < MIN_VOCAB:
        raise DataError(f"{what}: the tokenizer in {source} has {size} tokens, too few to be a text tower's "
                        f"vocabulary (nothing but special tokens: no vocabulary was saved with it); {fix}")
    ids = tokenize(list(PROBES))
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    ids = torch.as_tensor(ids)
    if vocab_size is not None and ids.numel() and int(ids.max()) >= vocab_size:
        raise DataError(f"{what}: the tokenizer in {source} gives token id {int(ids.max())}, past the text tower's "
                        f"vocab_size {vocab_size}: it is another model's tokenizer; {fix}")
    if len(ids) > 1 and bool((ids == ids[:1]).all()):
        raise DataError(f"{what}: the tokenizer in {source} gives every caption the same ids "
                        f"({ids[0][:8].tolist()}...), so every caption would score alike; {fix}")


def quote(exc) -> str:
    """A library's error text for a message: its first lines, less any sentence advising to turn a safeguard
    off (``trust_remote_code``, ``weights_only``, ``ignore_mismatched_sizes``)."""
    text = " ".join(str(exc).split())
    kept = [s for s in re.split(r"(?<=[.!?])\s+", text)
            if not re.search(r"trust_remote_code|weights_only|ignore_mismatched_sizes", s)]
    return " ".join(kept)[:300] or type(exc).__name__
