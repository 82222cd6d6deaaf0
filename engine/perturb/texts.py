"""RoCOCO-style caption variants: replace the caption's lowest-embedding-influence noun."""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from hardrank.atomic import write_text_atomic
from hardrank.config import DATA_DIR
from hardrank.errors import DataError, UsageError
from hardrank.formats.karpathy import read_karpathy
from hardrank.formats.variants import N_PERTURBED, TEXT_VARIANTS
from hardrank.text import pre_caption

__all__ = ["KINDS", "Vocab", "load_vocab", "embedding_influence", "perturb_captions", "write_variant_file"]

KINDS = TEXT_VARIANTS  # RoCOCO's four, written once
DEFAULT_VOCAB = DATA_DIR / "vocab" / "concepts.json"
_WORD = re.compile(r"^([\W_]*)(.*?)((?:'s)?[\W_]*)$")  # prefix, core, suffix: "dog's," -> ("", "dog", "'s,")
_FORM = re.compile(r"^[a-z][a-z-]*$")


@dataclass(frozen=True)
class Vocab:
    classes: dict[str, list[tuple[str, ...]]]  # class -> nouns, each (singular, plural) or (uncountable,)
    danger: list[tuple[str, ...]]              # danger nouns, (singular, plural)
    random: list[str]                          # rand_voca source: words of all kinds
    stopwords: frozenset[str]                  # never replaced by the fallback
    nouns: dict[str, tuple[str, int, bool]]    # form -> (class, entry index, is the plural form)


def load_vocab(path: str | os.PathLike | None = None) -> Vocab:
    """Read and check a vocabulary JSON (default: the bundled ``data/vocab/concepts.json``)."""
    return _load_vocab(str(path or DEFAULT_VOCAB))


@lru_cache(maxsize=4)
def _load_vocab(path: str) -> Vocab:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"vocabulary {path} does not exist") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise DataError(f"vocabulary {path}: not valid UTF-8 JSON ({exc})") from exc
    expected = {"classes", "danger", "random", "stopwords"}
    if not isinstance(doc, dict) or not expected <= set(doc) or set(doc) - expected - {"about"}:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise DataError(f"vocabulary {path}: expected an object with keys {sorted(expected)} (and 'about'), got {got}")

    def entries(where, items):
        if not isinstance(items, list) or len(items) < 2:
            raise DataError(f"vocabulary {path}: {where} must be a list of at least 2 nouns")
        out = []
        for e in items:
            if not (isinstance(e, list) and 1 <= len(e) <= 2 and all(isinstance(f, str) and _FORM.match(f) for f in e)):
                raise DataError(f"vocabulary {path}: {where} entry {e!r} must be [singular, plural] or [uncountable], "
                                f"lowercase words without spaces")
            out.append(tuple(e))
        return out

    if not isinstance(doc["classes"], dict) or len(doc["classes"]) < 2:
        raise DataError(f"vocabulary {path}: 'classes' must map at least 2 class names to noun lists")
    classes = {c: entries(f"class {c!r}", v) for c, v in doc["classes"].items()}
    nouns: dict[str, tuple[str, int, bool]] = {}
    for c, es in classes.items():
        for k, e in enumerate(es):
            for j, form in enumerate(e):
                if form in nouns and nouns[form][:2] != (c, k):
                    raise DataError(f"vocabulary {path}: {form!r} is in class {nouns[form][0]!r} and in {c!r}; "
                                    f"a form may belong to one class only")
                nouns.setdefault(form, (c, k, j == 1 and e[0] != e[1]))
    rand = doc["random"]
    if not isinstance(rand, list) or len(set(rand)) < 2 or not all(isinstance(w, str) and _FORM.match(w) for w in rand):
        raise DataError(f"vocabulary {path}: 'random' must be a list of at least 2 lowercase words without spaces")
    stop = doc["stopwords"]
    if not isinstance(stop, list) or not all(isinstance(w, str) for w in stop):
        raise DataError(f"vocabulary {path}: 'stopwords' must be a list of strings")
    return Vocab(classes=classes, danger=entries("'danger'", doc["danger"]), random=list(rand),
                 stopwords=frozenset(stop), nouns=nouns)


def _words(caption: str) -> list[str]:
    return pre_caption(caption).split()


