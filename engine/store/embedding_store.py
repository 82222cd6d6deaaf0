"""Arrow embedding store: one folder per model fingerprint, checksummed atomic shards keyed by content."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pwd
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from hardrank.atomic import atomic_path, named_when_full, why_unwritable, write_json_atomic
from hardrank.errors import DataError, NoSpace, UsageError
from hardrank.store.key_index import KeyIndex, as_string_array

__all__ = ["EmbeddingStore", "MissingKeys", "embedding_schema", "open_store", "is_store_folder", "SCHEMA_VERSION",
           "READS", "check_version", "reads_version"]

log = logging.getLogger("hardrank.store.embedding_store")

SCHEMA_VERSION = 1  # the store format this code writes: in each shard's schema metadata and in the manifest
# The compatibility rule. Every manifest and shard records the store format version that wrote it (manifest
# "schema_version", shard schema metadata "hardrank_schema"); one without a record is of version 1. A folder
# of a version this code reads (READS: every layout hardrank has written, checksummed shards and those from
# before checksums alike) is read as it is: nothing in it is moved, rewritten or encoded again because of
# its version. A newer version, or one no hardrank writes, is refused when the folder (or a shard of it) is
# opened, before anything in it is moved or written: one line naming the folder, its version, the versions
# read here and the fix. Damage is another matter: a shard of a readable version that fails its checksum is
# moved to quarantine/ (never deleted) and its items encoded again.
READS = (1,)
_DTYPES = {"float16": pa.float16(), "float32": pa.float32()}
_MODALITIES = ("image", "text")
_DIGEST = b"hardrank_digest"  # schema metadata of each shard: the checksum of its rows
_LOCK_NAME = ".lock"
_QUARANTINE = "quarantine"


class MissingKeys(DataError, KeyError):
    """Keys asked of ``EmbeddingStore.read`` that the store does not hold (a KeyError too)."""

    __str__ = Exception.__str__  # KeyError's would quote the whole message


def embedding_schema(dim: int, dtype: str) -> pa.Schema:
    """The one place the store's row schema is built: ``key`` + ``embedding`` as a
    ``fixed_size_list<dtype>[dim]`` (never a variable ``list``)."""
    if dtype not in _DTYPES:
        raise UsageError(f"store dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return pa.schema(
        [pa.field("key", pa.string(), nullable=False),
         pa.field("embedding", pa.list_(pa.field("item", _DTYPES[dtype], nullable=False), dim), nullable=False)],
        metadata={"hardrank_schema": str(SCHEMA_VERSION)},
    )


def _version(raw) -> int | None:
    """A recorded version as an integer (None: not one)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        return int(text.strip())
    except ValueError:
        return None


def reads_version(raw) -> bool:
    """Whether a recorded store format version (None: none recorded, version 1) is one this code reads."""
    return raw is None or (not isinstance(raw, (bool, float)) and _version(raw) in READS)


def check_version(raw, folder: Path, where: str) -> None:
    """Refuse a store folder whose ``where`` (its manifest, or a shard) records a store format version this
    code does not read (``READS``): a DataError naming the folder, the version and the fix. ``raw``: the
    recorded value (None: none recorded, version 1)."""
    if reads_version(raw):
        return
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    version = _version(raw)
    reads = ", ".join(map(str, READS))
    if version is not None and version > max(READS):
        raise DataError(f"store folder {folder}: {where} is in store format version {version}, written by a newer "
                        f"hardrank; this one reads version {reads}: upgrade hardrank to use these embeddings, or "
                        f"pass another --store (nothing in the folder was changed)")
    raise DataError(f"store folder {folder}: {where} records store format version {text!r}, which no hardrank "
                    f"writes (this one reads version {reads}); the folder was not written by hardrank or was "
                    f"edited: pass another --store, or move the folder away to start it afresh (nothing in it "
                    f"was changed)")


def _digest(keys, emb: np.ndarray) -> str:
    """Checksum of a shard's rows: its keys (joined by NUL, UTF-8) and the raw bytes of its (n, dim)
    embeddings. ``keys``: a list of str or an Arrow string array (hashed from its buffers, no str objects)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{len(keys)}|{emb.shape[1] if emb.ndim == 2 else 0}|{emb.dtype.str}|".encode())
    h.update(_joined_keys(as_string_array(keys)))
    h.update(np.ascontiguousarray(emb))
    return "blake2b:" + h.hexdigest()


def _joined_keys(arr: pa.Array) -> np.ndarray:
    """The bytes of ``"\\0".join(keys).encode()`` built from the array's buffers."""
    if len(arr) == 0:
        return np.zeros(0, np.uint8)
    width = 8 if pa.types.is_large_string(arr.type) else 4
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if width == 8 else np.int32, count=len(arr) + 1,
                        offset=arr.offset * width).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return np.insert(data[off[0]:off[-1]], off[1:-1] - off[0], 0)


