"""The one timing toolkit every benchmark uses: device sync, timers, bare-GEMM limits, FLOP formulas, peak memory."""
from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from hardrank.errors import UsageError

__all__ = ["sync", "timed", "timings", "best_of", "interleaved", "throughput", "Clock", "Timeline",
           "score_gemm", "bare_gemm", "bare_gemm_gflops", "vit_flops", "image_flops", "text_flops",
           "flops_per_item", "PeakRSS"]


# -- clocks ----------------------------------------------------------------------------------------------------
def sync(device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously; CPU needs nothing)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device="cpu", clock=time.perf_counter) -> tuple[float, Any]:
    """(seconds, result) of one call of ``fn``, the device synchronised before and after (cold: no warm-up)."""
    sync(device)
    t = clock()
    res = fn()
    sync(device)
    return clock() - t, res


def timings(fn: Callable[[], Any], device="cpu", repeat: int = 3, warmup: int = 1, min_s: float = 0.0,
            clock=time.perf_counter) -> list[float]:
    """Seconds of each timed call of ``fn``, after ``warmup`` untimed calls: ``repeat`` calls, then more until
    ``min_s`` seconds of ``clock`` have passed since the first (``time.process_time``: this process's CPU time,
    which ignores time spent descheduled on a shared machine)."""
    if repeat < 1:
        raise UsageError(f"timings needs repeat >= 1 (the number of timed calls), got {repeat}")
    for _ in range(warmup):
        fn()
    sync(device)
    out: list[float] = []
    start = clock()
    while len(out) < repeat or clock() - start < min_s:
        out.append(timed(fn, device, clock)[0])
    return out


def best_of(fn: Callable[[], Any], device="cpu", repeat: int = 3, warmup: int = 1, min_s: float = 0.0,
            clock=time.perf_counter) -> float:
    """The fastest of ``timings(...)``: the run least disturbed by other work on the machine."""
    return min(timings(fn, device, repeat, warmup, min_s, clock))