def _encode(model, tokenizer, texts: list[str]) -> np.ndarray:
    """(B, d) float32, L2-normalised text embeddings."""
    device = next(model.parameters()).device
    emb = model.encode_text(tokenizer(texts).to(device)).float()
    return torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()


@torch.inference_mode()
def embedding_influence(model, tokenizer, captions: list[str], *, batch_size: int = 512) -> list[np.ndarray]:
    """Per caption, ``(n_words,) float32``: 1 - cosine similarity between the L2-normalised text
    embedding of the caption and that of the caption with word i removed. Words are those of
    ``pre_caption(caption).split()``; a caption with no words gets an empty array. The caption and
    all its leave-one-out versions of many captions share big batches of ``batch_size`` texts."""
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    words = [_words(c) for c in captions]
    out = [np.zeros(len(w), dtype=np.float32) for w in words]
    full = None  # (n_captions, d) embeddings of the whole captions

    def texts():  # (caption index, removed word index or -1 for the whole caption, text); whole caption first
        for ci, w in enumerate(words):
            yield ci, -1, " ".join(w)
            for j in range(len(w)):
                yield ci, j, " ".join(w[:j] + w[j + 1:])

    batch: list[tuple[int, int, str]] = []

    def flush():
        nonlocal full
        emb = _encode(model, tokenizer, [t for _, _, t in batch])  # (B, d)
        if full is None:
            full = np.zeros((len(captions), emb.shape[1]), dtype=np.float32)
        owner = np.array([ci for ci, _, _ in batch])
        slot = np.array([j for _, j, _ in batch])
        whole = slot < 0
        full[owner[whole]] = emb[whole]  # a caption's whole text precedes its variants, so it is set by now
        rows = np.flatnonzero(~whole)
        sims = np.einsum("bd,bd->b", emb[rows], full[owner[rows]])
        for r, s in zip(rows, sims):
            out[owner[r]][slot[r]] = 1.0 - s
        batch.clear()

    for item in texts():
        batch.append(item)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return out


def _rng(caption: str, kind: str, seed: int) -> np.random.Generator:
    # keyed on the caption text, so a caption's variant does not depend on its position or batch
    digest = int.from_bytes(hashlib.blake2b(caption.encode("utf-8"), digest_size=8).digest(), "little")
    return np.random.default_rng([seed, KINDS.index(kind), digest])


def _looks_plural(word: str) -> bool:
    return word.endswith("s") and not word.endswith(("ss", "us", "is"))


def _pick(rng, entries: list[tuple[str, ...]], plural: bool) -> str:
    e = entries[int(rng.integers(len(entries)))]
    return e[-1] if plural else e[0]


def _replacement(core: str, kind: str, vocab: Vocab, rng, noun: tuple[str, int, bool] | None) -> str:
    """A word different from ``core``. ``noun`` = (class, entry, plural) when core is a vocabulary noun."""
    plural = noun[2] if noun else _looks_plural(core)
    if kind == "rand_voca":
        words = [w for w in vocab.random if w != core]
        return words[int(rng.integers(len(words)))]
    if kind == "danger":
        return _pick(rng, [e for e in vocab.danger if core not in e], plural)
    names = list(vocab.classes)
    if noun is None:  # fallback word: no class known, so any class
        cls = names[int(rng.integers(len(names)))]
        return _pick(rng, vocab.classes[cls], plural)
    if kind == "same_concept":
        return _pick(rng, [e for k, e in enumerate(vocab.classes[noun[0]]) if k != noun[1]], plural)
    others = [c for c in names if c != noun[0]]
    return _pick(rng, vocab.classes[others[int(rng.integers(len(others)))]], plural)


def _perturb_one(caption: str, infl: np.ndarray, kind: str, seed: int, vocab: Vocab) -> tuple[str, bool]:
    """(perturbed caption, whether the fallback was used)."""
    words = _words(caption)
    rng = _rng(caption, kind, seed)
    if not words:  # nothing to replace: the variant is the replacement word alone
        return _replacement("", kind, vocab, rng, None), True
    parts = [_WORD.match(w).groups() for w in words]
    eligible = [i for i, (_, core, _) in enumerate(parts) if core in vocab.nouns]
    fallback = not eligible
    if fallback:  # lowest-influence content word; if the caption has none, any word
        eligible = [i for i, (_, core, _) in enumerate(parts) if core and core not in vocab.stopwords] \
            or [i for i, (_, core, _) in enumerate(parts) if core] or list(range(len(words)))
    i = eligible[int(np.argmin(infl[eligible]))]  # ties: the earliest word wins
    pre, core, post = parts[i]
    new = _replacement(core, kind, vocab, rng, None if fallback else vocab.nouns[core])
    return " ".join(words[:i] + [pre + new + post] + words[i + 1:]), fallback


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise UsageError(f"unknown perturbation kind {kind!r}; expected one of {list(KINDS)}")