# -- one lock per store folder, shared by every EmbeddingStore object of this process -------------
class _FolderLock:
    """An exclusive ``flock`` on ``<folder>/.lock``, re-entrant within this process (threads and
    store objects of one folder share it). The kernel drops it when the holder dies, even by kill -9."""

    def __init__(self, path: Path):
        self.path = path
        self.mutex = threading.RLock()
        self.depth = 0
        self.fd: int | None = None

    @contextlib.contextmanager
    def held(self, wait: bool = True) -> Iterator[bool]:
        """Yields True once held; with ``wait=False`` yields False at once if another process holds it."""
        with self.mutex:
            if self.depth == 0:
                holder = f"pid {os.getpid()} on {os.uname().nodename}\n".encode()
                try:
                    with named_when_full(self.path, len(holder)):  # no inode left
                        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
                except NoSpace:
                    raise
                except OSError as exc:
                    raise DataError(f"cannot create the lock file {self.path} of the store ({exc.strerror or exc}); "
                                    f"the store must be on a writable filesystem") from None
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        if not wait:
                            os.close(fd)
                            yield False
                            return
                        other = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                        log.warning("store %s is being written by %s; waiting for it to finish (its items will "
                                    "then come from the store)", self.path.parent, other)
                        fcntl.flock(fd, fcntl.LOCK_EX)
                    with named_when_full(self.path, len(holder)):
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, holder, 0)
                except BaseException:
                    os.close(fd)
                    raise
                self.fd = fd
            self.depth += 1
            try:
                yield True
            finally:
                self.depth -= 1
                if self.depth == 0:
                    fd, self.fd = self.fd, None
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, 0)
                    os.close(fd)  # closing releases the flock


_LOCKS: dict[str, _FolderLock] = {}
_LOCKS_MUTEX = threading.Lock()

# shard file identity (device, inode, size, mtime) -> checksum verdict: each shard is verified once
# per process, however many store objects read it
_VERIFIED: dict[tuple, bool] = {}


def _owner(path: Path) -> str:
    """``, owned by user NAME`` when another user owns ``path`` (a shared store), else empty."""
    with contextlib.suppress(OSError):
        uid = path.stat().st_uid
        if uid != os.geteuid():
            try:
                return f", owned by user {pwd.getpwuid(uid).pw_name}"
            except KeyError:
                return f", owned by uid {uid}"
    return ""


def _file_id(path: Path) -> tuple:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Shard:
    name: str
    path: Path
    keys: pa.Array             # (n,) Arrow strings, memory-mapped: no Python str per key
    emb: np.ndarray            # (n, dim), memory-mapped
    digest: str | None         # None: written before shards carried checksums
    file_id: tuple | None
    verified: bool = False


