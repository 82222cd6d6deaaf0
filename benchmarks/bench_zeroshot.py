"""Zero-shot classification, K checkpoints: hardrank (one decode feeds K, the store serves reruns) vs CLIP_benchmark.

Generated ImageNet-shaped data: an ImageFolder of ``--classes`` folders (ImageNet-1k's class names and
open_clip's 80 OpenAI templates when --classes is 1000; a prefix of them otherwise) holding ``--images``
JPEGs in all, scored by the toy model's first ``--k`` bundled checkpoints (or random tiny ones). Timed, in
one run on the same images and checkpoints:

- hardrank cold: ``hardrank.evaluate(suites=["imagefolder"], ...)`` with an empty store, end to end
  (list the folder, hash, decode once, encode K times, class embeddings, rank, write results);
- hardrank warm: the same call again (every embedding from the store);
- CLIP_benchmark: its own ``zeroshot_classification.evaluate`` per checkpoint (classifier from the templates,
  torchvision ImageFolder + DataLoader, ``--workers`` worker processes), in a child process whose
  ``PYTHONPATH`` is CLIP_benchmark installed ``--no-deps`` into ``--cb-target`` (never into this environment).

Prints one table and writes JSON: images/s end to end, text encodes per checkpoint, the speed-up against
CLIP_benchmark, and whether top-1 / top-5 / mean per-class recall are identical per checkpoint.
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
import time
from pathlib import Path

_CB_PACKAGES = ("clip_benchmark", "scikit-learn", "scipy", "joblib", "threadpoolctl", "cloudpickle", "narwhals")

# Runs in the child process: CLIP_benchmark's evaluate per checkpoint, timed as a whole (model load included,
# as a user running it per checkpoint pays it). CLIP_benchmark 1.6's accuracy() calls float() on a 1-element
# array, which numpy >= 2.1 refuses: its module gets a float() taking the one element, otherwise unchanged.
_CB_SCRIPT = r"""
import builtins, json, sys, time
import numpy as np, open_clip, torch, torchvision
from safetensors.torch import load_file
from clip_benchmark.metrics import zeroshot_classification as cb
from hardrank.models.openclip import resolve_arch
cb.float = lambda x: builtins.float(np.asarray(x).reshape(-1)[0])
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
name = resolve_arch(args["model"])
classes = [l.strip() for l in open(args["classnames"]) if l.strip()]
templates = [l.strip() for l in open(args["templates"]) if l.strip()]
out = []
t0 = time.perf_counter()
for ckpt in args["checkpoints"]:
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=None)
    model.load_state_dict(load_file(ckpt))
    model.eval()
    ds = torchvision.datasets.ImageFolder(args["root"], transform=preprocess)
    loader = torch.utils.data.DataLoader(ds, batch_size=args["batch"], num_workers=args["workers"])
    m = cb.evaluate(model, loader, open_clip.get_tokenizer(name), classes, templates, "cpu", amp=False)
    out.append({k: float(v) for k, v in m.items()})
