"""The one model parser: a ``--model`` spelling, or a model object given to the Python API, becomes a ``ModelSpec``.

A model kind is one ``Kind`` in this module's registry: its name, how it is recognised (a prefix such as ``hf:``,
a predicate for an unprefixed spelling such as a ``.json`` or a folder, or a predicate for an in-memory object),
its loader and its help lines. ``hardrank.models`` (its ``__init__``) registers the built-in ones, one
``register_kind`` line each; a new kind is its module in ``hardrank.models`` plus its line there.
``ModelSpec`` parses its spelling when it is made (``kind``, ``name``), so every room after the parser reads the
spec, never the string: the loaders (``hardrank.models.load``), job files (``rebased``, ``label``), the
executors (``portable``) and every help text and refusal (``forms_help``, ``object_refusal``). The registry
imports no loader: it sits below them.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hardrank.config import PRECISIONS
from hardrank.devices import resolve_device
from hardrank.errors import DataError, UsageError

__all__ = ["ModelSpec", "LoadedModel", "LiveModel", "Kind", "KINDS", "register_kind", "unregister_kind", "kind_of",
           "safe_name", "forms_help", "object_refusal", "split_live", "rebased", "label", "LIVE_OPTIONS", "PRECISIONS"]

LIVE_OPTIONS = ("preprocess", "tokenizer", "processor", "fingerprint")  # the API keywords that go with a model object


@dataclass(frozen=True, eq=False)
class LiveModel:
    """A model object as the Python API takes it (``hardrank.evaluate(model=<object>, ...)``), with what
    preprocesses its inputs; compared by identity."""

    model: object                   # an open_clip model, or a transformers dual encoder (a torch.nn.Module)
    preprocess: object = None       # open_clip: its eval transform; transformers: an image processor
    tokenizer: object = None        # open_clip's tokenizer; transformers: a tokenizer (with preprocess=)
    processor: object = None        # transformers: a processor holding image_processor and tokenizer (CLIPProcessor)
    fingerprint: str | None = None  # the caller's name for these weights (e.g. "run1-step4000"): only with one
                                    # is the embedding store read or written

    def __post_init__(self):
        fp = self.fingerprint
        if fp is not None and not (isinstance(fp, str) and fp.strip() and fp.isprintable()):
            shown = repr(fp) if isinstance(fp, str) else f"(a {type(fp).__name__})"
            raise UsageError(f"option 'fingerprint' names the model object's weights in the store, e.g. "
                             f"'run1-step4000': a non-empty printable string, got {shown[:60]}")

    def describe(self) -> str:
        """What results record as the model: ``<in-memory open_clip.model.CLIP>``."""
        t = type(self.model)
        return f"<in-memory {t.__module__}.{t.__qualname__}>"


@dataclass(frozen=True)
class ModelSpec:
    """A model as parsed: its ``kind`` (a registered ``Kind``'s name) and ``name`` (what the spelling names,
    its prefix removed: an open_clip name, a config .json, a folder, ORG/NAME), from ``arch`` by ``kind_of``;
    ``arch`` is kept in the spelling of its kind (a bare folder becomes ``local-dir:FOLDER`` or ``hf:FOLDER``)."""

    arch: str                        # as --model spells it: open_clip name, config .json, hf-hub:, local-dir:, hf:,
                                     # blip:, a folder (see forms_help); for a model object, its description
    checkpoint: str | None = None    # weights file (.pt/.pth/.bin/.safetensors, training or TorchScript checkpoints)
    precision: str = "auto"          # auto = fp16 on CUDA, fp32 on CPU (a model object: its own dtype)
    device: str = "auto"             # auto = cuda if available (a model object: where it is)
    pretrained: str | None = None    # open_clip tag: its preprocessing, activation, and (no checkpoint) weights
    random_init: bool = False        # evaluate random weights on purpose (otherwise weights are required)
    quick_gelu: bool | None = None   # force the activation (a training run's force_quick_gelu); None: tag / arch
    preprocess: tuple = ()           # (key, value) overrides of mean/std/interpolation/resize_mode (a run's params)
    image_size: int | None = None    # force_image_size of a training run
    context_length: int | None = None  # force_context_length of a training run
    logit_bias: bool = False         # the model has a SigLIP logit bias (a run trained with --siglip)
    live: LiveModel | None = None    # a model object given to the Python API (its kind takes objects)
    kind: str = field(init=False)    # the parser's: which registered Kind this is
    name: str = field(init=False)    # the parser's: the spelling without its kind's prefix ("" for an object)

    def __post_init__(self):
        if self.live is None and not isinstance(self.arch, (str, os.PathLike)):  # ModelSpec(<a model object>)
            object.__setattr__(self, "live", LiveModel(self.arch))
        if self.live is None:
            object.__setattr__(self, "arch", os.fspath(self.arch))
        k = kind_of(self.arch if self.live is None else self.live)
        if self.live is not None:
            arch, name = self.live.describe(), ""
        elif k.prefix and self.arch.startswith(k.prefix):
            arch, name = self.arch, self.arch[len(k.prefix):]
        else:  # an unprefixed spelling of a prefixed kind (a bare folder): spelled with the prefix from here on
            arch, name = k.prefix + self.arch, self.arch
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "kind", k.name)
        object.__setattr__(self, "name", name)

    @property
    def spec_kind(self) -> Kind:
        """The registered ``Kind`` of this spec."""
        return KINDS[self.kind]

    def resolved_device(self) -> str:
        return resolve_device(self.device)

    def resolved_precision(self) -> str:
        if self.precision not in PRECISIONS:
            raise UsageError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "auto":
            return "fp16" if self.resolved_device().startswith("cuda") else "fp32"
        return self.precision

    def record(self) -> dict:
        """The spec as plain values (provenance): every field but the model object."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "live"}


