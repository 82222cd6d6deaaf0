"""Adversarial RoCOCO variants: per checkpoint, the one-word substitutions and Mix/Patch partners that break it.

Texts: every content word of a caption (noun, adjective, colour, number, spatial word) is replaced,
one at a time, by words of the same word class drawn from the dataset's own captions, except words
of the same concept (the pairs RoCOCO's ``same_concept`` file substitutes for each other). All
candidates are scored against the caption's image in one grouped pass (``own_scores``); the winner
of a caption is the candidate with the largest margin over the true caption (``segment_winners``).

Images: each image's Mix/Patch partner is chosen among its k nearest images by embedding: the
partner whose altered copy beats the original image for the most of its captions (then by the mean
margin, then the nearer neighbour). Candidates are made with ``perturb_images``' alteration code.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hardrank.errors import DataError, UsageError
from hardrank.formats.karpathy import read_karpathy, read_rococo_variant
from hardrank.formats.variants import N_PERTURBED
from hardrank.kernels import choice_scores, topk
from hardrank.perturb.images import _alter_batch, _load, _rand_box, _save_jpeg, _to_uint8
from hardrank.text import pre_caption
from hardrank.word_tags import OrderTagger, order_tagger

__all__ = ["WORD_CLASSES", "COLOUR_WORDS", "NUMBER_WORDS", "SPATIAL_WORDS", "Concepts", "Vocabulary",
           "Candidates", "tag_captions", "word_class", "concepts_from_rococo", "no_concepts", "build_vocab",
           "vocab_from_file", "make_candidates", "own_scores", "segment_winners", "nearest_images",
           "image_candidates", "pick_partners", "write_image_candidates"]

WORD_CLASSES = ("noun", "adjective", "colour", "number", "spatial")
COLOUR_WORDS = frozenset("""
red orange yellow green blue purple pink brown black white gray grey silver gold golden cyan magenta
violet beige tan maroon navy teal turquoise crimson ivory
""".split())
NUMBER_WORDS = frozenset("""
zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
seventeen eighteen nineteen twenty thirty forty fifty hundred dozen single double triple couple pair
first second third
""".split())
SPATIAL_WORDS = frozenset("""
left right above below under over behind beside near inside outside top bottom front back between
across underneath beneath atop on in next into onto along around against
""".split())
_PLAIN = re.compile(r"^(?:[a-z]+|\d+)$")  # a word that may be replaced: letters only, or digits only


def word_class(word: str, tag: str) -> str | None:
    """The word class of a normalised word given its tagger tag ("noun", "adj", "other"), or None
    when the word is not a content word. Listed colours, numbers and spatial words win over the tag."""
    if not _PLAIN.match(word):
        return None
    if word in COLOUR_WORDS:
        return "colour"
    if word in NUMBER_WORDS or word.isdigit():
        return "number"
    if word in SPATIAL_WORDS:
        return "spatial"
    return {"noun": "noun", "adj": "adjective"}.get(tag)


def _align(words: list[str], tokens: list[str], tags: list[str]) -> list[str]:
    """The tag of each word from the tagger's tokens: a word made of one token takes its tag; a word
    split into several tokens ("ice-cream") is "other". Falls back to "other" if the tokens do not
    spell the words (the tagger changed the text)."""
    out, t = [], 0
    for w in words:
        got, first = "", t
        while t < len(tokens) and len(got) < len(w):
            got += tokens[t]
            t += 1
        if got != w:
            return ["other"] * len(words)
        out.append(tags[first] if t - first == 1 else "other")
    return out


def tag_captions(captions: list[str], tagger: OrderTagger | None = None) -> list[list[str | None]]:
    """Per normalised caption (``pre_caption`` output), the word class of each of its space-separated
    words (None for non-content words). ``tagger``: ARO's tagger (spaCy when installed, else word lists)."""
    tagger = tagger or order_tagger()
    words = [c.split() for c in captions]
    tagged = tagger.tag_many([" ".join(w) for w in words])
    return [[word_class(w, g) for w, g in zip(ws, _align(ws, toks, tags))] for ws, (toks, tags) in zip(words, tagged)]


@dataclass(frozen=True)
class Concepts:
    """Which words count as the same concept: ``groups[w]`` holds the words a RoCOCO ``same_concept``
    file substitutes for ``w`` or ``w`` for (neighbours, not a transitive closure: on COCO the closure
    joins 2,206 of 2,242 words into one group)."""

    source: str
    groups: dict[str, frozenset[str]] = field(default_factory=dict)

    def same(self, a: str, b: str) -> bool:
        return a == b or b in self.groups.get(a, ()) or a in self.groups.get(b, ())

    def to_json(self) -> dict:
        return {"source": self.source,
                "rule": "w and v are the same concept iff the same_concept file replaces one by the other "
                        "(one differing word between an original and its perturbed caption)",
                "groups": {w: sorted(g) for w, g in sorted(self.groups.items())}}


