"""The input-kind contract: what one format declares (name, detection, what it yields) and what opening it gives.

An input kind is one module of ``hardrank.inputs.kinds`` holding one ``InputKind`` (``KIND``), listed once in
``hardrank.inputs.registry``. Opening a path gives a ``Source``: per modality its **items** (ids, and the
image refs or normalised captions a model embeds), or ids and precomputed **embeddings**
(``Embeddings``), which `mine --corpus/--queries` searches and `eval --embeddings` scores.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from hardrank import urls
from hardrank.errors import DataError
from hardrank.inputs.embedding_files import match_ids
from hardrank.items import Tables, text_key
from hardrank.text import pre_caption

__all__ = ["InputKind", "InputOptions", "Items", "Source", "Embeddings", "UnknownInput", "MODALITIES", "LazyList"]

MODALITIES = ("image", "text")


class UnknownInput(DataError):
    """A path no kind can read as it is (a folder without images, a listing without its columns): the
    registry adds what inputs may be."""


@dataclass(frozen=True)
class InputOptions:
    """What opening an input may need besides its path."""

    images: str | None = None   # root of relative image paths (Karpathy .json, Parquet listings)
    captions: str = "txt"       # where a sample's captions are (tar shards, img2dataset): txt | json:KEY


class LazyList(Sequence):
    """A list made on first use of its items (its length is known before): an embeddings input's ids and keys,
    which a mining corpus reads as Arrow columns instead (``Embeddings.columns``), never as Python strings."""

    def __init__(self, make, n: int):
        self._make, self._n, self._items = make, n, None

    def _list(self) -> list:
        if self._items is None:
            self._items = list(self._make())
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())


@dataclass
class Items:
    """Items of one modality of one input. Items sharing ``group`` are each other's positives
    (Karpathy: an image and its captions); ``group_key`` names the group across inputs."""

    ids: list[str]
    entries: list | None      # ImageRef / normalised caption; None when the input holds their embeddings
    group: np.ndarray         # (n,) int64
    group_key: list[str] | None = None  # None: the item's own content key
    keys: list[str] | None = None       # content keys ("" = unreadable); None: known once embedded
    known: list[str | None] | None = None  # content keys a reader computed already (a tar shard's scan)


@dataclass
class Source:
    """One opened input: its items per modality and how they relate."""

    kind: str                 # the InputKind's name (recorded in mining summaries)
    path: str
    items: dict[str, Items]
    embeddings: Embeddings | None = None  # precomputed vectors of the items; None: a model embeds the entries
    group_names: list[str] | None = None  # items pair by ``group``, named (Karpathy: image path; shards: sample id)
    paired: bool = False      # its modalities pair up by group: an image and its captions are each other's positives
    path_ids: bool = False    # image ids are file paths: a mining run names them relative to one root
    hint: str = ""            # added where a modality it lacks is asked for

    @classmethod
    def of_embeddings(cls, kind: str, path: str, emb: Embeddings, *, paired: bool = False) -> Source:
        """The items of an input holding embeddings: its ids and their keys, per modality. ``paired``: row i
        of each modality is one sample (its group is the image's key)."""
        items = {}
        for mod in emb.modalities:
            n = emb.count(mod)
            ids = LazyList(lambda m=mod: emb.ids(m), n)
            keys = LazyList(lambda m=mod: emb.keys(m), n)
            items[mod] = Items(ids=ids, entries=None, group=range(n), keys=keys)
        if paired and "image" in items:
            for it in items.values():
                it.group_key = items["image"].keys
        return cls(kind, str(path), items, emb, paired=paired)


class Embeddings:
    """Precomputed, L2-normalised vectors of an input, by id. A kind implements ``modalities``,
    ``ids`` and ``vectors``; the rest has defaults: keys as the store makes them (a caption's
    normalised text, an image's id), rows read by position, ids matched to a suite's items as
    ``eval --embeddings`` matches a Parquet file's."""

    dir: str | Path = ""      # where the vectors come from (named in messages)
    fingerprint: str = ""     # the model that made them when known, else content_id: mining refuses to mix two
    content_id: str = ""      # identity of the files' content (eval's model_fingerprint); "" = fingerprint
    modalities: tuple[str, ...] = ()
    # ``fingerprint`` names the model that made them (a store folder, an export carrying its model's
    # fingerprint); False: it names the files only, and which model made them is the user's word
    names_model: bool = False

    def ids(self, modality: str) -> list[str]:
        raise NotImplementedError

    def vectors(self, modality: str):
        """(n, d) float32 L2-normalised rows of ``modality`` in ``ids`` order: an array or a lazy array-like."""
        raise NotImplementedError

    def keys(self, modality: str) -> list[str]:
        """Content keys of the rows: the store's text key of the normalised caption, ``id:<id>`` for images."""
        ids = self.ids(modality)
        return [text_key(pre_caption(i)) for i in ids] if modality == "text" else [f"id:{i}" for i in ids]

    def count(self, modality: str) -> int:
        """Rows of ``modality`` (a kind that knows it without listing its ids says so)."""
        return len(self.ids(modality))

    def columns(self, modality: str, paired: bool = False):
        """(ids, keys, groups) Arrow string arrays of the rows of ``modality``, chunk after chunk in row order:
        the mining corpus's catalog (``mining.catalog``). ``groups``: the key of the row's group where it is
        not the row's own (``paired`` inputs: a caption's image), else null."""
        ids, keys = self.ids(modality), self.keys(modality)
        groups = self.keys("image") if paired and modality != "image" and "image" in self.modalities else None
        step = 1 << 20
        for s in range(0, len(ids), step):
            g = groups[s:s + step] if groups is not None else [None] * len(ids[s:s + step])
            yield (pa.array(ids[s:s + step], pa.string()), pa.array(keys[s:s + step], pa.string()),
                   pa.array(g, pa.string()))

    def read(self, modality: str, rows, *, lazy: bool = False):
        """(len(rows), d) vectors of these rows (repeats allowed). ``lazy``: the result may go to other
        processes; a kind that can returns a picklable view that reads on demand."""
        return np.asarray(self.vectors(modality)[np.asarray(rows, dtype=np.int64)], dtype=np.float32)

    def reread(self, modality: str, rows):
        """The rows ``read`` gives, read again from the input's files on each access, holding no copy of them
        (an array-like): the recall check's reference, independent of what loading made of the vectors. None
        (the default): ``read`` already reads the files as stored (a store's shards, memory-mapped parts)."""
        return None

    def for_tables(self, tables: Tables) -> dict[str, np.ndarray]:
        """Whole-table (rows, d) arrays for a suite's items, in table order; missing ids fail."""
        data = {m: (self.ids(m), np.asarray(self.vectors(m), dtype=np.float32)) for m in self.modalities}
        return match_ids(self.dir, data, tables)


class InputKind:
    """One input format. Subclasses set the class attributes and implement ``detect`` and ``open``
    (a kind yielding embeddings may implement ``embeddings`` instead of ``open``)."""

    name: str = ""            # recorded in mining summaries (inputs.corpus.kind)
    describe: str = ""        # a noun phrase for help and errors: "an image folder"
    yields: str = "items"     # items (image refs / captions + ids, embedded by a model) | embeddings (vectors + ids)
    by_id: bool = True        # embeddings: ids are names a suite can match (False: content keys only)
    remote: bool = False      # detect/open read URLs as they are; else they get a local copy (urls.fetch_input)
    suffixes: tuple[str, ...] = ()  # a file kind's suffixes: which URLs are worth a local copy to detect
    markers: tuple[str, ...] = ()   # a folder kind's marker entries: which folder URLs are worth a local copy

    def detect(self, path: str) -> bool:
        """Whether ``path`` (local unless ``remote``) is of this kind; cheap: a stat, a listing, a schema."""
        raise NotImplementedError

    def open(self, path: str, options: InputOptions) -> Source:
        if self.yields != "embeddings":
            raise NotImplementedError(f"input kind {self.name} implements no open()")
        return Source.of_embeddings(self.name, path, self.embeddings(path))

    def embeddings(self, path: str) -> Embeddings:
        raise DataError(f"{path}: {self.describe} holds no embeddings")

    def worth_fetching(self, url: str) -> bool:
        """Whether a URL may be of this kind (declared suffix or marker), so a local copy is made to detect it."""
        if self.suffixes:
            return url.endswith(self.suffixes)
        return bool(self.markers) and urls.is_dir(url) and any(urls.exists(urls.join(url, m)) for m in self.markers)
