"""A collection of stand-in datasets for K toy checkpoints: one hardrank command against CLIP_benchmark's own loop.

Seven datasets in CLIP_benchmark's WebDataset layout, written by its own ``convert_dataset`` /
``convert_retrieval_dataset`` from the toy world (``hardrank.toyworld``): six zero-shot classification datasets of
1,000 distinct images each (the 6,000 training images, labelled by the left or right object's colour or shape, the
left object, or the background) and one retrieval dataset (the 1,000 test images and their 5,010 captions, named
``wds/flickr30k`` so both tools' ``--task auto`` picks retrieval). hardrank runs them as one collection
(``hardrank eval --suite datacomp --tasklist`` of the seven, K checkpoints: each image decoded once, prompts and
captions encoded once per checkpoint); CLIP_benchmark 1.6.2 runs its ``clip_benchmark eval --dataset <the seven>
--pretrained <the K>``, which loops over every (checkpoint, dataset). Same model config, same roots, same batch
size (64, its CLI's default), same machine, interleaved; wall and CPU time of each command as a user runs it (cold
embedding store), and every metric of every (checkpoint, dataset) compared.

CLIP_benchmark is installed with ``--no-deps`` into a scratch folder (``--scratch``; once) and imported from there on
top of this environment's torch and open_clip, as the tests do; its CLI imports a captioning metric that needs
pycocoevalcap (Java jars), which no run here uses: stand-ins are put in its place. Writes the table and
``benchmarks/results/bench_collections.json``. Slow (minutes); not part of the tests.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hardrank.jobs.bench.timing import timed

CB_PACKAGES = ("clip_benchmark==1.6.2", "scikit-learn", "scipy", "joblib", "threadpoolctl", "cloudpickle", "narwhals")
TOY_CHECKPOINTS = ("toy-clip_step0100", "toy-clip_step0200", "toy-clip_step0400", "toy-clip_step0700")
TOL = 0.05  # percentage points: both sides count the same ranks; this absorbs float32 means
# (name, range of training images, label function of a scene): six classification datasets of distinct images
DATASETS = (("toy_left_colour", (0, 1000), lambda s: s.left.colour),
            ("toy_left_shape", (1000, 2000), lambda s: s.left.shape),
            ("toy_right_colour", (2000, 3000), lambda s: s.right.colour),
            ("toy_right_shape", (3000, 4000), lambda s: s.right.shape),
            ("toy_left_object", (4000, 5000), lambda s: f"{s.left.colour} {s.left.shape}"),
            ("toy_background", (5000, 6000), lambda s: s.bg))
TEMPLATES = {"toy_left_colour": ["a {c} shape on the left", "something {c} on the left"],
             "toy_left_shape": ["a {c} on the left"], "toy_right_colour": ["a {c} shape on the right"],
             "toy_right_shape": ["a {c} on the right", "a picture with a {c} on the right"],
             "toy_left_object": ["a {c} on the left", "a small {c}", "a large {c}"],
             "toy_background": ["a picture on a {c} background"]}

_CB_DRIVER = """import builtins, sys, types
import numpy as np
import open_clip
sys.path.insert(0, sys.argv[1])
open_clip.add_model_config(sys.argv[2])  # the toy config: CLIP_benchmark loads models by open_clip name
for path, cls in (("tokenizer.ptbtokenizer", "PTBTokenizer"), ("bleu.bleu", "Bleu"), ("meteor.meteor", "Meteor"),
                  ("rouge.rouge", "Rouge"), ("cider.cider", "Cider"), ("spice.spice", "Spice")):
    parts = ("pycocoevalcap." + path).split(".")  # its CLI imports its captioning metric; no captioning runs
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    setattr(sys.modules["pycocoevalcap." + path], cls, None)
import clip_benchmark.metrics.zeroshot_classification as zsc
zsc.float = lambda x: builtins.float(np.asarray(x).reshape(-1)[0])  # numpy >= 2.1 refuses float() of an array
sys.argv = ["clip_benchmark"] + sys.argv[3:]
from clip_benchmark.cli import main
main()
"""

_CONVERT = """import json, sys
sys.path.insert(0, sys.argv[1])
from clip_benchmark import webdataset_builder as wb
spec = json.loads(open(sys.argv[2]).read())
for d in spec:
    if d["kind"] == "retrieval":
        wb.convert_retrieval_dataset(d["items"], "test", d["root"], transform=wb.path_to_bytes, verbose=False,
                                     max_count=d["per_shard"])
    else:
        class DS(list):
            pass
        ds = DS((p, y) for p, y in d["items"])
        ds.classes, ds.templates = d["classes"], d["templates"]
        wb.convert_dataset(ds, "test", d["root"], transform=wb.path_to_bytes, verbose=False,
                           max_count=d["per_shard"])
