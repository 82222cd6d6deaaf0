"""hardrank against the tools a user would run instead (CLIP_benchmark, clip-retrieval, autofaiss), side by side.

Each peer is installed from the package registry into its own virtual environment (``--venvs``; created on the
first run, reused after), never into hardrank's. Rows:

- ``retrieval K=1`` / ``K=4``: ``hardrank eval --suite karpathy`` against CLIP_benchmark's ``eval`` (its
  ``flickr30k`` loader over a Karpathy-style file) on the toy world's test split (1,000 images, 5,010 captions),
  the toy checkpoints registered in open_clip; wall time of each command as a user runs it (cold store), and
  the recalls of both, which must agree. ``K=4 beside a CPU-bound neighbour``: the same, while one spinning
  process per core runs.
- ``zero-shot classification``: ``hardrank eval --suite imagefolder`` against CLIP_benchmark's zero-shot
  classification (its ImageFolder loader, our class names and templates) on an ImageFolder built from the toy
  test images (class: the left object's colour and shape); "not available in this checkout" where this
  checkout's ``eval`` has no ``imagefolder`` suite.
- ``image inference``: images/s of hardrank's embed pipeline against ``clip-retrieval inference``, ViT-B-32 with
  the same random-init weights (a checkpoint file both load), the same images.
- ``ANN search``: ``autofaiss build_index`` against hardrank's mining searcher at the same memory budget:
  build and search seconds, recall@10 against exact search (numpy/torch brute force).

Every timing is repeated (``--repeat``; min and max reported, peers interleaved with hardrank so drifting load
hits both), and the load average is recorded before and after each row. Writes the table and
``benchmarks/results/bench_peers.json``. Slow (minutes): ``make bench-peers``, not part of ``make test``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hardrank.jobs.bench.timing import timed

# venv name -> what pip installs there (torch from the pinned local wheels, as our Makefile does). CLIP_benchmark
# imports requests without declaring it and its zero-shot accuracy calls float() on a 1-element array (numpy 2.4
# refuses); clip-retrieval's clip dependency imports pkg_resources (setuptools < 81);
# autofaiss pins numpy < 2, which pyarrow >= 16 refuses, and calls faiss's OPQMatrix as faiss 1.8 had it
PEERS = {
    "clip_benchmark": ["torch==2.14.1", "torchvision==0.29.1", "clip-benchmark==1.6.2", "requests", "numpy<2.4"],
    "clip_retrieval": ["torch==2.14.1", "torchvision==0.29.1", "clip-retrieval==2.45.0", "setuptools<81"],
    "autofaiss": ["autofaiss==2.18.0", "pyarrow<16", "faiss-cpu==1.8.0"],
}
TOY_CHECKPOINTS = ("toy-clip_step0100", "toy-clip_step0200", "toy-clip_step0400", "toy-clip_step0700")
RECALL_TOL = 0.05  # percentage points: both sides count the same ranks; this absorbs float32 means of 5,010


# -- table and JSON ---------------------------------------------------------------------------------
@dataclass
class Row:
    """One comparison: seconds (or a rate) of each repeat for hardrank and the peer, their metrics."""

    name: str                     # what is compared
    peer: str                     # the peer tool
    unit: str = "s"               # "s": lower is better; "img/s": higher is better
    ours: list = field(default_factory=list)
    theirs: list = field(default_factory=list)
    metrics_ours: dict = field(default_factory=dict)
    metrics_theirs: dict = field(default_factory=dict)
    agree: bool | None = None     # metrics equal within RECALL_TOL (None: nothing to compare)
    available: bool = True
    note: str = ""
    load: dict = field(default_factory=dict)  # os.getloadavg() before and after

    def ratio(self) -> float | None:
        """How many times faster hardrank is (best against best)."""
        if not (self.ours and self.theirs):
            return None
        if self.unit == "s":
            return min(self.theirs) / min(self.ours)
        return max(self.ours) / max(self.theirs)


def _span(xs: list, unit: str) -> str:
    if not xs:
        return "-"
    f = "{:.1f}" if unit == "s" or max(xs) >= 10 else "{:.2f}"
    return f.format(min(xs)) if len(xs) == 1 else f"{f.format(min(xs))}-{f.format(max(xs))}"


def table(rows: list[Row]) -> str:
    """Markdown table: one line per row, hardrank's and the peer's min-max, the ratio, agreement, load."""
    out = ["| comparison | peer | hardrank | peer | hardrank faster | metrics agree | load before/after |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.available:
            out.append(f"| {r.name} | {r.peer} | not available in this checkout | | | | |")
            continue
        ratio = r.ratio()
        agree = {True: "yes", False: "**no**", None: "-"}[r.agree]
        load = "/".join(f"{r.load[k][0]:.1f}" for k in ("before", "after") if k in r.load) or "-"
        out.append(f"| {r.name} | {r.peer} | {_span(r.ours, r.unit)} {r.unit} | {_span(r.theirs, r.unit)} {r.unit} | "
                   f"{'-' if ratio is None else f'{ratio:.2f}x'} | {agree} | {load} |")
    notes = [f"- {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(out + ([""] + notes if notes else []))


def report(rows: list[Row], args: dict) -> dict:
    """The JSON written: each row with min/max and the ratio, the machine and the arguments."""
    def one(r: Row) -> dict:
        d = asdict(r)
        for side in ("ours", "theirs"):
            d[f"{side}_min"] = min(r.__dict__[side]) if r.__dict__[side] else None
            d[f"{side}_max"] = max(r.__dict__[side]) if r.__dict__[side] else None
        d["hardrank_faster"] = r.ratio()
        return d
    return {"rows": [one(r) for r in rows], "args": args,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "python": platform.python_version(), "loadavg_end": os.getloadavg()}}


def agree(ours: dict, theirs: dict, tol: float = RECALL_TOL) -> bool | None:
    """Whether every metric both sides report is equal within ``tol``."""
    common = sorted(set(ours) & set(theirs))
    if not common:
        return None
    return all(abs(float(ours[k]) - float(theirs[k])) <= tol for k in common)


# -- peers' environments ----------------------------------------------------------------------------
def peer_python(venvs: Path, name: str) -> Path:
    """The Python of the peer's own venv, created and filled from the package registry on first use."""
    venv = venvs / name
    py, stamp = venv / "bin" / "python", venv / ".hardrank-installed"
    want = " ".join(PEERS[name])
    if stamp.is_file() and stamp.read_text() == want:
        return py
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    print(f"installing {want} into {venv} (once)", flush=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PEERS[name]], check=True)
    stamp.write_text(want)
    return py


