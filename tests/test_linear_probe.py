"""Linear probes: the few-shot pick, search and metrics against slow twins; the store; CLIP_benchmark's own probe."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import import_clip_benchmark, install_clip_benchmark, save_random_checkpoint, write_tiny_config

from hardrank.errors import DataError, UsageError
from hardrank.evaluate import evaluate, plan
from hardrank.exports.clip_benchmark import export_clip_benchmark
from hardrank.scoring.probe import (
    DEFAULT_WEIGHT_DECAYS,
    ProbeOptions,
    fewshot_pick,
    probe_metrics,
    search_weight_decay,
    short_classes,
    split_by_proportion,
)
from hardrank.scoring.results import summary_row

CLASSES = ("blue", "cyan", "dark", "gray", "green", "pink", "red")  # sorted: ImageFolder's label order
COLOURS = {"blue": (30, 30, 200), "cyan": (30, 200, 200), "dark": (20, 20, 20), "gray": (128, 128, 128),
           "green": (30, 200, 30), "pink": (230, 120, 200), "red": (200, 30, 30)}
# images per class and split: the test split unbalanced, so mean per-class recall differs from top-1
SPLITS = {"train": (12, 10, 11, 12, 9, 12, 10), "val": (4, 3, 4, 4, 3, 4, 4), "test": (9, 5, 8, 6, 7, 4, 8)}


# -- slow twins --------------------------------------------------------------------------------------------------
def test_fewshot_pick_walks_one_permutation(tmp_path):
    rng = np.random.default_rng(0)
    for n, c, k, seed in ((1, 1, 1, 0), (37, 5, 3, 7), (200, 13, 1, 2), (64, 4, 20, 1), (50, 3, -1, 5)):
        labels = rng.integers(0, c, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()  # the twin: walk it
        counts, want = {}, []
        for p in perm:
            if k < 0 or counts.get(labels[p], 0) < k:
                counts[labels[p]] = counts.get(labels[p], 0) + 1
                want.append(p)
        assert fewshot_pick(labels, k, seed).tolist() == want
    assert short_classes(np.array([0, 0, 2, 2, 2, 5]), 3) == [(0, 2), (5, 1)]  # class 1, 3, 4: absent, not short
    for n, p in ((10, 0.2), (7, 0.5), (1001, 0.1)):
        tr, va = split_by_proportion(n, p, 3)
        parts = torch.utils.data.random_split(range(n), [1 - p, p], generator=torch.Generator().manual_seed(3))
        assert (tr.tolist(), va.tolist()) == (parts[0].indices, parts[1].indices)
        assert sorted(tr.tolist() + va.tolist()) == list(range(n))


def test_probe_metrics_match_brute_force():
    rng = np.random.default_rng(1)
    for n, c in ((1, 3), (23, 4), (60, 9), (31, 6)):
        logits = torch.from_numpy(rng.integers(0, 4, (n, c)).astype(np.float32))  # many ties
        labels = torch.from_numpy(rng.integers(0, c, n))
        m = probe_metrics(logits, labels)
        lg, lab = logits.numpy(), labels.numpy()
        top = [sorted(range(c), key=lambda j, i=i: (-lg[i, j], j)) for i in range(n)]  # ties: the lower class first
        pred = [t[0] for t in top]
        assert m["acc1"] == pytest.approx(100 * np.mean([p == y for p, y in zip(pred, lab)]))
        if lab.max() >= 5:  # CLIP_benchmark's probe reports top-5 only when some test label is >= 5
            assert m["acc5"] == pytest.approx(100 * np.mean([y in t[:5] for t, y in zip(top, lab)]))
        else:
            assert m["acc5"] != m["acc5"]
        recalls = [np.mean([p == y for p, y in zip(pred, lab) if y == cl]) for cl in sorted(set(lab.tolist()))]
        assert m["mean_per_class_recall"] == pytest.approx(100 * np.mean(recalls))


def _find_peak_twin(acc, grid):
    """CLIP_benchmark's search as it runs: every round trains each of its points again (no memo)."""
    trained = []

    def peak(idxs):
        best, top = 0, 0
        for i in idxs:
            trained.append(i)
            if top < acc(grid[i]):
                best, top = i, acc(grid[i])
        return best

    p = peak([i for i, v in enumerate(grid) if v in np.logspace(-6, 2, num=7).tolist()])
    span = 8
    while span > 0:
        p = peak([max(p - span, 0), p, min(p + span, len(grid) - 1)])
        span //= 2
    return grid[p], trained


