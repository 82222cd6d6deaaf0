"""``--key-by id``: store hits decided from an item's identity, without reading its bytes; the id -> content record.

The store names an image by the hash of its bytes (``hardrank.items.bytes_key``): exact, and it finds
duplicates under any name, but the driver must read every image before it knows what to encode. With
``--key-by id`` an image is first named by its **identity**, which costs a ``stat`` and no read:

- a file: absolute path + size + mtime (ns); an object behind a URL: URL + size + ETag;
- a tar member: the shard's identity (one ``stat`` per shard) + the member's name and offset;
- a Parquet cell: the file's identity + row and column.

``IdIndex`` records identity -> bytes key in ``<store root>/<fingerprint>/ids/`` of every model a run writes
(a folder this user cannot write is skipped: its records are read, none added),
and reads the records of every fingerprint folder of the store root (an identity's content does not depend
on the model, so another model's records serve too; keeping them inside the fingerprint folders leaves
the store root a folder of fingerprints, and a folder copied alone keeps its records).
An image whose identity is recorded gets its content key without a read, so store hits are decided from
``stat`` calls alone. An image whose identity is new gets a provisional key (``?<identity key>``) that no
store holds; the workers that decode it hash the bytes they decode anyway (``DecodeStage``), its
embedding is stored under its real content key, and the identity is recorded. So either way the store
holds content keys: a later ``--key-by content`` run (or mining's duplicate exclusion) finds the same
keys and the same duplicates. The price of ``id``: two names of the same bytes, both new, are encoded
twice in their first run (stored once); a changed file (new size or mtime) is a new identity and is
encoded again, an unchanged file with rewritten bytes but the same size and mtime would not be (the
same trust ``make`` and ``rsync`` place in mtimes). ``--key-by content`` runs record identities too,
so switching to ``id`` later starts with every image known.

Records are Arrow IPC shards (``ids-<time>-<uuid>.arrow``: ``id_key``, ``key``), each written atomically
and never rewritten; several writers may add shards at once, and a record two shards share is the same
fact (the first read wins; a writer commits only identities it does not hold yet). They are looked up
with the store's key index (``hardrank.store.key_index``) over the memory-mapped shards, in batches: no Python
dict of identities, 8 bytes of heap a record.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from hardrank import urls
from hardrank.atomic import atomic_path, why_unwritable
from hardrank.errors import UsageError
from hardrank.items import _PARQUET_SCHEME, ImageRef, ItemTable, failure_reason, map_rows
from hardrank.store.key_index import KeyIndex, as_string_array

__all__ = ["IdIndex", "KEY_BY", "identity_key", "table_keys", "is_provisional", "IDS_FOLDER"]

log = logging.getLogger("hardrank.store.idkeys")

KEY_BY = ("content", "id")
IDS_FOLDER = "ids"  # inside each fingerprint folder
_PROVISIONAL = "?"
_SCHEMA = pa.schema([pa.field("id_key", pa.string(), nullable=False), pa.field("key", pa.string(), nullable=False)])


def is_provisional(key: str) -> bool:
    return key.startswith(_PROVISIONAL)


def _source_identity(uri: str, cache: dict) -> str:
    """Identity of the file/object/shard holding ``uri`` (stat'ed once per file through ``cache``)."""
    if urls.is_member_uri(uri):
        shard, off, _, member = urls.parse_member_uri(uri)
        if shard not in cache:
            cache[shard] = urls.identity(shard)
        return f"{cache[shard]}#{member}@{off}"
    if uri.startswith(_PARQUET_SCHEME):
        file, _, cell = uri[len(_PARQUET_SCHEME):].rpartition("#")
        if file not in cache:
            cache[file] = urls.identity(file)
        return f"{cache[file]}#{cell}"
    return urls.identity(uri)


def identity_key(uri: str, cache: dict | None = None) -> str:
    """The identity key of an image's bytes (see the module docstring); raises like a read would when
    the file is missing."""
    ident = _source_identity(uri, {} if cache is None else cache)
    return "d" + hashlib.blake2b(ident.encode("utf-8"), digest_size=16).hexdigest()


class IdIndex:
    """identity key -> bytes key records of one store root: read from ``<root>/*/ids/``, written (``commit``:
    one atomic shard per folder) to ``<root>/<fingerprint>/ids/`` of each of ``fingerprints`` this process can
    write (another user's folder, a read-only mount: skipped, its records still read); ``add`` buffers.
    ``readonly``: write nothing (dry runs).

    Lookups use the store's key index (``hardrank.store.key_index.KeyIndex``: sorted 8-byte hash-prefix
    entries, each candidate verified against the stored string), one block per record shard, over the
    shards' memory-mapped Arrow columns: 8 bytes of heap a record and no Python object per record, so a
    store root with 100M recorded identities is looked up in under 1 GB of RAM (page cache aside)."""

    def __init__(self, root: str | os.PathLike, fingerprints=(), readonly: bool = False):
        self.root = Path(root)
        self.dirs = [] if readonly else [d for d in (self.root / fp / IDS_FOLDER for fp in fingerprints)
                                         if _writable(d)]
        self.readonly = readonly or not self.dirs
        self._index = KeyIndex()             # block b: the id_key column of record shard b
        self._values: list[pa.Array] = []    # block b: its key column
        self._seen: set[str] = set()
        self._pending: dict[str, str] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the record shards not read yet (written since by this or another process). Shards are
        read in name (= time) order, so a record two shards share resolves to the earlier one."""
        if not self.root.is_dir():
            return
        new: list[tuple[pa.Array, pa.Array]] = []
        for p in sorted(self.root.glob(f"*/{IDS_FOLDER}/ids-*.arrow"), key=lambda q: (q.name, str(q))):
            if p.name in self._seen:  # (the same shard in another fingerprint folder: the same records)
                continue
            try:
                new.append(self._read(p))
            except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as exc:
                # a record is a cache: an unreadable one is skipped
                log.warning("id index shard %s is unreadable (%s); its images will be read again", p, exc)
            self._seen.add(p.name)
        self._index.extend([ids for ids, _ in new])  # one sort for all of them
        self._values.extend(keys for _, keys in new)

    @staticmethod
    def _read(path: Path) -> tuple[pa.Array, pa.Array]:
        source = pa.memory_map(str(path), "r")
        try:
            t = ipc.open_file(source).read_all()
        finally:
            source.close()  # the mapped buffers stay valid; no file descriptor is held per shard
        return as_string_array(t.column("id_key")), as_string_array(t.column("key"))

    def __len__(self) -> int:
        """Identities recorded in the shards read (pending records not included)."""
        return len(self._index)

    def lookup(self, id_keys) -> list[str | None]:
        """The recorded bytes key of each identity key (None where unknown): one batched search."""
        id_keys = list(id_keys)
        out: list[str | None] = [None] * len(id_keys)
        if self._values and id_keys:
            block, row = self._index.locate(id_keys)
            found = np.flatnonzero(block >= 0)
            found = found[np.argsort(block[found], kind="stable")]  # grouped by block: one take per block
            for sel in np.split(found, np.flatnonzero(np.diff(block[found])) + 1):
                if len(sel):
                    values = self._values[int(block[sel[0]])].take(pa.array(row[sel])).to_pylist()
                    for i, k in zip(sel.tolist(), values):
                        out[i] = k
        if self._pending:
            for i, k in enumerate(out):
                if k is None:
                    out[i] = self._pending.get(id_keys[i])
        return out

    def get(self, id_key: str) -> str | None:
        return self.lookup([id_key])[0]

    def add(self, id_key: str, key: str) -> None:
        """Record that the bytes of ``id_key`` hash to ``key`` (a bytes key, without recipe); identities
        recorded already are dropped when committing."""
        self._pending.setdefault(id_key, key)

    def commit(self) -> None:
        """Write the buffered records not recorded yet as one shard (atomic rename)."""
        if not self._pending or self.readonly:
            return
        ids = list(self._pending)
        new = ~self._index.contains(ids) if self._values else np.ones(len(ids), bool)
        ids = [i for i, n in zip(ids, new) if n]
        keys = [self._pending[i] for i in ids]
        self._pending = {}
        if not ids:
            return
        table = pa.Table.from_arrays([pa.array(ids, pa.string()), pa.array(keys, pa.string())], schema=_SCHEMA)
        name = f"ids-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.arrow"
        for d in self.dirs:  # the same records in each model's folder: a folder copied or kept alone has them
            d.mkdir(parents=True, exist_ok=True)
            with atomic_path(d / name, table.nbytes) as tmp:
                with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, _SCHEMA) as writer:
                    writer.write_table(table)
        self._seen.add(name)
        ids, keys = self._read(self.dirs[0] / name)  # re-opened memory-mapped: the records leave the heap
        self._index.add(ids)
        self._values.append(keys)


def _writable(folder: Path) -> bool:
    why = why_unwritable(folder)
    if why:  # records are a cache: the run goes on without writing them there
        log.info("id records are not written to %s (%s)", folder, why)
    return why is None


def _recipe(key_or_ref) -> str:
    return ("@" + key_or_ref.recipe) if isinstance(key_or_ref, ImageRef) and key_or_ref.recipe else ""


def table_keys(table: ItemTable, key_by: str, index: IdIndex | None, threads: int = 8) -> list[str]:
    """The image table's keys for a run: ``content`` reads and hashes every image whose key is not known
    yet (then records identities in ``index``); ``id`` names each image by its recorded content key when
    its identity is known, else by a provisional key that the decoding workers replace. Unreadable images
    get ``""`` and their reason in ``table.failed``, as ``ItemTable.keys`` does."""
    if key_by not in KEY_BY:
        raise UsageError(f"key_by must be one of {KEY_BY}, got {key_by!r}")
    if table.modality != "image":
        return table.keys()
    if key_by == "content":
        keys = table.keys(threads)
        if index is not None and not index.readonly:
            _record(table, keys, index, threads)
        return keys
    known = table.known_keys()
    cache: dict = {}

    def one(row_ref):
        row, ref = row_ref
        if row in known:
            return None, None
        try:
            return identity_key(ref.uri, cache), None
        except (OSError, ValueError) as exc:
            return None, failure_reason(exc)

    out = map_rows(one, enumerate(table.entries), threads)
    asked = [r for r, (idk, _) in enumerate(out) if idk is not None]
    recorded = index.lookup(out[r][0] for r in asked) if index is not None else [None] * len(asked)
    keys = [known.get(r, "") for r in range(len(out))]
    for r, base in zip(asked, recorded):
        keys[r] = (base or _PROVISIONAL + out[r][0]) + _recipe(table.entries[r])
    table.set_keys(keys)
    table.failed = {row: why for row, (_, why) in enumerate(out) if why}
    return keys


def _record(table: ItemTable, keys: list[str], index: IdIndex, threads: int, chunk: int = 1 << 18) -> None:
    """Record the identity of every readable image whose content key is known (content runs), so a later
    ``--key-by id`` run knows them without a read. Costs one ``stat`` per file (per shard for tar members);
    committed ``chunk`` rows at a time (bounded buffers); identities recorded already write nothing."""
    cache: dict = {}

    def one(row):
        k = keys[row]
        if not k or row in table.failed:
            return None
        with contextlib.suppress(OSError, ValueError):
            return identity_key(table.entries[row].uri, cache), k.split("@", 1)[0]
        return None

    for lo in range(0, len(keys), chunk):
        for pair in map_rows(one, range(lo, min(len(keys), lo + chunk)), threads):
            if pair is not None:
                index.add(*pair)
        index.commit()