def _run(cmd: list, env=None, cwd=None, timeout: float | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """(wall seconds, the finished process) of ``cmd``, timed by the one toolkit; a failure stops the benchmark
    (``timeout``: seconds, then ``subprocess.TimeoutExpired``; the child is killed)."""
    sec, p = timed(lambda: subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd,
                                          timeout=timeout))
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))[:300]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return sec, p


class Neighbour:
    """A CPU-bound neighbour: one spinning process per core, for the ``with`` block."""

    def __enter__(self):
        spin = "import itertools\nfor _ in itertools.count(): pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


# -- data ---------------------------------------------------------------------------------------------
def toy_inputs(work: Path) -> dict:
    """The toy world, its test split as CLIP_benchmark's Karpathy-style flickr30k file, and the checkpoints."""
    from hardrank.toyworld import TOY_CHECKPOINTS as CKPT_DIR
    from hardrank.toyworld import TOY_MODEL, build_world

    world = build_world(work / "toy_world")
    _flickr_file(json.loads((world / "karpathy_test.json").read_text()), work / "flickr_test.txt")
    return {"world": world, "model": TOY_MODEL, "ann": work / "flickr_test.txt",
            "ckpts": [CKPT_DIR / f"{c}.safetensors" for c in TOY_CHECKPOINTS]}