@pytest.mark.parametrize("shape", ["single_peak", "plateau", "all_zero", "edge"])
def test_weight_decay_search_is_clip_benchmarks(shape):
    grid = list(DEFAULT_WEIGHT_DECAYS)
    centre = {"single_peak": 41, "plateau": 70, "all_zero": 0, "edge": 96}[shape]

    def acc(w):
        i = grid.index(w)
        if shape == "all_zero":
            return 0.0
        if shape == "plateau":
            return 0.5 if 60 <= i <= 80 else 0.25  # ties: the first best of each round stays
        return 1.0 / (1 + abs(i - centre))

    calls = []
    wd, tried = search_weight_decay(lambda w: calls.append(w) or acc(w))
    want, trained = _find_peak_twin(acc, grid)
    assert wd == want and sorted(set(calls)) == sorted(set(grid[i] for i in trained)) and len(calls) == len(set(calls))
    assert [w for w, _ in tried] == calls
    if shape == "all_zero":
        assert wd == grid[0]  # find_peak's start: the grid's first value when every probe scores 0
    given, _ = search_weight_decay(lambda w: {0.1: 0.2, 1.0: 0.7, 10.0: 0.7}[w], (0.1, 1.0, 10.0))
    assert given == 1.0  # a grid given: each value, the first best


