"""Zero-shot classification: classifier, metrics vs brute force, the three layouts, bad input, CLIP_benchmark."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import (
    import_clip_benchmark,
    install_clip_benchmark,
    save_random_checkpoint,
    write_image,
    write_tiny_config,
)

from hardrank.config import build
from hardrank.errors import DataError
from hardrank.evaluate import evaluate
from hardrank.exports.clip_benchmark import export_clip_benchmark
from hardrank.items import Tables
from hardrank.scoring.classify import class_embeddings, classify_metrics, classify_ranks
from hardrank.suites import load_suites
from hardrank.suites._common import SuiteOptions
from hardrank.suites.classification import build_classify, read_classnames, read_templates

CLASSES = ("cat", "dog", "bird", "fish", "frog", "lion")


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _task(n_img=40, n_cls=7, groups=2, seed=0, prompts_per_class=(3,)):
    """A ClassifyTask over a table of rows (no files): image rows 0.., text rows per class prompts."""
    rng = np.random.default_rng(seed)
    tables = Tables.empty()
    from hardrank.items import ImageRef
    names = [f"class {c}" for c in range(n_cls)]
    prompts = [[f"p{j} {n}" for j in range(prompts_per_class[c % len(prompts_per_class)])] for c, n in enumerate(names)]
    refs = [ImageRef(f"img{i}.jpg") for i in range(n_img)]
    variants = {f"blur_{g}_s0": [ImageRef(f"v{g}/img{i}.jpg") for i in range(n_img)] for g in range(1, groups)}
    labels = rng.integers(0, n_cls, n_img)
    task = build_classify(tables, refs, [r.uri for r in refs], labels, names, prompts, variants)
    return task, tables, rng


def _brute(task, img, txt):
    """Per (group, image): rank of the true class (strictly higher scores, then equal scores of earlier classes)."""
    classes = np.stack([_unit(_unit(txt[task.prompt_rows[a:b]]).mean(0))
                        for a, b in zip(task.prompt_ptr[:-1], task.prompt_ptr[1:])])
    out = {}
    for g, name in enumerate(task.groups):
        s = img[task.query_items[g]] @ classes.T
        lab = task.labels
        ps = s[np.arange(len(lab)), lab][:, None]
        cols = np.arange(s.shape[1])[None, :]
        rank = ((s > ps) | ((s == ps) & (cols < lab[:, None]))).sum(1)
        acc1 = 100 * np.mean(rank == 0)
        mpcr = 100 * np.mean([np.mean(rank[lab == c] == 0) for c in np.unique(lab)])
        out[name] = {"acc1": acc1, "acc5": 100 * np.mean(rank < 5), "mean_per_class_recall": mpcr}
    return classes, out


def test_class_embeddings_and_metrics_match_brute_force():
    task, tables, rng = _task(prompts_per_class=(1, 3, 2))
    img = rng.normal(size=(len(tables.images), 16)).astype(np.float32)
    txt = rng.normal(size=(len(tables.texts), 16)).astype(np.float32) * 3  # unnormalised: each is normalised first
    classes, want = _brute(task, _unit(img), txt)
    np.testing.assert_allclose(class_embeddings(txt, task.prompt_ptr, task.prompt_rows), classes, atol=1e-6)
    ranks = classify_ranks(task, _unit(img), txt)
    m = classify_metrics(task, ranks)
    for g in task.groups:
        for k, v in want[g].items():
            assert m[g][k] == pytest.approx(v), (g, k)
    assert m["blur_1_s0"]["relative_robustness"] == pytest.approx(want["blur_1_s0"]["acc1"] / want["clean"]["acc1"])
    assert m["variants_mean"]["members"] == ["blur_1_s0"]
    assert m["corruptions"] == {"blur": {"acc1": pytest.approx(want["blur_1_s0"]["acc1"]), "severities": 1}}


def test_ties_go_to_the_first_class_and_are_counted():
    task, tables, _ = _task(n_img=6, n_cls=3, groups=1)
    img = np.ones((len(tables.images), 4), dtype=np.float32) / 2
    txt = np.tile(np.array([[1, 0, 0, 0]], dtype=np.float32), (len(tables.texts), 1))  # every class equal
    ranks = classify_ranks(task, img, txt)
    assert (ranks["rank"] == task.labels).all()  # the index rule: every earlier class beats an equal score
    assert (ranks["top1"] == 0).all() and ranks["tie"].all()
    assert classify_metrics(task, ranks)["clean"]["ties"] == 6


def test_seeds_average_and_failed_copies_are_left_out():
    task, tables, rng = _task(groups=1)
    from hardrank.items import ImageRef
    refs = [ImageRef(f"img{i}.jpg") for i in range(40)]
    vs = {f"noise_3_s{s}": [ImageRef(f"n{s}/img{i}.jpg") for i in range(40)] for s in (0, 1)}
    task = build_classify(tables, refs, [r.uri for r in refs], task.labels, task.classnames,
                          [[n] for n in task.classnames], vs)
    img = _unit(rng.normal(size=(len(tables.images), 8)).astype(np.float32))
    txt = rng.normal(size=(len(tables.texts), 8)).astype(np.float32)
    bad = np.zeros(task.query_items.shape, dtype=bool)
    bad[1, :5] = True
    task = task.drop(bad)
    ranks = classify_ranks(task, img, txt)
    m = classify_metrics(task, ranks, {"noise_3": ["noise_3_s0", "noise_3_s1"]})
    assert m["noise_3_s0"]["images"] == 35 and m["noise_3_s1"]["images"] == 40 and task.skipped == {"noise_3_s0": 5}
    assert m["noise_3"]["acc1"] == pytest.approx((m["noise_3_s0"]["acc1"] + m["noise_3_s1"]["acc1"]) / 2)
    assert m["variants_mean"]["members"] == ["noise_3"]


def test_classnames_and_templates_formats(tmp_path):
    (tmp_path / "c.txt").write_text("cat\ndog\n\n")
    (tmp_path / "c.json").write_text(json.dumps({"pets": ["cat", "dog"], "cars": ["a", "b"]}))
    assert read_classnames(str(tmp_path / "c.txt")) == ["cat", "dog"]
    assert read_classnames(str(tmp_path / "c.json") + "#pets") == ["cat", "dog"]
    with pytest.raises(DataError, match="name one: --classnames"):
        read_classnames(str(tmp_path / "c.json"))
    (tmp_path / "t.txt").write_text("a photo of a {c}.\nart of the {c}\n")
    assert read_templates(str(tmp_path / "t.txt"), ["cat"])[0] == [["a photo of a cat.", "art of the cat"]]
    (tmp_path / "t.json").write_text(json.dumps({"pets": ["a {c}"], "imagenet1k": ["x {c}"]}))
    assert read_templates(str(tmp_path / "t.json") + "#pets", ["cat", "dog"])[0] == [["a cat"], ["a dog"]]
    (tmp_path / "cupl.json").write_text(json.dumps({"cat": ["a furry cat", "a cat sleeping"], "dog": "a dog"}))
    assert read_templates(str(tmp_path / "cupl.json"), ["cat", "dog"])[0] == [["a furry cat", "a cat sleeping"],
                                                                              ["a dog"]]
    assert read_templates(None, ["cat"]) == ([["a photo of a cat."]], "default")


# -- files on disk ------------------------------------------------------------------------------------------
def _imagefolder(root: Path, per_class=3, classes=CLASSES, seed=0) -> Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        for i in range(per_class):
            write_image(root / c / f"{c}_{i}.jpg", rng, size=(36, 36))
    return root


def _load(tmp_path, **kw):
    tables = Tables.empty()
    suite, = load_suites(["imagefolder"], tables, build(SuiteOptions, kw))
    return suite, tables


def test_bad_inputs_name_the_item_and_the_fix(tmp_path):
    root = _imagefolder(tmp_path / "if", per_class=1)
    (root / "empty").mkdir()
    with pytest.raises(DataError, match=r"class folder 'empty' holds no images .*add its images or remove the folder"):
        _load(tmp_path, images=str(root))
    (root / "empty").rmdir()
    (tmp_path / "names.txt").write_text("cat\ndog\nbird\nfish\nfrog\n")  # no lion
    with pytest.raises(DataError, match=r"class folder 'lion' is not in --classnames .*names.txt"):
        _load(tmp_path, images=str(root), classnames=str(tmp_path / "names.txt"))
    (tmp_path / "t.txt").write_text("a photo of a {c}\na photo\n")
    with pytest.raises(DataError, match=r"t.txt: template 2 'a photo' has no \{c\}; write \{c\}"):
        _load(tmp_path, images=str(root), templates=str(tmp_path / "t.txt"))
    (tmp_path / "labels.csv").write_text("image,label\ncat/cat_0.jpg,0\ndog/dog_0.jpg,6\n")
    (tmp_path / "c6.txt").write_text("\n".join(CLASSES))
    with pytest.raises(DataError, match=r"labels.csv: row 1 label 6 is out of range for 6 classes \(0..5\)"):
        _load(tmp_path, images=str(root), annotations=str(tmp_path / "labels.csv"), classnames=str(tmp_path / "c6.txt"))


def test_folder_order_mapping_and_variant_folders(tmp_path):
    root = _imagefolder(tmp_path / "if", per_class=1)
    shutil.copytree(root, root / "snow_2_s0")  # a variant folder beside the class folders
    suite, tables = _load(tmp_path, images=str(root), image_variants=("snow_2",), seeds=(0,))
    t = suite.classify[0]
    assert t.classnames == sorted(CLASSES) and t.groups == ["clean", "snow_2_s0"]
    assert [tables.images.entries[r].uri for r in t.query_items[1]] == [
        str(root / "snow_2_s0" / i) for i in t.query_ids]
    suite, _ = _load(tmp_path, images=str(root), image_variants=("snow_5",), seeds=(0,))
    with pytest.raises(FileNotFoundError, match=r"snow_5_s0 does not exist; make it with `hardrank perturb images"):
        suite.check_images()  # before a model run reads any image
    (tmp_path / "names.txt").write_text("\n".join(reversed(CLASSES)))
    suite, _ = _load(tmp_path, images=str(root), classnames=str(tmp_path / "names.txt"))
    t = suite.classify[0]
    assert t.classnames == list(reversed(CLASSES))
    assert [t.classnames[lab] for lab in t.labels] == [i.split("/")[0] for i in t.query_ids]
    for i, c in enumerate(CLASSES):  # ImageNet-V2's numeric folders are labels
        (root / c).rename(root / str(i))
    suite, _ = _load(tmp_path, images=str(root), classnames=str(tmp_path / "names.txt"))
    assert [int(i.split("/")[0]) for i in suite.classify[0].query_ids] == suite.classify[0].labels.tolist()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("zs_model")
    cfg = write_tiny_config(d)
    return cfg, [save_random_checkpoint(cfg, d / "a.safetensors", 0),
                 save_random_checkpoint(cfg, d / "b.safetensors", 3)]


def _write_cb_wds(root: Path, folder: Path, classes) -> None:
    """CLIP_benchmark's WebDataset root: classnames.txt, templates, test/0.tar of <key>.jpg + <key>.cls."""
    import io
    import tarfile
    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(classes) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\nart of the {c}.\n")
    (root / "test" / "nshards.txt").write_text("1")
    with tarfile.open(root / "test" / "0.tar", "w") as tar:
        for i, f in enumerate(sorted(folder.rglob("*.jpg"))):
            for name, data in ((f"s{i:07d}.jpg", f.read_bytes()),
                               (f"s{i:07d}.cls", str(classes.index(f.parent.name)).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_eval_three_layouts_agree(tmp_path, tiny_model):
    cfg, ckpts = tiny_model
    root = _imagefolder(tmp_path / "if")
    shutil.copytree(root, root / "noise_1_s0")
    (tmp_path / "t.txt").write_text("a photo of a {c}.\nart of the {c}.\n")
    (tmp_path / "names.txt").write_text("\n".join(sorted(CLASSES)))
    common = dict(model=str(cfg), checkpoints=tuple(map(str, ckpts)), store=str(tmp_path / "store"))
    rep = evaluate(suites=["imagefolder"], images=str(root), templates=str(tmp_path / "t.txt"),
                   image_variants=("noise_1",), seeds=(0,), out=str(tmp_path / "o1"), **common)
    m = rep.results[0]["metrics"]["zeroshot"]
    assert rep.results[0]["task_type"] == "classification" and m["clean"]["images"] == 18
    assert m["noise_1_s0"]["acc1"] == m["clean"]["acc1"]  # the same bytes: the same embeddings
    assert m["noise_1_s0"]["relative_robustness"] == pytest.approx(1.0) or m["clean"]["acc1"] == 0
    out = pq.read_table(tmp_path / "o1" / "a" / "imagefolder.parquet").to_pylist()
    assert len(out) == 36 and {o["view"] for o in out} == {"clean", "noise_1_s0"}
    assert all(o["correct"] == (o["top1_id"] == o["subset"]) for o in out)
    written = export_clip_benchmark(tmp_path / "o1", tmp_path / "cb")["written"]
    recs = {json.loads(Path(f).read_text())["dataset"]: json.loads(Path(f).read_text()) for f in written
            if "_a_" in Path(f).name}
    assert set(recs) == {"if", "if/noise_1_s0"} and recs["if"]["task"] == "zeroshot_classification"
    assert recs["if"]["metrics"] == pytest.approx({k: m["clean"][k] / 100 for k in
                                                   ("acc1", "acc5", "mean_per_class_recall")})
    _write_cb_wds(tmp_path / "wds", root, sorted(CLASSES))
    rep2 = evaluate(suites=["classification"], images=str(tmp_path / "wds"), out=str(tmp_path / "o2"), **common)
    (tmp_path / "t.csv").write_text("image,label\n" + "".join(
        f"{p.relative_to(root).as_posix()},{p.parent.name}\n" for p in sorted(root.glob("*/*.jpg"))
        if "noise" not in p.parent.name))
    rep3 = evaluate(suites=["classification"], images=str(root), annotations=str(tmp_path / "t.csv"),
                    classnames=str(tmp_path / "names.txt"), templates=str(tmp_path / "t.txt"),
                    out=str(tmp_path / "o3"), **common)
    for r1, r2, r3 in zip(rep.results, rep2.results, rep3.results):
        clean = {k: r1["metrics"]["zeroshot"]["clean"][k] for k in ("acc1", "acc5", "mean_per_class_recall")}
        for r in (r2, r3):
            assert {k: r["metrics"]["zeroshot"]["clean"][k] for k in clean} == pytest.approx(clean)
    assert rep2.results[0]["suite_meta"]["templates_from"] == "dataset"


# -- agreement with CLIP_benchmark ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def clip_benchmark_path():
    return install_clip_benchmark()


def test_agrees_with_clip_benchmark(tmp_path, tiny_model, clip_benchmark_path, monkeypatch):
    import open_clip
    import torch
    import torchvision
    from safetensors.torch import load_file

    from hardrank.models.openclip import resolve_arch

    cb, = import_clip_benchmark(clip_benchmark_path, monkeypatch, "clip_benchmark.metrics.zeroshot_classification")
    cfg, ckpts = tiny_model
    root = _imagefolder(tmp_path / "if", per_class=3, seed=5)
    templates = ["a photo of a {c}.", "a drawing of the {c}."]
    (tmp_path / "t.txt").write_text("\n".join(templates))
    rep = evaluate(suites=["imagefolder"], images=str(root), templates=str(tmp_path / "t.txt"), model=str(cfg),
                   checkpoints=tuple(map(str, ckpts)), out=str(tmp_path / "o"), store=str(tmp_path / "store"))
    name = resolve_arch(str(cfg))
    for ckpt, result in zip(ckpts, rep.results):
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
        model.load_state_dict(load_file(str(ckpt)))
        model.eval()
        ds = torchvision.datasets.ImageFolder(str(root), transform=preprocess)
        loader = torch.utils.data.DataLoader(ds, batch_size=7)
        want = cb.evaluate(model, loader, open_clip.get_tokenizer(name), ds.classes, templates, "cpu", amp=False)
        ours = result["metrics"]["zeroshot"]["clean"]
        assert ours["ties"] == 0
        assert ours["acc1"] == pytest.approx(100 * want["acc1"])
        assert ours["acc5"] == pytest.approx(100 * want["acc5"])
        assert ours["mean_per_class_recall"] == pytest.approx(100 * want["mean_per_class_recall"])


def test_report_draws_accuracy_against_severity(tmp_path, tiny_model):
    from hardrank.jobs.report import build_report

    cfg, ckpts = tiny_model
    root = _imagefolder(tmp_path / "if", per_class=1)
    for v in ("fog_1_s0", "fog_3_s0"):
        shutil.copytree(root, root / v, ignore=shutil.ignore_patterns("fog_*"))
    evaluate(suites=["imagefolder"], images=str(root), image_variants=("fog_1", "fog_3"), seeds=(0,),
             model=str(cfg), checkpoints=tuple(map(str, ckpts)), out=str(tmp_path / "o"), store=str(tmp_path / "s"))
    build_report(tmp_path / "o", tmp_path / "rep")
    assert (tmp_path / "rep" / "plots" / "severity.png").is_file()
    assert "Accuracy vs corruption severity" in (tmp_path / "rep" / "report.md").read_text()
    rows = list(csv.DictReader((tmp_path / "rep" / "leaderboard.csv").open()))
    assert {r["main_metric"] for r in rows} == {"top-1"} and "zs:fog top1" in rows[0]


def test_toy_world_classification_split(tmp_path):
    from hardrank.toyworld import WorldConfig, build_world
    from hardrank.toyworld.world import CLASSIFY_CORRUPTIONS, _sample_scenes, classification_split

    cfg = WorldConfig(n_train=0, n_test=12, n_inpaint=0, alter_methods=())
    world = Path(build_world(tmp_path / "w", cfg))
    split = classification_split(world)
    rows = list(csv.DictReader((split / "labels.csv").open()))
    scenes = _sample_scenes(cfg)[1]
    assert [r["label"] for r in rows] == [f"{s.left.colour} {s.left.shape}" for s in scenes]
    names, severities, seed = CLASSIFY_CORRUPTIONS
    for n in names:
        for s in severities:
            assert (world / "images" / f"{n}_{s}_s{seed}" / rows[0]["image"]).is_file()
    tables = Tables.empty()
    suite, = load_suites(["toy-classify"], tables, SuiteOptions(data=str(world)))
    t = suite.classify[0]
    assert len(t.classnames) == 24 and t.num_queries == 12 and len(t.groups) == 1 + len(names) * len(severities)


def test_imagenet_builtins_wnid_folders_and_the_200_class_shifts(tmp_path):
    from hardrank.suites.imagenet import IMAGENET_WNIDS, imagenet_classnames, shift_subset

    rng = np.random.default_rng(0)
    root = tmp_path / "in"
    for w in (IMAGENET_WNIDS[0], IMAGENET_WNIDS[999]):
        write_image(root / w / "a.jpg", rng, size=(8, 8))
    suite, _ = _load(tmp_path, images=str(root))
    t = suite.classify[0]
    assert t.classnames == imagenet_classnames() and sorted(t.labels.tolist()) == [0, 999]
    assert int(t.prompt_ptr[1]) == 80 and suite.meta["templates_from"] == "dataset"  # the openai set by default
    r = tmp_path / "imagenet-r"
    for i in shift_subset("imagenet-r"):
        write_image(r / IMAGENET_WNIDS[i] / "a.jpg", rng, size=(8, 8))
    suite, _ = _load(tmp_path, images=str(r), templates="simple")
    t = suite.classify[0]
    names = imagenet_classnames()
    assert t.classnames == [names[i] for i in shift_subset("imagenet-r")]  # scored against its 200 classes only
    assert [t.classnames[lab] for lab in t.labels] == [names[IMAGENET_WNIDS.index(q.split("/")[0])]
                                                       for q in t.query_ids]
    assert int(t.prompt_ptr[1]) == 7
    v2 = tmp_path / "v2"
    write_image(v2 / "5" / "a.jpg", rng, size=(8, 8))
    suite, _ = _load(tmp_path, images=str(v2), classnames="imagenet1k")
    assert suite.classify[0].labels.tolist() == [5] and len(suite.classify[0].classnames) == 1000
    with pytest.raises(DataError, match=r"class folder 'n01440764' \(ImageNet class 0\) is not among the 200"):
        _load(tmp_path, images=str(root), classnames="imagenet-a")