def _flickr_file(ann: list, path: Path) -> Path:
    """Karpathy entries as CLIP_benchmark's flickr30k ``image,caption`` file (it splits lines at ".jpg,")."""
    lines = ["image,caption"] + [f"{e['image']},{c}" for e in ann for c in e["caption"]]
    path.write_text("\n".join(lines) + "\n")
    return path


def _hardrank_cli() -> list:
    return [str(Path(sys.executable).with_name("hardrank"))]


_CB_DRIVER = """import sys, open_clip
open_clip.add_model_config(sys.argv[1])  # the toy config: CLIP_benchmark loads models by open_clip name
sys.argv = ["clip_benchmark"] + sys.argv[2:]
from clip_benchmark.cli import main
main()
"""


def _cb(py: Path, work: Path, model_json: Path, args: list) -> float:
    driver = work / "cb_driver.py"
    driver.write_text(_CB_DRIVER)
    sec, _ = _run([py, driver, model_json, "eval", *args])
    return sec


def _hr_recalls(out: Path, label: str, suite: str = "karpathy") -> dict:
    m = json.loads((out / label / f"{suite}.json").read_text())["metrics"]["original"]
    return {f"{d}_R@{k}": m[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)}


def _cb_recalls(path: Path) -> dict:
    m = json.loads(path.read_text())["metrics"]
    return {f"{d}_R@{k}": 100 * m[f"{cb}_retrieval_recall@{k}"] for d, cb in (("i2t", "text"), ("t2i", "image"))
            for k in (1, 5, 10)}


def vit_inputs(toy: dict, work: Path, n_images: int, k: int = 4) -> dict:
    """``toy`` narrowed to the first ``n_images`` test images (and their captions) with ``k`` random-init
    ViT-B-32 weight files (seeds 0..k-1, written once): the encode-bound case of the retrieval row."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    ann = json.loads((toy["world"] / "karpathy_test.json").read_text())[:n_images]
    sub = work / f"karpathy_test_{n_images}.json"
    sub.write_text(json.dumps(ann))
    flickr = _flickr_file(ann, work / f"flickr_test_{n_images}.txt")
    ckpts = []
    for seed in range(k):
        f = work / f"vit_b32_seed{seed}.safetensors"
        if not f.is_file():
            torch.manual_seed(seed)
            m = open_clip.create_model("ViT-B-32", pretrained=None)
            save_file({n: v.contiguous() for n, v in m.state_dict().items()}, str(f))
        ckpts.append(f)
    return {**toy, "model": "ViT-B-32", "cb_model": "ViT-B-32", "cb_config": toy["model"], "annotations": sub,
            "ann": flickr, "ckpts": ckpts,
            "what": f"ViT-B-32 (random init, seeds 0-{k - 1}), {len(ann)} images, "
                    f"{sum(len(e['caption']) for e in ann)} captions"}


def row_retrieval(k: int, toy: dict, venvs: Path, work: Path, repeat: int, neighbour: bool = False) -> Row:
    py = peer_python(venvs, "clip_benchmark")
    ckpts = toy["ckpts"][-k:]
    name = f"retrieval K={k}" + (f", {toy['what']}" if toy.get("what") else "")
    row = Row(name + (", beside a CPU-bound neighbour" if neighbour else ""), "CLIP_benchmark 1.6.2",
              note="" if k > 1 else "wall of the whole command (start-up, model loads, decode, encode, scoring)")
    row.load["before"] = os.getloadavg()
    workers = str(os.cpu_count() or 1)
    for i in range(repeat):
        tag = f"k{k}{'_vit' if toy.get('what') else ''}_{i}"
        out, store, cb_out = work / f"hr_{tag}", work / f"store_{tag}", work / f"cb_{tag}"
        for d in (out, store, cb_out):
            shutil.rmtree(d, ignore_errors=True)
        cb_out.mkdir(parents=True)
        hr = [*_hardrank_cli(), "eval", "--suite", "karpathy", "--model", toy["model"], "--checkpoint", *ckpts,
              "--annotations", toy.get("annotations") or toy["world"] / "karpathy_test.json",
              "--images", toy["world"] / "images",
              "--store", store, "--out", out, "--quiet"]
        cb = ["--model", toy.get("cb_model", "toy-clip"), "--pretrained", *ckpts, "--dataset", "flickr30k",
              "--dataset_root",
              toy["world"] / "images", "--annotation_file", toy["ann"], "--task", "zeroshot_retrieval",
              "--recall_k", "1", "5", "10", "--no_amp", "--num_workers", workers, "--batch_size", "64",
              "--output", f"{cb_out}/{{pretrained}}.json", "--quiet"]
        with Neighbour() if neighbour else _nothing():
            row.ours.append(_run(hr)[0])
            row.theirs.append(_cb(py, work, toy.get("cb_config", toy["model"]), cb))
    row.load["after"] = os.getloadavg()
    label = Path(ckpts[-1]).stem
    row.metrics_ours = _hr_recalls(out, label)
    row.metrics_theirs = _cb_recalls(cb_out / f"{Path(ckpts[-1]).name}.json")
    row.agree = all(agree(_hr_recalls(out, Path(c).stem), _cb_recalls(cb_out / f"{Path(c).name}.json"))
                    for c in ckpts)
    return row


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _eval_suites() -> str:
    p = subprocess.run([*_hardrank_cli(), "eval", "--help"], capture_output=True, text=True)
    return p.stdout


def zeroshot_available() -> bool:
    """Whether this checkout's ``hardrank eval`` has the ``imagefolder`` suite (zero-shot classification)."""
    return "imagefolder" in _eval_suites()