# -- a CLIP_benchmark WebDataset root ------------------------------------------------------------------------------
def _images(folder: Path, split: str, seed: int) -> Path:
    """An ImageFolder of colour patches with noise: a random tiny model's features still tell the classes apart."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, n in zip(CLASSES, SPLITS[split]):
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            a = np.asarray(COLOURS[c])[None, None] + rng.normal(0, 70, (32, 32, 3))
            Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(folder / c / f"{i}.png")
    return folder


def _shards(root: Path, splits=("train", "val", "test")) -> Path:
    """The layout CLIP_benchmark's convert_dataset writes (keys s%07d, <key>.png + <key>.cls, nshards.txt,
    classnames.txt), written with the webdataset package."""
    import webdataset as wds

    for seed, split in enumerate(splits):
        folder = _images(root.parent / f"{root.name}-if" / split, split, seed)
        (root / split).mkdir(parents=True, exist_ok=True)
        with wds.ShardWriter(str(root / split / "%d.tar"), maxcount=40) as sink:
            files = [(f, CLASSES.index(f.parent.name)) for f in sorted(folder.glob("*/*.png"))]
            for i, (f, label) in enumerate(files):
                sink.write({"__key__": f"s{i:07d}", "png": f.read_bytes(), "cls": label})
            n = sink.shard
        (root / split / "nshards.txt").write_text(f"{n}\n")
    (root / "classnames.txt").write_text("\n".join(CLASSES) + "\n")
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("lp_model")
    cfg = write_tiny_config(d)
    return cfg, [save_random_checkpoint(cfg, d / f"{n}.safetensors", s) for n, s in (("a", 0), ("b", 3))]


def test_probe_reads_the_store_and_a_rerun_encodes_nothing(tmp_path, tiny):
    cfg, ckpts = tiny
    root = _shards(tmp_path / "wds_flowers")
    common = dict(suites=["linear_probe"], images=str(root), model=str(cfg), checkpoints=tuple(map(str, ckpts)),
                  store=str(tmp_path / "store"), fewshot_k=4, val_split="val", fewshot_epochs=3)
    p = plan(**common, out=str(tmp_path / "p"))
    n_train = 4 * len(CLASSES)  # only the picked shots are encoded, with the validation and test images
    assert p["images"] == n_train + sum(SPLITS["val"]) + sum(SPLITS["test"])
    first = evaluate(**common, out=str(tmp_path / "o1"))
    again = evaluate(**common, out=str(tmp_path / "o2"))
    for r1, r2 in zip(first.results, again.results):
        assert r1["task_type"] == "linear_probe" and r1["suite"] == "linear_probe"
        assert r1["provenance"]["embed"]["image"]["encoded"] == p["images"]
        assert r2["provenance"]["embed"]["image"]["encoded"] == 0 and r2["provenance"]["embed"]["image"]["from_store"]
        assert r1["metrics"] == r2["metrics"]
        m = r1["metrics"]["linear_probe"]
        assert m["images"] == sum(SPLITS["test"]) and m["weight_decay"] in DEFAULT_WEIGHT_DECAYS
        assert r1["counts"]["linear_probe"]["train"] == n_train
        assert r1["counts"]["linear_probe"]["final_training"] == "train"
        assert 7 <= len(r1["probe"]["linear_probe"]["weight_decay_search"]) <= 19
        assert r1["provenance"]["suite_options"]["fewshot_k"] == 4  # its own options, recorded flat
        assert set(summary_row(r1)) == {"lp top1", "lp top5", "lp mpcr"}
    assert first.results[0]["metrics"] != first.results[1]["metrics"]  # two checkpoints, two probes
    out = pq.read_table(tmp_path / "o1" / "a" / "linear_probe.parquet").to_pylist()
    assert len(out) == sum(SPLITS["test"]) and all(o["correct"] == (o["top1_id"] == o["subset"]) for o in out)
    acc1 = first.results[0]["metrics"]["linear_probe"]["acc1"]
    assert np.mean([o["correct"] for o in out]) * 100 == pytest.approx(acc1)
    rec = json.loads(Path(export_clip_benchmark(tmp_path / "o1", tmp_path / "cb")["written"][0]).read_text())
    assert rec["task"] == "linear_probe" and rec["dataset"] == "wds_flowers" and rec["metrics"]["fewshot_k"] == 4
    assert rec["metrics"]["lp_acc1"] == pytest.approx(acc1 / 100)
    # a held-out share instead of a split: seeded, so the same twice
    held = [evaluate(**{**common, "val_split": None, "fewshot_k": -1}, val_proportion=0.25, probe_seed=1,
                     out=str(tmp_path / f"h{i}")).results[0] for i in range(2)]
    assert held[0]["metrics"] == held[1]["metrics"] and held[0]["counts"] == held[1]["counts"]
    assert held[0]["counts"]["linear_probe"]["val"] == sum(SPLITS["train"]) // 4
    assert held[0]["counts"]["linear_probe"]["final_training"] == "train+val"


def test_bad_input_names_the_dataset_and_the_fix(tmp_path, tiny):
    cfg, ckpts = tiny
    root = _shards(tmp_path / "wds_pets", splits=("train", "test"))
    common = dict(suites=["linear_probe"], images=str(root), model=str(cfg), checkpoints=(str(ckpts[0]),),
                  store=str(tmp_path / "store"), out=str(tmp_path / "o"))
    with pytest.raises(DataError) as e:  # "dark" has 11 and "green" 9 training images
        evaluate(**common, fewshot_k=11)
    msg = str(e.value)
    assert str(root) in msg and "'green' (label 4) has 9" in msg and "--fewshot-k 9 or less" in msg
    assert "'dark'" not in msg and not (tmp_path / "o" / "a").exists()
    with pytest.raises(DataError, match=r"no val split .* --val-proportion"):
        evaluate(**common, val_split="val")
    (root / "train" / "nshards.txt").unlink()
    for f in (root / "train").glob("*.tar"):
        f.unlink()
    with pytest.raises(DataError, match=r"wds_pets: no train split .*wds_pets/train/0\.tar.* --train-split"):
        evaluate(**common)
    for bad, match in (({"fewshot_k": 0}, "fewshot_k"), ({"val_proportion": 1.5}, "between 0 and 1"),
                       ({"val_proportion": 0.2, "val_split": "val"}, "not both"), ({"fewshot_lr": 0.0}, "> 0"),
                       ({"val_split": "test"}, "split of its own")):
        with pytest.raises(UsageError, match=match):
            evaluate(**common, **bad)
    with pytest.raises(UsageError, match="fewshot_k"):
        ProbeOptions(fewshot_k=-2)


# -- agreement with CLIP_benchmark --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clip_benchmark_path():
    return install_clip_benchmark()


class _CudaOnCpu(str):
    """The device CLIP_benchmark's probe is handed on a machine without a GPU: ``"cpu"`` to torch, equal to
    ``"cuda"`` for its ``assert device == 'cuda'``."""

    def __new__(cls):
        return str.__new__(cls, "cpu")

    def __eq__(self, other):
        return other in ("cuda", "cpu")

    __hash__ = str.__hash__


CASES = [(-1, "val"), (4, None), (3, "val")]  # (fewshot_k, validation split)


def test_agrees_with_clip_benchmark(tmp_path, tiny, clip_benchmark_path, monkeypatch):
    """CLIP_benchmark's own linear_probe.evaluate, on a root its convert_dataset wrote, with the tiny model: the same
    top-1, top-5, mean per-class recall and chosen weight decay, full and few-shot, with and without a validation
    split. Its probe runs on the CPU here with .cuda() a no-op; its global generator is seeded just before each
    evaluate, reading features it cached (what a rerun of CLIP_benchmark does), as our seed contract defines."""
    import open_clip
    import torchvision
    from safetensors.torch import load_file

    from hardrank.models.openclip import resolve_arch

    wb, lp, builder = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.webdataset_builder",
                                            "clip_benchmark.metrics.linear_probe", "clip_benchmark.datasets.builder")
    cfg, ckpts = tiny
    root = tmp_path / "wds_cars"
    for seed, split in enumerate(("train", "val", "test")):
        folder = _images(tmp_path / "if" / split, split, seed)
        ds = torchvision.datasets.ImageFolder(str(folder), loader=lambda p: p)  # paths: the files' bytes are copied
        wb.convert_dataset(ds, split, str(root), transform=wb.path_to_bytes, verbose=False)
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")  # its loader requires one
    ours = {case: evaluate(suites=["linear_probe"], images=str(root), model=str(cfg), checkpoints=(str(ckpts[0]),),
                           fewshot_k=case[0], val_split=case[1], fewshot_epochs=4, store=str(tmp_path / "store"),
                           device="cpu",  # as CLIP_benchmark runs here: fp32 features and probes
                           out=str(tmp_path / f"o{i}")).results[0]["metrics"]["linear_probe"]
            for i, case in enumerate(CASES)}

    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    name = resolve_arch(str(cfg))
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
    model.load_state_dict(load_file(str(ckpts[0])))
    model.eval()

    def loader(split):
        ds = builder.build_dataset("wds/cars", root=str(root), transform=preprocess, split=split)
        return torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False, num_workers=0)

    common = dict(batch_size=64, num_workers=0, lr=0.1, epochs=4, model_id="tiny", seed=0,
                  feature_root=str(tmp_path / "features"), device=_CudaOnCpu(), amp=False, verbose=False)
    lp.evaluate(model, loader("train"), loader("test"), fewshot_k=-1, val_dataloader=loader("val"), **common)
    for case in CASES:
        torch.manual_seed(0)
        want = lp.evaluate(model, loader("train"), loader("test"), fewshot_k=case[0],
                           val_dataloader=loader("val") if case[1] else None, **common)
        got = ours[case]
        assert got["acc1"] == pytest.approx(100 * want["lp_acc1"]), case
        assert got["acc5"] == pytest.approx(100 * want["lp_acc5"]), case
        assert got["mean_per_class_recall"] == pytest.approx(100 * want["lp_mean_per_class_recall"]), case
        assert got["weight_decay"] == want["weight_decay"], case
    assert len({round(g["acc1"], 6) for g in ours.values()}) > 1  # the cases train different probes