class EmbeddingStore:
    """Embeddings of one model fingerprint, for images and texts.

    Layout: ``root/<fingerprint>/{image,text}/shard-*.arrow`` plus ``manifest.json``. A shard is
    written to a temporary name and renamed, so a killed writer leaves no half shard; the shard
    files on disk are the truth (the manifest, rewritten atomically after each shard, is a
    readable summary, rebuilt from the shards when missing or unreadable). Rows are joined on
    ``key``, never on row order. Reads are memory-mapped.

    Key index (``hardrank.store.key_index.KeyIndex``): 8 bytes a row, no Python object per key: the keys
    stay in the shards' memory-mapped Arrow columns, sorted hash prefixes find candidates and the
    stored strings confirm them. A shard is one block of the index; shards appended (by this object
    or, seen by ``refresh``, by other writers) are added to it, a shard set aside rebuilds it.

    Integrity: each shard's schema metadata carries a blake2b checksum of its keys and embedding
    bytes, written in the same atomic file. ``verify`` (called by ``read``, and by the embed
    pipeline before it decides what to encode) checks each shard holding a requested key once per
    process (one pass over the shard's bytes); a shard that fails is moved to
    ``<fingerprint>/quarantine/`` and its keys count as missing, so they are encoded again.

    Writers: ``lock()`` holds an exclusive lock on the folder (``.lock``, ``flock``); ``write``
    takes it, and the embed pipeline holds it from deciding what is missing until its last shard
    is committed, so concurrent runs on one store never encode an item twice and never drop each
    other's shards from the manifest. Readers need no lock.

    ``readonly``: create, move or rewrite nothing (dry runs, store folders given as inputs). A folder
    this process cannot write (another user's, a read-only mount) opens read-only too, its reason in
    ``unwritable``: it serves the embeddings it holds, and the embed pipeline refuses, before encoding,
    a run that would have to add some.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: str, *, dim: int, dtype: str,
                 meta: dict | None = None, readonly: bool = False):
        self.dir = Path(root) / fingerprint
        self.fingerprint = fingerprint
        self.dim = int(dim)
        self.dtype = dtype
        self.schema = embedding_schema(self.dim, dtype)
        self.meta = dict(meta or {})
        self.readonly = readonly
        self.unwritable: str | None = None  # why this process cannot write the folder (it is then read-only)
        self._shards: dict[str, list[_Shard]] = {m: [] for m in _MODALITIES}
        self._index: dict[str, KeyIndex] = {m: KeyIndex() for m in _MODALITIES}
        self.quarantined: list[str] = []  # shard paths moved aside by this object
        manifest = self._read_manifest()
        if manifest is not None:  # before anything else is read or written (the compatibility rule: READS)
            check_version(manifest.get("schema_version"), self.dir, "manifest.json")
        if manifest is not None and (manifest.get("dim"), manifest.get("dtype")) != (self.dim, self.dtype):
            raise DataError(
                f"{self.dir / 'manifest.json'}: store holds dim={manifest.get('dim')} dtype={manifest.get('dtype')}, "
                f"but this model gives dim={self.dim} dtype={self.dtype}; the fingerprint should differ: delete "
                f"{self.dir} if it is stale")
        if not readonly:
            if self.dir.exists() and not self.dir.is_dir():
                raise UsageError(f"store folder {self.dir} is a file; pass a --store folder (or remove the file)")
            self.unwritable = self._why_unwritable()
            self.readonly = readonly = self.unwritable is not None
        if not readonly:
            try:
                with named_when_full(self.dir):
                    for modality in _MODALITIES:
                        (self.dir / modality).mkdir(parents=True, exist_ok=True)
            except NoSpace:
                raise
            except OSError as exc:
                raise UsageError(f"cannot create the store folder {self.dir} ({exc.strerror or exc}): this model "
                                 f"has no embeddings in that store and the store cannot be written; pass a "
                                 f"--store this user can write") from None
        self.refresh()
        # a missing manifest, or one a kill -9 cut short between a shard's rename into place and the manifest's
        # rewrite (the shards on disk are the truth), is rewritten now, not only after this run's next shard
        listed = manifest.get("shards") if manifest is not None else None
        stale = not isinstance(listed, dict) or any(set(listed.get(m) or []) != {x.name for x in self._shards[m]}
                                                     for m in _MODALITIES)
        if stale and not readonly:
            with self.lock(wait=False) as held:  # a busy writer rewrites it after its next shard
                if held:
                    self.refresh()
                    self.write_manifest()

    def _why_unwritable(self) -> str | None:
        """Why an existing folder of this store cannot be written, or None (a missing folder is created:
        failing that is an error). Every place a writer touches: the folder (manifest, quarantine), its
        modality folders (shards) and the lock file."""
        if not self.dir.is_dir():
            return None
        for p in (self.dir, *(self.dir / m for m in _MODALITIES), self.dir / _LOCK_NAME):
            if p.exists() and (why := why_unwritable(p)):
                return why + _owner(p)
        return None

    def _read_manifest(self) -> dict | None:
        """The manifest, or None when missing or unreadable (then rebuilt from the shards)."""
        path = self.dir / "manifest.json"
        if not path.exists():
            return None
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(m, dict):
                raise DataError(f"holds a {type(m).__name__}, not an object")
            return m
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s); rebuilding it from the shards, which are the truth", path, exc)
            return None

    # -- the shards on disk ----------------------------------------------------------------
    def refresh(self) -> None:
        """Pick up shards other writers committed since this object last looked, and forget shards
        that were moved to quarantine."""
        for modality in _MODALITIES:
            folder = self.dir / modality
            names = sorted(p.name for p in folder.glob("shard-*.arrow")) if folder.is_dir() else []
            known = {s.name for s in self._shards[modality]}
            gone = known - set(names)
            if gone:
                self._shards[modality] = [s for s in self._shards[modality] if s.name not in gone]
            new = [s for s in (self._open_shard(folder / name) for name in names if name not in known) if s is not None]
            if gone or not self._shards[modality]:
                self._shards[modality].extend(new)
                self._reindex(modality)  # one sorted pass over every shard's keys
            else:
                for shard in new:  # appended: the index grows by one block per shard
                    self._shards[modality].append(shard)
                    self._index[modality].add(shard.keys)

    def _open_shard(self, path: Path) -> _Shard | None:
        try:
            file_id = _file_id(path)
            source = pa.memory_map(str(path), "r")
            try:
                reader = ipc.open_file(source)
                version = (reader.schema.metadata or {}).get(b"hardrank_schema")
                # another version's shard is refused below, never read, nor quarantined for its layout
                table = reader.read_all() if reads_version(version) else None
            finally:
                source.close()  # the mapped buffers stay valid: no file descriptor held per shard
            if table is not None:
                emb_type = table.schema.field("embedding").type
                keys = as_string_array(table.column("key"))
        except FileNotFoundError:  # moved to quarantine by another process meanwhile
            return None
        except (pa.ArrowInvalid, OSError, KeyError, ValueError) as exc:
            self._quarantine(path, f"not a readable Arrow shard ({exc})")
            return None
        if table is None:
            check_version(version, self.dir, f"shard {path.parent.name}/{path.name}")
        if emb_type != self.schema.field("embedding").type:
            raise DataError(f"{path}: embedding type {emb_type} does not match this store's "
                            f"{self.schema.field('embedding').type}; the file does not belong in {self.dir}")
        digest = (reader.schema.metadata or {}).get(_DIGEST)
        return _Shard(path.name, path, keys, self._to_numpy(table), digest.decode() if digest else None, file_id)

    def _reindex(self, modality: str) -> None:
        """Block b of the index = shard b of ``self._shards[modality]``."""
        self._index[modality] = KeyIndex.build([s.keys for s in self._shards[modality]])

    def _to_numpy(self, table: pa.Table) -> np.ndarray:
        col = table.column("embedding")
        if table.num_rows == 0:
            return np.zeros((0, self.dim), dtype=self.dtype)
        # np.frombuffer, not Array.to_numpy: pyarrow copies float16 values to the heap even with
        # zero_copy_only=True, which would pull a whole fp16 store into RAM when it is opened
        dtype = np.dtype(self.dtype)
        parts = []
        for chunk in col.chunks:
            if len(chunk):
                v = chunk.flatten()  # (n * dim,) values, a zero-copy slice of the child array
                parts.append(np.frombuffer(v.buffers()[1], dtype=dtype, count=len(v),
                                           offset=v.offset * dtype.itemsize).reshape(-1, self.dim))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _quarantine(self, path: Path, why: str) -> None:
        """Move a bad shard aside (``<fingerprint>/quarantine/``), never delete it: its items are
        then missing and get encoded again."""
        if self.readonly:
            log.warning("store shard %s %s; its items are ignored (read-only: the file stays)", path, why)
            return
        target = self.dir / _QUARANTINE / f"{path.parent.name}-{path.name}"
        target.parent.mkdir(exist_ok=True)
        if target.exists():
            target = target.with_name(f"{target.stem}-{uuid.uuid4().hex[:8]}{target.suffix}")
        try:
            os.replace(path, target)
        except FileNotFoundError:  # another process moved it first
            return
        self.quarantined.append(str(target))
        log.warning("store shard %s %s: moved to %s; its items will be encoded again", path, why, target)

    # -- integrity ---------------------------------------------------------------------------
    def verify(self, modality: str, keys=None) -> int:
        """Check the checksum of every shard holding one of ``keys`` (default: every shard), once
        per shard per process. Shards that fail are quarantined and forgotten, so their keys count
        as missing. Returns how many shards failed. Cost: one read of each shard's bytes."""
        bad = 0
        while True:
            index = self._index[modality]
            shards = self._shards[modality]
            if keys is None:
                sids = range(len(shards))
            else:
                blocks = index.locate(keys)[0]
                sids = np.unique(blocks[blocks >= 0]).tolist()
            failed = [s for s in (shards[i] for i in sids) if not self._check(s)]
            if not failed:
                return bad
            bad += len(failed)
            self._shards[modality] = [s for s in shards if all(s is not f for f in failed)]
            self._reindex(modality)  # a key of a bad shard may also live in a good one

    def _check(self, shard: _Shard) -> bool:
        if shard.verified:
            return True
        if shard.digest is None:  # written before shards carried checksums: trusted as it is
            shard.verified = True
            return True
        ok = _VERIFIED.get(shard.file_id)
        if ok is None:
            actual = _digest(shard.keys, shard.emb)
            ok = actual == shard.digest
            if shard.file_id is not None:
                _VERIFIED[shard.file_id] = ok
            if not ok:
                self._quarantine(shard.path, f"failed its checksum (stored {shard.digest}, computed {actual}: "
                                             f"the file changed after it was written)")
        elif not ok:
            self._quarantine(shard.path, "failed its checksum")
        shard.verified = ok
        return ok

    # -- reading -------------------------------------------------------------------------
    def keys(self, modality: str) -> list[str]:
        """Every stored key of ``modality`` once, in shard order."""
        index = self._index[modality]
        return [k for b in range(index.num_blocks)
                for k in index.block(b).filter(pa.array(index.first_rows(b))).to_pylist()]

    def count(self, modality: str) -> int:
        """Distinct keys stored."""
        return len(self._index[modality])

    @property
    def key_index(self) -> dict[str, KeyIndex]:
        """The key index of each modality (block b = the b-th shard file of that modality)."""
        return self._index

    def contains(self, modality: str, keys) -> np.ndarray:
        """(N,) bool: whether each key (a list of str or an Arrow string array) is stored."""
        return self._index[modality].contains(keys)

    def read(self, modality: str, keys) -> np.ndarray:
        """(N, dim) embeddings in the order of ``keys``; every key must be present. The shards
        read are verified first (once per process)."""
        keys = as_string_array(keys)
        n_bad = self.verify(modality, keys)
        out = np.empty((len(keys), self.dim), dtype=self.dtype)
        sid, row = self._index[modality].locate(keys)
        absent = np.flatnonzero(sid < 0)
        if len(absent):
            why = (f"; {n_bad} shard(s) holding them failed their checksum and were set aside: rerun the "
                   f"command that filled the store to encode them again" if n_bad else "")
            raise MissingKeys(f"{len(absent)} {modality} keys are not in store {self.dir}, e.g. "
                              f"{keys.take(pa.array(absent[:3])).to_pylist()}{why}")
        if not len(keys):
            return out
        shards = self._shards[modality]
        for s in np.unique(sid):
            sel = np.nonzero(sid == s)[0]
            out[sel] = shards[s].emb[row[sel]]
        return out

    # -- writing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, wait: bool = True) -> Iterator[bool]:
        """Hold this store folder's writer lock, waiting while another process holds it; with
        ``wait=False`` yields False instead of waiting."""
        if self.readonly:
            raise RuntimeError(f"store {self.dir} was opened read-only")
        key = os.path.realpath(self.dir)
        with _LOCKS_MUTEX:
            lk = _LOCKS.setdefault(key, _FolderLock(Path(key) / _LOCK_NAME))
        with lk.held(wait) as held:
            yield held

    def write(self, modality: str, keys: list[str], embeddings: np.ndarray) -> str | None:
        """Append one shard atomically, its checksum inside it. Keys already stored (by this or
        another process) are dropped. Returns the shard name."""
        embeddings = np.ascontiguousarray(embeddings, dtype=self.dtype)
        if embeddings.shape != (len(keys), self.dim):
            raise ValueError(f"embeddings of shape {embeddings.shape} do not match "
                             f"{len(keys)} keys x dim {self.dim}")
        with self.lock():
            self.refresh()
            index = self._index[modality]
            stored = index.contains(keys) if len(keys) else np.zeros(0, bool)
            keep, seen = [], set()
            for i, k in enumerate(keys):
                if k and not stored[i] and k not in seen:
                    keep.append(i)
                    seen.add(k)
            if not keep:
                return None
            keys = [keys[i] for i in keep]
            embeddings = embeddings[keep]
            digest = _digest(keys, embeddings)
            values = pa.array(embeddings.reshape(-1), type=self.schema.field("embedding").type.value_type)
            schema = self.schema.with_metadata({**self.schema.metadata, _DIGEST: digest.encode()})
            table = pa.Table.from_arrays(
                [pa.array(keys, pa.string()), pa.FixedSizeListArray.from_arrays(values, self.dim)], schema=schema)
            name = f"shard-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.arrow"
            path = self.dir / modality / name
            with atomic_path(path, table.nbytes) as tmp:
                with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
                    writer.write_table(table)
            file_id = _file_id(path)
            _VERIFIED[file_id] = True
            shard = self._open_shard(path)  # memory-mapped: what was written leaves the heap
            if shard is None:
                raise DataError(f"store shard {path} vanished right after it was written; is another program "
                                f"deleting files in {self.dir}?")
            shard.verified = True
            self._shards[modality].append(shard)
            index.add(shard.keys)
            self.write_manifest()
        return name

    def remove_stale_temporaries(self) -> None:
        """Delete the half-written temporaries of killed writers. Call with ``lock()`` held (no
        writer of this store is running then)."""
        stale = [*self.dir.glob(".manifest.json.*.tmp"), *(p for m in _MODALITIES
                                                           for p in (self.dir / m).glob(".shard-*.tmp"))]
        for tmp in stale:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def write_manifest(self) -> None:
        """Rewrite ``manifest.json`` from the shards this object knows (call ``refresh`` under
        ``lock()`` first to list every writer's)."""
        write_json_atomic(self.dir / "manifest.json", {
            "fingerprint": self.fingerprint, "dim": self.dim, "dtype": self.dtype,
            "schema_version": SCHEMA_VERSION, "meta": self.meta,
            "checksum": "blake2b-128 of each shard's keys and embedding bytes, in its schema metadata "
                        "('hardrank_digest')",
            "shards": {m: [s.name for s in self._shards[m]] for m in _MODALITIES},
            "rows": {m: len(self._index[m]) for m in _MODALITIES},
        })