def toy_imagefolder(world: Path, work: Path, n: int = 500) -> tuple[Path, list[str], list[str]]:
    """The first ``n`` toy test images as an ImageFolder (class: the left object's colour and shape, as the
    scene that drew it says), the class names in folder order, and prompt templates."""
    from hardrank.toyworld import world_config
    from hardrank.toyworld.world import _sample_scenes  # the scenes the world drew, in test-image order

    _, scenes = _sample_scenes(world_config(world))
    ann = json.loads((world / "karpathy_test.json").read_text())
    root = work / "toy_imagefolder"
    shutil.rmtree(root, ignore_errors=True)
    for entry, scene in list(zip(ann, scenes))[:n]:
        d = root / f"{scene.left.colour} {scene.left.shape}"  # the folder is the class name, as both tools read it
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(world / "images" / entry["image"], d / Path(entry["image"]).name)
    classes = sorted(p.name for p in root.iterdir())  # ImageFolder's order
    return root, classes, ["a {c} on the left", "a small {c}", "a large {c}"]


def row_zeroshot(toy: dict, venvs: Path, work: Path, repeat: int) -> Row:
    row = Row("zero-shot classification K=4", "CLIP_benchmark 1.6.2")
    if not zeroshot_available():
        row.available = False
        row.note = "`hardrank eval --suite imagefolder` is not in this checkout (zero-shot classification)"
        return row
    py = peer_python(venvs, "clip_benchmark")
    root, classes, templates = toy_imagefolder(toy["world"], work)
    (work / "classnames.json").write_text(json.dumps({"imagenet_sketch": classes}))
    (work / "templates.json").write_text(json.dumps({"imagenet_sketch": templates}))
    (work / "classnames.txt").write_text("\n".join(classes) + "\n")
    (work / "templates.txt").write_text("\n".join(templates) + "\n")
    ckpts = toy["ckpts"]
    row.load["before"] = os.getloadavg()
    for i in range(repeat):
        out, store, cb_out = work / f"hr_zs_{i}", work / f"store_zs_{i}", work / f"cb_zs_{i}"
        for d in (out, store, cb_out):
            shutil.rmtree(d, ignore_errors=True)
        cb_out.mkdir(parents=True)
        hr = [*_hardrank_cli(), "eval", "--suite", "imagefolder", "--images", root, "--classnames",
              work / "classnames.txt", "--templates", work / "templates.txt", "--model", toy["model"],
              "--checkpoint", *ckpts, "--store", store, "--out", out, "--quiet"]
        # imagenet_sketch: CLIP_benchmark's plain ImageFolder loader; our names and templates replace its own
        cb = ["--model", "toy-clip", "--pretrained", *ckpts, "--dataset", "imagenet_sketch", "--dataset_root", root,
              "--task", "zeroshot_classification", "--custom_classname_file", work / "classnames.json",
              "--custom_template_file", work / "templates.json", "--no_amp", "--num_workers",
              str(os.cpu_count() or 1), "--batch_size", "64", "--output", f"{cb_out}/{{pretrained}}.json", "--quiet"]
        row.ours.append(_run(hr)[0])
        row.theirs.append(_cb(py, work, toy["model"], cb))
    row.load["after"] = os.getloadavg()

    def clean(m: dict) -> dict:  # the first group holding acc1 ({"zeroshot": {"clean": {...}}}), in percent
        if "acc1" in m:
            return m
        return next((g for g in (clean(v) for v in m.values() if isinstance(v, dict)) if g), {})

    def ours(c):
        res = json.loads(next((out / Path(c).stem).glob("imagefolder*.json")).read_text())["metrics"]
        return {k: float(clean(res)[k]) for k in ("acc1", "acc5", "mean_per_class_recall")}

    def theirs(c):
        m = json.loads((cb_out / f"{Path(c).name}.json").read_text())["metrics"]
        return {k: 100 * m[k] for k in ("acc1", "acc5", "mean_per_class_recall")}

    row.metrics_ours, row.metrics_theirs = ours(ckpts[-1]), theirs(ckpts[-1])
    row.agree = all(agree(ours(c), theirs(c)) for c in ckpts)
    return row


