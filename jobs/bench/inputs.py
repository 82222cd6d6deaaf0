"""Benchmark inputs: COCO-sized natural-ish JPEGs, small random open_clip checkpoints and BLIP folders, made once."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import open_clip
import torch
from PIL import Image, ImageDraw
from safetensors.torch import save_file

from hardrank.atomic import atomic_path, write_text_atomic
from hardrank.models.load import load_model
from hardrank.models.runs import user_specs

__all__ = ["coco_like_jpegs", "CONFIGS", "small_checkpoints", "images_and_models", "BLIP_SIZES", "WORDS", "small_blip"]


def coco_like_jpegs(folder: str | Path, n: int = 200, size=(640, 480), seed: int = 0, quality: int = 90) -> list[str]:
    """``n`` JPEGs of ``size`` (w, h) in ``folder`` (reused if present): smooth colour gradients,
    sensor-like noise and filled shapes, so the entropy coder and resampler see photo-like content."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    paths = []
    for i in range(n):
        path = folder / f"{i:05d}_{w}x{h}.jpg"
        paths.append(str(path))
        if path.exists():
            rng.random(4)  # keep later images independent of which ones were cached
            continue
        f = rng.uniform(15, 60, 3)
        ph = rng.uniform(0, 6.3, 3)
        img = np.stack([128 + 90 * np.sin(xx / f[0] + ph[0]) * np.cos(yy / (2 * f[0])),
                        128 + 90 * np.cos(yy / f[1] + ph[1]),
                        128 + 90 * np.sin((xx + yy) / f[2] + ph[2])], -1)
        img += rng.normal(0, 6, img.shape)
        im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(im)
        for _ in range(rng.integers(4, 12)):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = x0 + int(rng.integers(20, 250)), y0 + int(rng.integers(20, 250))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
        with atomic_path(path) as tmp:  # a killed run leaves no half JPEG to be reused
            im.save(tmp, format="JPEG", quality=quality)
    return paths


CONFIGS = {  # ViT-B/32-shaped (224 px, patch 32) but narrow CLIPs, cheap enough for 2 CPU cores
    "small": {"embed_dim": 256,
              "vision_cfg": {"image_size": 224, "layers": 4, "width": 256, "head_width": 64, "patch_size": 32},
              "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 256, "heads": 4, "layers": 4}},
    "tiny": {"embed_dim": 64,
             "vision_cfg": {"image_size": 224, "layers": 1, "width": 64, "head_width": 32, "patch_size": 32},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 1}},
}


def small_checkpoints(folder: str | Path, k: int, size: str = "small") -> tuple[str, list[str]]:
    """(model config path, k random-init checkpoint files) of ``CONFIGS[size]``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"bench-{size}-clip"
    cfg = folder / f"{name}.json"
    write_text_atomic(cfg, json.dumps(CONFIGS[size]))
    open_clip.add_model_config(cfg)
    out = []
    for i in range(k):
        path = folder / f"{name}-{i}.safetensors"
        if not path.exists():
            torch.manual_seed(i)
            model = open_clip.create_model(name, pretrained=None)
            with atomic_path(path) as tmp:
                save_file({n: t.contiguous() for n, t in model.state_dict().items()}, str(tmp))
        out.append(str(path))
    return str(cfg), out


def images_and_models(data: str | Path, n_images: int, k: int, size: str):
    """The shared set-up of the embed benchmarks: COCO-like JPEGs, K loaded checkpoints of one
    bench model, and a fresh work folder for their stores."""
    paths = coco_like_jpegs(data, n_images)
    cfg, ckpts = small_checkpoints(Path(data) / "models", k, size)
    models = [load_model(s) for s in user_specs(cfg, ckpts)]
    return paths, models, Path(tempfile.mkdtemp(prefix="hardrank-bench-"))



# BLIP retrieval models: (image size, vision width/layers/heads, text width/layers/heads, ITC dim); "base" has
# BLIP-base's shapes (ViT-B/16 at 384 px, BERT-base with cross-attention: Salesforce/blip-itm-base-coco)
BLIP_SIZES = {"tiny": (64, 64, 2, 2, 64, 2, 2, 32), "small": (128, 192, 4, 3, 192, 4, 3, 64),
              "base": (384, 768, 12, 12, 768, 12, 12, 256)}
WORDS = ("a an the of on in near with and or two three man woman dog cat bus car tree pizza horse boat table street "
         "red blue green white black small large sitting standing riding eating next to top front group people "
         "plate road field water sky building room kitchen bed train grass snow").split()


def small_blip(folder: str | Path, size: str = "small") -> str:
    """A random ``BlipForImageTextRetrieval`` of ``BLIP_SIZES[size]`` saved (weights, BLIP's image processor and
    a BERT WordPiece tokenizer over ``WORDS`` with BLIP's [DEC]/[ENC] tokens) into ``folder``, once: its path."""
    from transformers import BertTokenizer, BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor
    folder = Path(folder) / f"bench-{size}-blip"
    if (folder / "model.safetensors").is_file():
        return str(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]", *WORDS, *map(str, range(10))]
    BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    img, vw, vl, vh, tw, tl, th, d = BLIP_SIZES[size]
    cfg = BlipConfig(vision_config={"hidden_size": vw, "intermediate_size": 4 * vw, "num_hidden_layers": vl,
                                    "num_attention_heads": vh, "image_size": img, "patch_size": 16},
                     text_config={"vocab_size": len(vocab), "hidden_size": tw, "intermediate_size": 4 * tw,
                                  "num_hidden_layers": tl, "num_attention_heads": th, "encoder_hidden_size": vw,
                                  "pad_token_id": 0, "bos_token_id": 2, "sep_token_id": 3},
                     image_text_hidden_size=d)
    torch.manual_seed(0)
    net = BlipForImageTextRetrieval(cfg)
    with torch.no_grad():  # BLIP's init gives near-constant random features (ties everywhere): spread them
        for name, p in net.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
            elif "norm" not in name.lower():
                p.normal_(0.0, 0.1)
    net.save_pretrained(folder)
    BlipImageProcessor(size={"height": img, "width": img}).save_pretrained(folder)
    return str(folder)
