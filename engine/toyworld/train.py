"""Train the tiny open_clip model on the toy world and save fp16 safetensors checkpoints along the way."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from pathlib import Path

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from hardrank.atomic import atomic_path
from hardrank.errors import DataError, UsageError
from hardrank.toyworld import TOY_MODEL

__all__ = ["train_toy", "recall_at_k", "evaluate_checkpoints", "MODEL_NAME", "MODEL_CONFIG", "DEFAULT_STEPS"]

log = logging.getLogger(__name__)

MODEL_NAME = "toy-clip"
MODEL_CONFIG = TOY_MODEL
DEFAULT_STEPS = (0, 50, 100, 200, 400, 700)  # checkpoint steps; the last is the end of training


def _create(train: bool = False):
    """(model, preprocess, tokenizer) of toy-clip; preprocess is open_clip's eval transform."""

    open_clip.add_model_config(MODEL_CONFIG)
    model, _, preprocess = open_clip.create_model_and_transforms(MODEL_NAME)
    model.train(train)
    return model, preprocess, open_clip.get_tokenizer(MODEL_NAME)


def _read_split(world_dir: Path, split: str) -> list[dict]:
    path = world_dir / f"karpathy_{split}.json"
    if not path.is_file():
        raise DataError(f"{path} not found: build the world first (engine.toyworld.build_world)")
    return json.loads(path.read_text(encoding="utf-8"))


def _images(world_dir: Path, items: list[dict], preprocess) -> torch.Tensor:
    """(N, 3, S, S) float32: every image through the model's own preprocess transform."""

    out = []
    for it in items:
        with Image.open(world_dir / "images" / it["image"]) as im:
            out.append(preprocess(im.convert("RGB")))
    return torch.stack(out)


def recall_at_k(img: np.ndarray, txt: np.ndarray, txt_img: np.ndarray, ks=(1, 5, 10)) -> dict:
    """Clean retrieval R@K (percent) from a full score matrix; small galleries only.

    img (n_img, d) and txt (n_txt, d) L2-normalised; txt_img (n_txt,) the image index of each text.
    i2t: an image's rank is the best rank among its texts; t2i: a text's rank is its image's.
    Ties count against the query (an equal-scoring item ranks ahead).
    """
    s = img @ txt.T  # (n_img, n_txt)
    pos = np.zeros_like(s, dtype=bool)
    pos[txt_img, np.arange(len(txt_img))] = True
    best = np.where(pos, s, -np.inf).max(1, keepdims=True)  # (n_img, 1) score of the best positive
    i2t_rank = ((s >= best) & ~pos).sum(1)
    t2i = s.T  # (n_txt, n_img)
    own = t2i[np.arange(len(txt_img)), txt_img][:, None]
    t2i_rank = (t2i >= own).sum(1) - 1
    out = {}
    for name, rank in (("i2t", i2t_rank), ("t2i", t2i_rank)):
        out[name] = {f"R@{k}": float(100.0 * (rank < k).mean()) for k in ks}
    return out


@torch.no_grad()
def _encode(model, images: torch.Tensor, tokens: torch.Tensor, batch: int = 500) -> tuple[np.ndarray, np.ndarray]:
    img = torch.cat([model.encode_image(images[i:i + batch], normalize=True) for i in range(0, len(images), batch)])
    txt = torch.cat([model.encode_text(tokens[i:i + batch], normalize=True) for i in range(0, len(tokens), batch)])
    return img.float().numpy(), txt.float().numpy()


def _test_set(world_dir: Path, preprocess, tokenizer):
    items = _read_split(world_dir, "test")
    caps = [c for it in items for c in it["caption"]]
    txt_img = np.array([i for i, it in enumerate(items) for _ in it["caption"]])
    return _images(world_dir, items, preprocess), tokenizer(caps), txt_img


def evaluate_checkpoints(checkpoints: list[str | Path], world_dir: str | Path) -> list[dict]:
    """Clean R@1/5/10 of toy-clip checkpoints on the world's test split (full score matrix): a self-check."""

    model, preprocess, tokenizer = _create()
    images, tokens, txt_img = _test_set(Path(world_dir), preprocess, tokenizer)
    out = []
    for ckpt in checkpoints:
        model.load_state_dict({k: v.float() for k, v in load_file(str(ckpt)).items()})
        out.append(recall_at_k(*_encode(model, images, tokens), txt_img))
    return out