def is_store_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is one fingerprint folder of a store (a manifest or shard folders)."""
    p = Path(folder)
    return p.is_dir() and ((p / "manifest.json").is_file()
                           or any((p / m).is_dir() and any((p / m).glob("shard-*.arrow")) for m in _MODALITIES))


def _shape_from_shards(p: Path) -> tuple[int, str] | None:
    for m in _MODALITIES:
        for shard in sorted((p / m).glob("shard-*.arrow")):
            try:
                t = ipc.open_file(pa.memory_map(str(shard), "r")).schema.field("embedding").type
                dtype = next((name for name, pt in _DTYPES.items() if pt == t.value_type), None)
                if dtype is not None:
                    return int(t.list_size), dtype
            except (pa.ArrowInvalid, OSError, KeyError, AttributeError):
                continue
    return None


def open_store(folder: str | os.PathLike, *, readonly: bool = True) -> EmbeddingStore:
    """The store of one fingerprint folder (``<root>/<fingerprint>``), its dimension and dtype read
    from the manifest, or from the shards when the manifest is missing or unreadable."""
    p = Path(folder)
    if not is_store_folder(p):
        raise DataError(f"{p}: not an embedding store folder (no manifest.json and no shards); pass a folder "
                        f"<store root>/<fingerprint> written by hardrank")
    manifest = p / "manifest.json"
    m = None
    if manifest.is_file():
        try:
            m = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("%s is unreadable (%s); reading the store's shape from its shards", manifest, exc)
    if isinstance(m, dict):
        check_version(m.get("schema_version"), p, "manifest.json")
    if isinstance(m, dict) and "dim" in m and m.get("dtype") in _DTYPES:
        if m.get("fingerprint") != p.name:
            raise DataError(f"{manifest}: names fingerprint {m.get('fingerprint')!r}, not this folder {p.name!r}; "
                            f"the folder was renamed or the manifest edited")
        return EmbeddingStore(p.parent, p.name, dim=int(m["dim"]), dtype=m["dtype"], meta=m.get("meta"),
                              readonly=readonly)
    shape = _shape_from_shards(p)
    if shape is None:
        raise DataError(f"{p}: the manifest is unreadable and no shard is readable; this store holds nothing usable")
    return EmbeddingStore(p.parent, p.name, dim=shape[0], dtype=shape[1], readonly=readonly)
