"""Test helpers: tiny open_clip configs, stand-in images, Karpathy/RoCOCO files, brute-force protocol."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np

TINY_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
}


def measured(x) -> bool:
    """The shape of a measured time, rate or ratio: a finite number >= 0. Tests assert this, never its value:
    a busy machine rounds a rate or fraction to 0.0, and a loaded one stretches any time."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def write_tiny_config(folder: Path, name: str = "tiny-test-clip") -> Path:
    path = Path(folder) / f"{name}.json"
    path.write_text(json.dumps(TINY_CFG))
    return path


def save_random_checkpoint(cfg_path: Path, out: Path, seed: int, fmt: str = "safetensors") -> Path:
    import open_clip
    import torch

    from hardrank.models.openclip import resolve_arch

    name = resolve_arch(str(cfg_path))
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(sd, str(out))
    else:  # open_clip training checkpoint layout
        torch.save({"epoch": 1, "state_dict": {"module." + k: v for k, v in sd.items()}}, out)
    return out


def write_image(path: Path, rng: np.random.Generator, size=(40, 30)) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, quality=90)


def make_karpathy_world(root: Path, n_images: int = 12, seed: int = 0, variants=("same_concept",),
                        image_variants=("mix_0.9_s1",)) -> dict:
    """Karpathy JSON + RoCOCO variant files + stand-in images under the real naming scheme."""
    rng = np.random.default_rng(seed)
    words = ["dog", "cat", "car", "tree", "man", "woman", "bus", "pizza", "horse", "boat"]
    clean = []
    for i in range(n_images):
        n = 6 if i == 1 else 5
        caps = [f"A {words[(i + j) % 10]} and a {words[(i * 3 + j) % 10]} number {i}." for j in range(n)]
        if i == 2:
            caps[1] = caps[0]  # duplicate caption within an image
        clean.append({"image": f"val2014/COCO_val2014_{i:012d}.jpg", "caption": caps})
    ann = root / "ann"
    ann.mkdir(parents=True)
    (ann / "coco_karpathy_test.json").write_text(json.dumps(clean))
    for v in variants:
        data = []
        for i, item in enumerate(clean):
            pert = [c.replace("and", "or") for c in item["caption"][:5]]
            if i == 3:
                pert[0] = item["caption"][0]  # perturbed == original (degenerate, as in the real files)
            data.append({"image": item["image"], "caption": item["caption"] + pert})
        (ann / f"{v}.json").write_text(json.dumps(data))
    images = root / "images"
    for item in clean:
        write_image(images / item["image"], rng)
        for v in image_variants:
            write_image(images / v / item["image"], rng)
    return {"annotations": ann, "images": images, "clean": clean}


def brute_force_rococo(img_emb: dict[str, np.ndarray], txt_emb: dict[str, np.ndarray], clean, text_variants,
                       image_variants, normalise) -> dict:
    """Reference protocol with full score matrices and a stable argsort (index tie rule)."""
    out = {}
    images = [it["image"] for it in clean]
    originals = [normalise(c) for it in clean for c in it["caption"]]
    owner = [i for i, it in enumerate(clean) for _ in it["caption"]]
    Q = np.stack([img_emb[im] for im in images]).astype(np.float64)

    def ranks_i2t(gallery_texts):
        G = np.stack([txt_emb[t] for t in gallery_texts]).astype(np.float32)
        S = (Q.astype(np.float32) @ G.T)
        ranks, top1 = [], []
        for q in range(len(images)):
            order = np.argsort(-S[q], kind="stable")
            pos = {j for j, o in enumerate(owner) if o == q}
            ranks.append(min(np.nonzero(np.isin(order, list(pos)))[0]))
            top1.append(order[0])
        return np.array(ranks), np.array(top1)

    def summarise(r, top1=None, n_orig=None):
        m = {f"R@{k}": 100.0 * np.mean(r < k) for k in (1, 5, 10)}
        if top1 is not None:
            m["false_rate"] = 100.0 * np.mean(top1 >= n_orig)
        return m

    r, _ = ranks_i2t(originals)
    out[("original", "i2t")] = summarise(r)
    for v, per_image in text_variants.items():
        gallery = originals + [normalise(c) for caps in per_image for c in caps]
        r, t = ranks_i2t(gallery)
        out[(v, "i2t")] = summarise(r, t, len(originals))
    T = np.stack([txt_emb[t] for t in originals]).astype(np.float32)

    def t2i(extra):
        G = np.stack([img_emb[im] for im in images]
                     + [img_emb[f"{v}/{im}"] for v in extra for im in images]).astype(np.float32)
        S = T @ G.T
        ranks, top1 = [], []
        for q in range(len(originals)):
            order = np.argsort(-S[q], kind="stable")
            ranks.append(int(np.nonzero(order == owner[q])[0][0]))
            top1.append(order[0])
        return np.array(ranks), np.array(top1)

    r, _ = t2i([])
    out[("original", "t2i")] = summarise(r)
    for v in image_variants:
        r, t = t2i([v])
        out[(v, "t2i")] = summarise(r, t, len(images))
    return out


