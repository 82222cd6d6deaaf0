"""A run's settings: decided once where the run starts, frozen, and handed down to its stages and workers.

No module keeps them: ``start_run`` decides the thread budget (``hardrank.cpus``) and the decode threads,
sizes torch's pools, and returns a ``RunSettings`` that the entry point (``evaluate``, ``mine``, the attack
commands, the benchmarks) passes to what it builds: ``EmbedPipeline`` (the decode threads of every
``EmbedJob``, in this process or in Ray actors), the executors (a local Ray cluster's CPUs), and the
results (``provenance.threads``, mining's ``summary.json`` ``threads``). Two runs in one process, one after
the other, each use and record their own.
"""
from __future__ import annotations

from dataclasses import dataclass

from hardrank import cpus
from hardrank.cpus import ThreadBudget

__all__ = ["RunSettings", "start_run", "DECODE_THREADS_CAP"]

DECODE_THREADS_CAP = 8  # default decode threads: the budget, at most this (past it the GIL-bound parts stop scaling)


@dataclass(frozen=True)
class RunSettings:
    """What one run computes with. Built by ``start_run``; plain data, so it travels to workers as it is."""

    budget: ThreadBudget   # torch's threads (FAISS's follow them), a local Ray cluster's CPUs; recorded in results
    decode_threads: int    # threads per image decoder: --decode-threads, else the budget, at most DECODE_THREADS_CAP

    @property
    def threads(self) -> int:
        return self.budget.threads

    def record(self) -> dict:
        """What results record (``provenance.threads``): the budget, why, and OpenMP's wait policy."""
        return self.budget.record()


def start_run(threads: int | None = None, decode_threads: int | None = None, *, probe: bool = True) -> RunSettings:
    """Decide a run's settings and size this process's torch pools to them: the first step of every entry
    point. ``threads``, ``decode_threads``: the options (None: the budget's rule, ``hardrank.cpus.budget``;
    ``probe``: whether it looks at the idle cores first, as ``cpus.decide``)."""
    b = cpus.apply(cpus.decide(threads, probe=probe))
    if decode_threads is not None:
        cpus.check_threads(decode_threads, "option decode_threads (--decode-threads)")
    return RunSettings(b, decode_threads or max(1, min(DECODE_THREADS_CAP, b.threads)))
