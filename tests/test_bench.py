"""bench pipeline: the naive baseline's pieces (rank, view slices, encoders) and, with the kernels, the whole bench."""
import json
import re
import sys

import numpy as np
import pytest
import torch
from helpers import make_karpathy_world, measured, save_random_checkpoint, write_tiny_config

from hardrank.config import EmbedOptions, SuiteOptions
from hardrank.jobs.bench import PipelineBenchConfig, write_bench
from hardrank.jobs.bench.naive import NaivePipeline, view_slice
from hardrank.jobs.bench.timing import Clock, bare_gemm_gflops, flops_per_item
from hardrank.jobs.cli import main
from hardrank.kernels import grouped_ranks
from hardrank.kernels.reference import naive_rank
from hardrank.tasks import RankingTask


def _brute(S, pos_sets):
    """Rank by counting: items with a higher score, or an equal score and a lower index (index rule)."""
    ranks = []
    for q, pos in enumerate(pos_sets):
        best = min(pos, key=lambda j: (-S[q, j], j))
        beat = sum(1 for j in range(S.shape[1]) if j not in pos and
                   (S[q, j] > S[q, best] or (S[q, j] == S[q, best] and j < best)))
        ranks.append(beat)
    return np.array(ranks)


@pytest.mark.parametrize("nq, nb", [(1, 1), (7, 13), (31, 5), (2, 64)])
def test_naive_rank_matches_brute_force_with_ties(nq, nb):
    g = torch.Generator().manual_seed(nq * 100 + nb)
    xq = torch.randint(-2, 3, (nq, 4), generator=g).float()   # small integers: many exact ties
    xb = torch.randint(-2, 3, (nb, 4), generator=g).float()
    rng = np.random.default_rng(nq + nb)
    pos_sets = [sorted(set(rng.integers(0, nb, rng.integers(1, 4)).tolist())) for _ in range(nq)]
    ptr = np.concatenate([[0], np.cumsum([len(p) for p in pos_sets])])
    idx = np.concatenate([p for p in pos_sets])
    rank, top1 = naive_rank(xq, xb, ptr, idx)
    S = (xq @ xb.T).numpy()
    np.testing.assert_array_equal(rank.numpy(), _brute(S, [set(p) for p in pos_sets]))
    np.testing.assert_array_equal(top1.numpy(), [min(range(nb), key=lambda j: (-S[q, j], j)) for q in range(nq)])


@pytest.mark.parametrize("nq, nb, q_block, g_block", [(1, 1, None, None), (5, 2, 2, 1), (33, 129, 7, 128),
                                                       (17, 257, None, None), (3, 131, 1, 3)])
