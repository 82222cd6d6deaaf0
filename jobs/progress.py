"""Progress for long stages: tqdm bars on a terminal, periodic log lines elsewhere, nothing with --quiet.

Throughput and ETA come from a ``_Meter`` that starts measuring when the first batch has arrived:
the first batch carries the start-up (model load, decode threads, a cold page cache), and a bar
created before its stage starts (the texts wait for the images) would otherwise count the wait.
Until a second batch has arrived there is no rate and the ETA says so. Items done without being
encoded (images that failed to decode: ``skip``) advance the count, never the rate: counted as
encoded, a batch's failures and its encoded rows, delivered microseconds apart, made rates such as
"964,990 item/s".
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

from hardrank.units import hms

__all__ = ["make_progress"]


class _Meter:
    """Items done, and the rate of those encoded, measured between the first and the latest encoded batch."""

    def __init__(self, total: int | None, clock=time.monotonic):
        self.total, self.clock = total, clock
        self.n = 0                          # items done: encoded or skipped
        self.skipped = 0                    # done without being encoded (not in the rate)
        self._encoded = 0
        self._t_first: float | None = None  # when the first encoded batch arrived
        self._n_first = 0                   # items in that batch (not timed: they carry the start-up)
        self._t_last: float | None = None

    def update(self, n: int) -> None:
        """``n`` items encoded."""
        now = self.clock()
        self.n += n
        self._encoded += n
        if self._t_first is None:
            self._t_first, self._n_first = now, self._encoded
        self._t_last = now

    def skip(self, n: int) -> None:
        """``n`` items done without being encoded (failed): progress, not throughput."""
        self.n += n
        self.skipped += n

    @property
    def rate(self) -> float | None:
        """Items encoded per second after the first encoded batch, or None before a second one has arrived."""
        if (self._t_first is None or self._t_last is None or self._t_last <= self._t_first
                or self._encoded <= self._n_first):
            return None
        return (self._encoded - self._n_first) / (self._t_last - self._t_first)

    @property
    def elapsed(self) -> float:
        """Seconds from the first batch to the latest one."""
        return 0.0 if self._t_first is None else self._t_last - self._t_first

    def text(self, final: bool = False) -> str:
        """``"259 item/s, ETA 0:12"`` (``"done"`` when ``final``)."""
        rate = self.rate
        speed = f"{rate:,.0f} item/s" if rate is not None else "measuring item/s"
        if final:
            failed = f"; {self.skipped} failed" if self.skipped else ""
            return f"{speed}, {hms(self.elapsed)}, done{failed}"
        if not self.total:
            return speed
        if rate is None:
            return f"{speed}, ETA after the second batch"
        return f"{speed}, ETA {hms(max(self.total - self.n, 0) / rate)}"


class _LogLines:
    """A bar for logs (CI, nohup, files): one line every ``interval`` seconds and one at the end,
    each with the count, the measured throughput and the ETA."""

    def __init__(self, total: int | None, desc: str, stream, interval: float, clock=time.monotonic):
        self.meter = _Meter(total, clock)
        self.desc, self.stream, self.interval, self.clock = desc, stream, interval, clock
        self._last = clock()
        self._closed = False

    def _line(self, final: bool) -> str:
        m = self.meter
        count = f"{m.n}/{m.total} ({100 * m.n / m.total:.0f}%)" if m.total else f"{m.n}"
        return f"{self.desc}: {count} {m.text(final)}"

    def update(self, n: int = 1) -> None:
        self.meter.update(n)
        self._maybe_print()

    def skip(self, n: int = 1) -> None:
        self.meter.skip(n)
        self._maybe_print()

    def _maybe_print(self) -> None:
        now = self.clock()
        if now - self._last >= self.interval:
            self._last = now
            print(self._line(False), file=self.stream, flush=True)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            print(self._line(True), file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Bar:
    """A tqdm bar on a terminal whose rate and ETA come from the ``_Meter`` (tqdm's own would be
    timed from the bar's creation and from the first, slowest batch)."""

    _FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {postfix}"

    def __init__(self, total: int | None, desc: str, stream):
        self.meter = _Meter(total)
        self.bar = tqdm(total=total, desc=desc, unit="item", leave=False, dynamic_ncols=True, file=stream,
                        bar_format=self._FORMAT if total else None)
        self.bar.set_postfix_str(self.meter.text(), refresh=False)

    def update(self, n: int = 1) -> None:
        self.meter.update(n)
        self.bar.set_postfix_str(self.meter.text(), refresh=False)
        self.bar.update(n)

    def skip(self, n: int = 1) -> None:
        self.meter.skip(n)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_progress(quiet: bool = False, *, stream=None, interval: float = 10.0):
    """A ``progress(total=..., desc=...)`` factory for ``hardrank.evaluate`` (the object it returns has
    ``update(n)`` for items encoded, ``skip(n)`` for items that failed, and ``close()``), or None when
    ``quiet``. A terminal gets a bar, anything else (a log file, CI) a line every ``interval`` seconds;
    both show the throughput measured after the first batch and the ETA it gives."""
    if quiet:
        return None
    stream = stream if stream is not None else sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return lambda total=None, desc="": _Bar(total, desc, stream)
    return lambda total=None, desc="": _LogLines(total, desc, stream, interval)