def no_concepts() -> Concepts:
    return Concepts(source="none (only the word itself is excluded)")


def concepts_from_rococo(clean_path: str | os.PathLike, same_concept_path: str | os.PathLike) -> Concepts:
    """The concept grouping a RoCOCO ``same_concept`` file implies: for each perturbed caption that
    differs from its original in exactly one word (after ``pre_caption``), that word pair is one concept."""
    clean = read_karpathy(clean_path)
    pert = read_rococo_variant(same_concept_path, clean)
    groups: dict[str, set[str]] = defaultdict(set)
    for (_, caps), new in zip(clean, pert):
        for a, b in zip(caps[:N_PERTURBED], new):
            wa, wb = pre_caption(a).split(), pre_caption(b).split()
            if len(wa) != len(wb):
                continue
            diff = [(x, y) for x, y in zip(wa, wb) if x != y]
            if len(diff) == 1:
                x, y = diff[0]
                groups[x].add(y)
                groups[y].add(x)
    return Concepts(source=str(same_concept_path), groups={w: frozenset(g) for w, g in groups.items()})


@dataclass(frozen=True)
class Vocabulary:
    """Replacement words per word class, most frequent first."""

    words: dict[str, list[str]]
    source: str

    def to_json(self) -> dict:
        return {"source": self.source, "words": self.words}


def build_vocab(classes: list[list[str | None]], captions: list[str], per_class: int) -> Vocabulary:
    """The ``per_class`` most frequent words of each class in the (normalised) captions; a word
    tagged with several classes belongs to its most frequent one. Ties: alphabetical."""
    if per_class < 1:
        raise UsageError(f"the vocabulary needs at least 1 word per class, got {per_class}")
    counts: dict[str, Counter] = defaultdict(Counter)
    for cls, cap in zip(classes, captions):
        for w, c in zip(cap.split(), cls):
            if c is not None:
                counts[w][c] += 1
    per: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for w, cnt in counts.items():
        c, _ = min(cnt.items(), key=lambda kv: (-kv[1], WORD_CLASSES.index(kv[0])))
        per[c].append((-sum(cnt.values()), w))
    words = {c: [w for _, w in sorted(per[c])[:per_class]] for c in WORD_CLASSES if per[c]}
    return Vocabulary(words, f"the captions' {per_class} most frequent words per class")


