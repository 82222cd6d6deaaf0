"""Hugging Face text parts of open_clip models (tokenizer, transformers text tower), found offline.

open_clip builds them by name (``text_cfg.hf_tokenizer_name``, ``text_cfg.hf_model_name``) through
``transformers``' ``from_pretrained``, which downloads whatever the cache lacks (and the tower's
pretrained weights, although the CLIP checkpoint replaces them). Here each name becomes a folder
first and transformers reads only that folder (``local_files_only``):

- the tokenizer: the model's own folder (a ``local-dir:`` folder, or the ``hf-hub:`` snapshot the
  weights come from) when it holds tokenizer files, as open_clip's ``push_to_hf_hub`` saves them;
  else ``hf_tokenizer_name``'s snapshot in the local Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``);
- the text tower (xlm-roberta, mt5, NLLB towers): ``hf_model_name``'s ``config.json`` from that cache,
  the model built from the config alone.

``transformers`` (and ``sentencepiece``) are the ``hardrank[hf]`` extra, imported by this module alone.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub.constants as hf_constants
from huggingface_hub import snapshot_download
from open_clip.tokenizer import DEFAULT_CONTEXT_LENGTH, HFTokenizer

from hardrank.errors import DataError, MissingExtra
from hardrank.models.boundary import check_tokenizer, open_folder, quote, vet_config
from hardrank.openclip_import import bind_transformers

__all__ = ["HFText", "hf_text", "snapshot"]

# any one of these marks a folder that holds a tokenizer
_TOKENIZER_MARKS = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                    "sentencepiece.bpe.model", "tokenizer.model")
# what a tokenizer may read: hashed into the model fingerprint
_TOKENIZER_GLOBS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "*.model")
# the small files of a repo (tokenizer files and configs), never its weights
_FETCH = '--include "*.json" --include "*.model" --include "*.txt"'


@dataclass
class HFText:
    """What a model's text side takes from Hugging Face: its tokenizer (None: open_clip's own) and the
    ``text_cfg`` that builds its transformers tower from a local config (None: no such tower)."""

    tokenizer: HFTokenizer | None = None
    text_cfg: dict | None = None
    ident: dict = field(default_factory=dict)    # names and content hashes: part of the model fingerprint
    folders: dict = field(default_factory=dict)  # where each came from on this machine (provenance only)
    tower_config: dict | None = None             # the transformers tower's config.json (its size is checked)


def _require_transformers(what: str) -> None:
    try:
        bind_transformers()  # open_clip was imported without it (hardrank.openclip_import)
    except ImportError as exc:
        raise MissingExtra(what, "hf", "transformers") from exc


def _require_sentencepiece(what: str) -> None:
    """transformers reads a SentencePiece model (mt5's repos hold no tokenizer.json) with sentencepiece;
    without it transformers 5 falls back to tiktoken and fails naming tiktoken instead."""
    try:
        import sentencepiece  # noqa: F401
    except ImportError as exc:
        raise MissingExtra(what, "hf", "sentencepiece") from exc


def _holds_tokenizer(folder: Path) -> bool:
    return any((folder / n).is_file() for n in _TOKENIZER_MARKS)


def snapshot(name: str, what: str, needs, kind: str, fetch: str | None = None) -> Path:
    """The folder ``name`` names: a local folder, else its snapshot in the local Hugging Face cache,
    which must hold what ``needs`` accepts (``kind`` says what that is in the error; ``fetch`` the
    command that fetches it, by default the repo's small files)."""
    fetch = fetch or f"hf download {name} {_FETCH}"
    if Path(name).is_dir():
        folder = Path(name)
    else:
        try:
            folder = Path(snapshot_download(name, local_files_only=True))
        except Exception as exc:  # not cached (LocalEntryNotFoundError), or not a repo id at all
            raise DataError(f"{what}: {name} is not in the local Hugging Face cache ({hf_constants.HF_HUB_CACHE}; "
                            f"{type(exc).__name__}); hardrank never downloads. Fetch its {kind} once with "
                            f"`{fetch}` (huggingface_hub's CLI)") from exc
    if not needs(folder):
        raise DataError(f"{what}: {folder} holds no {kind} of {name}; fetch them once with "
                        f"`{fetch}` (huggingface_hub's CLI)")
    return folder


def _files_hash(folder: Path, globs) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in sorted({p for g in globs for p in folder.glob(g) if p.is_file()}):
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def _tokenizer(text: dict, own: Path | None, context_length: int | None, what: str, vocab_size: int | None
               ) -> tuple[HFTokenizer, Path]:
    name = text["hf_tokenizer_name"]
    source = own if own is not None and _holds_tokenizer(own) else \
        snapshot(name, what, _holds_tokenizer, "tokenizer files")
    open_folder(source, what)  # its settings vetted: no auto_map, no custom class, no path outside
    if not (source / "tokenizer.json").is_file() and any(source.glob("*.model")):
        _require_sentencepiece(f"{what} (tokenizer {name}: {source} holds a SentencePiece model, no tokenizer.json)")
    # as open_clip.get_tokenizer builds it: context length = argument > text_cfg > default; its kwargs (vetted:
    # only TOKENIZER_KWARGS, which open_clip's HFTokenizer takes itself)
    kwargs = dict(text.get("tokenizer_kwargs", {}))
    if text.get("tokenizer_mode"):
        kwargs["tokenizer_mode"] = text["tokenizer_mode"]
    fetch = f"fetch them again with `hf download {name} {_FETCH}`"
    try:
        tok = HFTokenizer(str(source), context_length=context_length or text.get("context_length",
                                                                                 DEFAULT_CONTEXT_LENGTH),
                          local_files_only=True, trust_remote_code=False, **kwargs)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise DataError(f"{what}: the tokenizer files in {source} do not load ({type(exc).__name__}: "
                        f"{quote(exc)}); {fetch}") from None
    check_tokenizer(tok, size=len(tok.tokenizer), vocab_size=vocab_size, what=what, source=source,
                    fix=f"the model's own tokenizer is the one it was trained with: {fetch}")
    return tok, source


def hf_text(model_cfg: dict, name: str, own: Path | None, context_length: int | None, arch: str,
            config_file: str = "") -> HFText:
    """The Hugging Face parts of open_clip model ``name`` (config ``model_cfg``, read from ``config_file``;
    ``own``: its ``local-dir:``/``hf-hub:`` folder), resolved offline and vetted before the model is built.
    Raises ``MissingExtra`` without transformers, ``DataError`` when files are not in the local cache or
    fail the trust boundary (``hardrank.models.boundary``)."""
    text = model_cfg.get("text_cfg", {})
    tok_name, tower = text.get("hf_tokenizer_name"), text.get("hf_model_name")
    what = f"model {arch}"
    vet_config(model_cfg, config_file or name, config_file or f"the config of {name}", what=what)
    if not tok_name and not tower:
        if own is None and "siglip" in name.lower():
            # open_clip.get_tokenizer gives such names a SentencePiece vocabulary fetched from
            # storage.googleapis.com at every load
            raise DataError(f"{what}: open_clip tokenizes a model named '*siglip*' without text_cfg.hf_tokenizer_name "
                            f"with a vocabulary it downloads at each load; hardrank never downloads. Set "
                            f"text_cfg.hf_tokenizer_name in the config to the tokenizer the model was trained with "
                            f"(e.g. timm/ViT-B-16-SigLIP, from the local Hugging Face cache)")
        return HFText()
    _require_transformers(f"{what} (its transformers text tower {tower})" if tower else
                          f"{what} (its Hugging Face tokenizer {tok_name})")
    out = HFText()
    vocab_size = text.get("vocab_size", 49408)  # open_clip's own text transformer (CLIPTextCfg's default)
    if tower:
        folder = open_folder(snapshot(tower, what, lambda f: (f / "config.json").is_file(), "config.json"), what)
        # the tower from its config alone: the CLIP checkpoint brings its weights
        out.text_cfg = {**text, "hf_model_name": str(folder.path), "hf_model_pretrained": False}
        if context_length:
            out.text_cfg["context_length"] = context_length
        out.ident["text_tower"] = {"name": tower, "config": _files_hash(folder.path, ("config.json",))}
        out.folders["text_tower"] = str(folder.path)
        out.tower_config = folder.config("config.json")
        vocab_size = out.tower_config.get("vocab_size")
    if tok_name:
        out.tokenizer, source = _tokenizer(text, own, context_length, what,
                                           vocab_size if isinstance(vocab_size, int) else None)
        out.ident["tokenizer"] = {"name": tok_name, "files": _files_hash(source, _TOKENIZER_GLOBS)}
        out.folders["tokenizer"] = str(source)
    return out
