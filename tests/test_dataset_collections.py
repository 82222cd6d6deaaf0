"""Datasets by CLIP_benchmark's names and the standard collections: names and roots, one command for several
datasets, each task's main metric and the aggregates, reruns, bad input, and agreement with CLIP_benchmark's own
zero-shot, retrieval and linear-probe evaluation on roots its own converter wrote."""
from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import (
    import_clip_benchmark,
    install_clip_benchmark,
    save_random_checkpoint,
    stub_captioning_deps,
    worst_group_twin,
    write_tiny_config,
)

from hardrank import suite_registry
from hardrank.errors import DataError, UsageError
from hardrank.evaluate import evaluate
from hardrank.exports.clip_benchmark import export_clip_benchmark
from hardrank.jobs.cli import main
from hardrank.suites.collections import CB_COLLECTIONS, datacomp_tasks
from hardrank.suites.datasets import candidates, dataset_key, is_dataset_name, mirror

COLOURS = {"blue": (30, 30, 200), "cyan": (30, 200, 200), "dark": (20, 20, 20), "gray": (128, 128, 128),
           "green": (30, 200, 30), "pink": (230, 120, 200), "red": (200, 30, 30)}


def _png(colour, rng, size=32) -> bytes:
    from PIL import Image

    a = np.asarray(colour)[None, None] + rng.normal(0, 70, (size, size, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _image_folder(folder: Path, classes, per_class, seed: int) -> Path:
    """An ImageFolder of noisy colour patches (a random tiny model still tells some apart)."""
    rng = np.random.default_rng(seed)
    for c, n in zip(classes, per_class):
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (folder / c / f"{i}.png").write_bytes(_png(COLOURS[c], rng))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("dc_model")
    cfg = write_tiny_config(d)
    return cfg, [save_random_checkpoint(cfg, d / f"{n}.safetensors", s) for n, s in (("a", 0), ("b", 3))]


@pytest.fixture(scope="module")
def clip_benchmark_path():
    return install_clip_benchmark()


def _common(tmp_path, tiny, **kw) -> dict:
    cfg, ckpts = tiny
    return {"model": str(cfg), "checkpoints": tuple(map(str, ckpts)), "store": str(tmp_path / "store"),
            "device": "cpu", "out": str(tmp_path / "out"), **kw}


# -- names, collections, roots ------------------------------------------------------------------------------------
def test_names_collections_and_roots(tmp_path):
    assert is_dataset_name("wds/vtab/cifar10") and is_dataset_name("cifar10") and is_dataset_name("vtab/pets")
    assert is_dataset_name("fairness/geode") and not is_dataset_name("wds/") and not is_dataset_name("wds/../x")
    assert not is_dataset_name("cifar11") and suite_registry.is_suite("wds/my_own")
    assert suite_registry.is_suite("sun397")
    assert suite_registry.get("karpathy").name == "karpathy"  # a registered suite is never a family's
    assert suite_registry.expand(["vtab", "vtab+"])[:2] == ["vtab/caltech101", "vtab/cifar100"]
    assert len(suite_registry.expand(["vtab+"])) == 36 and suite_registry.expand(["datacomp"]) == [
        t.key for t in datacomp_tasks()]
    with pytest.raises(UsageError, match=r"unknown suite 'cifar11' \(did you mean 'cifar10'\?\)"):
        suite_registry.expand(["cifar11"])
    # --data-root: CLIP_benchmark's placeholders, or a folder of mirror-named roots (then DataComp's _test names)
    assert candidates("vtab/pets", "d/{dataset}") == ["d/vtab/pets"]
    assert candidates("vtab/pets", "d/wds_{dataset_cleaned}") == ["d/wds_vtab-pets"]
    assert candidates("fairness/geode", "d") == ["d/wds_fairness-geode", "d/wds_geode_test"]
    assert candidates("retrieval/flickr_1k_test_image_text_retrieval", "d")[0] == "d/wds_flickr30k"
    with pytest.raises(UsageError, match=r"unknown placeholder\(s\) \['name'\]"):
        candidates("cifar10", "d/{name}")
    assert mirror("vtab/cifar10") == "huggingface.co/datasets/clip-benchmark/wds_vtab-cifar10"
    assert mirror("fairness/dollar_street") == "huggingface.co/datasets/djghosh/wds_dollar_street_test"
    assert mirror("wds/mine") is None and mirror("misc/winogavil") is None


def test_collections_are_clip_benchmarks(clip_benchmark_path, monkeypatch):
    (builder,) = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.datasets.builder")
    for name, members in CB_COLLECTIONS.items():
        assert list(members) == builder.dataset_collection[name], name
        assert suite_registry.expand([name]) == list(members)


def _datacomp_download_dir(key: str) -> str:
    """The folder DataComp's download_evalsets.py writes task ``key`` into (mlfoundations/datacomp, commit 274dbee):
    ``wds_<key, 'fairness/' dropped, '/' as '-'>_test``; its retrieval/ and misc/ tasks are Hugging Face datasets."""
    return f"wds_{key.removeprefix('fairness/').replace('/', '-')}_test"


def _names_clip_benchmark_builds(builder) -> set[str]:
    """The dataset names CLIP_benchmark's build_dataset has a branch of its own for (``dataset_name == "..."``)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(builder.build_dataset))
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and getattr(n.left, "id", "") == "dataset_name"]
    return {c.value for n in compares for c in n.comparators if isinstance(c, ast.Constant)}


def test_every_member_names_its_release_folder(tmp_path, clip_benchmark_path, monkeypatch):
    """Every name a family of the registry stands for loads or fails alone with one line naming it and the folder
    it looked for; the folders are the ones the releases are downloaded as (DataComp's download_evalsets.py,
    CLIP_benchmark's wds_<name> mirrors); the plain names are ones CLIP_benchmark's own builder takes."""
    from hardrank.config import SuiteOptions
    from hardrank.items import Tables
    from hardrank.suites import load_suites
    from hardrank.suites.datasets import PLAIN_NAMES

    (builder,) = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.datasets.builder")
    datacomp_keys = {t.key for t in datacomp_tasks()}
    plain = {n for n in PLAIN_NAMES - datacomp_keys if not n.startswith("vtab/")}
    unknown = plain - _names_clip_benchmark_builds(builder)
    assert not unknown, f"plain names CLIP_benchmark's builder does not take: {sorted(unknown)}"
    for key in sorted(datacomp_keys):
        if not key.startswith(("retrieval/", "misc/")):  # the folder DataComp's own download writes is found
            assert f"d/{_datacomp_download_dir(key)}" in candidates(key, "d"), key
    members = {m for ms in CB_COLLECTIONS.values() for m in ms}
    for name in members:  # CLIP_benchmark's mirror of each collection member, as its README downloads them
        assert candidates(name, "d")[0] == f"d/wds_{name.replace('/', '-')}", name
    assert members | datacomp_keys <= PLAIN_NAMES
    assert suite_registry.FAMILIES, "no family registered"
    empty = tmp_path / "empty"
    empty.mkdir()
    opts = SuiteOptions(own=(("data_root", str(empty)),))
    refused = {"misc/winogavil": "WinoGAViL", "voc2007_multilabel": "multilabel"}
    for family, spec in suite_registry.FAMILIES.items():
        names = [*spec.examples, "wds/my_own"]
        failures = {}
        assert load_suites(names, Tables.empty(), opts, failures) == [], family
        assert sorted(failures) == sorted(names), family
        for name, exc in failures.items():
            line = str(exc)
            assert isinstance(exc, DataError) and "\n" not in line and line.startswith(f"{name}: "), (name, line)
            if name in refused:  # what hardrank does not score says so, and what to do instead
                assert refused[name] in line and "leave it out" in line, (name, line)
                continue
            assert str(empty) in line, (name, line)
            if mirror(dataset_key(name)):
                assert mirror(dataset_key(name)) in line, (name, line)


# -- stand-in roots in CLIP_benchmark's layout, written by its own converter ----------------------------------
def _cb_classification(wb, root: Path, folder_of_split: dict[str, Path], templates) -> Path:
    import torchvision

    for split, folder in folder_of_split.items():
        ds = torchvision.datasets.ImageFolder(str(folder), loader=lambda p: p)  # paths: their bytes are copied
        ds.templates = templates
        wb.convert_dataset(ds, split, str(root), transform=wb.path_to_bytes, verbose=False)
    return root


def _cb_retrieval(wb, root: Path, folder: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pairs = []
    names = sorted(COLOURS)
    for i in range(n):
        c = names[i % len(names)]
        f = folder / f"{i}.png"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(_png(COLOURS[c], rng))
        # captions unique: two images sharing one caption tie on it, which both tools break by position
        pairs.append((str(f), [f"a {c} square, {i}", f"something {c} {i}", f"photo number {i}"][: 2 + i % 2]))
    wb.convert_retrieval_dataset(pairs, "test", str(root), transform=wb.path_to_bytes, verbose=False)
    return root


class _CudaOnCpu(str):
    """The device CLIP_benchmark's probe is handed without a GPU: "cpu" to torch, equal to "cuda" for its assert."""

    def __new__(cls):
        return str.__new__(cls, "cpu")

    def __eq__(self, other):
        return other in ("cuda", "cpu")

    __hash__ = str.__hash__


def test_one_command_agrees_with_clip_benchmark(tmp_path, tiny, clip_benchmark_path, monkeypatch):
    """Four tiny datasets in CLIP_benchmark's WebDataset layout (written by its convert_dataset and
    convert_retrieval_dataset): two zero-shot, one retrieval, one linear probe, run by hardrank as one collection (a
    task list of one's own, one command, the probe's task given per dataset) against CLIP_benchmark's own `eval`
    CLI (zero-shot, retrieval) and linear_probe.evaluate: equal metrics; the collection's average is theirs; the
    export writes CLIP_benchmark's dataset names and file names."""
    import open_clip

    stub_captioning_deps(monkeypatch)
    wb, builder, lp, cli = import_clip_benchmark(
        clip_benchmark_path, monkeypatch, "clip_benchmark.webdataset_builder", "clip_benchmark.datasets.builder",
        "clip_benchmark.metrics.linear_probe", "clip_benchmark.cli")
    cfg, ckpts = tiny
    data = tmp_path / "data"
    src = tmp_path / "src"
    _cb_classification(wb, data / "wds_tiny_a", {"test": _image_folder(src / "a", ("blue", "green", "red"),
                                                                       (4, 3, 5), 1)}, ["a photo of a {c}."])
    six = ("blue", "cyan", "dark", "gray", "green", "pink")
    _cb_classification(wb, data / "wds_vtab-tiny_b", {"test": _image_folder(src / "b", six, (3, 2, 3, 4, 2, 3), 2)},
                       ["a photo of a {c}.", "art of the {c}."])
    _cb_retrieval(wb, data / "wds_tiny_c", src / "c", 12, 3)
    probe_classes = ("blue", "dark", "green", "pink", "red")
    _cb_classification(wb, data / "wds_tiny_d", {
        split: _image_folder(src / "d" / split, probe_classes, per, seed)
        for split, per, seed in (("train", (8, 7, 9, 6, 8), 4), ("val", (3, 2, 3, 3, 2), 5),
                                 ("test", (5, 4, 6, 3, 5), 6))}, ["a photo of a {c}."])
    tasklist = tmp_path / "mine.yml"
    tasklist.write_text("wds/tiny_a:\n  name: A\nwds/vtab/tiny_b:\n  name: B\n  main_metric: mean_per_class_recall\n"
                        "wds/tiny_c:\n  name: C\n  main_metric: mean_recall@1\nwds/tiny_d:\n  name: D\n")
    rep = evaluate(suites=["datacomp"], tasklist=str(tasklist), data_root=str(data), recall_k=(1, 5, 10),
                   per_suite={"wds/tiny_d": {"task": "linear_probe", "val_split": "val", "fewshot_epochs": 4}},
                   **_common(tmp_path, tiny))
    assert not rep.failed_suites
    ours = {(r["checkpoint"], r["suite"]): r for r in rep.results}
    assert {s for _, s in ours} == {"wds/tiny_a", "wds/vtab/tiny_b", "wds/tiny_c", "wds/tiny_d", "datacomp"}
    assert ours[("a", "wds/tiny_d")]["task_type"] == "linear_probe" and ours[("a", "wds/tiny_c")]["task_type"] == \
        "ranking"

    # CLIP_benchmark's own eval, as its users run it: several datasets, a --dataset_root template, both checkpoints
    name = Path(cfg).stem  # registered with open_clip by hardrank's model loading, as its CLI needs a name
    cb_out = tmp_path / "cb"
    cb_out.mkdir()
    for datasets, task in ((["wds/tiny_a", "wds/vtab/tiny_b"], "auto"), (["wds/tiny_c"], "zeroshot_retrieval")):
        # (its --task auto goes by the name alone: a retrieval root not named flickr30k, ... needs the task named)
        monkeypatch.setattr(sys, "argv", [
            "clip_benchmark", "eval", "--dataset", *datasets, "--task", task,
            "--dataset_root", f"{data}/wds_{{dataset_cleaned}}", "--model", name, "--pretrained", *map(str, ckpts),
            "--recall_k", "1", "5", "10", "--no_amp", "--num_workers", "0", "--batch_size", "8",
            "--output", f"{cb_out}/{{dataset}}_{{pretrained}}_{{model}}_{{language}}_{{task}}.json", "--quiet"])
        cli.main()
    theirs = {}
    for f in cb_out.glob("*.json"):
        rec = json.loads(f.read_text())
        theirs[(Path(rec["pretrained"]).stem, rec["dataset"])] = (f.name, rec)
    assert len(theirs) == 6
    for ckpt in ("a", "b"):
        for ds in ("wds/tiny_a", "wds/vtab/tiny_b"):
            got, want = ours[(ckpt, ds)]["metrics"]["zeroshot"]["clean"], theirs[(ckpt, ds)][1]["metrics"]
            assert got["acc1"] == pytest.approx(100 * want["acc1"]) and got["ties"] == 0
            assert got["mean_per_class_recall"] == pytest.approx(100 * want["mean_per_class_recall"])
            if ds == "wds/vtab/tiny_b":  # 6 classes (CLIP_benchmark gives top-5 from 5 classes on)
                assert got["acc5"] == pytest.approx(100 * want["acc5"])
        got, want = ours[(ckpt, "wds/tiny_c")]["metrics"]["original"], theirs[(ckpt, "wds/tiny_c")][1]["metrics"]
        for k in (1, 5, 10):
            assert got["i2t"][f"R@{k}"] == pytest.approx(100 * want[f"text_retrieval_recall@{k}"])
            assert got["t2i"][f"R@{k}"] == pytest.approx(100 * want[f"image_retrieval_recall@{k}"])

    # its linear probe, on the same root, through its own dataset builder (seeded as test_linear_probe.py explains)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    for i, ckpt in enumerate(ckpts):
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=str(ckpt))
        model.eval()

        def loader(split):
            ds = builder.build_dataset("wds/tiny_d", root=str(data / "wds_tiny_d"), transform=preprocess, split=split)
            return torch.utils.data.DataLoader(ds, batch_size=16, shuffle=False, num_workers=0)

        common = dict(batch_size=64, num_workers=0, lr=0.1, epochs=4, model_id=f"tiny{i}", seed=0, amp=False,
                      feature_root=str(tmp_path / "features"), device=_CudaOnCpu(), verbose=False)
        lp.evaluate(model, loader("train"), loader("test"), fewshot_k=-1, val_dataloader=loader("val"), **common)
        torch.manual_seed(0)
        want = lp.evaluate(model, loader("train"), loader("test"), fewshot_k=-1, val_dataloader=loader("val"),
                           **common)
        got = ours[(ckpt.stem, "wds/tiny_d")]["metrics"]["wds/tiny_d"]
        assert got["acc1"] == pytest.approx(100 * want["lp_acc1"])
        assert got["mean_per_class_recall"] == pytest.approx(100 * want["lp_mean_per_class_recall"])
        assert got["weight_decay"] == want["weight_decay"]
        # the collection: each task's own main metric, and their mean
        coll = ours[(ckpt.stem, "datacomp")]
        values = [100 * theirs[(ckpt.stem, "wds/tiny_a")][1]["metrics"]["acc1"],
                  100 * theirs[(ckpt.stem, "wds/vtab/tiny_b")][1]["metrics"]["mean_per_class_recall"],
                  50 * (theirs[(ckpt.stem, "wds/tiny_c")][1]["metrics"]["text_retrieval_recall@1"]
                        + theirs[(ckpt.stem, "wds/tiny_c")][1]["metrics"]["image_retrieval_recall@1"]),
                  100 * want["lp_acc1"]]
        assert [t["value"] for t in coll["tasks"].values()] == pytest.approx(values)
        assert coll["metrics"] == {"Average": pytest.approx(sum(values) / 4)} and coll["scored"] == 4
        assert json.loads((tmp_path / "out" / ckpt.stem / "collection_datacomp.json").read_text())["metrics"] == \
            coll["metrics"]

    # the export: CLIP_benchmark's dataset names, and with its --output template its file names
    written = export_clip_benchmark(tmp_path / "out", tmp_path / "ours_cb",
                                    "{dataset}_{pretrained_full_path}_{model}_{language}_{task}.json")["written"]
    by_key = {}
    for f in written:
        rec = json.loads(Path(f).read_text())
        by_key[(rec["pretrained"], rec["dataset"])] = (Path(f).name, rec)
    for (ckpt, ds), (fname, rec) in theirs.items():
        ours_name, ours_rec = by_key[(ckpt, ds)]
        assert ours_rec["task"] == rec["task"] and ours_rec["dataset"] == rec["dataset"] == ds
        assert ours_name == fname.replace(f"_{ckpt}.safetensors_", f"_{str(tiny[1][ckpt == 'b']).replace('/', '_')}_")
        for k, v in rec["metrics"].items():
            if isinstance(v, float) and v == v:
                assert ours_rec["metrics"][k] == pytest.approx(v, abs=1e-7), (ds, k)
    assert ("a", "wds/tiny_d") in by_key and by_key[("a", "wds/tiny_d")][1]["task"] == "linear_probe"


# -- DataComp's worst-group metrics from the shards' .npy metadata ------------------------------------------------
def _datacomp_shards(root: Path, classes, per_class: int, seed: int, npy: bool = True) -> Path:
    """A root as DataComp's wds_*_test copies are: webp/png + cls + npy (its metadata row per image)."""
    import webdataset as wds

    rng = np.random.default_rng(seed)
    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(classes) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")
    with wds.ShardWriter(str(root / "test" / "%d.tar"), maxcount=7) as sink:
        i = 0
        for label, c in enumerate(classes):
            for _ in range(per_class):
                sample = {"__key__": f"s{i:07d}", "png": _png(COLOURS[c], rng), "cls": label}
                if npy:  # dollar street: income_ds, income_meta, region
                    sample["npy"] = np.array([i % 3, 1000.0 + i, (i * 7) % 4], dtype=np.float32)
                sink.write(sample)
                i += 1
        n = sink.shard
    (root / "test" / "nshards.txt").write_text(str(n))
    return root


def test_worst_group_metrics_read_the_npy_metadata_and_a_rerun_scores_nothing(tmp_path, tiny):
    data = tmp_path / "data"
    _datacomp_shards(data / "wds_dollar_street_test", ("blue", "dark", "green", "pink", "red", "gray"), 4, 0)
    _datacomp_shards(data / "wds_geode_test", ("blue", "red", "green"), 5, 1)
    (tmp_path / "geode.yml").write_text("fairness/geode:\n  name: GeoDE\n  main_metric: acc_wg\n"
                                        "  group_by: region\n  metadata_fields: [income, x, region]\n"
                                        "fairness/dollar_street:\n  name: Dollar Street\n  main_metric: acc_top5_wg\n")
    common = _common(tmp_path, tiny, data_root=str(data), tasklist=str(tmp_path / "geode.yml"))
    first = evaluate(suites=["datacomp"], **common)
    assert not first.failed_suites
    for r in [r for r in first.results if r["task_type"] == "classification"]:
        rows = pq.read_table(Path(common["out"]) / r["checkpoint"] / f"{r['suite'].replace('/', '_')}.parquet")
        rows = rows.to_pylist()
        idx = [int(o["query_id"].split("#s")[1]) for o in rows]  # s%07d: the i of the metadata written
        if r["suite"] == "fairness/dollar_street":  # worst income_ds group, top-5
            want = worst_group_twin([o["rank"] < 5 for o in rows], [i % 3 for i in idx])
            assert r["task_metrics"]["acc_top5_wg"] == pytest.approx(want)
        else:  # worst region (the third field), top-1
            want = worst_group_twin([o["rank"] == 0 for o in rows], [(i * 7) % 4 for i in idx])
            assert r["task_metrics"]["acc_wg"] == pytest.approx(want)
        assert r["suite_meta"]["dataset"]["main_metric"] in r["task_metrics"]
    coll = {r["checkpoint"]: r for r in first.results if r["task_type"] == "collection"}
    assert set(coll) == {"a", "b"} and coll["a"]["scored"] == 2
    assert coll["a"]["metrics"]["Average"] == pytest.approx(
        (coll["a"]["tasks"]["fairness/geode"]["value"] + coll["a"]["tasks"]["fairness/dollar_street"]["value"]) / 2)
    # the report: one leaderboard row per (checkpoint, collection), its main metric the average
    from hardrank.jobs.report import build_report

    rows = list(csv.DictReader(build_report(common["out"], tmp_path / "report")["csv"].open()))
    mine = [r for r in rows if r["suite"] == "datacomp"]
    assert [(r["checkpoint"], r["main_metric"], r["task_type"]) for r in mine] == [
        ("a", "average", "collection"), ("b", "average", "collection")]
    assert float(mine[0]["main"]) == pytest.approx(coll["a"]["metrics"]["Average"], abs=1e-4)
    # a rerun: every (checkpoint, dataset) is there for this model and these options: nothing loaded or scored
    mtimes = {p: p.stat().st_mtime_ns for p in Path(common["out"]).rglob("fairness_*.json")}
    again = evaluate(suites=["datacomp"], **common)
    assert len(again.finished) == 4 and [r["task_type"] for r in again.results] == ["collection"] * 2
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    assert [r["metrics"] for r in again.results] == [coll["a"]["metrics"], coll["b"]["metrics"]]
    changed = evaluate(suites=["datacomp"], **{**common, "templates": str(_templates(tmp_path))})
    assert not changed.finished and len([r for r in changed.results if r["task_type"] == "classification"]) == 4
    assert evaluate(suites=["datacomp"], skip_existing=False, **common).finished == {}


def _templates(tmp_path: Path) -> Path:
    f = tmp_path / "t.txt"
    f.write_text("art of the {c}.\n")
    return f


# -- the documented commands ------------------------------------------------------------------------------------
DOC = Path(__file__).resolve().parents[1] / "docs" / "collections.md"


def _documented_commands() -> list[list[str]]:
    """The `hardrank ...` lines of docs/collections.md's first bash block, continuations joined, comments dropped."""
    import shlex

    block = DOC.read_text().split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [shlex.split(line, comments=True)[1:] for line in block.splitlines() if line.startswith("hardrank ")]


def _on_stand_ins(argv: list[str], data: Path, tmp_path: Path, cfg: Path, ckpts) -> list[str]:
    """A documented command with its paths pointed at the stand-ins: /data/<x> at ``data``, results/ under
    ``tmp_path``, the model at the tiny one, its checkpoints (or --pretrained tag) at the tiny checkpoints."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--checkpoint", "--pretrained"):  # the run's checkpoints, whatever the doc names
            out += ["--checkpoint", *map(str, ckpts)]
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                i += 1
            continue
        if a == "--model":
            out += ["--model", str(cfg)]
            i += 2
            continue
        if a.startswith("/data/"):
            a = str(data) + "/" + a.split("/", 3)[3] if a.count("/") > 2 else str(data)
        elif a.startswith("results/") or a.endswith(".yml"):
            a = str(tmp_path / a)
        out.append(a)
        i += 1
    if out[0] == "eval":
        out += [] if "--checkpoint" in out else ["--checkpoint", *map(str, ckpts)]
        out += [] if "--out" in out else ["--out", str(tmp_path / "results" / "default")]
        out += ["--store", str(tmp_path / "store"), "--device", "cpu", "--quiet"]
    return out


def test_the_documented_commands_run_on_stand_ins(tmp_path, tiny, clip_benchmark_path, monkeypatch, capsys):
    """docs/collections.md's commands, as a user types them, over stand-ins CLIP_benchmark's own converter wrote
    under its mirrors' names: the datasets by name (its --dataset_root template), the probe, a task list of one's
    own and the export run whole; --suite vtab scores the VTAB datasets present and names each one missing."""
    (wb,) = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.webdataset_builder")
    cfg, ckpts = tiny
    data, src = tmp_path / "data", tmp_path / "src"
    three = ("blue", "green", "red")
    _cb_classification(wb, data / "wds_vtab-cifar10", {"test": _image_folder(src / "c10", three, (3, 2, 3), 1)},
                       ["a photo of a {c}."])
    _cb_classification(wb, data / "wds_imagenet1k", {"test": _image_folder(src / "in", three, (2, 3, 2), 2)},
                       ["a photo of a {c}."])
    _cb_retrieval(wb, data / "wds_mscoco_captions", src / "coco", 8, 3)
    _cb_classification(wb, data / "wds_vtab-pets", {split: _image_folder(src / "pets" / split, ("dark", "pink"),
                                                                         (n, n), seed)
                                                    for split, n, seed in (("train", 16, 4), ("test", 3, 5))},
                       ["a photo of a {c}."])
    (tmp_path / "my_tasks.yml").write_text("vtab/cifar10:\n  name: CIFAR-10\nvtab/pets:\n  name: Pets\n"
                                           "  main_metric: mean_per_class_recall\n")
    docs = _documented_commands()
    assert [d[:3] for d in docs] == [["eval", "--suite", "vtab"], ["eval", "--suite", "datacomp"],
                                     ["eval", "--suite", "wds/vtab/cifar10"], ["eval", "--suite", "wds/vtab/pets"],
                                     ["eval", "--suite", "datacomp"], ["export", "results/vtab", "--format"]]
    runs = [_on_stand_ins(d, data, tmp_path, cfg, ckpts) for d in docs]
    for argv in runs[2:5]:  # the datasets by name, the probe, one's own task list: every dataset is there
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    by_name = json.loads((tmp_path / "results" / "cb" / "a" / "wds_mscoco_captions.json").read_text())
    assert by_name["task_type"] == "ranking" and by_name["suite"] == "wds/mscoco_captions"
    probe = json.loads((tmp_path / "results" / "default" / "a" / "wds_vtab_pets.json").read_text())
    assert probe["task_type"] == "linear_probe"
    mine = json.loads((tmp_path / "results" / "mine" / "a" / "collection_datacomp.json").read_text())
    assert mine["scored"] == 2 and mine["metrics"]["Average"] is not None
    capsys.readouterr()
    assert main(runs[0]) == 3  # vtab: 19 datasets, two of them here (vtab/cifar10 is no member: CIFAR-100 is)
    err = capsys.readouterr().err
    vtab = json.loads((tmp_path / "results" / "vtab" / "a" / "collection_vtab.json").read_text())
    assert vtab["scored"] == 1 and (tmp_path / "results" / "vtab" / "b" / "vtab_pets.json").is_file()
    assert "vtab/svhn: no dataset folder" in err and "clip-benchmark/wds_vtab-svhn" in err
    assert main(runs[5]) == 0, capsys.readouterr().err  # CLIP_benchmark's JSON files of the vtab run
    assert list((tmp_path / "results" / "vtab_cb").rglob("*.json"))


# -- bad input: one line naming the dataset and the fix, the others still run, the exit code says so ---------------
def test_bad_inputs_name_the_dataset_and_the_fix_and_the_others_run(tmp_path, tiny, capsys):
    cfg, ckpts = tiny
    data = tmp_path / "data"
    _datacomp_shards(data / "wds_good", ("blue", "red", "green"), 3, 0, npy=False)
    no_names = _datacomp_shards(data / "wds_nonames", ("blue", "red"), 2, 1, npy=False)
    (no_names / "classnames.txt").unlink()
    no_shards = data / "wds_noshards"
    no_shards.mkdir()
    (no_shards / "classnames.txt").write_text("a\nb\n")
    _datacomp_shards(data / "wds_dollar_street_test", ("blue", "red"), 2, 2, npy=False)  # no .npy: no groups
    shots = _datacomp_shards(data / "wds_shots", ("blue", "red"), 3, 3, npy=False)
    (shots / "train").mkdir()
    for f in (shots / "test").iterdir():
        (shots / "train" / f.name).write_bytes(f.read_bytes())  # 3 per class: fewer than --fewshot-k 4
    (tmp_path / "list.yml").write_text(
        "wds/good:\n  name: good\nwds/nonames:\n  name: nonames\nwds/noshards:\n  name: noshards\n"
        "wds/badmetric:\n  name: badmetric\n  main_metric: acc_top1\nfairness/dollar_street:\n  name: DS\n"
        "  main_metric: acc_top5_wg\nwds/shots:\n  name: shots\nvtab/missing:\n  name: missing\n")
    rc = main(["eval", "--suite", "datacomp", "--tasklist", str(tmp_path / "list.yml"), "--data-root", str(data),
               "--model", str(cfg), "--checkpoint", str(ckpts[0]), "--store", str(tmp_path / "store"),
               "--out", str(tmp_path / "out"), "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert (tmp_path / "out" / "a" / "wds_good.json").is_file()  # the good one ran
    assert "5 suite(s) not run (wds/nonames, wds/noshards, wds/badmetric, fairness/dollar_street, vtab/missing)" \
        in err
    lines = {n: [ln for ln in err.splitlines() if ln.startswith(f"  {n}: ")] for n in
             ("wds/nonames", "wds/noshards", "wds/badmetric", "fairness/dollar_street", "vtab/missing")}
    assert all(len(v) == 1 for v in lines.values()), err  # one line each, naming the dataset
    lines = {n: v[0] for n, v in lines.items()}
    assert "no classnames.txt" in lines["wds/nonames"] and "--classnames FILE" in lines["wds/nonames"]
    assert "holds no test split" in lines["wds/noshards"] and "test/0.tar" in lines["wds/noshards"]
    assert "unknown main_metric 'acc_top1'" in lines["wds/badmetric"]
    assert "computes acc1, acc5" in lines["wds/badmetric"]
    assert ".npy metadata" in lines["fairness/dollar_street"] and "djghosh/wds_dollar_street_test" in \
        lines["fairness/dollar_street"]
    assert "wds_vtab-missing" in lines["vtab/missing"] and "clip-benchmark/" not in lines["vtab/missing"]
    coll = json.loads((tmp_path / "out" / "a" / "collection_datacomp.json").read_text())
    assert coll["scored"] == 2 and coll["tasks"]["wds/nonames"]["why"].startswith("wds/nonames: ")  # good, shots
    assert coll["metrics"]["Average"] is None and len(coll["missing"]["Average"]) == 5
    # a few-shot k larger than a class (the probe as one dataset's own task): that dataset alone fails
    rep = evaluate(suites=["wds/good", "wds/shots"], data_root=str(data),
                   per_suite={"wds/shots": {"task": "linear_probe", "fewshot_k": 4}},
                   **_common(tmp_path, (cfg, ckpts[:1]), out=str(tmp_path / "o2")))
    assert [r["suite"] for r in rep.results] == ["wds/good"]
    assert "--fewshot-k 4 needs 4 training images per class" in str(rep.failed_suites["wds/shots"])
    assert "--fewshot-k 3 or less" in str(rep.failed_suites["wds/shots"])
    with pytest.raises(DataError, match=r"1 suite\(s\) not run \(wds/shots\)"):
        rep.raise_failures()
    with pytest.raises(UsageError, match=r"wds/good: where is it\? give --data-root DIR"):
        evaluate(suites=["wds/good"], **_common(tmp_path, (cfg, ckpts[:1]), out=str(tmp_path / "o3")))


# -- ImageNet-V2 and ObjectNet from their release folders, as CLIP_benchmark's own loaders read them --------------
def _objectnet_release(root: Path, rng) -> None:
    """ObjectNet 1.0 unpacked, its mapping files copied into the root (as CLIP_benchmark's download does), with
    ImageNet 2012 ids a permutation of the usual indices; "chair" maps to no ImageNet class (never read)."""
    root.mkdir(parents=True)
    (root / "folder_to_objectnet_label.json").write_text(json.dumps(
        {"alarm_clock": "Alarm clock", "banana": "Banana", "chair": "Chair"}))
    (root / "objectnet_to_imagenet_1k.json").write_text(json.dumps({"Banana": "L21", "Alarm clock": "L7; L14"}))
    (root / "pytorch_to_imagenet_2012_id.json").write_text(json.dumps({str(k): 7 * k % 1000 for k in range(1000)}))
    (root / "imagenet_to_label_2012_v2").write_text("".join(f"L{i}\n" for i in range(1000)))
    for folder, colour, n in (("alarm_clock", "red", 3), ("banana", "green", 4), ("chair", "blue", 2)):
        (root / "objectnet-1.0" / "images" / folder).mkdir(parents=True)
        for i in range(n):
            (root / "objectnet-1.0" / "images" / folder / f"{i}.png").write_bytes(_png(COLOURS[colour], rng))


def _imagenetv2_release(root: Path, rng) -> None:
    for cls, colour in ((0, "red"), (1, "green"), (417, "blue"), (999, "pink")):
        d = root / "ImageNetV2-matched-frequency" / str(cls)
        d.mkdir(parents=True)
        for i in range(2):
            (d / f"{i}.jpeg").write_bytes(_png(COLOURS[colour], rng))  # PNG bytes: both tools open by content


def test_imagenet_releases_agree_with_clip_benchmark(tmp_path, tiny, clip_benchmark_path, monkeypatch):
    """ImageNet-V2's and ObjectNet's release folders in the imagenet_robustness collection: each image's rank of its
    true class equals the rank CLIP_benchmark's own loaders and classifier give it (its ObjectNet dataset and class
    mapping, ImageNet-V2's class numbers against ImageNet's 1,000 names), and the other members fail alone."""
    import open_clip

    builder, zsc, v2 = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.datasets.builder",
                                             "clip_benchmark.metrics.zeroshot_classification",
                                             "clip_benchmark.datasets.imagenetv2")
    # its ImageNet-V2 loader downloads the release unless the folder holds all 10,000 images: the stand-in's 8
    monkeypatch.setattr(v2, "V2_DATASET_SIZE", 8)
    rng = np.random.default_rng(7)
    _objectnet_release(tmp_path / "data" / "objectnet", rng)
    _imagenetv2_release(tmp_path / "data" / "imagenetv2", rng)
    (tmp_path / "t.txt").write_text("a photo of a {c}.\n")
    (tmp_path / "t.json").write_text(json.dumps({"imagenetv2": ["a photo of a {c}."]}))
    cfg, ckpts = tiny
    rep = evaluate(suites=["imagenet_robustness"], data_root=str(tmp_path / "data" / "{dataset}"),
                   per_suite={"imagenetv2": {"templates": str(tmp_path / "t.txt")}},
                   **_common(tmp_path, (cfg, ckpts[:1])))
    assert sorted(rep.failed_suites) == ["imagenet-a", "imagenet-r", "imagenet_sketch"]
    assert "data/imagenet-a" in str(rep.failed_suites["imagenet-a"])
    ours = {r["suite"]: r for r in rep.results}
    assert ours["objectnet"]["suite_meta"]["classes"] == 2 and ours["imagenetv2"]["suite_meta"]["classes"] == 1000
    coll = ours["imagenet_robustness"]
    assert coll["scored"] == 2 and coll["metrics"]["Average"] is None
    name = Path(cfg).stem
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=str(ckpts[0]))
    model.eval()
    tokenizer = open_clip.get_tokenizer(name)
    for ds_name, root, templates in (("objectnet", "objectnet", None), ("imagenetv2", "imagenetv2", "t.json")):
        ds = builder.build_dataset(ds_name, root=str(tmp_path / "data" / root), transform=preprocess,
                                   custom_template_file=str(tmp_path / templates) if templates else None)
        paths = [str(p) for p, _ in ds.samples] if ds_name == "objectnet" else [str(p) for p in ds.fnames]
        loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False, num_workers=0)
        classifier = zsc.zero_shot_classifier(model, tokenizer, ds.classes, ds.templates, "cpu", amp=False)
        logits, target = zsc.run_classification(model, classifier, loader, "cpu", amp=False)
        want_rank = (logits > logits.gather(1, target[:, None])).sum(1).tolist()
        rows = pq.read_table(tmp_path / "out" / "a" / f"{ds_name}.parquet").to_pylist()
        got_rank = {r["query_id"]: r["rank"] for r in rows if r["view"] == "clean"}
        want = {"/".join(Path(p).parts[-2:]): r for p, r in zip(paths, want_rank)}
        assert got_rank == want, ds_name
        assert ours[ds_name]["metrics"]["zeroshot"]["clean"]["images"] == len(paths)
        if ds_name == "objectnet":
            assert ds.classes == ["alarm clock", "banana"]  # its class names, as ours


def test_a_family_registers_in_one_line_and_its_members_take_their_own_options(tmp_path):
    """A family (``register(..., match=)``) stands for the names it accepts: each a suite with the family's loader
    and options, addressable per suite; unregistering it removes its members."""
    seen = []

    def load(tables, opts, own, name):
        seen.append((name, own.data_root))
        raise DataError(f"{name}: loaded")

    from hardrank.suites.datasets import DatasetOptions

    suite_registry.register("fam/<x>", load, DatasetOptions, "a test family", match=lambda n: n.startswith("fam/"))
    try:
        assert suite_registry.is_suite("fam/a") and not suite_registry.is_suite("fam/<x>")
        assert suite_registry.get("fam/a").name == "fam/a" and suite_registry.takes("fam/a", "data_root")
        from hardrank.config import SuiteOptions
        opts = SuiteOptions(per_suite=(("fam/b", "data_root", "B"),), own=(("data_root", "A"),))
        assert opts.own_options("fam/b").data_root == "B" and opts.own_options("fam/a").data_root == "A"
        from hardrank.items import Tables
        from hardrank.suites import load_suites
        failures = {}
        load_suites(["fam/a", "fam/b"], Tables.empty(), opts, failures)
        assert seen == [("fam/a", "A"), ("fam/b", "B")] and list(failures) == ["fam/a", "fam/b"]
        assert "fam/<x>" in suite_registry.describe() and "fam/<x>" in suite_registry.listing()
    finally:
        suite_registry.unregister("fam/<x>")
    assert not suite_registry.is_suite("fam/a")
    with pytest.raises(UsageError, match="unknown suite 'fam/a'"):
        suite_registry.get("fam/a")
