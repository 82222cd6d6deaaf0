"""The search backends' registry is the one source of --search: names, parsing, help, dispatch, provenance.

A backend registered here, in the test, serves `hardrank eval --search brute` and `hardrank mine --search
brute` end to end without any other module knowing it."""
from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

from hardrank.config import EvalConfig, MineOptions
from hardrank.errors import UsageError
from hardrank.kernels import GroupedRanks, grouped_ranks
from hardrank.kernels.reference import grouped_ranks_reference, topk_reference
from hardrank.mining import MineProblem, mine_arrays
from hardrank.scoring import backends
from hardrank.scoring.backends import RANKS, TOPK, Backend
from hardrank.scoring.backends.sharded import Sharded, for_mining, for_ranking

ROOT = Path(__file__).resolve().parent.parent


def _t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


class _ReferenceSearch:
    """Top-k by the kernels' slow twin: every score exact, ties to the lower index."""

    exact = True

    def __init__(self, xb):
        self.xb = _t(np.asarray(xb, np.float32))
        self.info = {"oracle": "kernels.reference.topk_reference"}

    def __call__(self, xq, kk, excl):
        ptr, idx = excl if excl is not None else (None, None)
        D, I = topk_reference(_t(xq), self.xb, kk, exclude_ptr=ptr, exclude_idx=idx)
        return D.numpy(), I.numpy()


class _Brute(Backend):
    """The tiny backend a user might add: every score from ``kernels.reference``, both operations."""

    name = "brute"
    ops = {RANKS: "every score by the kernels' reference twin", TOPK: "top-k by sorting every score row"}

    def grouped_ranks(self, spec, xq, xb, group_bounds, pos_ptr, pos_idx, *, tie_rule, device, budget_bytes,
                      precision):
        r = grouped_ranks_reference(_t(xq).float(), _t(xb).float(), _t(group_bounds), _t(pos_ptr), _t(pos_idx),
                                    tie_rule=tie_rule)
        return SimpleNamespace(counts=r.counts.numpy(), pos_score=r.pos_score.numpy(), pos_index=r.pos_index.numpy(),
                               neg_score=r.neg_score.numpy(), neg_index=r.neg_index.numpy(),
                               info={"oracle": "kernels.reference.grouped_ranks_reference"})

    def searcher(self, spec, xb, opts, nq=None):
        return _ReferenceSearch(xb)


class _EvenRows(Backend):
    """An approximate top-k without an IVF index: only the even corpus rows are searched (exactly)."""

    name = "evens"
    ops = {TOPK: "the even rows only (test)"}

    def searcher(self, spec, xb, opts, nq=None):
        return _EvenSearch(xb)


class _EvenSearch(_ReferenceSearch):
    exact = False

    def __init__(self, xb):
        super().__init__(np.asarray(xb)[::2])
        self.info = {}

    def __call__(self, xq, kk, excl):  # the exclusions are ignored: these tests mine without positives
        D, I = super().__call__(xq, kk, None)
        return D, np.where(I >= 0, 2 * I, -1)


@pytest.fixture
def registered():
    """Register backends for one test, removed afterwards."""
    names = []

    def add(backend):
        names.append(backends.register(backend).name)
        return backend

    yield add
    for n in names:
        backends.unregister(n)


# -- the registry is the single source ------------------------------------------------------------------------------
def _search_help(command: str) -> str:
    from hardrank.jobs.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return next(a.help for a in sub.choices[command]._actions if a.dest == "search")


def test_every_registered_backend_parses_and_is_in_the_help_of_the_commands_it_serves():
    names = [b.name for b in backends.registered()]
    assert names == ["exhaustive", "faiss", "auto"]
    helps = {RANKS: _search_help("eval"), TOPK: _search_help("mine")}
    for b in backends.registered():
        for value in b.examples or b.words:
            spec = backends.parse(value)
            assert backends.get(spec) is b and str(spec) == value
        for op, text in helps.items():
            shown = f"{b.written()}: {b.ops[op]}" if op in b.ops else None
            assert (shown in text) if shown else (f"{b.written()}:" not in text), (b.name, op, text)
    assert backends.parse("exact", RANKS).method == "exact" and backends.get("exact").name == "exhaustive"