_HR_EMBED = """import json, sys, time
t0 = time.perf_counter()
import hardrank
from hardrank.items import ImageRef, Tables
paths, ckpt, store = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
pipe = hardrank.EmbedPipeline([hardrank.ModelSpec("ViT-B-32", checkpoint=ckpt, device="cpu")],
                              hardrank.EmbedOptions(store=store, device="cpu"))
tables = Tables.empty()
tables.images.add_many(ImageRef(p) for p in paths)
st = pipe.run(tables)["image"]
print(json.dumps({"stage_seconds": st.stage_seconds, "wall": time.perf_counter() - t0}))
"""

_CR_DRIVER = """import sys, open_clip
sys.argv = ["clip-retrieval"] + sys.argv[1:]
from clip_retrieval.cli import main
main()
"""


def row_inference(venvs: Path, work: Path, toy: dict, n_images: int, repeat: int) -> Row:
    """images/s of one encode pass (ViT-B-32, same weights, same images): the encode stage's rate on each
    side (``encode`` seconds from our stats; theirs from the model-forward time its workers record)."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    py = peer_python(venvs, "clip_retrieval")
    ckpt = work / "vit_b32_random.safetensors"
    if not ckpt.is_file():
        torch.manual_seed(0)
        m = open_clip.create_model("ViT-B-32", pretrained=None)
        save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(ckpt))
    src = sorted((toy["world"] / "images" / "test").glob("*.jpg"))[:n_images]
    folder = work / "cr_images"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for p in src:
        shutil.copyfile(p, folder / p.name)
    paths = [str(folder / p.name) for p in src]
    row = Row(f"image inference, ViT-B-32, {len(paths)} images", "clip-retrieval 2.45.0", unit="img/s")
    row.load["before"] = os.getloadavg()
    walls_ours, walls_theirs = [], []
    for i in range(repeat):
        store = work / f"store_inf_{i}"
        shutil.rmtree(store, ignore_errors=True)
        sec, p = _run([sys.executable, "-c", _HR_EMBED, json.dumps(paths), ckpt, store])
        st = json.loads(p.stdout.strip().splitlines()[-1])
        row.ours.append(len(paths) / st["stage_seconds"]["encode"])
        walls_ours.append(sec)
        out = work / f"cr_out_{i}"
        shutil.rmtree(out, ignore_errors=True)
        sec, p = _run([py, "-c", _CR_DRIVER, "inference", "--input_dataset", folder, "--output_folder", out,
                         "--input_format", "files", "--enable_text", "False", "--enable_metadata", "False",
                         "--clip_model", f"open_clip:ViT-B-32/{ckpt}", "--batch_size", "64",
                         "--num_prepro_workers", str(os.cpu_count() or 1), "--enable_wandb", "False",
                         "--use_mclip", "False"])
        walls_theirs.append(sec)
        stats = [json.loads(f.read_text()) for f in sorted((out / "stats").glob("*.json"))]  # one per partition
        row.theirs.append(sum(s["sample_count"] for s in stats) / sum(s["inference_duration"] for s in stats))
    row.load["after"] = os.getloadavg()
    row.metrics_ours = {"wall_s": [round(w, 2) for w in walls_ours]}
    row.metrics_theirs = {"wall_s": [round(w, 2) for w in walls_theirs]}
    row.note = ("encode rates: ours images / encode-stage seconds, clip-retrieval images / its inference_duration "
                f"(stats/*.json); whole-command walls: ours {_span(walls_ours, 's')} s, theirs "
                f"{_span(walls_theirs, 's')} s")
    return row


_AF_DRIVER = """import json, sys, time
import numpy as np
from autofaiss import build_index
xb, xq = np.load(sys.argv[1]), np.load(sys.argv[2])
t0 = time.perf_counter()
index, info = build_index(embeddings=xb, max_index_memory_usage=sys.argv[3], current_memory_available="4G",
                          metric_type="ip", save_on_disk=False, verbose=30, min_nearest_neighbors_to_retrieve=10)
