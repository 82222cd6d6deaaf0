"""Which of N string keys are present, and where: sorted 8-byte entries, verified against the keys' Arrow columns.

The embedding store holds up to hundreds of millions of rows keyed by content. A Python dict of
them costs ~100 bytes a key (the str object, its hash slot, a (shard, row) tuple); this index costs
8 bytes a row and keeps no Python object per key:

- the keys stay in their Arrow string columns (one **block** per store shard, memory-mapped: page
  cache, not heap);
- each **run** of consecutive blocks is a sorted ``uint64`` array whose entries pack the top 32 bits
  of a 64-bit hash of the key with the key's 32-bit position in the run
  (``entry = hash >> 32 << 32 | position``); ``np.searchsorted`` finds the candidates of a query
  key, and every candidate is **verified** by comparing the stored key string itself, so an answer is
  exact whatever the hash does (two keys sharing 32 hash bits only cost one more string compare);
- runs merge like an LSM tree (a new run is merged into the previous one while that one is less
  than twice its size), so appending one small shard at a time stays cheap and a lookup searches
  O(log n) runs; a bulk build (``KeyIndex.build``) sorts one run in place.

A key present several times resolves to its first occurrence: the lowest (block, row), blocks in
the order they were added (the store's shard order). The slow, obviously correct twin is a dict of
the first occurrence of each key (``tests/test_key_index.py`` compares the two).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KeyIndex", "hash_keys", "as_string_array"]

_POS_BITS = 32
_POS_MASK = np.uint64((1 << _POS_BITS) - 1)
_MAX_RUN = (1 << _POS_BITS) - 1  # rows a run can address (a bulk build splits larger sets into several runs)
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)  # murmur3 fmix64 constants
_SEED = np.uint64(0x9E3779B97F4A7C15)
_CHUNK = 1 << 18  # keys hashed / entries scanned / queries looked up per step: bounded temporaries
_BYTE_MASKS = np.array([0] + [(1 << (8 * k)) - 1 for k in range(1, 8)] + [(1 << 64) - 1], dtype=np.uint64)


def as_string_array(keys) -> pa.Array:
    """``keys`` (a list of str, a numpy array of str, an Arrow string array or chunked array) as one
    Arrow ``string`` / ``large_string`` array without nulls."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    if not isinstance(keys, pa.Array):
        keys = pa.array(keys if not isinstance(keys, np.ndarray) else keys.tolist(), pa.string())
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        raise TypeError(f"keys must be strings, got an Arrow array of {keys.type}")
    if keys.null_count:
        raise ValueError(f"keys hold {keys.null_count} null(s); every key must be a string")
    return keys