def write_wds_shards(clean, images_root: Path, out: Path, per_shard: int = 5) -> str:
    """The Karpathy items ``clean`` as WebDataset shards written by the ``webdataset`` package, in order:
    ``KEY.jpg`` (the image's bytes as they are), ``KEY.txt`` (captions, one per line) and ``KEY.json``
    (``{"captions": [...], "image": path}``). Returns the brace pattern naming the shards."""
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    n_shards = (len(clean) + per_shard - 1) // per_shard
    for s in range(n_shards):
        with wds.TarWriter(str(out / f"{s:05d}.tar")) as w:
            for i in range(s * per_shard, min(len(clean), (s + 1) * per_shard)):
                item = clean[i]
                w.write({"__key__": f"{i:09d}", "jpg": (Path(images_root) / item["image"]).read_bytes(),
                         "txt": "\n".join(item["caption"]),
                         "json": {"captions": item["caption"], "image": item["image"]}})
    return str(out / f"{{00000..{n_shards - 1:05d}}}.tar")


def smooth_photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """(h, w, 3) uint8: smooth gradients plus noise, so every resample weight matters."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / max(w, 1), yy * 255 / max(h, 1), (xx + yy) * 127 / max(w + h, 1)], -1)
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=1)
def _pillow_mode_cases() -> dict:
    """name -> (image, format, save options, the mode Image.open gives): every mode Pillow opens from a file,
    each saved in a format that keeps it; alpha, transparency and 16/32-bit values are random, so no
    conversion order can hide."""
    from PIL import Image

    rng = np.random.default_rng(5)
    photo = smooth_photo(rng, 90, 60)
    rgb = Image.fromarray(photo)
    alpha = Image.fromarray(rng.integers(0, 256, (60, 90), dtype=np.uint8))
    rgba = rgb.convert("RGBA")
    rgba.putalpha(alpha)
    la = rgb.convert("LA")
    la.putalpha(alpha)
    pa = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).convert("PA")
    pa.putalpha(alpha)
    wide = (photo[..., 0].astype(np.int64) * 1031 + rng.integers(0, 1000, (60, 90))) % 65536
    frames = [Image.fromarray(smooth_photo(rng, 90, 60)).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
              for _ in range(3)]
    return {
        "1": (rgb.convert("1"), "PNG", {}, "1"),
        "L": (rgb.convert("L"), "PNG", {}, "L"),
        "LA": (la, "PNG", {}, "LA"),
        "P": (rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=37), "PNG", {}, "P"),
        "P-transparent": (rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), "PNG", {"transparency": 3},
                          "P"),
        "PA": (pa, "TIFF", {}, "PA"),
        "RGBA": (rgba, "PNG", {}, "RGBA"),
        "RGBA-webp": (rgba, "WEBP", {"lossless": True}, "RGBA"),
        "CMYK-jpeg": (rgb.convert("CMYK"), "JPEG", {"quality": 92}, "CMYK"),
        "CMYK-tiff": (Image.fromarray(rng.integers(0, 256, (60, 90, 4), dtype=np.uint8), "CMYK"), "TIFF", {}, "CMYK"),
        "I;16": (Image.fromarray(wide.astype(np.uint16)), "PNG", {}, "I;16"),
        "I;16B": (Image.fromarray(wide.astype(np.uint16)).convert("I;16B"), "TIFF", {}, "I;16B"),
        "I": (Image.fromarray((wide * 7 - 200_000).astype(np.int32)), "TIFF", {}, "I"),
        "F": (Image.fromarray(photo[..., 1].astype(np.float32) * 1.7 - 40.25), "TIFF", {}, "F"),
        "YCbCr": (rgb.convert("YCbCr"), "TIFF", {}, "YCbCr"),
        "LAB": (rgb.convert("LAB"), "TIFF", {}, "LAB"),
        "GIF": (frames[0], "GIF", {}, "P"),
        "GIF-transparent": (frames[0], "GIF", {"transparency": 5}, "P"),
        "GIF-animated": (frames[0], "GIF", {"save_all": True, "append_images": frames[1:], "duration": 50}, "P"),
    }


PILLOW_MODES = ("1", "L", "LA", "P", "P-transparent", "PA", "RGBA", "RGBA-webp", "CMYK-jpeg", "CMYK-tiff", "I;16",
                "I;16B", "I", "F", "YCbCr", "LAB", "GIF", "GIF-transparent", "GIF-animated")


def pillow_mode_image(folder, name: str):
    """(path, the mode Image.open gives) of one of ``PILLOW_MODES``, written to ``folder``."""
    img, fmt, kw, mode = _pillow_mode_cases()[name]
    p = folder / f"mode-{name.replace(';', '_')}.{fmt.lower()}"
    img.save(p, fmt, **kw)
    return p, mode


def empty_hf_cache_no_network(hub: Path, monkeypatch) -> dict:
    """Point huggingface_hub at an empty cache ``hub`` (HF_HUB_OFFLINE unset: hardrank must stay offline without
    it) and make every connection fail and be counted: {"hub": hub, "tries": [the refused calls' args]}."""
    import socket

    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    tries: list = []

    def refuse(*args, **kwargs):
        tries.append(args)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return {"hub": hub, "tries": tries}


# -- CLIP_benchmark, installed --no-deps into a scratch folder (never into the environment) ----------------------
CB_PACKAGES = ("clip_benchmark", "scikit-learn", "scipy", "joblib", "threadpoolctl", "cloudpickle", "narwhals")


def install_clip_benchmark() -> Path:
    """CLIP_benchmark (and scikit-learn, which its metrics import) installed with ``--no-deps`` into a cache
    folder of its own under the temp folder; pytest.skip only where that install fails."""
    import subprocess
    import sys
    import tempfile

    import pytest

    target = Path(tempfile.gettempdir()) / "hardrank-test-clip-benchmark"
    if not (target / "clip_benchmark" / "metrics" / "linear_probe.py").is_file():
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--target", str(target), *CB_PACKAGES], check=True, capture_output=True, timeout=600)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            pytest.skip(f"clip_benchmark could not be installed: {exc}")
    return target


def import_clip_benchmark(target: Path, monkeypatch, *modules: str) -> list:
    """Import ``modules`` from the scratch folder; every module imported from it leaves ``sys.modules`` at teardown
    (a later ``find_spec("clip_benchmark")`` must not find what this environment cannot import). CLIP_benchmark
    1.6's ``accuracy`` calls ``float()`` on a 1-element array, which numpy >= 2.1 refuses: its module gets a
    ``float`` that takes the one element, so its own code runs otherwise unchanged."""
    import builtins
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(target))
    before = set(sys.modules)
    mods = [importlib.import_module(m) for m in modules]
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(target)):
            monkeypatch.setitem(sys.modules, name, sys.modules.pop(name))  # absent before: removed at teardown
    zsc = importlib.import_module("clip_benchmark.metrics.zeroshot_classification")
    monkeypatch.setattr(zsc, "float", lambda x: builtins.float(np.asarray(x).reshape(-1)[0]), raising=False)
    return mods


