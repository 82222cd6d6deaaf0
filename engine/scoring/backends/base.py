"""What a search backend is: a ``--search`` name, how its spec parses, and the two operations it serves.

The two operations (``OPS``):

- ``ranks`` (evaluation): ``grouped_ranks(spec, xq (nq, d), xb (nb, d), group_bounds (G+1,), pos_ptr (nq+1,),
  pos_idx, *, tie_rule, device, budget_bytes, precision)`` -> an object with numpy ``counts (nq, G)``,
  ``pos_score / pos_index (nq,)``, ``neg_score / neg_index (nq, G)`` (what ``scoring.metrics`` reads, the
  contract of ``kernels.grouped_ranks``) and ``info`` (a dict recorded as the result's
  ``provenance.search[direction]``; the registry adds ``search``: the backend's name and argument).
- ``topk`` (mining): ``searcher(spec, xb (nb, d), opts, nq)`` -> a searcher: ``searcher(xq (m, d) float32,
  kk, exclude)`` gives exact-scored ``(D (m, kk) float32, I (m, kk) int64)``, score descending then lower
  index, padded with -inf / -1, never returning an excluded (query, row) pair (``exclude``: CSR
  ``(ptr (m+1,), idx)`` or None); its ``exact`` says whether the lists are the exact top-kk, ``info``
  is recorded as mining's ``summary.json`` ``search`` (the registry adds ``method`` when it is missing).
  An approximate searcher may carry ``index`` (``nlist``, ``nprobe``, ``set_nprobe``) for nprobe tuning.
  ``opts`` is the mining options (``hardrank.config.MineOptions``: ``budget_mb``, ``block_size``,
  ``rank_precision``, ``nprobe``, ``seed``).

A backend lists the operations it serves in ``ops``; asking it for another is a UsageError that says which
backends serve it. Backends hold no state per run (one instance serves every run), except the sharded
placement (``backends.sharded``), which is built per run around one of them and closed after it.
"""
from __future__ import annotations

from dataclasses import dataclass

from hardrank.errors import UsageError

__all__ = ["Backend", "SearchSpec", "MinePlan", "OPS", "RANKS", "TOPK"]

RANKS = "ranks"  # evaluation: per query and gallery group, the count of items beating the best positive
TOPK = "topk"    # mining: per query, the top-k corpus rows
OPS = {RANKS: "eval ranking", TOPK: "mining"}  # what each operation serves, for help and errors


@dataclass(frozen=True)
class SearchSpec:
    """A parsed ``--search`` value: a registered backend's name (or alias) as written, and what followed its
    colon (faiss: the index factory), as the backend parsed it. ``hardrank.scoring.backends.parse`` makes one."""

    method: str             # the backend's name or alias: exhaustive, exact, auto, faiss, ...
    arg: str | None = None  # the part after "name:" (None: none given)

    def __str__(self) -> str:
        return self.method if self.arg is None else f"{self.method}:{self.arg}"


@dataclass(frozen=True)
class MinePlan:
    """How mining will search, in words for the plan line, and whether with an IVF index the run builds (or
    reuses) itself, which can live in a folder (``index``: its FAISS factory; None: the backend's searcher)."""

    how: str                          # the method, e.g. "exact search (kernels.topk, streamed)"
    why: str = ""                     # one clause: what chose it (auto: the cost model's estimates)
    index: str | None = None          # an IVF factory the run builds or reuses (mine --index / --index-out)
    exact_s: float | None = None      # the cost model's estimates, seconds (auto)
    index_s: dict | None = None
    alternatives: tuple[str, ...] = ()  # a smaller and a larger index and their costs (auto)


class Backend:
    """One search backend. A subclass sets the class attributes below and implements the operations named
    in ``ops``; ``parse`` checks the part of ``--search`` after the colon (default: none allowed)."""

    name: str = ""                  # the --search word (and the provenance's name for it)
    aliases: tuple[str, ...] = ()   # other words for the same backend
    syntax: str = ""                # how it is written, for help and errors (default: its words)
    examples: tuple[str, ...] = ()  # whole --search values that name it (default: its words)
    hint: str = ""                  # how to write the argument, for errors (e.g. the examples)
    ops: dict[str, str] = {}        # operation -> what it does there, one clause for --search help
    # its ranks are the exhaustive kernels' pass, which the executor's sharded ranker splits exactly over
    # gallery shards (--shard-gallery); the ranks of the others are computed in process
    gallery_shards: bool = False
    # its work runs on actors that load their own corpus rows (mining keeps the corpus lazy for them)
    remote: bool = False

    @property
    def words(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def written(self) -> str:
        """How ``--search`` names it: ``faiss:<factory>``, ``exhaustive | exact``."""
        return self.syntax or " | ".join(self.words)

    def parse(self, arg: str | None) -> str | None:
        """The argument after ``name:`` checked and normalised; UsageError saying what it takes."""
        if arg is not None:
            raise UsageError(f"search {self.written()} takes no argument after a colon, got ':{arg}'; "
                             f"write --search {self.name}")
        return None

    def describe(self, spec: SearchSpec, shape: tuple[int, int], opts) -> str:
        """How its top-k will search a corpus of ``shape`` (nb, d), in words, for plans printed before the work."""
        return f"--search {spec}"

    def mining_plan(self, spec: SearchSpec, nq: int, shape: tuple[int, int], opts, *, mapped: bool = False,
                    built: str | None = None) -> MinePlan:
        """How mining ``nq`` queries over a corpus of ``shape`` will search (``mapped``: the corpus is read from
        disk on demand; ``built``: the factory of an index built before, which ``mine --index`` reuses).
        Default: its own searcher, described."""
        return MinePlan(self.describe(spec, shape, opts))

    def lacks(self, op: str) -> UsageError:
        """The error for an operation this backend does not serve."""
        serves = " and ".join(OPS[o] for o in self.ops) or "nothing"
        return UsageError(f"search {self.name!r} does not serve {OPS[op]} (it serves {serves}); "
                          f"pick a backend that does (--help lists them under --search)")

    def grouped_ranks(self, spec: SearchSpec, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule: str,
                      device: str, budget_bytes: int, precision: str):
        raise self.lacks(RANKS)

    def searcher(self, spec: SearchSpec, xb, opts, nq: int | None = None):
        raise self.lacks(TOPK)

    def close(self) -> None:
        """Release what a run held (actors, a Ray session); nothing for in-process backends."""
