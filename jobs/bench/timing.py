"""Measuring for the benchmarks: a per-stage clock that syncs the device, bare-GEMM GFLOP/s, FLOPs, peak memory."""
from __future__ import annotations

import os
import threading
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["sync", "Clock", "bare_gemm_gflops", "flops_per_item", "PeakRSS"]


def sync(device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously; CPU needs nothing)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class Clock:
    """Accumulates seconds and items per stage name, synchronising the device around each block.

    >>> clock = Clock("cuda")
    >>> with clock("image encode", len(batch)):
    ...     encode(batch)
    >>> clock.s["image encode"], clock.n["image encode"]
    """

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.s: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def __call__(self, stage: str, items: int = 0) -> _Block:
        return _Block(self, stage, items)


class _Block:
    """One timed block of a ``Clock``: its seconds and items are added on exit."""

    def __init__(self, clock: Clock, stage: str, items: int):
        self.clock, self.stage, self.items = clock, stage, items

    def __enter__(self):
        sync(self.clock.device)
        self.t = time.perf_counter()

    def __exit__(self, *exc):
        c = self.clock
        sync(c.device)
        c.s[self.stage] = c.s.get(self.stage, 0.0) + time.perf_counter() - self.t
        c.n[self.stage] = c.n.get(self.stage, 0) + self.items


def bare_gemm_gflops(m: int, n: int, k: int, device: str, dtype=None, reps: int = 3, chunk: int = 4096) -> float:
    """GFLOP/s of ``(m, k) @ (k, n)`` in query chunks of ``chunk`` rows (so an (m, n) matrix is
    never held), after a warm-up: the hardware limit the rank and encode stages are held to."""
    dtype = dtype or (torch.float16 if str(device).startswith("cuda") else torch.float32)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(min(m, chunk), k, generator=g).to(device, dtype)
    b = torch.randn(n, k, generator=g).to(device, dtype)
    full, rest = divmod(m, chunk) if m > chunk else (1, 0)
    a_rest = a[:rest] if rest else None
    a @ b.T  # warm-up
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        for _ in range(full):
            a @ b.T
        if a_rest is not None:
            a_rest @ b.T
    sync(device)
    dt = (time.perf_counter() - t) / reps
    return 2.0 * m * n * k / dt / 1e9


def flops_per_item(fn, x) -> float | None:
    """FLOPs of ``fn(x)`` per row of x (torch's FLOP counter), or None where it cannot count."""
    try:
        with FlopCounterMode(display=False) as fc:
            fn(x)
        return fc.get_total_flops() / len(x) or None
    except Exception:  # an op the counter does not know: report no limit rather than fail the bench
        return None


class PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms (CPU runs)."""

    def __init__(self):
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        self.base = self._rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._rss() - self.base)