def test_an_unknown_name_lists_the_registry_and_a_wrong_command_says_what_it_serves():
    with pytest.raises(UsageError) as e:
        backends.parse("ivf-kernel")
    for b in backends.registered():
        assert all(repr(w) in str(e.value) for w in ((b.syntax,) if b.syntax else b.words)), str(e.value)
    with pytest.raises(UsageError, match=r"for eval ranking must be 'exhaustive', 'exact' or 'faiss:<factory>' "
                                         r"\(a faiss index_factory string: faiss:Flat.*got 'ivf-kernel'"):
        EvalConfig(suites=("toy",), search="ivf-kernel")
    with pytest.raises(UsageError, match="search 'auto' serves mining, not eval ranking; search for eval ranking "
                                         "must be 'exhaustive', 'exact' or 'faiss:<factory>'"):
        EvalConfig(suites=("toy",), search="auto")
    with pytest.raises(UsageError, match=r"search 'faiss' needs an index factory .*got 'faiss:'"):
        MineOptions(search="faiss:")
    with pytest.raises(UsageError, match="takes no argument after a colon, got ':x'"):
        MineOptions(search="exact:x")
    with pytest.raises(UsageError, match=r"--shard-gallery splits the exhaustive ranking pass over actors; "
                                         r"search 'faiss:Flat' cannot be split: drop --shard-gallery or use "
                                         r"--search exhaustive"):
        EvalConfig(suites=("toy",), search="faiss:Flat", shard_gallery=2)
    with pytest.raises(UsageError, match="the word 'exact' is empty, holds a colon or is taken"):
        backends.register(type("Clash", (_Brute,), {"name": "exact"})())
    assert [b.name for b in backends.registered()] == ["exhaustive", "faiss", "auto"]


def test_a_backend_is_named_in_provenance_by_its_own_name():
    rng = np.random.default_rng(0)
    xq, xb = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((9, 8)).astype(np.float32)
    bounds, ptr, idx = np.array([0, 4, 9]), np.arange(6), np.arange(5)
    r = backends.grouped_ranks("exact", xq, xb, bounds, ptr, idx)
    assert list(r.info)[:2] == ["search", "precision"] and r.info["search"] == "exhaustive"
    s = backends.searcher("exhaustive", xb, MineOptions(), 5)
    assert s.info["method"] == "exact" and s.info["backend"] == "kernels.topk"


