"""This process's memory while a mining run works: anonymous and file-backed apart, sampled, against the aim.

The resident set (``VmRSS``, its peak ``VmHWM``) adds two different things: anonymous memory (what the
process allocated: arrays, indexes, Python objects), which only it can free, and file-backed pages (a
memory-mapped corpus or index read so far), which the kernel reclaims whenever it needs the memory. The
budget bounds the first; a map's pages follow what was read. Linux reports both (``RssAnon``, ``RssFile``,
``RssShmem`` in ``/proc/self/status``) but keeps a peak of their sum only, so a thread samples them every
``interval`` seconds while the run works (a spike shorter than that may be missed: ``VmHWM`` is recorded
beside, exact).
"""
from __future__ import annotations

import sys
import threading

__all__ = ["MemoryWatch", "status", "ids_bytes"]

_FIELDS = ("RssAnon", "RssFile", "RssShmem", "VmHWM", "VmRSS")


def status() -> dict[str, int]:
    """This process's ``/proc/self/status`` memory fields in bytes (empty where /proc is absent)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in _FIELDS:
                    out[name] = int(rest.split()[0]) << 10
    except (OSError, ValueError):
        return {}
    return out


class MemoryWatch:
    """Peaks of anonymous and file-backed resident memory, sampled by a daemon thread between ``start`` and
    ``stop`` (and at every ``sample()`` call)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak_anon = self.peak_file = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        s = status()
        self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0) + s.get("RssShmem", 0))
        self.peak_file = max(self.peak_file, s.get("RssFile", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> MemoryWatch:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="hardrank-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


def ids_bytes(*columns) -> int:
    """Bytes the id and key columns hold in memory: Python lists of strings (the list and its strings), Arrow
    arrays (their buffers). Leave memory-mapped columns out: their pages are file-backed."""
    total = 0
    for col in columns:
        if col is None:
            continue
        if hasattr(col, "nbytes") and hasattr(col, "type"):  # Arrow Array / ChunkedArray
            total += int(col.nbytes)
        elif isinstance(col, list):
            total += sys.getsizeof(col) + sum(sys.getsizeof(s) for s in col)
    return total