@dataclass
class LoadedModel:
    """A model ready to encode: what the encode stages call (``model.encode_image``, ``model.encode_text``), its
    tokenizer, the preprocessing its decoder reproduces, and the fingerprint its store folder is named by
    (None: a model object given without one, whose embeddings are never stored)."""

    spec: ModelSpec
    arch_name: str
    model: torch.nn.Module
    tokenizer: object
    preprocess_cfg: dict
    fingerprint: str | None
    embed_dim: int
    device: str
    precision: str
    checkpoint_hash: str | None
    info: dict = field(default_factory=dict)  # source: pretrained tag, weights file and format, quick_gelu, warnings
    session: Callable | None = None  # () -> a context manager held while it encodes (a model object: its modes
                                     # set for inference there, and restored after)

    @property
    def dtype(self) -> torch.dtype:
        return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]

    @property
    def store_dtype(self) -> str:
        return "float32" if self.precision == "fp32" else "float16"

    @property
    def label(self) -> str:
        """The results folder name: the checkpoint's stem, else the model (+ tag)."""
        if self.spec.checkpoint:
            return Path(self.spec.checkpoint).stem
        if self.spec.live is not None:
            return safe_name(self.spec.live.fingerprint) if self.spec.live.fingerprint else "in-memory"
        base = safe_name(self.spec.name.rstrip("/").split("/")[-1])
        if self.spec.pretrained:
            return f"{base}-{safe_name(self.spec.pretrained)}"
        return base if self.info.get("weights") else f"{base}-init"


def safe_name(s: str) -> str:
    """``s`` as one file-name part (a results folder's label, a fingerprint's): letters, digits and ``-_.`` kept,
    the rest ``_``; a name of dots alone (``..``: a folder named so, a fingerprint) becomes ``_``s, never a path."""
    s = "".join(c if c.isalnum() or c in "-_." else "_" for c in s)
    return "_" * len(s) if s and set(s) == {"."} else s