def test_nothing_outside_the_registry_compares_search_names():
    """The backends are chosen in one place: no module outside hardrank.scoring.backends compares a value with a
    backend's name (an `if search == "faiss"` chain) or reads a spec's method to branch on it."""
    from test_layout import MODULES

    words = {w for b in backends.registered() for w in b.words} - {"auto"}  # "auto" also names precisions, devices
    found = []
    for name, path in MODULES.items():
        skip = ("hardrank.scoring.backends", "hardrank.kernels", "hardrank.jobs.bench", "hardrank.perturb")
        if name.startswith(skip):
            continue  # the registry itself; kernels' precision levels and the bench's rows reuse the words; perturb's
            # `method` is an alteration (mix, patch, corrupt:...), not a search
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                if (isinstance(side, ast.Constant) and side.value in words) or \
                        (isinstance(side, ast.Attribute) and side.attr == "method"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


# -- a backend registered here works end to end ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bworld")
    w = make_karpathy_world(root / "w", n_images=8)
    w["cfg"] = write_tiny_config(root)
    w["ckpt"] = save_random_checkpoint(w["cfg"], root / "c.safetensors", 0)
    w["store"] = root / "store"
    return w


def test_a_backend_registered_in_a_test_serves_eval_and_mine_from_the_command_line(world, registered, tmp_path):
    from hardrank.jobs.cli import main

    registered(_Brute())
    model = ["--model", str(world["cfg"]), "--checkpoint", str(world["ckpt"]), "--store", str(world["store"]),
             "--quiet"]
    ev = ["eval", *model, "--suite", "rococo", "--annotations", str(world["annotations"]), "--images",
          str(world["images"]), "--image-variants", "mix_0.9"]
    for search in ("exhaustive", "brute"):
        assert main([*ev, "--out", str(tmp_path / search), "--search", search]) == 0
    a = json.loads(next((tmp_path / "exhaustive").glob("*/rococo.json")).read_text())
    b = json.loads(next((tmp_path / "brute").glob("*/rococo.json")).read_text())
    assert b["metrics"] == a["metrics"] and b["provenance"]["config"]["search"] == "brute"
    oracle = "kernels.reference.grouped_ranks_reference"
    assert b["provenance"]["search"]["t2i"] == {"search": "brute", "oracle": oracle}
    assert pq.read_table(next((tmp_path / "brute").glob("*/rococo.parquet"))).equals(
        pq.read_table(next((tmp_path / "exhaustive").glob("*/rococo.parquet"))))

    mine = ["mine", *model, "--corpus", str(world["images"]), "--queries",
            str(world["annotations"] / "coco_karpathy_test.json"), "--images", str(world["images"]), "--direction",
            "t2i", "-k", "4", "--no-dup-filter"]  # a random model's embeddings are all near duplicates
    for search in ("exact", "brute"):
        assert main([*mine, "--out", str(tmp_path / f"m-{search}"), "--search", search]) == 0
    sa = json.loads((tmp_path / "m-exact" / "summary.json").read_text())
    sb = json.loads((tmp_path / "m-brute" / "summary.json").read_text())
    assert sb["search"] == {"method": "brute", "oracle": "kernels.reference.topk_reference"}
    assert sb["counts"] == sa["counts"] and sb["counts"]["negatives"] > 0

    def negatives(out):
        return pq.read_table(out / "negatives").sort_by([("query_id", "ascending"), ("rank", "ascending")])

    assert negatives(tmp_path / "m-brute").equals(negatives(tmp_path / "m-exact"))


def test_an_approximate_backend_without_an_index_has_its_recall_measured(registered, tmp_path):
    registered(_EvenRows())
    rng = np.random.default_rng(4)
    unit = lambda x: (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    xb, xq = unit(rng.standard_normal((60, 8))), unit(rng.standard_normal((20, 8)))
    prob = MineProblem(xq=xq, xb=xb, query_ids=[f"q{i}" for i in range(20)], corpus_ids=[f"c{j}" for j in range(60)],
                       modality="text", direction="t2t")
    lines = []
    s = mine_arrays(prob, MineOptions(k=3, search="evens", recall_sample=20, dup_threshold=None), tmp_path,
                    echo=lines.append)
    assert s["search"]["method"] == "evens" and s["search"]["nprobe"] is None and len(s["search"]["tuning"]) == 1
    assert 0 < s["search"]["tuning_recall@10"] < 1  # half the corpus is never searched
    assert any(line.startswith("approximate search evens: tuning recall@10") for line in lines)
    ids = pq.read_table(tmp_path / "negatives").column("negative_id").to_pylist()
    assert ids and all(int(i[1:]) % 2 == 0 for i in ids)


# -- the sharded placement: asked of the executor only for what can be split -----------------------------------------
class _Executor:
    """What the sharded placement asks of ``hardrank.executors``: a ranker and a corpus-search factory (or None)."""

    def __init__(self, ranker=None, search=None):
        self.ranker, self.search, self.asked = ranker, search, []

    def sharded_ranker(self, shards, above_mb):
        self.asked.append(("ranker", shards, above_mb))
        return self.ranker

    def sharded_search(self, shards):
        self.asked.append(("search", shards))
        return self.search


class _Ranker:
    """A stand-in for ``executors.ray_rank.ShardedRanker``: the kernels' ranks, sharded for galleries of >= 5 rows."""

    closed = False

    def wants(self, nb, d):
        return nb >= 5

    def __call__(self, xq, xb, bounds, ptr, idx, *, tie_rule, precision, budget_bytes):
        r = grouped_ranks(_t(xq), _t(xb), _t(bounds), _t(ptr), _t(idx), tie_rule=tie_rule, precision=precision,
                          budget_bytes=budget_bytes)
        return GroupedRanks(r.counts, r.pos_score, r.pos_index, r.neg_score, r.neg_index,
                            info={**r.info, "sharded": {"shards": 2}})

    def close(self):
        self.closed = True


def test_the_sharded_placement_splits_only_what_its_backend_allows():
    faiss = backends.get("faiss:Flat")
    ex = _Executor(ranker=_Ranker())
    assert for_ranking(faiss, ex, 3, 8192) is faiss and ex.asked == []  # faiss ranks are not split: Ray never asked
    exhaustive = backends.get("exhaustive")
    assert for_ranking(exhaustive, _Executor(), 0, 8192) is exhaustive  # the executor shards nothing
    placed = for_ranking(exhaustive, ex, 3, 8192)
    assert isinstance(placed, Sharded) and ex.asked == [("ranker", 3, 8192)] and not placed.remote
    rng = np.random.default_rng(1)
    xq = rng.standard_normal((4, 8)).astype(np.float32)
    for nb in (4, 6):  # below the ranker's size: in process; above: sharded, recorded in the provenance
        xb = rng.standard_normal((nb, 8)).astype(np.float32)
        args = ("exhaustive", xq, xb, np.array([0, 2, nb]), np.arange(5), np.arange(4) % nb)
        r = backends.grouped_ranks(*args, backend=placed)
        local = backends.grouped_ranks(*args)
        assert np.array_equal(r.counts, local.counts) and r.info["search"] == "exhaustive"
        assert ("sharded" in r.info) == (nb >= 5)
    placed.close()
    assert ex.ranker.closed

    made = []

    class Factory:  # a stand-in for executors.ray_search.ShardedSearchFactory
        def __call__(self, xb, opts):
            made.append(("search", xb.shape))
            return _ReferenceSearch(xb)

        def close(self):
            made.append("closed")

    ex = _Executor(search=Factory())
    assert for_mining(exhaustive, _Executor(), None) is exhaustive
    placed = for_mining(backends.get("auto"), ex, 4)
    assert placed.remote and placed.name == "auto" and ex.asked == [("search", 4)]
    s = backends.searcher("auto", np.zeros((7, 8), np.float32), MineOptions(), backend=placed)
    assert made == [("search", (7, 8))] and s.info["method"] == "auto"  # named by the backend it places
    placed.close()
    assert made[-1] == "closed"