def _save(model, path: Path, step: int, seed: int) -> None:
    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(sd, str(tmp), metadata={"model": MODEL_NAME, "step": str(step), "seed": str(seed)})
        os.chmod(tmp, 0o644)


def train_toy(world_dir: str | Path, out_dir: str | Path, *, steps: tuple[int, ...] = DEFAULT_STEPS,
              batch_size: int = 256, seed: int = 0, lr: float = 2e-3, warmup: int = 50,
              weight_decay: float = 0.05, threads: int | None = 2) -> list[Path]:
    """Train toy-clip with the CLIP contrastive loss; save ``toy-clip_step{N:04d}.safetensors`` at each step.

    steps: sorted checkpoint steps, the first 0 (the initialisation), the last the training length.
    threads: torch CPU threads to use (None leaves the setting alone). The global torch RNG state is
    restored afterwards. Check the result with ``evaluate_checkpoints``.
    """
    steps = tuple(int(s) for s in steps)
    if len(steps) < 2 or steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
        raise UsageError(f"steps must start at 0 and strictly increase (e.g. {DEFAULT_STEPS}), got {steps}")
    if batch_size < 2:
        raise UsageError(f"batch_size must be >= 2 (a contrastive loss needs negatives), got {batch_size}")
    world_dir, out_dir = Path(world_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model, preprocess, tokenizer = _create(train=True)
        items = _read_split(world_dir, "train")
        t0 = time.perf_counter()
        images = _images(world_dir, items, preprocess)  # (N, 3, S, S)
        caps = [it["caption"] for it in items]
        n_caps = [len(c) for c in caps]
        tokens = tokenizer([c for cs in caps for c in cs])  # (sum n_caps, ctx)
        first = torch.tensor(np.concatenate([[0], np.cumsum(n_caps)[:-1]]))
        n_caps_t = torch.tensor(n_caps)
        log.info("loaded %d train images in %.1fs", len(items), time.perf_counter() - t0)

        decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
        other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                 {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98), eps=1e-6)
        total = steps[-1]
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
            1 + math.cos(math.pi * min(s, total) / total)))
        g = torch.Generator().manual_seed(seed)
        order, pos, paths, step = torch.randperm(len(items), generator=g), 0, [], 0
        t0 = time.perf_counter()
        while True:
            if step in steps:
                path = out_dir / f"{MODEL_NAME}_step{step:04d}.safetensors"
                _save(model, path, step, seed)
                paths.append(path)
            if step == total:
                break
            if pos + batch_size > len(order):
                order, pos = torch.randperm(len(items), generator=g), 0
            idx = order[pos:pos + batch_size]
            pos += batch_size
            cap = first[idx] + (torch.rand(len(idx), generator=g) * n_caps_t[idx]).long()
            img_f = model.encode_image(images[idx], normalize=True)
            txt_f = model.encode_text(tokens[cap], normalize=True)
            logits = model.logit_scale.exp() * img_f @ txt_f.T  # (B, B)
            labels = torch.arange(len(idx))
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            with torch.no_grad():
                model.logit_scale.clamp_(0, math.log(100))
            step += 1
            if step % 100 == 0:
                log.info("step %d loss %.3f (%.1f steps/s)", step, loss.item(), step / (time.perf_counter() - t0))
        log.info("trained %d steps in %.1fs", total, time.perf_counter() - t0)
    return paths


def _main(argv: list[str] | None = None) -> None:
    """python -m engine.toyworld.train WORLD OUT: train, then print clean R@1/R@5 per checkpoint."""

    ap = argparse.ArgumentParser(description=_main.__doc__)
    ap.add_argument("world")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, nargs="+", default=list(DEFAULT_STEPS))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    t0 = time.perf_counter()
    paths = train_toy(args.world, args.out, steps=tuple(args.steps))
    print(f"trained in {time.perf_counter() - t0:.1f}s (including data loading)")
    for p, r in zip(paths, evaluate_checkpoints(paths, args.world)):
        print(f"{p.name}  {p.stat().st_size / 1e6:.2f} MB  i2t R@1 {r['i2t']['R@1']:5.1f} R@5 {r['i2t']['R@5']:5.1f}"
              f"  t2i R@1 {r['t2i']['R@1']:5.1f} R@5 {r['t2i']['R@5']:5.1f}")


if __name__ == "__main__":
    _main()