def _offsets_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets (n + 1,) int64 into data, data uint8) of a string array, zero-copy where Arrow allows."""
    width = 8 if pa.types.is_large_string(arr.type) else 4
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if width == 8 else np.int32, count=len(arr) + 1,
                        offset=arr.offset * width).astype(np.int64, copy=False)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return off, data


def hash_keys(keys) -> np.ndarray:
    """(n,) uint64 hash of each key's UTF-8 bytes (and its length): 8-byte little-endian words mixed
    with murmur3's finaliser. Vectorised over keys; a loop over the longest key's words only.
    Deterministic across processes and machines (nothing persists it today, but an id record may)."""
    arr = as_string_array(keys)
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    off, data = _offsets_data(arr)
    lens = off[1:] - off[:-1]                                   # (n,) bytes per key
    # the key bytes as aligned little-endian words, padded so a word read past the end stays inside
    lo, hi = int(off[0]), int(off[-1])
    buf = np.zeros((hi - lo + 16 + 7) // 8 * 8, np.uint8)
    buf[:hi - lo] = data[lo:hi]
    words = buf.view("<u8")
    start = off[:-1] - lo
    h = _SEED ^ lens.astype(np.uint64)
    for j in range(int(-(-int(lens.max()) // 8))):
        live = lens > 8 * j                                     # keys with bytes at word j
        p = np.where(live, start + 8 * j, 0)
        q, r = p >> 3, (p & 7).astype(np.uint64) * np.uint64(8)
        w = words[q] >> r                                       # an unaligned 8-byte read from two words
        w |= np.where(r > 0, words[q + 1] << ((np.uint64(64) - r) & np.uint64(63)), np.uint64(0))
        w &= _BYTE_MASKS[np.minimum(lens - 8 * j, 8).clip(0)]
        mixed = (h ^ w) * _M1
        mixed ^= mixed >> np.uint64(29)
        h = np.where(live, mixed, h)
    h ^= h >> np.uint64(33)
    h *= _M2
    h ^= h >> np.uint64(33)
    return h


class _Run:
    """Sorted entries of the blocks [b0, b1): ``hash >> 32 << 32 | (global position - base)``."""

    __slots__ = ("b0", "b1", "base", "entries")

    def __init__(self, b0: int, b1: int, base: int, entries: np.ndarray):
        self.b0, self.b1, self.base, self.entries = b0, b1, base, entries


class KeyIndex:
    """Which of N keys are present, and where (block, row) each first occurs.

    >>> idx = KeyIndex.build([shard0_keys, shard1_keys])   # blocks: Arrow string arrays or lists of str
    >>> block, row = idx.locate(["a", "b"])               # (N,) int32 / int64, -1 where absent
    >>> idx.contains(["a", "b"])                          # (N,) bool
    >>> idx.add(new_keys)                                 # one more block; returns its number
    >>> idx.extend([keys_a, keys_b])                      # several more blocks, sorted as one run

    Memory: 8 bytes a row (the runs) plus the key columns themselves, which the index references and
    does not copy (memory-mapped store shards cost page cache only). A lookup costs the Arrow
    conversion of the query keys, a hash, one ``searchsorted`` per run over the sorted queries, and
    one string comparison per candidate, done block by block."""

    def __init__(self):
        self._blocks: list[pa.Array] = []
        self._starts: list[int] = [0]     # global position of each block's first row; last = total rows
        self._runs: list[_Run] = []
        self._distinct = 0

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def build(cls, blocks: Sequence) -> KeyIndex:
        """An index over ``blocks`` (each a sequence of keys), sorted in one pass per 2**32 rows."""
        idx = cls()
        idx._extend([as_string_array(b) for b in blocks], merge=False)
        return idx

    def extend(self, blocks: Sequence) -> None:
        """Append several blocks at once (sorted as one run, then merged like ``add``'s): the cheap way
        to add many blocks to an index that already holds some."""
        self._extend([as_string_array(b) for b in blocks], merge=True)

    def _extend(self, arrays: list[pa.Array], merge: bool) -> None:
        i = 0
        while i < len(arrays):
            j, rows = i, 0
            while j < len(arrays) and (j == i or rows + len(arrays[j]) <= _MAX_RUN):
                rows += len(arrays[j])
                j += 1
            self._append(arrays[i:j], merge=merge)
            i = j

    def add(self, keys) -> int:
        """Append one block of keys (a store shard); returns its block number. Keys already present
        keep resolving to their earlier occurrence."""
        self._append([as_string_array(keys)], merge=True)
        return len(self._blocks) - 1

    def _append(self, arrays: list[pa.Array], merge: bool) -> None:
        b0, base = len(self._blocks), self._starts[-1]
        rows = sum(len(a) for a in arrays)
        if rows > _MAX_RUN:
            raise ValueError(f"one block of {rows} keys exceeds the {_MAX_RUN} rows a run can address; "
                             f"split it into smaller blocks")
        entries = np.empty(rows, np.uint64)
        at = 0
        for a in arrays:
            for s in range(0, len(a), _CHUNK):  # bounded temporaries whatever the block size
                part = a.slice(s, _CHUNK)
                n = len(part)
                entries[at:at + n] = (hash_keys(part) >> np.uint64(_POS_BITS) << np.uint64(_POS_BITS)) | \
                    np.arange(at, at + n, dtype=np.uint64)
                at += n
        entries.sort()  # in place: (hash prefix, position); equal prefixes keep their position order
        earlier = self._count_present(arrays) if self._runs else 0
        for a in arrays:
            self._blocks.append(a)
            self._starts.append(self._starts[-1] + len(a))
        run = _Run(b0, len(self._blocks), base, entries)
        self._distinct += rows - self._duplicates_within(run) - earlier
        self._runs.append(run)
        while merge and len(self._runs) > 1 and len(self._runs[-2].entries) < 2 * len(self._runs[-1].entries) \
                and self._starts[self._runs[-1].b1] - self._runs[-2].base <= _MAX_RUN:
            self._merge_last_two()

    def _merge_last_two(self) -> None:
        a, b = self._runs[-2], self._runs[-1]
        shift = np.uint64(b.base - a.base)
        moved = (b.entries & ~_POS_MASK) | ((b.entries & _POS_MASK) + shift)
        entries = np.concatenate([a.entries, moved])
        entries.sort(kind="stable")  # two sorted runs: timsort merges them in linear time
        self._runs[-2:] = [_Run(a.b0, b.b1, a.base, entries)]

    def _count_present(self, arrays: list[pa.Array]) -> int:
        """How many distinct keys of ``arrays`` the index holds already (before they are added)."""
        keys = pa.chunked_array(arrays, type=arrays[0].type).combine_chunks() if len(arrays) > 1 else arrays[0]
        found = self.locate(keys)[0] >= 0
        if not found.any():
            return 0
        return int(pc.count_distinct(keys.filter(pa.array(found))).as_py())

    def _duplicates_within(self, run: _Run) -> int:
        """Rows of ``run`` whose key occurs earlier in the same run (only entries sharing a hash
        prefix can be equal; their strings are compared)."""
        e = run.entries
        if len(e) < 2:
            return 0
        pairs = []  # i where entries i and i + 1 share a prefix, found chunk by chunk (bounded temporaries)
        for s in range(0, len(e) - 1, _CHUNK):
            hi = e[s:s + _CHUNK + 1] >> np.uint64(_POS_BITS)
            pairs.append(np.flatnonzero(hi[1:] == hi[:-1]) + s)
        pairs = np.concatenate(pairs)
        if not len(pairs):
            return 0
        same = np.zeros(len(e) - 1, bool)
        same[pairs] = True
        first = np.nonzero(same & ~np.concatenate([[False], same[:-1]]))[0]   # start of each equal-prefix group
        ends = np.nonzero(same & ~np.concatenate([same[1:], [False]]))[0] + 2  # one past its end
        members = np.concatenate([np.arange(s, t) for s, t in zip(first, ends)])
        pos = (e[members] & _POS_MASK).astype(np.int64) + run.base
        keys = self._strings(pos)
        group = np.repeat(np.arange(len(first)), ends - first)
        return len(members) - len({(int(g), k) for g, k in zip(group, keys)})

    # -- lookups -------------------------------------------------------------------------------
    def locate(self, keys) -> tuple[np.ndarray, np.ndarray]:
        """(block (N,) int32, row (N,) int64) of each key's first occurrence; -1 where absent."""
        q = as_string_array(keys)
        if len(q) > _CHUNK:  # bounded temporaries (~200 bytes a query) whatever N
            parts = [self.locate(q.slice(s, _CHUNK)) for s in range(0, len(q), _CHUNK)]
            return np.concatenate([b for b, _ in parts]), np.concatenate([r for _, r in parts])
        n = len(q)
        pos = np.full(n, -1, np.int64)
        if n and self._runs:
            qh = hash_keys(q) >> np.uint64(_POS_BITS) << np.uint64(_POS_BITS)
            order = np.argsort(qh, kind="stable")  # sorted queries: searchsorted walks memory in order
            qs = qh[order]
            todo = np.arange(n)                    # indices into order still unresolved
            for run in self._runs:
                if not len(todo):
                    break
                e = run.entries
                lo = np.searchsorted(e, qs[todo])
                cand, at = todo, lo
                while len(cand):
                    ok = at < len(e)
                    ok[ok] = (e[at[ok]] & ~_POS_MASK) == qs[cand[ok]]
                    cand, at = cand[ok], at[ok]
                    if not len(cand):
                        break
                    gpos = (e[at] & _POS_MASK).astype(np.int64) + run.base
                    hit = self._equal(gpos, q, order[cand])
                    pos[order[cand[hit]]] = gpos[hit]
                    cand, at = cand[~hit], at[~hit] + 1
                todo = todo[pos[order[todo]] < 0]
        block = np.full(n, -1, np.int32)
        row = np.full(n, -1, np.int64)
        found = pos >= 0
        if found.any():
            starts = np.asarray(self._starts, np.int64)
            b = np.searchsorted(starts, pos[found], side="right") - 1
            block[found] = b
            row[found] = pos[found] - starts[b]
        return block, row

    def contains(self, keys) -> np.ndarray:
        """(N,) bool: whether each key is present."""
        return self.locate(keys)[0] >= 0

    def _equal(self, gpos: np.ndarray, q: pa.Array, qi: np.ndarray) -> np.ndarray:
        """Whether the stored key at each global position equals query key ``q[qi]``: compared block by
        block (an Arrow take on a chunked array would concatenate every block first)."""
        out = np.zeros(len(gpos), bool)
        starts = np.asarray(self._starts, np.int64)
        by = np.argsort(gpos, kind="stable")
        blocks = np.searchsorted(starts, gpos[by], side="right") - 1
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        for part in np.split(np.arange(len(by)), cuts):
            if not len(part):
                continue
            b = int(blocks[part[0]])
            sel = by[part]
            stored = self._blocks[b].take(pa.array(gpos[sel] - starts[b]))
            asked = q.take(pa.array(qi[sel]))
            if stored.type != asked.type:
                asked = asked.cast(stored.type)
            out[sel] = pc.equal(stored, asked).to_numpy(zero_copy_only=False)
        return out

    def _strings(self, gpos: np.ndarray) -> list[str]:
        starts = np.asarray(self._starts, np.int64)
        b = np.searchsorted(starts, gpos, side="right") - 1
        return [self._blocks[int(bb)][int(p - starts[bb])].as_py() for bb, p in zip(b, gpos)]

    # -- what it holds ---------------------------------------------------------------------------
    def __len__(self) -> int:
        """Distinct keys."""
        return self._distinct

    @property
    def rows(self) -> int:
        """Rows over all blocks (duplicates included)."""
        return self._starts[-1]

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_runs(self) -> int:
        return len(self._runs)

    @property
    def nbytes(self) -> int:
        """Bytes the index itself holds (the runs), not counting the referenced key columns."""
        return sum(r.entries.nbytes for r in self._runs)

    def block(self, b: int) -> pa.Array:
        """The keys of block ``b``, as added."""
        return self._blocks[b]

    def first_rows(self, b: int) -> np.ndarray:
        """(rows of block b,) bool: rows holding the first occurrence of their key (False for a key
        that an earlier block or row holds too)."""
        keys = self._blocks[b]
        if self._distinct == self.rows:
            return np.ones(len(keys), bool)
        block, row = self.locate(keys)
        return (block == b) & (row == np.arange(len(keys)))
