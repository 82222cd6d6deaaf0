"""Unique-item tables: every image and text a run needs, deduplicated, with content keys."""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import io
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError

from hardrank import urls
from hardrank.errors import DataError, UsageError

__all__ = ["ImageRef", "ItemTable", "Tables", "read_image_bytes", "prefetched", "bytes_key", "text_key",
           "failure_reason", "map_rows"]

_PARQUET_SCHEME = "parquet://"


@dataclass(frozen=True)
class ImageRef:
    """Where an image's bytes live and which derived variant of it we want.

    uri: a file path, an fsspec URL (``s3://bucket/a.jpg``), a tar member (``tar:<offset>:<size>:<shard>#<member>``,
         ``hardrank.urls.member_uri``), or ``parquet://<file>#<row>/<column>`` for images stored as bytes
         or Hugging Face image structs (``{bytes, path}``) inside a Parquet file.
    crop: (x, y, w, h) box in pixels applied after decoding (ARO / hard-positives SWAP), or None.
    """

    uri: str
    crop: tuple[float, float, float, float] | None = None

    @property
    def recipe(self) -> str:
        if self.crop is None:
            return ""
        return "crop:" + ",".join(f"{v:g}" for v in self.crop)


def parquet_uri(file: str | os.PathLike, row: int, column: str) -> str:
    return f"{_PARQUET_SCHEME}{os.fspath(file)}#{row}/{column}"


_parquet_cache: dict[str, object] = {}
_prefetched: dict[str, bytes] = {}  # bytes a decode stage read ahead for its batch (see ``prefetched``)


@contextlib.contextmanager
def prefetched(data: dict[str, bytes]):
    """Serve ``read_image_bytes(uri)`` from ``data`` (uri -> bytes) inside the block: a decode stage
    reads a batch's bytes at once (one range request per run of tar members), hashes them, and every
    decoder then decodes those very bytes without reading them again."""
    _prefetched.update(data)
    try:
        yield
    finally:
        for u in data:
            _prefetched.pop(u, None)


def read_image_bytes(uri: str) -> bytes:
    """Raw encoded bytes of an image (file, URL, tar member or Parquet cell). Raises
    FileNotFoundError/ValueError naming the source."""
    data = _prefetched.get(uri)
    if data is not None:
        return data
    if urls.is_member_uri(uri) or urls.is_url(uri):
        return urls.read_source(uri)
    if not uri.startswith(_PARQUET_SCHEME):
        with open(urls.local_path(uri), "rb") as f:
            return f.read()
    file, _, cell = uri[len(_PARQUET_SCHEME):].rpartition("#")
    row_s, _, column = cell.partition("/")
    table = _parquet_cache.get(file)
    if table is None:
        table = pq.read_table(file, memory_map=True)
        _parquet_cache[file] = table
    value = table.column(column)[int(row_s)].as_py()
    if isinstance(value, dict):
        value = value.get("bytes")
    if not value:
        raise DataError(f"{file}: row {row_s} column {column!r} holds no image bytes")
    return value


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def failure_reason(exc: BaseException) -> str:
    """Why an item failed, as recorded in results: the same text on every run (object addresses
    such as ``<_io.BytesIO object at 0x7f...>`` removed)."""
    return _ADDRESS.sub("", f"{type(exc).__name__}: {exc}")


def text_key(text: str) -> str:
    """Content key of a text: hash of the exact string fed to the tokenizer."""
    return "t" + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def bytes_key(data: bytes, recipe: str = "") -> str:
    """Content key of an image: hash of its encoded bytes, plus the derived-variant recipe."""
    return "i" + hashlib.blake2b(data, digest_size=16).hexdigest() + (("@" + recipe) if recipe else "")


