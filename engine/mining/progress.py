"""Progress lines of a mining stage: how far, how fast, how long still; at most one line every few seconds."""
from __future__ import annotations

import time

from hardrank.units import hms

__all__ = ["Progress"]


class Progress:
    """``update(n)`` after each piece of a stage of ``total`` units: a line ``label: done/total unit (pct),
    rate unit/s, ETA m:ss`` at most every ``every`` seconds, and the last piece's always (when a stage runs
    longer than ``every``). The rate is measured from the first piece's end (the first carries start-up)."""

    def __init__(self, echo, label: str, total: int, unit: str = "rows", every: float = 10.0, clock=time.monotonic):
        self.echo, self.label, self.total, self.unit, self.every, self.clock = echo, label, total, unit, every, clock
        self.done = 0
        self._t0 = clock()
        self._first: tuple[float, int] | None = None
        self._last = self._t0

    def update(self, n: int) -> None:
        now = self.clock()
        self.done += n
        if self._first is None:
            self._first = (now, self.done)
            return
        if now - self._last < self.every and self.done < self.total:
            return
        if self.done >= self.total and now - self._t0 < self.every:
            return  # a short stage: its end is said by whoever ran it
        self._last = now
        t1, n1 = self._first
        rate = (self.done - n1) / (now - t1) if now > t1 and self.done > n1 else None
        left = self.total - self.done
        eta = f", ETA {hms(left / rate)}" if rate and left > 0 else ""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        speed = f", {rate:,.0f} {self.unit}/s" if rate else ""
        self.echo(f"{self.label}: {self.done:,}/{self.total:,} {self.unit} ({pct:.0f}%){speed}{eta}")