build = time.perf_counter() - t0
t0 = time.perf_counter()
_, I = index.search(xq, 10)
search = time.perf_counter() - t0
np.save(sys.argv[4], I)
print(json.dumps({"build": build, "search": search, "index": str(info.get("index_key") if info else None)}))
"""


def _exact_top10(xb, xq):
    import numpy as np
    import torch

    b, q = torch.from_numpy(xb), torch.from_numpy(xq)
    out = []
    for lo in range(0, len(q), 1024):
        out.append(torch.topk(q[lo:lo + 1024] @ b.T, 10, dim=1).indices.numpy())
    return np.concatenate(out)


def _recall10(I, gt) -> float:
    return float(sum(len(set(a[a >= 0]) & set(g)) for a, g in zip(I, gt)) / gt.size)


def row_ann(venvs: Path, work: Path, n: int, nq: int, dim: int, budget_mb: int, repeat: int,
            peer_timeout: float = 1800.0) -> Row:
    import numpy as np

    from hardrank.config import MineOptions
    from hardrank.mining.searcher import searcher_for

    py = peer_python(venvs, "autofaiss")
    rng = np.random.default_rng(0)  # clustered, as embeddings are (uniform noise defeats every index)
    centres = rng.standard_normal((max(16, n // 200), dim)).astype(np.float32)
    xb = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, dim)).astype(np.float32)
    xq = centres[rng.integers(0, len(centres), nq)] + 0.5 * rng.standard_normal((nq, dim)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq /= np.linalg.norm(xq, axis=1, keepdims=True)
    np.save(work / "xb.npy", xb)
    np.save(work / "xq.npy", xq)
    gt = _exact_top10(xb, xq)
    row = Row(f"ANN top-10, {n:,} x {dim} corpus, {nq:,} queries, {budget_mb} MB", "autofaiss 2.18.0",
              note="seconds: build + search; metrics: recall@10 against exact brute force (%)")
    row.load["before"] = os.getloadavg()
    ours_parts, theirs_parts = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        search = searcher_for(xb, MineOptions(search="auto", budget_mb=budget_mb), nq)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        _, I = search(xq, 10, None)
        srch = time.perf_counter() - t0
        ours_parts.append((build, srch))
        row.ours.append(build + srch)
        row.metrics_ours = {"recall@10": 100 * _recall10(np.asarray(I), gt),
                            "search": str(getattr(search, "name", type(search).__name__))}
        try:
            _, p = _run([py, "-c", _AF_DRIVER, work / "xb.npy", work / "xq.npy", f"{budget_mb}MB", work / "af_I.npy"],
                        timeout=peer_timeout)
        except subprocess.TimeoutExpired:  # its time is then "more than the limit": no recall, no ratio
            row.metrics_theirs = {"unfinished": f"build_index still running after {peer_timeout:.0f} s; stopped"}
            row.note += f"; autofaiss did not finish within --peer-timeout {peer_timeout:.0f} s"
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        theirs_parts.append((r["build"], r["search"]))
        row.theirs.append(r["build"] + r["search"])
        row.metrics_theirs = {"recall@10": 100 * _recall10(np.load(work / "af_I.npy"), gt), "index": r["index"]}
    row.load["after"] = os.getloadavg()
    row.metrics_ours["build_s"] = [round(b, 2) for b, _ in ours_parts]
    row.metrics_ours["search_s"] = [round(s, 2) for _, s in ours_parts]
    if theirs_parts:
        row.metrics_theirs["build_s"] = [round(b, 2) for b, _ in theirs_parts]
        row.metrics_theirs["search_s"] = [round(s, 2) for _, s in theirs_parts]
    row.agree = None
    return row


ROWS = ("k1", "k4", "k4-neighbour", "k4-vit", "zeroshot", "inference", "ann")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venvs", default=os.environ.get("HARDRANK_PEER_VENVS",
                                                      os.path.join(os.path.expanduser("~"), ".cache", "hardrank",
                                                                   "peer_venvs")),
                    help="folder of the peers' virtual environments (created on first use)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-peers"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    ap.add_argument("--images", type=int, default=200, help="images of the inference row")
    ap.add_argument("--vit-images", type=int, default=200, help="images of the ViT-B-32 K=4 retrieval row")
    ap.add_argument("--ann-n", type=int, default=200_000)
    ap.add_argument("--ann-nq", type=int, default=10_000)
    ap.add_argument("--ann-dim", type=int, default=512)
    ap.add_argument("--ann-budget-mb", type=int, default=None, help="default: the fp32 corpus's size")
    ap.add_argument("--peer-timeout", type=float, default=1800.0,
                    help="seconds autofaiss may take per repeat before it is stopped and reported unfinished")
    ap.add_argument("--json", default="benchmarks/results/bench_peers.json")
    args = ap.parse_args()
    venvs, work = Path(args.venvs), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    toy = toy_inputs(work)
    budget = args.ann_budget_mb or -(-args.ann_n * args.ann_dim * 4 // (1 << 20))
    make = {"k1": lambda: row_retrieval(1, toy, venvs, work, args.repeat),
            "k4": lambda: row_retrieval(4, toy, venvs, work, args.repeat),
            "k4-neighbour": lambda: row_retrieval(4, toy, venvs, work, args.repeat, neighbour=True),
            "k4-vit": lambda: row_retrieval(4, vit_inputs(toy, work, args.vit_images), venvs, work, args.repeat),
            "zeroshot": lambda: row_zeroshot(toy, venvs, work, args.repeat),
            "inference": lambda: row_inference(venvs, work, toy, args.images, args.repeat),
            "ann": lambda: row_ann(venvs, work, args.ann_n, args.ann_nq, args.ann_dim, budget, args.repeat,
                                   args.peer_timeout)}
    run_rows(args.rows, make, Path(args.json), vars(args))


def run_rows(names, make: dict, out: Path, args: dict) -> list[Row]:
    """Run the named rows (``make[name]()`` -> Row), print each as it ends and the whole table, write the JSON
    (after each row: an interrupted run keeps what it measured)."""
    from hardrank.atomic import write_text_atomic

    rows: list[Row] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(f"running {name} ...", flush=True)
        rows.append(make[name]())
        print(table(rows[-1:]), flush=True)
        write_text_atomic(out, json.dumps(report(rows, args), indent=2, default=str))
    print("\n" + table(rows))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