def vocab_from_file(path: str | os.PathLike, tagger: OrderTagger | None = None) -> Vocabulary:
    """Replacement words from a file: a JSON list of words, or one word per line; each word gets the
    class it has alone (colour/number/spatial lists, else the tagger). Words of no class are an error."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--vocab {p} does not exist (give a word file, or a number of words per class)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"--vocab {p}: not UTF-8 text ({exc}); re-save it as UTF-8") from None
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        items = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not isinstance(items, list) or not items or not all(isinstance(w, str) for w in items):
        raise DataError(f"--vocab {p}: expected a JSON list of words or one word per line")
    words = list(dict.fromkeys(pre_caption(w) for w in items))
    classes = tag_captions(words, tagger)
    out: dict[str, list[str]] = defaultdict(list)
    for w, c in zip(words, classes):
        if len(c) != 1 or c[0] is None:
            raise DataError(f"--vocab {p}: {w!r} is not one content word (noun, adjective, colour, number or "
                            f"spatial word); remove it")
        out[c[0]].append(w)
    return Vocabulary({c: out[c] for c in WORD_CLASSES if out[c]}, str(p))


@dataclass
class Candidates:
    """All substitutions, caption by caption (CSR ``ptr`` over captions); arrays are (N,)."""

    texts: list[str]        # the substituted captions (normalised)
    ptr: np.ndarray         # (n_captions + 1,) int64
    position: np.ndarray    # (N,) int64 index of the replaced word
    original: list[str]     # replaced word
    replacement: list[str]  # new word
    wclass: list[str]       # word class of the replaced word

    @property
    def owner(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))


def make_candidates(captions: list[str], classes: list[list[str | None]], vocab: Vocabulary, concepts: Concepts, *,
                    positions=WORD_CLASSES, budget: int | None = None,
                    forbidden: list[set[str]] | None = None) -> Candidates:
    """Single-word substitutions of each normalised caption. At each word whose class is in
    ``positions``, the vocabulary words of that class other than the word and its concept. With a
    ``budget``, positions take turns (caption order), each offering its next word (vocabulary order),
    until ``budget`` candidates. A candidate equal to an entry of ``forbidden[i]`` (caption i's image's
    own captions) or to an earlier candidate is skipped."""
    if budget is not None and budget < 1:
        raise UsageError(f"budget must be >= 1 candidate per caption, got {budget}")
    bad = set(positions) - set(WORD_CLASSES)
    if bad:
        raise UsageError(f"unknown word classes {sorted(bad)}; choose from {list(WORD_CLASSES)}")
    texts, ptr, pos, orig, repl, wcls = [], [0], [], [], [], []
    for i, (cap, cls) in enumerate(zip(captions, classes)):
        words = cap.split()
        lists = []
        for j, (w, c) in enumerate(zip(words, cls)):
            if c in positions:
                lists.append((j, c, [v for v in vocab.words.get(c, ()) if not concepts.same(w, v)]))
        seen = set(forbidden[i]) if forbidden is not None else set()
        seen.add(cap)
        n, depth = 0, 0
        while lists and (budget is None or n < budget):
            live = False
            for j, c, vs in lists:
                if depth >= len(vs):
                    continue
                live = True
                t = " ".join(words[:j] + [vs[depth]] + words[j + 1:])
                if t in seen:
                    continue
                seen.add(t)
                texts.append(t)
                pos.append(j)
                orig.append(words[j])
                repl.append(vs[depth])
                wcls.append(c)
                n += 1
                if budget is not None and n >= budget:
                    break
            if not live:
                break
            depth += 1
        ptr.append(len(texts))
    return Candidates(texts, np.array(ptr, dtype=np.int64), np.array(pos, dtype=np.int64), orig, repl, wcls)


def own_scores(query_emb: np.ndarray, item_emb: np.ndarray, owner: np.ndarray, *, device: str = "cpu",
               chunk: int = 1 << 16) -> np.ndarray:
    """(N,) float32 score of each item against its own query: ``item_emb[n] . query_emb[owner[n]]``,
    the one grouped pass of an attack (every caption's candidates against its image): the kernels'
    ``choice_scores`` on ``device``, ``chunk`` rows at a time (equal embeddings score equal)."""
    if len(item_emb) != len(owner):
        raise ValueError(f"{len(item_emb)} items but {len(owner)} owners")
    if not len(owner):
        return np.empty(0, dtype=np.float32)
    items = torch.from_numpy(np.ascontiguousarray(item_emb, dtype=np.float32)).to(device)
    queries = torch.from_numpy(np.ascontiguousarray(query_emb, dtype=np.float32)).to(device)
    own = torch.from_numpy(np.asarray(owner, dtype=np.int64))[:, None]
    return choice_scores(items, queries, torch.arange(len(owner))[:, None], own, block=chunk)[:, 0, 0].cpu().numpy()


def attack_sources(clean: list[tuple[str, list[str]]]) -> tuple[list[str], np.ndarray, list[set[str]]]:
    """The captions an attack perturbs, as RoCOCO does: the first ``N_PERTURBED`` of each image, normalised
    (``pre_caption``); each one's image (int64) and the image's normalised captions (candidates equal to
    one of them are not perturbations)."""
    sources, owner, forbidden = [], [], []
    for i, (_, caps) in enumerate(clean):
        norm = {pre_caption(c) for c in caps}
        for c in caps[:N_PERTURBED]:
            sources.append(pre_caption(c))
            owner.append(i)
            forbidden.append(norm)
    return sources, np.array(owner, dtype=np.int64), forbidden


def segment_winners(values: np.ndarray, ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per segment ``[ptr[i], ptr[i+1])``: the index of its largest value (the first among ties) and
    that value; -1 and -inf for an empty segment."""
    n = len(ptr) - 1
    best = np.full(n, -1, dtype=np.int64)
    top = np.full(n, -np.inf, dtype=np.float64)
    starts, sizes = ptr[:-1], np.diff(ptr)
    full = sizes > 0
    if not full.any():
        return best, top
    v = np.asarray(values, dtype=np.float64)
    s = starts[full]
    mx = np.maximum.reduceat(v, s)
    seg = np.repeat(np.arange(len(s)), sizes[full])
    idx = np.where(v == mx[seg], np.arange(len(v)), len(v))
    best[full] = np.minimum.reduceat(idx, s)
    top[full] = mx
    return best, top


# -- images -------------------------------------------------------------------------------------

def nearest_images(emb: np.ndarray, k: int, *, chunk: int = 1024) -> np.ndarray:
    """(n, min(k, n-1)) int64: each image's k most similar other images (dot product), most similar
    first, the lower index first among ties: the kernels' exact ``topk`` with each image excluded from
    its own list, ``chunk`` queries at a time."""
    n = len(emb)
    k = min(k, n - 1)
    if k < 1:
        raise UsageError(f"the image attack needs at least 2 images and k >= 1 (got {n} images, k={k})")
    e = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
    self_ptr, self_idx = torch.arange(n + 1), torch.arange(n)
    return topk(e, e, k, exclude_ptr=self_ptr, exclude_idx=self_idx, q_block=chunk)[1].numpy()


def image_candidates(images: list[str], neighbours: np.ndarray) -> list[tuple[int, int]]:
    """The (image, partner) pairs to alter, image by image, partners in neighbour order."""
    return [(i, int(j)) for i in range(len(images)) for j in neighbours[i]]


def pick_partners(margins: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Choose each image's partner from ``margins`` (n_images, k, n_captions_max) with NaN where an
    image has fewer captions: the candidate beating the original for the most captions, then with the
    largest mean margin, then the nearer neighbour. Returns (choice (n,) int64 in [0, k), wins (n,),
    mean margin (n,))."""
    n = len(margins)
    wins = (margins > 0).sum(2).astype(np.int64)  # NaN compares False
    mean = np.nanmean(margins, axis=2) if n else np.zeros((0, k))
    order = np.broadcast_to(np.arange(k), (n, k))
    choice = np.lexsort((order, -mean, -wins), axis=1)[:, 0] if n else np.zeros(0, dtype=np.int64)
    rows = np.arange(n)
    return choice.astype(np.int64), wins[rows, choice], mean[rows, choice]


def candidate_rel(path: str, partner: int) -> Path:
    """Relative path of the candidate altering ``path`` with image number ``partner``."""
    p = Path(path)
    return p.with_name(f"{p.stem}__{partner}.jpg")


def write_image_candidates(images_root: str | os.PathLike, image_paths: list[str], pairs: list[tuple[int, int]],
                           out_dir: str | os.PathLike, *, method: str, lam: float, seed: int, size: int = 384,
                           quality: int = 75, device: str = "cpu", batch: int = 64,
                           progress=None) -> tuple[list[Path], int]:
    """Write the altered copy of each (image, partner) pair with ``perturb images``' code (resize to
    ``size``, ``_alter_batch``, uint8 rounding, JPEG). Patch boxes: one per image, drawn in image order
    from ``RandomState(seed)``, shared by its candidates. Existing files are kept (resumable). Returns
    the candidates' paths (pair order) and how many were written. ``progress``: a ``progress(total=...,
    desc=...)`` factory (as ``hardrank.evaluate`` takes), advanced by each batch written."""
    root, out_dir = Path(images_root), Path(out_dir)
    rs = np.random.RandomState(seed)
    boxes = [_rand_box(rs, size, size, float(lam)) if method == "patch" else None for _ in image_paths]
    paths = [out_dir / candidate_rel(image_paths[i], j) for i, j in pairs]
    todo = [t for t, p in enumerate(paths) if not p.exists()]
    cache: dict[int, np.ndarray] = {}

    def img(i: int) -> np.ndarray:
        if i not in cache:
            if len(cache) > 4 * batch:
                cache.clear()
            cache[i] = _load(root / image_paths[i], size)
        return cache[i]

    by_box: dict[object, list[int]] = defaultdict(list)  # pairs sharing a box are altered in one batch
    for t in todo:
        by_box[boxes[pairs[t][0]]].append(t)
    bar = progress(total=len(todo), desc="write candidate images") if progress and todo else None
    try:
        for box, ts in by_box.items():
            for s in range(0, len(ts), batch):
                part = ts[s:s + batch]
                x = np.stack([img(pairs[t][0]) for t in part] + [img(pairs[t][1]) for t in part])
                xt = torch.from_numpy(x).to(device).permute(0, 3, 1, 2).float().div_(255)
                m = len(part)
                perm = torch.cat([torch.arange(m, 2 * m), torch.arange(m)]).to(device)
                y = _to_uint8(_alter_batch(xt, perm, method=method, lam=float(lam), box=box)).numpy()
                for r, t in enumerate(part):
                    _save_jpeg(y[r], paths[t], quality)
                if bar is not None:
                    bar.update(len(part))
    finally:
        if bar is not None:
            bar.close()
    return paths, len(todo)
