"""Where work runs: in this process (threads) or on long-lived Ray actors, behind one factory.

``executor(options, settings)`` is the only place the executor option is read; the executor carries the run's
threads to what it starts (a local Ray cluster's CPUs). Each kind of work asks it for its runner: embedding
(``embed_runner``), tar-shard scans (``scan_mapper``), ranking galleries sharded over actors
(``sharded_ranker``) and mining's corpus sharded over actors (``sharded_search``). The ``ray_*`` modules of
this package are the only ones in hardrank that import Ray; they load when a Ray executor first needs them, so
the core runs without the ``ray`` extra.
"""
from __future__ import annotations

import contextlib
import os

from hardrank.config import EmbedOptions
from hardrank.errors import MissingExtra
from hardrank.executors.local import LocalRunner
from hardrank.settings import RunSettings

__all__ = ["executor", "LocalExecutor", "RayExecutor", "LocalRunner"]


@contextlib.contextmanager
def _needs_ray(what: str):
    """Turn Ray's absence (and only Ray's) into MissingExtra naming ``what`` and the install line."""
    try:
        yield
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "ray":  # an import error of our own modules is a bug, not the extra
            raise
        raise MissingExtra(what, "ray", "ray[data]") from exc


class LocalExecutor:
    """In-process: decode threads feeding live models; scans in threads; one-process ranking and search.
    ``--shard-gallery N`` still shards a ranking gallery over N Ray actors (a cluster of its own)."""

    name = "local"
    live_models = True  # its embed runner encodes with the driver's own models (model objects included)

    def __init__(self, address: str | None = None, threads: int | None = None):
        self.address = address  # the Ray cluster for the work that runs on actors (None: start one)
        self.threads = threads  # the run's thread budget: a local Ray cluster's CPUs (None: this process's budget)

    def embed_runner(self, models):
        return LocalRunner(models)

    def shared_runner_key(self) -> str | None:
        """Runs that may share one embed runner have equal keys; None: each run keeps its own (in-process
        runners hold that run's live models)."""
        return None

    def scan_mapper(self):
        """``mapper(fn, shards)`` for ``hardrank.inputs.scan_with``; None scans with threads here."""
        return None

    def sharded_ranker(self, shards: int, above_mb: int):
        """A ranker over gallery shards held by Ray actors, or None for the one-process pass."""
        if not shards:
            return None
        return self._ray_ranker(shards, above_mb)

    def sharded_search(self, shards: int | None):
        """A factory of corpus-sharded searchers for mining, or None for the one-process search."""
        return None

    def _ray_ranker(self, shards: int, above_mb: int):
        with _needs_ray("eval --shard-gallery"):
            from hardrank.executors.ray_rank import ShardedRanker
        return ShardedRanker(shards=shards, above_mb=above_mb, address=self.address, threads=self.threads)


class RayExecutor(LocalExecutor):
    """Long-lived Ray actors (one decode+encode actor per node on CPU, decode actors feeding one encoder per
    GPU); shard scans as Ray tasks; galleries above a size and mining corpora sharded over actors."""

    name = "ray"
    live_models = False  # its actors rebuild every model from its spec

    def embed_runner(self, models):
        with _needs_ray("--executor ray"):
            from hardrank.executors.ray_embed import RayRunner
        return RayRunner(address=self.address, threads=self.threads)

    def shared_runner_key(self) -> str | None:
        return self.address or os.environ.get("RAY_ADDRESS") or ""  # one Ray session per cluster

    def scan_mapper(self):
        with _needs_ray("--executor ray"):
            from hardrank.executors.ray_embed import ScanMapper
        return ScanMapper(address=self.address, threads=self.threads)

    def sharded_ranker(self, shards: int, above_mb: int):
        return self._ray_ranker(shards, above_mb)

    def sharded_search(self, shards: int | None):
        with _needs_ray("mine --executor ray"):
            from hardrank.executors.ray_search import ShardedSearchFactory
        return ShardedSearchFactory(shards=shards, address=self.address, threads=self.threads)


_KINDS = {cls.name: cls for cls in (LocalExecutor, RayExecutor)}


def executor(options: EmbedOptions, settings: RunSettings | None = None) -> LocalExecutor:
    """The executor ``options.executor`` names (``EmbedOptions`` has checked the name), for the run ``settings``
    describe (None: the threads ``options`` set, if any)."""
    return _KINDS[options.executor](options.ray_address, settings.threads if settings else options.threads)
