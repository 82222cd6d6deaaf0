"""Progress for long stages: tqdm bars on a terminal, periodic log lines elsewhere, nothing with --quiet."""
from __future__ import annotations

import sys
import time

from tqdm import tqdm

__all__ = ["make_progress"]


class _LogLines:
    """A bar for logs (CI, nohup, files): one line every ``interval`` seconds and one at the end,
    each with the count, the throughput and the ETA."""

    def __init__(self, total: int | None, desc: str, stream, interval: float):
        self.total, self.desc, self.stream, self.interval = total, desc, stream, interval
        self.n = 0
        self.t0 = self._last = time.monotonic()

    def _line(self, final: bool) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = self.n / dt
        if self.total:
            left = (self.total - self.n) / rate if rate > 0 else float("inf")
            eta = "done" if final else (f"ETA {_hms(left)}" if left != float("inf") else "ETA ?")
            return (f"{self.desc}: {self.n}/{self.total} ({100 * self.n / self.total:.0f}%) "
                    f"{rate:,.0f} item/s, {_hms(dt)} elapsed, {eta}")
        return f"{self.desc}: {self.n} {rate:,.0f} item/s, {_hms(dt)} elapsed"

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            print(self._line(False), file=self.stream, flush=True)

    def close(self) -> None:
        print(self._line(True), file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def make_progress(quiet: bool = False, *, stream=None, interval: float = 10.0):
    """A ``progress(total=..., desc=...)`` factory for ``hardrank.evaluate`` (the object it returns has
    ``update(n)`` and ``close()``), or None when ``quiet``. A terminal gets tqdm bars with
    throughput and ETA; anything else (a log file, CI) gets a line every ``interval`` seconds."""
    if quiet:
        return None
    stream = stream if stream is not None else sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return lambda total=None, desc="": tqdm(total=total, desc=desc, unit="item", unit_scale=True,
                                                leave=False, dynamic_ncols=True, file=stream, smoothing=0.1)
    return lambda total=None, desc="": _LogLines(total, desc, stream, interval)
