"""WebDataset tar shards and img2dataset's three layouts (files, webdataset, parquet) read as samples.

A **sample** is what WebDataset calls one: the members of a tar that share a key (``000012.jpg``,
``000012.txt``, ``000012.json``), a group of files with one stem (img2dataset's ``files`` layout:
``00000/000012.jpg`` + ``.txt`` + ``.json``), or one row of img2dataset's Parquet (columns ``key``,
``url``, ``caption``, ``status``, and the image bytes in ``jpg``). Every sample gets:

- a human **id**: ``<shard>#<key>`` (the shard path relative to the shards' common folder, so
  ``00003.tar#000000345``), the image's relative path for files, ``<file>#<key>`` for Parquet. Results,
  failures and mining outputs show these ids;
- an **image uri** that any worker can read alone: a tar member's ``tar:<offset>:<size>:<shard>#<member>``
  (one range request: nothing is read by the driver, no shared filesystem is needed), a file path or
  URL, or a Parquet cell;
- its **texts** (``txt``, ``json``, ``cls`` members) for captions: ``--captions txt`` takes the ``.txt``
  (one caption per non-empty line; img2dataset writes one) or the Parquet ``caption`` column,
  ``--captions json:KEY`` takes ``KEY`` of the ``.json`` (a string or a list of strings) or the Parquet
  column ``KEY``;
- its small **arrays** (a ``.npy`` member, numbers only: DataComp's per-sample metadata such as a GeoDE image's
  region), as a flat list of floats.

Reading a tar shard is one streaming pass (``scan_shard``); the image bytes that pass through are hashed
on the way, so their content keys (the store's keys) cost no second read. A scan is cached under
``$HARDRANK_CACHE/wds_index`` by the shard's identity (URL, size, ETag or mtime): a rerun reads no shard
at all. A shard that is corrupt part-way (a bad header, truncated) keeps the samples before the damage;
the damage is recorded (``ShardScan.error``) and reported. A sample whose image bytes are not an image
fails at decode and is recorded and skipped like an unreadable file. With ``--executor ray`` the scans
run as Ray tasks (``scan_with``), so workers read their shards themselves.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import json
import logging
import os
import re
import tarfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank import urls
from hardrank.errors import DataError, UsageError
from hardrank.items import bytes_key, parquet_uri

__all__ = ["Sample", "ShardScan", "SampleSet", "IMAGE_EXTS", "scan_shard", "read_samples", "read_shards", "scan_with",
           "parse_captions", "sample_captions", "is_sample_source", "write_shard",
           "variant_shards"]

log = logging.getLogger("hardrank.wds")

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")  # the first present is the image
_TEXT_EXTS = ("txt", "json", "cls", "caption")
_ARRAY_EXTS = ("npy",)  # small numeric members, read as flat lists of floats (never with pickle)
_MAX_TEXT = 1 << 20
_MAX_ARRAY = 1 << 16
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's key/extension split: first dot of the basename
_SCAN_VERSION = 4  # 2: a file name repeated within a sample starts another sample (then refused by key); 3: a
# text member's byte-order mark dropped (a caption or cls written by a Windows editor); 4: .npy arrays read
_scanner: contextvars.ContextVar[Callable | None] = contextvars.ContextVar("hardrank_wds_scanner", default=None)


@dataclass
class Sample:
    id: str                       # human id (see the module docstring)
    key: str                      # the sample key (WebDataset __key__, img2dataset key)
    image: str | None             # uri of the image bytes; None: the sample has no image member
    image_key: str | None = None  # content key of the image bytes, when the reader hashed them
    texts: dict = field(default_factory=dict)  # ext/column -> text
    arrays: dict = field(default_factory=dict)  # ext -> a small numeric member's values (.npy), flattened


@dataclass
class ShardScan:
    shard: str
    samples: list[Sample]
    error: str | None = None      # where a damaged shard stopped being readable


@dataclass
class SampleSet:
    """The samples of a source, in order, and what reading them met."""

    layout: str                   # webdataset | files | parquet
    source: str
    samples: list[Sample]
    shards: list[str]
    errors: list[str] = field(default_factory=list)   # damaged shards (samples before the damage are kept)

    def meta(self) -> dict:
        return {"layout": self.layout, "source": self.source, "shards": len(self.shards),
                "samples": len(self.samples), "shard_errors": self.errors[:100]}


# -- which inputs are sample sources -------------------------------------------------------------------
def is_sample_source(spec: str | None) -> bool:
    """Whether ``spec`` names tar shards (``.tar`` after brace expansion) or img2dataset Parquet files."""
    if not spec:
        return False
    s = os.fspath(spec)
    first = urls.brace_expand(s)[0] if "{" in s else s
    return first.endswith((".tar", ".tar.gz", ".tgz")) or (("{" in s or "*" in s) and first.endswith(".parquet"))


# -- scanning a tar shard ------------------------------------------------------------------------------
def _cache_file(identity: str, hash_images: bool) -> Path:
    h = hashlib.blake2b(f"{_SCAN_VERSION}|{hash_images}|{identity}".encode(), digest_size=16).hexdigest()
    root = Path(os.environ.get("HARDRANK_CACHE") or Path.home() / ".cache" / "hardrank")
    return root / "wds_index" / f"{h}.json"


def scan_shard(shard: str, hash_images: bool = True, cache: bool = True) -> ShardScan:
    """Every sample of one tar shard (local path or URL) in order, its image as a member address, its
    texts inline and (``hash_images``) its image's content key. Cached by the shard's identity."""
    ident = urls.identity(shard)
    size = int(ident.rsplit("|", 2)[1])
    cf = _cache_file(ident, hash_images)
    if cache and cf.is_file():
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            d = json.loads(cf.read_text(encoding="utf-8"))
            return ShardScan(d["shard"], [Sample(**s) for s in d["samples"]], d.get("error"))
    scan = _scan(shard, hash_images, size)
    if cache:
        with contextlib.suppress(OSError):
            cf.parent.mkdir(parents=True, exist_ok=True)
            tmp = cf.with_name(f".{cf.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_text(json.dumps({"shard": scan.shard, "error": scan.error,
                                       "samples": [asdict(s) for s in scan.samples]}), encoding="utf-8")
            os.replace(tmp, cf)
    return scan


@contextlib.contextmanager
def _open_stream(shard: str) -> Iterator:
    path = urls.local_path(shard)
    if not urls.is_url(path):
        with open(path, "rb") as f:
            yield f
        return
    fs, p = urls.filesystem(path)
    try:
        f = fs.open(p, "rb", block_size=8 << 20, cache_type="readahead")
    except Exception as exc:
        raise urls.remote_error(path, exc, "opening the shard") from exc
    with f:
        yield f


def _scan(shard: str, hash_images: bool, size: int) -> ShardScan:
    samples: list[Sample] = []
    cur: dict | None = None
    error = None
    end = 0  # where the last member's data ends

    def close(c):
        if c is None:
            return
        img = next((c["members"][e] for e in IMAGE_EXTS if e in c["members"]), None)
        samples.append(Sample(id="", key=c["key"], image=img[0] if img else None,
                              image_key=img[1] if img else None, texts=c["texts"], arrays=c["arrays"]))

    try:
        with _open_stream(shard) as f:
            if shard.endswith((".gz", ".tgz")):
                raise UsageError(f"{shard}: compressed tar shards cannot be read by range; decompress them "
                                 f"(gunzip) so each image is one range of the .tar")
            tr = _TarReader(f)
            for name, off, msize in tr.members():
                base = name[2:] if name.startswith("./") else name
                km = _KEY_EXT.match(base)
                if km is None or Path(base).name.startswith("."):
                    continue
                key, ext = km.group(1), km.group(2).lower()
                end = off + msize
                # a file name already in the sample (KEY.jpg twice in a row) is another sample with the same
                # key, as older webdataset splits it (webdataset 1.0 raises): refused by key in read_shards
                if cur is None or cur["key"] != key or ext in cur["members"] or ext in cur["texts"] \
                        or ext in cur["arrays"]:
                    close(cur)
                    cur = {"key": key, "members": {}, "texts": {}, "arrays": {}}
                if ext in IMAGE_EXTS:
                    ikey = None
                    if hash_images:
                        data = tr.data()
                        ikey = bytes_key(data) if data else None
                    cur["members"][ext] = (urls.member_uri(shard, off, msize, base), ikey)
                elif ext in _TEXT_EXTS and msize <= _MAX_TEXT:
                    cur["texts"][ext] = tr.data().decode("utf-8-sig", "replace")
                elif ext in _ARRAY_EXTS and msize <= _MAX_ARRAY:
                    values = _array(tr.data())
                    if values is not None:
                        cur["arrays"][ext] = values
    except (tarfile.TarError, EOFError, OSError, ValueError, DataError) as exc:
        if isinstance(exc, (FileNotFoundError, UsageError)) or (isinstance(exc, DataError) and not samples
                                                                  and cur is None):
            raise
        lost = f"sample {cur['key']} and any after it are" if cur is not None else "any samples after them are"
        error = (f"{shard}: damaged after {len(samples)} complete sample(s) ({type(exc).__name__}: {exc}); those "
                 f"are used, {lost} lost: re-write or re-download the shard")
        log.warning("%s", error)
        cur = None  # its members may be cut short
    if error is None and size < -(-end // 512) * 512 + 1024:
        # tarfile ends a stream quietly at a cut header; a whole tar ends with two zero blocks after its data
        lost = f"sample {cur['key']} is" if cur is not None else "samples after them may be"
        error = (f"{shard}: truncated ({size} bytes; its last member ends at byte {end} and the end-of-archive "
                 f"marker is missing): {len(samples)} complete sample(s) are used, {lost} lost: re-write or "
                 f"re-download the shard")
        log.warning("%s", error)
        cur = None
    close(cur)
    return ShardScan(shard, samples, error)


def _array(data: bytes) -> list[float] | None:
    """A ``.npy`` member's numbers, flattened (None: not a numeric array; object arrays are never unpickled)."""
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError):
        return None
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "biuf":
        return None
    return a.astype(np.float64).ravel().tolist()