def map_rows(fn, rows, threads: int, chunk: int = 64) -> list:
    """``[fn(r) for r in rows]`` in ``threads`` threads, ``chunk`` rows per task. ``ThreadPoolExecutor.map``
    ignores its ``chunksize``: one future per row cost more than reading and hashing a small image
    (0.14 s against 0.03 s per 1,000 64 px JPEGs). A short list still spreads over every thread (remote
    reads wait on latency, not on a core)."""
    rows = list(rows)
    if threads <= 1 or len(rows) <= 1:
        return [fn(r) for r in rows]
    chunk = max(1, min(chunk, -(-len(rows) // threads)))
    with ThreadPoolExecutor(threads) as pool:
        parts = pool.map(lambda lo: [fn(r) for r in rows[lo:lo + chunk]], range(0, len(rows), chunk))
        return [out for part in parts for out in part]


def _image_key(ref: ImageRef) -> str:
    data = read_image_bytes(ref.uri)
    if not data:
        raise DataError(f"{ref.uri}: empty file (0 bytes; an interrupted download?)")
    return bytes_key(data, ref.recipe)


class ItemTable:
    """Deduplicated items of one modality. Entries are ``ImageRef`` (images) or ``str`` (texts,
    already normalised). ``add`` returns the row index; equal entries share a row."""

    def __init__(self, modality: str):
        if modality not in ("image", "text"):
            raise UsageError(f"modality must be 'image' or 'text', got {modality!r}")
        self.modality = modality
        self.entries: list = []
        self.ids: list[str] = []  # id as the annotation file writes it (first seen); for --embeddings
        self._index: dict = {}
        self._keys: list[str] | None = None
        self._known: dict[int, str] = {}  # row -> content key a reader already computed (a tar shard's scan)
        self.failed: dict[int, str] = {}  # row -> reason (unreadable image), filled by keys()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry, id: str | None = None, key: str | None = None) -> int:
        """Row of ``entry`` (added if new). ``id`` defaults to the text itself or the image uri; ``key``
        is its content key when the caller hashed its bytes already (then ``keys`` does not read it)."""
        row = self._index.get(entry)
        if row is None:
            row = len(self.entries)
            self._index[entry] = row
            self.entries.append(entry)
            self.ids.append(id if id is not None else (entry if isinstance(entry, str) else entry.uri))
            self._keys = None
        if key:
            self._known[row] = key
        return row

    def truncate(self, n: int) -> None:
        """Forget the rows added after the first ``n`` (a suite that failed to load half-way leaves none)."""
        for entry in self.entries[n:]:
            del self._index[entry]
        del self.entries[n:], self.ids[n:]
        self._known = {r: k for r, k in self._known.items() if r < n}
        self.failed = {r: w for r, w in self.failed.items() if r < n}
        if self._keys is not None:
            del self._keys[n:]

    def known_keys(self) -> dict[int, str]:
        """Rows whose content key is known without reading their bytes (row -> key)."""
        return dict(self._known)

    def set_keys(self, keys: list[str]) -> None:
        """Use ``keys`` as the table's keys (``hardrank.store.idkeys``: keys decided without reading bytes);
        the list is kept, so keys learned later (by the workers that decode) update it in place."""
        if len(keys) != len(self.entries):
            raise ValueError(f"got {len(keys)} keys for {len(self.entries)} rows")
        self._keys = keys

    def add_many(self, entries, ids=None) -> np.ndarray:
        if ids is None:
            return np.fromiter((self.add(e) for e in entries), dtype=np.int64)
        return np.fromiter((self.add(e, i) for e, i in zip(entries, ids)), dtype=np.int64)

    def keys(self, threads: int = 8) -> list[str]:
        """Content keys, computed once (images: bytes hash + recipe, read in threads). An image
        that cannot be read (missing, empty) gets key ``""``, which no store ever holds, and its
        reason in ``self.failed`` under its row: failures are keyed by row, never by content."""
        if self._keys is not None and len(self._keys) == len(self.entries):
            return self._keys
        if self.modality == "text":
            self._keys = [text_key(t) for t in self.entries]
            return self._keys

        def one(row_ref):
            row, ref = row_ref
            if row in self._known:
                return self._known[row], None
            try:
                return _image_key(ref), None
            except (OSError, ValueError) as exc:
                return "", failure_reason(exc)

        out = map_rows(one, enumerate(self.entries), threads)
        self._keys = [k for k, _ in out]
        self.failed = {row: why for row, (_, why) in enumerate(out) if why}
        return self._keys


@dataclass
class Tables:
    """The image and text tables shared by every suite of one run."""

    images: ItemTable
    texts: ItemTable

    @classmethod
    def empty(cls) -> Tables:
        return cls(ItemTable("image"), ItemTable("text"))

    def of(self, modality: str) -> ItemTable:
        return self.images if modality == "image" else self.texts


_MAGIC = ((b"%PDF", "a PDF document"), (b"PK\x03\x04", "a ZIP archive"), (b"\x1f\x8b", "gzip-compressed data"),
          (b"\x7fELF", "an executable (ELF)"), (b"\x1aE\xdf\xa3", "a WebM/Matroska video"))
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis")


def _file_kind(data: bytes) -> str:
    """What kind of file ``data`` is, for the message of a file that is no image: named from its signature
    or its text, never quoted (an annotation file may name ``/etc/passwd``; results and logs get no line of it)."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[257:262] == b"ustar":
        return "a tar archive"
    if data[4:8] == b"ftyp":
        return ("a HEIF/AVIF image this Pillow cannot read (convert it, or install a Pillow plugin for it)"
                if data[8:12] in _HEIF_BRANDS else "an MP4/QuickTime video")
    head = data[:4096]
    try:  # (not final when the head was cut: a character cut in two at its end is no error)
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) == len(data))
    except UnicodeDecodeError:
        return "binary data of an unrecognised format"
    if "\0" in text:
        return "binary data of an unrecognised format"
    start = text.lstrip().lower()
    if start.startswith(("<!doctype html", "<html")) or "<html" in start[:1024]:
        return "an HTML page (a failed download's error or login page?)"
    if "<svg" in start[:1024]:
        return "an SVG drawing (vector graphics: render it to PNG first)"
    if start.startswith("<?xml"):
        return "an XML document"
    if start.startswith(("{", "[")):
        return "JSON text"
    return "a text file"


def decode_image(ref: ImageRef, data: bytes | None = None, draft=None):
    """The PIL image the model's transform receives: the Pillow reference decoder.

    Uncropped, it is ``Image.open``'s image in its own mode (palette, alpha, 1-bit, 16-bit, CMYK, YCbCr,
    float; a GIF's first frame), loaded: open_clip's eval transform resizes and crops in that mode and
    converts to RGB after, so converting here first would give other pixels (a palette image resized
    with nearest, alpha resampled premultiplied, 16-bit values resampled before they are clipped).
    That is ``preprocess(Image.open(path))``, as open_clip's users run it. A cropped ref (an ARO or
    hard-positive region) is converted to RGB first and then cropped, as ARO's reference loader does
    (``Image.open(p).convert('RGB').crop(box)``); its padding outside the image is black.

    draft: None (the reference), or ``draft(width, height) -> (w, h) | None``, the smallest size the
    caller needs from a JPEG of that size: the JPEG is then decoded at 1/2, 1/4 or 1/8 scale (libjpeg's
    scaled IDCT, Pillow's ``draft``) when that still covers it. Not applied to cropped refs or to other
    formats; it changes pixels whenever it reduces (see ``PillowDecoder``'s ``draft``)."""

    data = read_image_bytes(ref.uri) if data is None else data
    if not data:
        raise DataError(f"{ref.uri}: empty file (0 bytes; an interrupted download?)")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:  # Pillow's message names a BytesIO object, not the file
        raise DataError(f"{ref.uri}: not an image Pillow can read; {len(data)} bytes: {_file_kind(data)}") from None
    if draft is not None and ref.crop is None and img.format == "JPEG":
        need = draft(*img.size)
        if need is not None:
            img.draft(None, need)  # largest 1/2^k scale whose size still covers `need`; no-op below 2x
    img.load()  # decode now: a truncated file fails here, where its failure is recorded
    if ref.crop is None:
        return img
    if img.mode != "RGB":  # convert("RGB") of an RGB image would only copy it
        img = img.convert("RGB")
    x, y, w, h = ref.crop
    return img.crop((int(x), int(y), int(x + w), int(y + h)))


def resolve(root: str | os.PathLike, rel: str) -> str:
    return os.fspath(Path(root) / rel)