"""
PER_SHARD = 250  # images per shard: 4 shards a dataset (the mirrors hold many; its loader wants one per worker)


def _run(cmd: list) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and every process it waited for: its DataLoader workers too).
    Both sides run with OpenMP's passive wait policy, which hardrank sets for itself (``hardrank.cpus``): torch
    imported first otherwise spins its threads between parallel regions on a loaded machine."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sec, p = timed(lambda: subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:300]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return sec, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def scratch_clip_benchmark(folder: Path) -> Path:
    """CLIP_benchmark and what its metrics import, ``--no-deps`` into ``folder`` (never into this environment)."""
    if not (folder / "clip_benchmark" / "cli.py").is_file():
        print(f"installing {' '.join(CB_PACKAGES)} --no-deps into {folder} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(folder), *CB_PACKAGES], check=True)
    return folder


# --sizes vtab: each dataset's images at the size of a VTAB dataset's (CIFAR/SVHN 32 px, EuroSAT 64, PCam 96,
# RESISC45 256, DTD/Caltech ~300, Pets/Flowers ~500; the retrieval images at COCO/Flickr's ~500), the toy renders
# resized bicubically and saved as JPEG (quality 90): what a decode costs beside the 64 px toy model's encode
VTAB_SIZES = (32, 64, 96, 256, 320, 500, 500)


def _resized(src: Path, size: int, dst: Path) -> str:
    from PIL import Image

    if not dst.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(src) as im:
            im.convert("RGB").resize((size, size * 3 // 4 if size > 96 else size), Image.BICUBIC).save(dst, quality=90)
    return str(dst)


def stand_ins(work: Path, scratch: Path, sizes: str) -> tuple[Path, Path, list[str]]:
    """The seven roots (written by CLIP_benchmark's converters, once per ``sizes``), the task list of them, their
    names. ``sizes``: ``toy`` (the 64 px renders as they are) or ``vtab`` (``VTAB_SIZES``)."""
    from hardrank.config import cache_dir
    from hardrank.toyworld import build_world, world_config
    from hardrank.toyworld.world import _sample_scenes  # the scenes the world drew, in image order

    data = work / f"data_{sizes}"
    names = [f"wds/{n}" for n, *_ in DATASETS] + ["wds/flickr30k"]
    if not (data / "wds_flickr30k" / "test" / "nshards.txt").is_file():
        world = build_world(cache_dir() / "toy_world")  # the demo's (built once, about 30 s)
        train, _ = _sample_scenes(world_config(world))

        def image(e, i):
            src = world / "images" / e["image"]
            return str(src) if sizes == "toy" else _resized(src, VTAB_SIZES[i], work / f"images_{sizes}" / e["image"])

        spec = []
        for i, (name, (lo, hi), label) in enumerate(DATASETS):
            entries = json.loads((world / "karpathy_train.json").read_text())[lo:hi]
            labels = [label(train[int(Path(e["image"]).stem.split("_")[1])]) for e in entries]
            classes = sorted(set(labels))
            spec.append({"kind": "classification", "root": str(data / f"wds_{name}"), "classes": classes,
                         "templates": TEMPLATES[name], "per_shard": PER_SHARD,
                         "items": [(image(e, i), classes.index(y)) for e, y in zip(entries, labels)]})
        test = json.loads((world / "karpathy_test.json").read_text())
        spec.append({"kind": "retrieval", "root": str(data / "wds_flickr30k"), "per_shard": PER_SHARD,
                     "items": [(image(e, len(DATASETS)), e["caption"]) for e in test]})
        shutil.rmtree(data, ignore_errors=True)
        (work / "spec.json").write_text(json.dumps(spec))
        print(f"writing the stand-in roots into {data} with CLIP_benchmark's converters (once)", flush=True)
        _run([sys.executable, "-c", _CONVERT, scratch, work / "spec.json"])
    tasklist = work / "collection.yml"
    tasklist.write_text("".join(f"{n}:\n  name: {n}\n" + ("  main_metric: mean_recall@1\n" if "flickr" in n else "")
                                for n in names))
    return data, tasklist, names


def _ours(out: Path, ckpts: list[Path], names: list[str]) -> dict:
    got = {}
    for c in ckpts:
        for n in names:
            r = json.loads((out / c.stem / f"{n.replace('/', '_')}.json").read_text())
            if r["task_type"] == "ranking":
                m = r["metrics"]["original"]
                got[(c.stem, n)] = {f"{d}_R@{k}": m[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)}
            else:
                m = r["metrics"]["zeroshot"]["clean"]
                got[(c.stem, n)] = {k: m[k] for k in ("acc1", "acc5", "mean_per_class_recall")}
    return got


def _theirs(folder: Path) -> dict:
    got = {}
    for f in folder.glob("*.json"):
        rec = json.loads(f.read_text())
        m, key = rec["metrics"], (Path(rec["pretrained"]).stem, rec["dataset"])
        if rec["task"] == "zeroshot_retrieval":
            got[key] = {f"{d}_R@{k}": 100 * m[f"{cb}_retrieval_recall@{k}"] for d, cb in (("i2t", "text"),
                        ("t2i", "image")) for k in (1, 5, 10)}
        else:
            got[key] = {k: 100 * m[k] for k in ("acc1", "acc5", "mean_per_class_recall")
                        if m.get(k) is not None and m[k] == m[k]}
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-collections"))
    ap.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-clip-benchmark"),
                    help="folder CLIP_benchmark is installed into with --no-deps (once)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--k", type=int, default=4, help="toy checkpoints (the last K of the trained ones)")
    ap.add_argument("--sizes", choices=("toy", "vtab"), default="toy",
                    help="the images: the toy world's 64 px renders, or resized to VTAB's datasets' sizes")
    ap.add_argument("--json", default="benchmarks/results/bench_collections.json")
    args = ap.parse_args()
    from hardrank.atomic import write_text_atomic
    from hardrank.toyworld import TOY_CHECKPOINTS as CKPT_DIR
    from hardrank.toyworld import TOY_MODEL

    work, scratch = Path(args.work), scratch_clip_benchmark(Path(args.scratch))
    work.mkdir(parents=True, exist_ok=True)
    data, tasklist, names = stand_ins(work, scratch, args.sizes)
    ckpts = [CKPT_DIR / f"{c}.safetensors" for c in TOY_CHECKPOINTS][-args.k:]
    workers = str(os.cpu_count() or 1)
    ours, theirs, load = [], [], {"before": os.getloadavg()}
    for i in range(args.repeat):
        out, store, cb_out = work / f"hr_{i}", work / f"store_{i}", work / f"cb_{i}"
        for d in (out, store, cb_out):
            shutil.rmtree(d, ignore_errors=True)
        cb_out.mkdir(parents=True)
        ours.append(_run([Path(sys.executable).with_name("hardrank"), "eval", "--suite", "datacomp", "--tasklist",
                          tasklist, "--data-root", data, "--model", TOY_MODEL, "--checkpoint", *ckpts,
                          "--recall-k", "1", "5", "10", "--batch-size", "64", "--store", store, "--out", out,
                          "--quiet"]))
        theirs.append(_run([sys.executable, "-c", _CB_DRIVER, scratch, TOY_MODEL, "eval", "--dataset", *names,
                            "--dataset_root", f"{data}/wds_{{dataset_cleaned}}", "--model", TOY_MODEL.stem,
                            "--pretrained", *ckpts, "--recall_k", "1", "5", "10", "--no_amp", "--num_workers",
                            workers, "--batch_size", "64", "--output",
                            f"{cb_out}/{{dataset}}_{{pretrained}}_{{model}}_{{language}}_{{task}}.json", "--quiet"]))
        print(f"repeat {i}: hardrank {ours[-1][0]:.1f} s ({ours[-1][1]:.1f} CPU s), CLIP_benchmark "
              f"{theirs[-1][0]:.1f} s ({theirs[-1][1]:.1f} CPU s)", flush=True)
    load["after"] = os.getloadavg()
    mine, cb = _ours(work / f"hr_{args.repeat - 1}", ckpts, names), _theirs(work / f"cb_{args.repeat - 1}")
    worst = max(abs(mine[k][m] - v) for k, ms in cb.items() for m, v in ms.items())
    agree = set(cb) == set(mine) and worst <= TOL
    coll = json.loads((work / f"hr_{args.repeat - 1}" / ckpts[-1].stem / "collection_datacomp.json").read_text())
    walls = [w for w, _ in ours], [w for w, _ in theirs]
    cpus = [c for _, c in ours], [c for _, c in theirs]
    ratio, cpu_ratio = min(walls[1]) / min(walls[0]), min(cpus[1]) / min(cpus[0])
    n_images = sum(hi - lo for _, (lo, hi), _ in DATASETS) + 1000
    table = "\n".join([
        "| comparison | hardrank wall / CPU s | CLIP_benchmark 1.6.2 wall / CPU s | hardrank faster (wall, CPU) | "
        "metrics agree | load before/after |",
        "|---|---|---|---|---|---|",
        f"| {len(names)} datasets ({n_images} images, {args.sizes} sizes), K={len(ckpts)} toy checkpoints | "
        f"{min(walls[0]):.1f} / {min(cpus[0]):.1f} | {min(walls[1]):.1f} / {min(cpus[1]):.1f} | "
        f"{ratio:.2f}x, {cpu_ratio:.2f}x | {'yes' if agree else '**no**'} (max diff {worst:.2g} pts, {len(cb)} "
        f"pairs) | {load['before'][0]:.1f}/{load['after'][0]:.1f} |"])
    print(table)
    print(f"collection average ({ckpts[-1].stem}): {coll['metrics']['Average']:.3f}")
    doc = {"ours_wall_s": walls[0], "theirs_wall_s": walls[1], "ours_cpu_s": cpus[0], "theirs_cpu_s": cpus[1],
           "ratio_best_wall": ratio, "ratio_best_cpu": cpu_ratio, "agree": agree, "max_diff_pts": worst,
           "pairs": len(cb), "datasets": names, "images": n_images, "checkpoints": [c.stem for c in ckpts],
           "collection_average_last": coll["metrics"]["Average"], "load": load, "args": vars(args),
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "python": platform.python_version()}}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.json), json.dumps(doc, indent=2, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