class _TarReader:
    """A forward-only reader of a tar stream's regular members (ustar, GNU long names, pax paths and sizes):
    ``members()`` yields (name, data offset, size); ``data()`` reads the current member's bytes, and what is
    not read is skipped (a seek on seekable files). tarfile's own stream mode copies its buffer on every
    header, which made a scan CPU-bound at ~130 MB/s; this one reads at disk speed."""

    def __init__(self, f):
        self.f = f
        self.pos = 0
        self._left = 0  # bytes of the current member's data (and padding) not read yet
        self._size = 0
        self._seek = getattr(f, "seekable", lambda: False)()

    def _read(self, n: int) -> bytes:
        b = self.f.read(n)
        while len(b) < n:
            more = self.f.read(n - len(b))
            if not more:
                break
            b += more
        self.pos += len(b)
        return b

    def _skip(self, n: int) -> None:
        if n <= 0:
            return
        if self._seek:
            self.f.seek(n, 1)
            self.pos += n
        else:
            while n > 0:
                got = len(self._read(min(n, 1 << 20)))
                if not got:
                    raise EOFError(f"truncated member data at byte {self.pos}")
                n -= got

    def data(self) -> bytes:
        """The current member's bytes (call once, before the next member)."""
        b = self._read(self._size)
        if len(b) < self._size:
            raise EOFError(f"truncated member data at byte {self.pos} ({len(b)} of {self._size} bytes)")
        self._left -= self._size
        self._size = 0
        return b

    def members(self):
        long_name, pax = None, {}
        while True:
            self._skip(self._left)
            self._left = self._size = 0
            start = self.pos
            hdr = self._read(512)
            if not hdr:
                return  # (a missing end-of-archive marker is judged by the caller from the shard's size)
            if len(hdr) < 512:
                raise EOFError(f"truncated header at byte {start}")
            if hdr == bytes(512):
                return  # end-of-archive
            info = tarfile.TarInfo.frombuf(hdr, "utf-8", "surrogateescape")  # checks the header checksum
            size, padded = info.size, -(-info.size // 512) * 512
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.XGLTYPE):
                body = self._read(padded)[:size]
                if len(body) < size:
                    raise EOFError(f"truncated extended header at byte {start}")
                if info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = body.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif info.type == tarfile.XHDTYPE:
                    pax = _pax(body)
                continue
            name = pax.get("path") or long_name or info.name
            size = int(pax.get("size", size))
            padded = -(-size // 512) * 512
            long_name, pax = None, {}
            self._left, self._size = padded, 0
            if info.type in tarfile.REGULAR_TYPES:
                self._size = size
                yield name, start + 512, size


def _pax(body: bytes) -> dict:
    """A pax extended header's records (``<length> <key>=<value>\\n``)."""
    out, i = {}, 0
    while i < len(body):
        sp = body.index(b" ", i)
        n = int(body[i:sp])
        key, _, value = body[sp + 1:i + n - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        i += n
    return out


@contextlib.contextmanager
def scan_with(mapper: Callable | None):
    """Run shard scans with ``mapper(fn, shards) -> results`` inside the block (the Ray executor maps
    them onto Ray tasks, so workers read the shards); None: threads in this process."""
    token = _scanner.set(mapper)
    try:
        yield
    finally:
        _scanner.reset(token)


def _scan_all(shards: list[str], hash_images: bool) -> list[ShardScan]:
    mapper = _scanner.get()
    if mapper is not None:
        return list(mapper(scan_shard, shards, hash_images))
    with ThreadPoolExecutor(min(8, max(1, len(shards)))) as pool:
        return list(pool.map(lambda s: scan_shard(s, hash_images), shards))


# -- the three layouts ---------------------------------------------------------------------------------
def _common_dir(names: list[str]) -> str:
    if len(names) == 1:
        return names[0].rsplit("/", 1)[0] if "/" in names[0] else ""
    return os.path.commonpath(names) if not urls.is_url(names[0]) else _url_common(names)


def _url_common(names: list[str]) -> str:
    parts = [n.split("/") for n in names]
    common = []
    for xs in zip(*parts):
        if len(set(xs)) != 1:
            break
        common.append(xs[0])
    return "/".join(common[:len(min(parts, key=len)) - 1])


def _rel(name: str, root: str) -> str:
    return name[len(root):].lstrip("/") if root and name.startswith(root) else name


def variant_shards(ss: SampleSet, folder: str, variant: str) -> list[str]:
    """The shard names of ``variant`` for the shards of ``ss``, under ``folder`` (default their folder)."""
    root = _common_dir(ss.shards)
    return [urls.join(folder or root, variant, _rel(s, root)) for s in ss.shards]


def read_samples(spec: str, *, hash_images: bool = True) -> SampleSet:
    """The samples of tar shards (a pattern: ``dir/{00000..00099}.tar``, globs allowed; local or URL),
    an img2dataset ``files`` folder, or img2dataset Parquet files (a ``.parquet`` file or pattern)."""
    spec = urls.local_path(os.fspath(spec))
    first = urls.brace_expand(spec)[0]
    if first.endswith((".tar", ".tar.gz", ".tgz")):
        return read_shards(urls.expand(spec), hash_images=hash_images, source=spec)
    if first.endswith(".parquet"):
        files = urls.expand(spec, what="parquet files")
        return _parquet_samples(spec, files)
    if urls.is_dir(spec):
        return _files_samples(spec)
    if not urls.exists(spec):
        raise FileNotFoundError(f"{spec} does not exist (expected tar shards such as dir/{{00000..00009}}.tar, "
                                f"an img2dataset folder, or .parquet files)")
    raise DataError(f"{spec}: not a sample source; expected tar shards (dir/{{00000..00009}}.tar), an img2dataset "
                    f"output folder (files layout: 00000/000000001.jpg + .txt + .json), or img2dataset .parquet "
                    f"files with image bytes")


def read_shards(shards: list[str], *, hash_images: bool = True, source: str | None = None) -> SampleSet:
    """The samples of these tar shards, in order (ids ``<shard relative to their common folder>#<key>``)."""
    shards = [s if urls.is_url(s) else os.path.abspath(s) for s in shards]
    scans = _scan_all(shards, hash_images)
    root = _common_dir(shards)
    samples = []
    for sc in scans:
        _refuse_repeated_keys(sc.shard, sc.samples, "shard")
        name = _rel(sc.shard, root)
        for s in sc.samples:
            s.id = f"{name}#{s.key}"
            samples.append(s)
    return SampleSet("webdataset", source or ",".join(shards), samples, shards, [sc.error for sc in scans if sc.error])


def _refuse_repeated_keys(container: str, samples: list[Sample], what: str) -> None:
    """Two samples of one shard (or Parquet file) under one key would be two items with one id
    (``<shard>#<key>``), and a caption variant or altered image joined by key could land on either: a
    DataError naming both (their positions in the shard, and where their images are)."""
    first: dict[str, int] = {}
    for i, s in enumerate(samples):
        j = first.setdefault(s.key, i)
        if j != i:
            where = [f"sample {n}" + (f" (image {_member_name(samples[n].image)})" if samples[n].image else "")
                     for n in (j, i)]
            raise DataError(f"{container}: two samples have the key {s.key!r}: {where[0]} and {where[1]} of the "
                            f"{what}; a key names one sample (WebDataset groups a sample's files by it, and hardrank "
                            f"names a sample <{what}>#<key>): re-write the {what} with unique keys")


def _member_name(uri: str) -> str:
    """A tar member uri as ``name at byte offset``; other uris as they are."""
    if not urls.is_member_uri(uri):
        return uri
    _, off, _, member = urls.parse_member_uri(uri)
    return f"{member} at byte {off}"


def _files_samples(folder: str) -> SampleSet:
    files = urls.list_files(folder)
    root = urls.local_path(folder).rstrip("/")
    groups: dict[str, dict] = {}
    for f in files:
        rel = _rel(f, root)
        km = _KEY_EXT.match(rel)
        if km is None or Path(rel).name.startswith("."):
            continue
        groups.setdefault(km.group(1), {})[km.group(2).lower()] = f
    samples = []
    for stem in sorted(groups):
        g = groups[stem]
        img_ext = next((e for e in IMAGE_EXTS if e in g), None)
        if img_ext is None:
            if set(g) & {"jpg", "txt"} or "json" in g and "txt" in g:
                samples.append(Sample(id=stem, key=stem.rsplit("/", 1)[-1], image=None))
            continue
        texts = {}
        for e in _TEXT_EXTS:
            if e in g:
                texts[e] = urls.read_bytes(g[e]).decode("utf-8-sig", "replace")
        samples.append(Sample(id=f"{stem}.{img_ext}", key=stem.rsplit("/", 1)[-1], image=g[img_ext], texts=texts))
    if not samples:
        raise DataError(f"{folder}: holds no images ({', '.join(IMAGE_EXTS)}); expected img2dataset's files "
                        f"layout (00000/000000001.jpg + .txt + .json)")
    return SampleSet("files", folder, samples, [folder])


_PARQUET_IMAGE_COLUMNS = ("jpg", "jpeg", "png", "webp", "image")


def _parquet_samples(spec: str, files: list[str]) -> SampleSet:
    root = _common_dir(files)
    samples, errors = [], []
    for f in files:
        local = urls.fetch_input(f, what="parquet file")
        try:
            schema = pq.read_schema(local)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{f}: not a readable Parquet file ({exc}); expected img2dataset's parquet "
                            f"output") from None
        col = next((c for c in _PARQUET_IMAGE_COLUMNS if c in schema.names), None)
        if col is None:
            raise DataError(f"{f}: no image bytes column (one of {list(_PARQUET_IMAGE_COLUMNS)}); it has "
                            f"{schema.names}. img2dataset writes them with --output_format parquet")
        text_cols = [c for c in schema.names if schema.field(c).type in (pa.string(), pa.large_string())]
        t = pq.read_table(local, columns=[c for c in schema.names if c != col])
        n = t.num_rows
        keys = t.column("key").to_pylist() if "key" in t.column_names else [str(i) for i in range(n)]
        status = t.column("status").to_pylist() if "status" in t.column_names else [None] * n
        cols = {c: t.column(c).to_pylist() for c in text_cols if c in t.column_names}
        name = _rel(f, root)
        for i in range(n):
            ok = status[i] in (None, "success")
            samples.append(Sample(id=f"{name}#{keys[i]}", key=str(keys[i]),
                                  image=parquet_uri(local, i, col) if ok else None,
                                  texts={c: v[i] for c, v in cols.items() if v[i] is not None}))
        _refuse_repeated_keys(f, samples[len(samples) - n:], "file")
    return SampleSet("parquet", spec, samples, files, errors)


# -- captions ----------------------------------------------------------------------------------------
def parse_captions(spec: str) -> tuple[str, str | None]:
    """``txt`` -> ("txt", None); ``json:KEY`` -> ("json", KEY); anything else raises naming the forms."""
    if spec == "txt":
        return "txt", None
    if spec.startswith("json:") and len(spec) > 5:
        return "json", spec[5:]
    raise UsageError(f"option captions (--captions) must be 'txt' (the .txt member, one caption per line) or "
                     f"'json:KEY' (KEY of the .json member: a string or a list of strings), got {spec!r}")


def sample_captions(sample: Sample, how: tuple[str, str | None]) -> list[str]:
    """The captions of a sample as ``parse_captions`` names them ([] when it has none)."""
    kind, key = how
    if kind == "txt":
        text = sample.texts.get("txt", sample.texts.get("caption"))
        if text is None:
            return []
        return [line.strip() for line in str(text).splitlines() if line.strip()]
    if key in sample.texts and "json" not in sample.texts:  # a Parquet column of that name
        v = sample.texts[key]
    else:
        raw = sample.texts.get("json")
        if raw is None:
            return []
        try:
            v = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise DataError(f"{sample.id}: the .json member is not valid JSON") from None
        v = v.get(key) if isinstance(v, dict) else None
    if isinstance(v, str):
        return [v] if v.strip() else []
    if isinstance(v, list):
        return [c for c in v if isinstance(c, str) and c.strip()]
    return []


# -- writing shards ------------------------------------------------------------------------------------
def write_shard(url: str, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    """Write one tar shard of ``(key, {ext: bytes})`` samples, atomically: to a hidden temporary beside a
    local target then renamed, or uploaded as one object (``hardrank.urls.put_file``)."""
    target = urls.local_path(url)
    remote = urls.is_url(target)
    if remote:
        tmp = Path(urls._cache_root()) / "uploads" / f".{uuid.uuid4().hex}.tar"
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(target).with_name(f".{Path(target).name}.{uuid.uuid4().hex}.tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
            for key, members in samples:
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    info.mtime = 0  # reproducible shards: same samples, same bytes
                    tf.addfile(info, io.BytesIO(data))
        if remote:
            urls.put_file(tmp, target)
        else:
            os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()