def stub_captioning_deps(monkeypatch) -> None:
    """CLIP_benchmark's CLI imports its captioning metric, which imports pycocoevalcap (a 100 MB wheel of Java jars)
    at module top; no test runs captioning, so its names are stand-ins that refuse to be used."""
    import sys
    import types

    def refuse(*args, **kwargs):
        raise RuntimeError("pycocoevalcap is a stand-in in hardrank's tests: captioning is not run")

    names = {"tokenizer.ptbtokenizer": "PTBTokenizer", "bleu.bleu": "Bleu", "meteor.meteor": "Meteor",
             "rouge.rouge": "Rouge", "cider.cider": "Cider", "spice.spice": "Spice"}
    monkeypatch.setitem(sys.modules, "pycocoevalcap", types.ModuleType("pycocoevalcap"))
    for path, cls in names.items():
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            name = "pycocoevalcap." + ".".join(parts[:i])
            if name not in sys.modules:
                monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        setattr(sys.modules["pycocoevalcap." + path], cls, refuse)


def worst_group_twin(hit, groups) -> float:
    """Worst-group accuracy (percent) written plainly: each group's mean of ``hit``, the smallest (the twin of
    ``scoring.task_metrics``' worst-group metrics in the collection tests)."""
    by = {}
    for h, g in zip(hit, groups):
        by.setdefault(int(g), []).append(bool(h))
    return 100 * min(sum(v) / len(v) for v in by.values())