def _perturb(captions, model, tokenizer, kind, seed, vocab, influence, batch_size) -> tuple[list[str], int]:
    _check_kind(kind)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}")
    vocab = vocab if vocab is not None else load_vocab()
    influence = influence or {}
    missing = [c for c in dict.fromkeys(captions) if c not in influence]
    computed = dict(zip(missing, embedding_influence(model, tokenizer, missing, batch_size=batch_size)))
    out, n_fallback = [], 0
    for c in captions:
        infl = computed[c] if c in computed else np.asarray(influence[c])
        if len(infl) != len(_words(c)):
            raise UsageError(f"influence given for caption {c!r} has {len(infl)} values, the caption has "
                             f"{len(_words(c))} words; pass embedding_influence() of the same captions")
        text, fb = _perturb_one(c, infl, kind, int(seed), vocab)
        out.append(text)
        n_fallback += fb
    return out, n_fallback


def perturb_captions(captions: list[str], model, tokenizer, *, kind: str, seed: int, vocab: Vocab | None = None,
                     influence: Mapping[str, np.ndarray] | None = None, batch_size: int = 512) -> list[str]:
    """One perturbed caption per caption, normalised with ``pre_caption``, one word replaced.

    The replaced word is the lowest-influence vocabulary noun (earliest on ties), its plural/singular
    form kept, replaced by another noun of its class (``same_concept``), a noun of another class
    (``diff_concept``), a random word (``rand_voca``) or a danger word (``danger``). Punctuation glued
    to the word (``table,``) is kept. A caption without a vocabulary noun falls back to its
    lowest-influence non-stopword (any word if all are stopwords) and draws from any class.
    Deterministic: the draw depends on (seed, kind, caption text) only. ``influence`` may hold
    ``embedding_influence`` results keyed by caption (reuse them across kinds); the rest is computed.
    Unlike the reference files, only one occurrence of a repeated word is replaced and articles are
    not adapted ("an apple" -> "an dog")."""
    return _perturb(captions, model, tokenizer, kind, seed, vocab, influence, batch_size)[0]


def write_variant_file(karpathy_path: str | os.PathLike, out_path: str | os.PathLike, kind: str, model, tokenizer,
                       seed: int, *, vocab: Vocab | None = None, influence: Mapping[str, np.ndarray] | None = None,
                       batch_size: int = 512) -> dict:
    """Write a RoCOCO variant file for a Karpathy-format file: same image order, each caption list =
    the n originals unchanged then one perturbed caption for each of the first min(n, 5) originals.
    Written atomically. Returns counts: images, originals, perturbed,
    fallback (captions without a vocabulary noun), unchanged (perturbed == one of the image's originals
    after normalisation)."""
    _check_kind(kind)
    out_path = Path(out_path)
    if out_path.resolve() == Path(karpathy_path).resolve():
        raise UsageError(f"out_path {out_path} is the input file; write the variant next to it under another name")
    clean = read_karpathy(karpathy_path)
    sources = [c for _, caps in clean for c in caps[:N_PERTURBED]]
    perturbed, n_fallback = _perturb(sources, model, tokenizer, kind, seed, vocab, influence, batch_size)
    items, k, unchanged = [], 0, 0
    for image, caps in clean:
        m = min(len(caps), N_PERTURBED)
        new = perturbed[k:k + m]
        k += m
        normalised = {pre_caption(c) for c in caps}
        unchanged += sum(p in normalised for p in new)
        items.append({"image": image, "caption": list(caps) + new})
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_path, json.dumps(items, ensure_ascii=False))
    return {"path": str(out_path), "kind": kind, "seed": int(seed), "images": len(clean),
            "originals": sum(len(c) for _, c in clean), "perturbed": len(perturbed), "fallback": n_fallback,
            "unchanged": unchanged}