def interleaved(fns: dict[str, Callable[[], Any]], device="cpu", rounds: int = 3, warmup: int = 1,
                clock=time.perf_counter) -> dict[str, list[float]]:
    """Seconds of each function per round; every round calls each once, in turn, so load that drifts on a
    shared machine hits them all alike. ``warmup`` untimed rounds first."""
    if rounds < 1:
        raise UsageError(f"interleaved needs rounds >= 1 (the number of timed rounds), got {rounds}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name].append(timed(fn, device, clock)[0])
    return out


def throughput(fn: Callable[[], Any], items: int, device="cpu", min_s: float = 0.0, max_calls: int = 50) -> float:
    """Items/s of ``fn`` (``items`` per call). ``min_s`` > 0: a warm-up call, a timed one, then as many calls as
    last ``min_s`` back to back, synchronised at the ends only (queued GPU work overlaps, as in a pipeline);
    0: the first call's rate, cold."""
    if min_s <= 0:
        return items / timed(fn, device)[0]
    one = best_of(fn, device, repeat=1, warmup=1)
    n = max(1, min(max_calls, math.ceil(min_s / max(one, 1e-6))))

    def calls():
        for _ in range(n):
            fn()  # each result dropped at once, as a pipeline would

    return n * items / timed(calls, device)[0]


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


class Timeline:
    """A ``progress`` callback for ``embed_tables`` that records when each row finished (``perf_counter``);
    ``start`` is when it was made (reset it just before the run it follows)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.events: list[tuple[float, int]] = []

    def __call__(self, total, desc):
        return _TimelineBar(self.events)

    def rate(self, after: float = 0.5) -> float:
        """Rows/s over the rows delivered after the first ``after`` fraction: the steady state, with
        start-up (and any backlog the decoders built while the encoder was starting) excluded."""
        if len(self.events) < 3:
            return float("nan")
        t = np.array([e[0] for e in self.events])
        n = np.cumsum([e[1] for e in self.events])
        i = min(int(np.searchsorted(n, after * n[-1])), len(t) - 2)
        return float((n[-1] - n[i]) / (t[-1] - t[i]))


class _TimelineBar:
    """The progress bar a ``Timeline`` hands out: each update is stamped."""

    def __init__(self, events: list):
        self.events = events

    def update(self, n):
        self.events.append((time.perf_counter(), n))

    def close(self):
        pass


# -- bare GEMMs: the limit the kernels and encoders are held to ------------------------------------------------
@functools.cache
def _fp32_out(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` takes ``dtype`` operands on this device."""
    try:
        one = torch.ones(2, 2, dtype=dtype, device=device_type)
        return torch.mm(one, one, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def score_gemm(device, dtype: torch.dtype) -> tuple[str, Callable]:
    """(form, mm): ``mm(a, b_t)`` scores a tile from ``dtype`` operands the way the ranking kernels do on
    ``device``: fp32 operands in fp32; low-precision operands with fp32 output where torch's GEMM offers it
    there (CUDA), else in the operands' own format (CPU: the kernels keep that 2-byte tile)."""
    if dtype == torch.float32:
        return "float32", torch.mm
    if _fp32_out(torch.device(device).type, dtype):
        return "mm(out_dtype=float32)", functools.partial(torch.mm, out_dtype=torch.float32)
    return f"{str(dtype).removeprefix('torch.')} output", torch.mm


def bare_gemm(xq: torch.Tensor, xb: torch.Tensor, q_block: int, g_block: int, dtype: torch.dtype | None = None,
              native: bool = False) -> None:
    """Every (q_block, g_block) score tile of ``xq (nq, d) @ xb (nb, d).T`` and nothing else: the limit the
    ranking kernels are held to. ``dtype``: the operands (default xq's; gallery tiles are converted on the fly,
    as the kernels do). Scores come out as ``score_gemm`` makes them, or with ``native`` in the GEMM's own
    output format (for reference: no exact ranks from fp16 scores)."""
    dtype = dtype or xq.dtype
    a_all = xq.to(dtype)
    mm = torch.mm if native else score_gemm(xq.device, dtype)[1]
    # a GEMM in the operands' format writes into one reused tile; the fp32-output GEMM allocates its own
    # (the caching allocator hands the same block back)
    out = torch.empty((min(q_block, len(xq)), min(g_block, len(xb))), dtype=dtype, device=xq.device) \
        if mm is torch.mm else None
    for q0 in range(0, len(xq), q_block):
        a = a_all[q0:q0 + q_block]
        for c0 in range(0, len(xb), g_block):
            b = xb[c0:c0 + g_block].to(dtype)
            if out is None:
                mm(a, b.T)
            else:
                torch.mm(a, b.T, out=out[:len(a), :len(b)])


def bare_gemm_gflops(m: int, n: int, k: int, device, dtype: torch.dtype | None = None, reps: int = 3,
                     chunk: int = 4096, min_s: float = 0.0) -> float:
    """GFLOP/s of ``(m, k) @ (n, k).T`` (``nn.Linear``'s layout) in the GEMM's own output format, in query
    chunks of ``chunk`` rows (so an (m, n) matrix is never held): the best of ``reps`` runs (and of as many
    more as ``min_s`` seconds allow) after a warm-up. ``dtype``: fp16 on CUDA, fp32 elsewhere by default."""
    dtype = dtype or (torch.float16 if str(device).startswith("cuda") else torch.float32)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    b = torch.randn(n, k, generator=g, device=device).to(dtype)
    s = best_of(lambda: bare_gemm(a, b, chunk, n, native=True), device, repeat=reps, min_s=min_s)
    return 2.0 * m * n * k / s / 1e9


# -- FLOPs ------------------------------------------------------------------------------------------------------
def vit_flops(width: int, layers: int, tokens: int, mlp_ratio: float = 4.0) -> float:
    """FLOPs of ``layers`` transformer blocks over ``tokens`` tokens: per token and layer, the qkv and output
    projections (4 w^2 multiply-adds), the MLP (2 r w^2) and attention scores and mixing (2 n w); FLOPs = 2 x MACs."""
    return 2.0 * layers * tokens * ((4 + 2 * mlp_ratio) * width * width + 2 * tokens * width)


def image_flops(cfg: dict) -> float:
    """FLOPs of one image through an open_clip ViT image tower (patch embedding, blocks, projection); ``cfg``
    is the model config (``open_clip.get_model_config``). Counted from the architecture: torch's FLOP counter
    misses the fused inference attention's projections."""
    v = cfg["vision_cfg"]
    grid = v["image_size"] // v["patch_size"]
    patches, w = grid * grid, v["width"]
    embed = 2.0 * patches * 3 * v["patch_size"] ** 2 * w  # the patch convolution
    return embed + vit_flops(w, v["layers"], patches + 1, v.get("mlp_ratio", 4.0)) + 2.0 * w * cfg["embed_dim"]


def text_flops(cfg: dict, tokens: int) -> float:
    """FLOPs of one caption of ``tokens`` tokens through an open_clip text tower."""
    t = cfg["text_cfg"]
    return vit_flops(t["width"], t["layers"], tokens, t.get("mlp_ratio", 4.0)) + 2.0 * t["width"] * cfg["embed_dim"]


def flops_per_item(fn, x) -> float | None:
    """FLOPs of ``fn(x)`` per row of x (torch's FLOP counter), or None where it cannot count."""
    try:
        with FlopCounterMode(display=False) as fc:
            fn(x)
        return fc.get_total_flops() / len(x) or None
    except Exception:  # an op the counter does not know: report no limit rather than fail the bench
        return None


# -- memory -----------------------------------------------------------------------------------------------------
class PeakRSS:
    """Peak resident memory of this process, sampled by a thread every ``interval`` seconds.

    ``kind``: "total" (VmRSS: heap and the pages of mapped files) or "anon" (RssAnon: the heap alone; mapped
    files are page cache, shared and reclaimable). As a context manager, ``peak`` is the peak above the level
    at entry; otherwise ``start()`` it, ``reset()`` before each measurement and read ``high`` (bytes)."""

    def __init__(self, kind: str = "total", interval: float = 0.002):
        if kind not in ("total", "anon"):
            raise ValueError(f"PeakRSS kind must be 'total' or 'anon', got {kind!r}")
        self.kind, self.interval = kind, interval
        self.base = self.high = self.now()
        self.peak = 0
        self._lock = threading.Lock()  # a sample taken across a reset must not carry the old peak over
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    @staticmethod
    def status() -> dict[str, int]:
        """The memory lines of /proc/self/status (VmRSS, RssAnon, RssFile, VmHWM, ...), in bytes."""
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if v.strip().endswith("kB"):
                    out[k] = int(v.split()[0]) << 10
        return out

    def now(self) -> int:
        if self.kind == "anon":
            return self.status()["RssAnon"]
        with open("/proc/self/statm") as f:  # cheaper than status at a 2 ms period
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def reset(self) -> int:
        """Start a new peak from now; returns the level now."""
        with self._lock:
            self.base = self.high = self.now()
        return self.base

    def start(self) -> PeakRSS:
        self._stop.clear()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join()
        with self._lock:
            self.high = max(self.high, self.now())
        self.peak = self.high - self.base

    def _run(self):
        while not self._stop.is_set():
            with self._lock:
                self.high = max(self.high, self.now())
            time.sleep(self.interval)

    def __enter__(self):
        self.reset()
        return self.start()

    def __exit__(self, *exc):
        self.stop()