# -- the registry ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """One model kind. Recognised by ``prefix`` (``hf:``: the name follows it), else by ``matches`` (an
    unprefixed spelling: a ``.json``, a folder holding some file), else by ``accepts`` (a model object given to
    the Python API); the one kind with none of the three takes every other spelling (open_clip's names).
    ``load(spec) -> LoadedModel`` loads it."""

    name: str                                        # the spec's kind
    load: Callable                                   # ModelSpec -> LoadedModel, offline and fingerprinted
    forms: tuple = ()                                # ((spelling, what it names), ...): the help lines
    prefix: str = ""                                 # a spelling starting with it is this kind
    matches: Callable[[str], bool] | None = None     # an unprefixed spelling this kind takes
    accepts: Callable[[object], bool] | None = None  # a model object this kind takes (the Python API)
    folder: str = ""                                 # what a folder of this kind holds (said when a folder is none's)
    path: str = ""                                   # the name is a local path: "always", "folder" (when it is a
                                                     # folder: hf:FOLDER or hf:ORG/NAME); "" a name (job files)
    portable: bool = True                            # a worker process rebuilds it from the spec (Ray's actors);
                                                     # False: it encodes in this process only (a model object)


KINDS: dict[str, Kind] = {}  # name -> kind, in registration order (the order of help texts and of matching)


def register_kind(kind: Kind) -> Kind:
    """Add ``kind`` (see ``Kind``); a taken name or prefix, or a second catch-all kind, is a ValueError."""
    if not kind.name or kind.name in KINDS:
        raise ValueError(f"model kind {kind.name!r} is empty or taken")
    if kind.prefix and any(k.prefix and (k.prefix.startswith(kind.prefix) or kind.prefix.startswith(k.prefix))
                           for k in KINDS.values()):
        raise ValueError(f"model kind {kind.name!r}: prefix {kind.prefix!r} overlaps a registered one")
    if _catch_all(kind) and any(_catch_all(k) for k in KINDS.values()):
        raise ValueError(f"model kind {kind.name!r}: one kind takes every other spelling already")
    KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove kind ``name`` (a test's own kind, once the test is done)."""
    KINDS.pop(name, None)


def _catch_all(k: Kind) -> bool:
    return not (k.prefix or k.matches or k.accepts)


def kind_of(model) -> Kind:
    """The kind of a ``--model`` spelling (a ``str``) or of a model object (a ``LiveModel``, or the object
    itself); a folder no kind takes is a DataError naming what each kind's folder holds, an object none takes a
    UsageError naming its type and what is accepted."""
    if isinstance(model, (LiveModel, torch.nn.Module)) or not isinstance(model, (str, os.PathLike)):
        obj = model.model if isinstance(model, LiveModel) else model
        found = next((k for k in KINDS.values() if k.accepts is not None and k.accepts(obj)), None)
        if found is None:
            raise UsageError(object_refusal(obj))
        return found
    text = os.fspath(model)
    found = next((k for k in KINDS.values() if k.prefix and text.startswith(k.prefix)), None)
    found = found or next((k for k in KINDS.values() if not k.prefix and k.matches and k.matches(text)), None)
    found = found or next((k for k in KINDS.values() if k.prefix and k.matches and k.matches(text)), None)
    if found is not None:
        return found
    if Path(text).is_dir():
        holds = " nor ".join(k.folder for k in KINDS.values() if k.folder)
        raise DataError(f"--model {text}: the folder is neither {holds}; pass such a folder, or an open_clip model "
                        f"name or config .json with --checkpoint FILE")
    found = next((k for k in KINDS.values() if _catch_all(k)), None)
    if found is None:
        raise UsageError(f"unknown model {text!r}: --model takes {forms_help()}")
    return found


_WEIGHTS_OPTIONS = ("checkpoints", "checkpoint", "pretrained", "random_init", "run", "embeddings")


def split_live(options: dict) -> tuple[LiveModel | None, dict]:
    """The model object among the Python API's keywords (``model=<object>`` with ``preprocess``, ``tokenizer``,
    ``processor``, ``fingerprint``), and the other keywords with ``model`` spelled as the object's description;
    ``(None, options)`` for a ``--model`` spelling. An object no kind takes is refused in one line."""
    model = options.get("model")
    extra = {k: options[k] for k in LIVE_OPTIONS if k in options}
    if model is None or isinstance(model, (str, os.PathLike)):
        if extra:
            raise UsageError(f"option(s) {', '.join(extra)} go with a model object (model=<an open_clip or "
                             f"transformers model>); model={model!r} brings its own preprocessing, tokenizer and "
                             f"fingerprint: drop them")
        return None, options
    live = LiveModel(model, **extra)
    kind_of(live)
    rest = {k: v for k, v in options.items() if k != "model" and k not in LIVE_OPTIONS}
    clash = [k for k in _WEIGHTS_OPTIONS if rest.get(k) not in (None, False, (), [], (None,), [None])]
    if clash:
        raise UsageError(f"a model object brings its own weights: drop option(s) {', '.join(clash)} (to evaluate "
                         f"another state of it, call again with the model as it is then)")
    return live, {**rest, "model": live.describe()}


def forms_help(kinds=None) -> str:
    """Every ``--model`` spelling with what it names (of ``kinds``' names, default all), for a help text or an error."""
    return "; ".join(f"{spelling} ({what})" for k in KINDS.values() if k.accepts is None
                     and (kinds is None or k.name in kinds) for spelling, what in k.forms)


def object_refusal(obj) -> str:
    """One line for a ``model`` option no kind takes: its type, and what the option takes."""
    t = type(obj)
    objects = "; ".join(f"{spelling} ({what})" for k in KINDS.values() if k.accepts is not None
                        for spelling, what in k.forms)
    return (f"option 'model' got {t.__name__} (a {t.__module__}.{t.__qualname__} object), which is no model "
            f"hardrank runs; give a --model spelling (NAME, CONFIG.json, hf:FOLDER, ...) or a model object: "
            f"{objects}")


def rebased(model: str, base: str | os.PathLike) -> str:
    """``model`` with its local path taken relative to ``base`` (a job file's folder), as its kind reads it: a
    config .json and a ``local-dir:`` folder always, ``hf:`` / ``blip:`` when ``base`` holds that folder (else it
    is a repo id); names unchanged."""
    k = _syntax_kind(model)
    if k is None or not k.path or (k.prefix and not model.startswith(k.prefix)):  # (a bare folder: as found)
        return model
    head = k.prefix
    p = os.path.expanduser(model[len(head):])
    if os.path.isabs(p) or "://" in p:
        return head + p
    joined = Path(base) / p
    if k.path == "folder" and not joined.is_dir():
        return model
    return head + os.fspath(joined)


def label(model: str) -> str:
    """A job file's default results folder for a spelling: a ``local-dir:`` folder's name, a config's stem, any
    other spelling as it is."""
    k = _syntax_kind(model)
    if k is not None and k.path == "always":
        if not k.prefix:
            return Path(model).stem
        if model.startswith(k.prefix):
            return Path(model[len(k.prefix):]).name
    return model


def _syntax_kind(model: str) -> Kind | None:
    """The kind of a spelling, None for one no kind takes (a folder of neither kind): job files name paths
    relative to themselves, which the loaders check later."""
    try:
        return kind_of(model)
    except (DataError, UsageError):
        return None