print(json.dumps({"seconds": time.perf_counter() - t0, "metrics": out}))
"""


def _write_data(root: Path, n_classes: int, n_images: int, size: int, seed: int) -> tuple[list[str], list[str]]:
    """An ImageFolder of smooth random JPEGs (folders 0000.. in label order), its class names and templates."""
    import numpy as np
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES
    from PIL import Image

    names = list(IMAGENET_CLASSNAMES[:n_classes]) + [f"class {i}" for i in range(1000, n_classes)]
    templates = [t("{c}") for t in OPENAI_IMAGENET_TEMPLATES]
    done = root / ".complete"
    if done.is_file() and json.loads(done.read_text()) == [n_classes, n_images, size, seed]:
        return names, templates
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    for i in range(n_images):
        c = i % n_classes
        low = rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)  # smooth: a 4x4 field upsampled, as photos compress
        im = Image.fromarray(low).resize((size, size), Image.BICUBIC)
        folder = root / f"{c:04d}"  # label-numbered (ImageNet-V2's layout): torchvision's sorted order is label order
        folder.mkdir(parents=True, exist_ok=True)
        im.save(folder / f"img_{i:06d}.jpg", quality=90)
    done.write_text(json.dumps([n_classes, n_images, size, seed]))
    return names, templates


def _cpu(who) -> float:
    """CPU seconds (user + system) used so far: on a shared, loaded machine wall time measures the queue."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _install_cb(target: Path) -> None:
    if (target / "clip_benchmark" / "metrics" / "zeroshot_classification.py").is_file():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", str(target), *_CB_PACKAGES], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--size", type=int, default=96, help="side of the generated JPEGs, pixels")
    ap.add_argument("--model", default="toy", choices=["toy", "tiny"],
                    help="toy: the bundled toy-clip checkpoints; tiny: random checkpoints of a smaller config")
    ap.add_argument("--batch", type=int, default=64, help="CLIP_benchmark's batch size (its CLI default)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="CLIP_benchmark's DataLoader workers")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-zeroshot"))
    ap.add_argument("--cb-target", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-clip-benchmark"),
                    help="CLIP_benchmark is pip-installed --no-deps here (its own folder, not this environment)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of (hardrank cold, CLIP_benchmark, hardrank warm), "
                    "interleaved so a busy machine slows each alike; the best of each is reported")
    ap.add_argument("--json", default="benchmarks/results/bench_zeroshot.json")
    args = ap.parse_args()
    import torch

    import hardrank
    from hardrank.jobs.bench.inputs import small_checkpoints
    from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL

    data = Path(args.data)
    root = data / f"imagefolder_{args.classes}x{args.images}_{args.size}"
    names, templates = _write_data(root, args.classes, args.images, args.size, seed=0)
    (data / "classnames.txt").write_text("\n".join(names) + "\n")
    (data / "templates.txt").write_text("\n".join(templates) + "\n")
    if args.model == "toy":
        model, ckpts = str(TOY_MODEL), [str(p) for p in sorted(TOY_CHECKPOINTS.glob("*.safetensors"))[:args.k]]
    else:
        model, ckpts = small_checkpoints(data, args.k, "tiny")
    _install_cb(Path(args.cb_target))
    threads = os.cpu_count() or 1
    store, out = data / "store", data / "results"
    opts = dict(suites=["imagefolder"], images=str(root), classnames=str(data / "classnames.txt"),
                templates=str(data / "templates.txt"), model=model, checkpoints=tuple(ckpts), store=str(store),
                out=str(out), decode_threads=threads)
    # the driver runs on this interpreter (its site-packages and the installed hardrank), plus CLIP_benchmark's folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [args.cb_target, os.environ.get("PYTHONPATH")]))}
    cb_args = {"model": model, "checkpoints": ckpts, "root": str(root), "classnames": str(data / "classnames.txt"),
               "templates": str(data / "templates.txt"), "batch": args.batch, "workers": args.workers,
               "threads": torch.get_num_threads()}
    colds, warms, cbs, cpu = [], [], [], {"hardrank_cold": [], "clip_benchmark": []}
    for _ in range(args.repeat):
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        t0, c0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
        rep = hardrank.evaluate(**opts)
        colds.append(time.perf_counter() - t0)
        cpu["hardrank_cold"].append(_cpu(resource.RUSAGE_SELF) - c0)
        c0 = _cpu(resource.RUSAGE_CHILDREN)
        res = subprocess.run([sys.executable, "-c", _CB_SCRIPT, json.dumps(cb_args)], env=env, capture_output=True,
                             text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"CLIP_benchmark failed:\n{res.stderr[-3000:]}")
        cb = json.loads(res.stdout.strip().splitlines()[-1])
        cbs.append(cb["seconds"])
        cpu["clip_benchmark"].append(_cpu(resource.RUSAGE_CHILDREN) - c0)  # its DataLoader workers included
        t0 = time.perf_counter()
        hardrank.evaluate(**opts)
        warms.append(time.perf_counter() - t0)
    cold, warm, cb_s = min(colds), min(warms), min(cbs)
    ours = [r["metrics"]["zeroshot"]["clean"] for r in rep.results]
    text_encoded = rep.embed_stats["text"]["encoded"]
    same = [all(abs(o[k] - 100 * c[ck]) < 1e-6 for k, ck in (("acc1", "acc1"), ("acc5", "acc5"),
                                                              ("mean_per_class_recall", "mean_per_class_recall")))
            for o, c in zip(ours, cb["metrics"])]
    n = args.images
    print(f"{args.classes} classes x {len(templates)} templates, {n} JPEGs {args.size}px, K={args.k} checkpoints of "
          f"{Path(model).stem}, CPU, {threads} cores, torch {torch.get_num_threads()} threads, load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'run':34s} {'seconds':>8s} {'images/s':>9s} {'img x ckpt/s':>13s}")
    for label, sec in (("hardrank, empty store", cold), ("hardrank, rerun (store)", warm),
                       ("CLIP_benchmark evaluate x K", cb_s)):
        print(f"{label:34s} {sec:8.1f} {n / sec:9.1f} {n * args.k / sec:13.1f}")
    hc, cc = min(cpu["hardrank_cold"]), min(cpu["clip_benchmark"])
    print(f"CPU seconds (user + system; CLIP_benchmark's with its workers): hardrank {hc:.1f}, CLIP_benchmark "
          f"{cc:.1f} ({cc / hc:.2f}x); hardrank image stages: "
          f"{ {k: round(v, 1) for k, v in rep.embed_stats['image'].get('stage_seconds', {}).items()} }")
    print(f"text encodes per checkpoint: hardrank {text_encoded} (distinct prompts, once each), CLIP_benchmark "
          f"{args.classes * len(templates)}")
    print(f"speed-up vs CLIP_benchmark at K={args.k}: {cb_s / cold:.2f}x (empty store), "
          f"{cb_s / warm:.2f}x (rerun); metrics identical per checkpoint: {same}; best of {args.repeat} interleaved "
          f"rounds (all: hardrank {[round(x, 1) for x in colds]}, CLIP_benchmark {[round(x, 1) for x in cbs]})")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "classes": args.classes, "templates": len(templates), "images": n, "size": args.size, "k": args.k,
        "model": Path(model).stem, "hardrank_cold_s": cold, "hardrank_warm_s": warm, "clip_benchmark_s": cb_s,
        "rounds": {"hardrank_cold_s": colds, "hardrank_warm_s": warms, "clip_benchmark_s": cbs},
        "images_per_s": {"hardrank_cold": n / cold, "hardrank_warm": n / warm, "clip_benchmark": n / cb_s},
        "text_encodes_per_checkpoint": {"hardrank": text_encoded, "clip_benchmark": args.classes * len(templates)},
        "cpu_s": cpu, "image_stage_seconds": rep.embed_stats["image"].get("stage_seconds"),
        "speedup_cold": cb_s / cold, "speedup_warm": cb_s / warm, "identical": same,
        "hardrank_metrics": ours, "clip_benchmark_metrics": cb["metrics"],
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "loadavg": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