def test_naive_rank_agrees_with_grouped_ranks(nq, nb, q_block, g_block):
    """The bench's baseline and the engine's kernel, index tie rule, one group: quantised
    embeddings (exact scores, many ties), exact duplicate gallery rows, repeated positives."""
    g = torch.Generator().manual_seed(7 * nq + nb)
    xq = torch.randint(-1, 2, (nq, 8), generator=g).float() / 8   # (nq, 8): every dot product exact
    xb = torch.randint(-1, 2, (nb, 8), generator=g).float() / 8   # (nb, 8)
    dup = torch.randint(0, nb, (nb // 3,), generator=g)
    xb[torch.randint(0, nb, (nb // 3,), generator=g)] = xb[dup]     # exact duplicates at other indices
    pos = [torch.randint(0, nb, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
           for _ in range(nq)]                                      # duplicates within a query possible
    ptr = torch.tensor([0] + [len(p) for p in pos]).cumsum(0)
    idx = torch.tensor([j for p in pos for j in p])
    rank, top1 = naive_rank(xq, xb, ptr, idx)
    fast = grouped_ranks(xq, xb, torch.tensor([0, nb]), ptr, idx, tie_rule="index", q_block=q_block, g_block=g_block)
    assert torch.equal(rank, fast.rank())
    # top-1: the best positive where it ranks first, else the best non-positive (lowest index among ties)
    assert torch.equal(top1, torch.where(fast.rank() == 0, fast.pos_index, fast.neg_index[:, 0]))


def test_view_slice_remaps_positives():
    t = RankingTask(name="t2i", query_modality="text", query_items=np.arange(3), query_ids=list("abc"),
                    groups=["original", "mix", "patch"], group_bounds=np.array([0, 2, 4, 6]),
                    gallery_items=np.arange(6), gallery_ids=[str(i) for i in range(6)],
                    pos_ptr=np.array([0, 1, 3, 4]), pos_idx=np.array([1, 0, 5, 0]),
                    views={"original": ["original"], "patch": ["original", "patch"]})
    pos, ptr, idx = view_slice(t, "patch")
    assert pos.tolist() == [0, 1, 4, 5]
    assert ptr.tolist() == [0, 1, 3, 4] and idx.tolist() == [1, 0, 3, 0]
    pos, ptr, idx = view_slice(t, "original")
    assert pos.tolist() == [0, 1] and ptr.tolist() == [0, 1, 2, 3] and idx.tolist() == [1, 0, 0]


def test_bare_gemm_and_flop_count():
    assert measured(bare_gemm_gflops(300, 200, 64, "cpu", reps=1, chunk=128))
    lin = torch.nn.Linear(16, 8, bias=False)
    assert flops_per_item(lin, torch.zeros(4, 16)) == pytest.approx(2 * 16 * 8)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("benchworld")
    w = make_karpathy_world(root, n_images=6)
    w["cfg"] = write_tiny_config(root)
    w["ckpts"] = tuple(str(save_random_checkpoint(w["cfg"], root / f"c{i}.safetensors", i)) for i in range(2))
    return w


def _cfg(world, **kw):
    opts = SuiteOptions(annotations=str(world["annotations"]), images=str(world["images"]), image_variants=("mix_0.9",))
    return PipelineBenchConfig(model=str(world["cfg"]), checkpoints=world["ckpts"], suites=("rococo",),
                               suite_options=opts, embed=EmbedOptions(device="cpu", batch_size=5, decode_threads=1),
                               naive_workers=0, **kw)


def test_naive_pipeline_counts_its_work(world):
    clock = Clock()
    res = NaivePipeline(_cfg(world), clock).run()
    assert sorted(res) == ["c0", "c1"]
    assert set(res["c0"]) == {("rococo", v, d) for v, d in [("original", "i2t"), ("same_concept", "i2t"),
                                                               ("original", "t2i"), ("mix_0.9_s1", "t2i")]}
    # K separate passes, each view encoded from scratch: i2t views decode the 6 query images twice,
    # t2i views decode 6 + 12 gallery images; x 2 checkpoints
    assert clock.n["decode+preprocess"] == 2 * (6 + 6 + 6 + 12)
    assert clock.n["image encode"] == clock.n["decode+preprocess"]
    assert clock.n["tokenise"] == 2 * (31 + 61 + 31 + 31)
    assert clock.n["rank"] == 2 * (6 + 6 + 31 + 31)
    assert all(0 <= v <= 100 for v in res["c1"].values())


def test_bench_checkpoint_without_model_is_a_usage_error():
    assert main(["bench", "pipeline", "--checkpoint", "a.pt"]) == 2


def test_bench_pipeline_end_to_end(world, tmp_path, capsys):
    rc = main(["bench", "pipeline", "--model", str(world["cfg"]), "--checkpoint", *world["ckpts"], "--suite", "rococo",
               "--annotations", str(world["annotations"]), "--images", str(world["images"]), "--image-variants",
               "mix_0.9", "--batch-size", "8", "--decode-threads", "1", "--naive-workers", "0", "--sample", "16",
               "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    b = json.loads((tmp_path / "bench_pipeline.json").read_text())
    stages = {s["stage"]: s for s in b["stages"]}
    assert {"key/read", "decode", "preprocess", "image encode", "tokenise", "text encode", "rank",
            "write"} <= set(stages)
    assert measured(stages["rank"]["limit_fraction"]) and measured(stages["image encode"]["naive_items_per_s"])
    assert measured(b["end_to_end"]["speedup"]) and b["naive"]["check"]["max_abs_diff_R@1"] <= 1e-5
    assert (tmp_path / "bench_pipeline.png").read_bytes()[:4] == b"\x89PNG"
    assert "hardrank is" in capsys.readouterr().out


def test_bench_pipeline_flags(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "pipeline", "--help"])
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", capsys.readouterr().out))
    assert {"--model", "--checkpoint", "--suite", "--data", "--images", "--annotations", "--image-variants", "--seeds",
            "--device", "--batch-size", "--decode-threads", "--budget-mb", "--sample", "--naive", "--no-naive",
            "--naive-workers", "--out", "--quiet"} <= flags
    assert "--store" not in flags  # the bench times a fresh store of its own (cold, then warm)
    with pytest.raises(ValueError, match=r"sample \(--sample\) must be a number >= 1, got 0"):
        PipelineBenchConfig(model="toy-clip", sample=0)
    with pytest.raises(ValueError, match="option model is required"):
        PipelineBenchConfig()


def test_bench_writes_json_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "hardrank.jobs.report.plots", raising=False)
    b = {"stages": [], "end_to_end": {"speedup": 2.0}}
    assert write_bench(b, tmp_path) == [tmp_path / "bench_pipeline.json"]
    assert json.loads((tmp_path / "bench_pipeline.json").read_text()) == b
    assert not (tmp_path / "bench_pipeline.png").exists()
    assert "pip install 'hardrank[report]'" in capsys.readouterr().err
