"""DALI decode + preprocess stage matching open_clip's eval transform, with a per-image Pillow fallback."""
from __future__ import annotations

import io
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .items import ImageRef, read_image_bytes

__all__ = ["DaliDecoder"]

log = logging.getLogger("hardrank.dali")

# Images DALI decodes exactly like Pillow's ``convert("RGB")``: 8-bit RGB / greyscale JPEG and PNG.
# Anything else (CMYK, palette, alpha, 16-bit, GIF, WebP...) or a file whose header or end marker
# looks wrong goes to the Pillow reference path, which decodes it or records why it cannot.
_DALI_RAW = {"JPEG": ("RGB", "L"), "PNG": ("RGB", "L")}
_END = {"JPEG": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


def _geometry(cfg: dict) -> tuple[str, tuple[int, int]]:
    size = cfg.get("size", 224)
    hw = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    mode = cfg.get("resize_mode", "shortest")
    if mode == "shortest" and hw[0] != hw[1]:
        raise ValueError(f"DALI decoding supports resize_mode 'shortest' with a square size, got size={size}; "
                         f"use --decoder pillow for this model")
    if mode not in ("shortest", "squash"):
        raise ValueError(f"DALI decoding supports resize_mode 'shortest' or 'squash', got {mode!r}; "
                         f"use --decoder pillow for this model")
    if cfg.get("interpolation", "bicubic") not in ("bicubic", "bilinear", "random"):
        raise ValueError(f"unknown interpolation {cfg.get('interpolation')!r} in the model's preprocess config")
    return mode, hw


def _plan(w: int, h: int, mode: str, out_hw: tuple[int, int]) -> tuple[float, float, float, float]:
    """(resize_h, resize_w, crop_pos_y, crop_pos_x) exactly as torchvision's ``Resize(int)`` +
    ``CenterCrop`` compute them (int() truncation of the long side, Python round() of the offset)."""
    th, tw = out_hw
    if mode == "squash":
        return float(th), float(tw), 0.0, 0.0
    s = th
    if w <= h:
        nw, nh = s, int(s * h / w)
    else:
        nh, nw = s, int(s * w / h)
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    # DALI's anchor is trunc(pos * (extent - crop)); +0.5 keeps float error away from the integer edge.
    pos_y = (top + 0.5) / (nh - th) if nh > th else 0.0
    pos_x = (left + 0.5) / (nw - tw) if nw > tw else 0.0
    return float(nh), float(nw), pos_y, pos_x


class DaliDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels": (B, 3, H, W) float32, "ok": (B,) bool,
    "error": [str|None]}``, the same contract (and the same failure messages) as ``PillowDecoder``.

    One DALI pipeline decodes encoded bytes fed through ``external_source``, slices the ref's crop
    (zero padding outside the image, as Pillow's ``crop``), resizes to the size torchvision would
    pick with the model's interpolation and antialiasing, then centre-crops and normalises in one
    ``crop_mirror_normalize``. Each call feeds exactly its rows (variable batch size), so no row is
    duplicated or dropped (the reason for ``LastBatchPolicy.PARTIAL`` with iterators); rows stay
    in input order. DALI fails a whole batch on one bad image, so a failing batch is retried image
    by image, and images DALI cannot take go to the Pillow path.

    device: "cpu" (``device_id=None``, CPU-only DALI), "gpu" (``decoders.image(device="mixed")``),
    or "auto" (gpu when CUDA is available). Pixels are returned on the CPU either way.
    """

    def __init__(self, preprocess_cfg: dict, threads: int = 2, batch_size: int = 256, device: str = "cpu"):
        from .embed import PillowDecoder

        self.mode, self.size = _geometry(preprocess_cfg)
        self.cfg = dict(preprocess_cfg)
        if device == "auto":
            device = "gpu" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "gpu"):
            raise ValueError(f"DaliDecoder device must be 'cpu', 'gpu' or 'auto', got {device!r}")
        self.device = device
        self.threads = max(1, int(threads))
        self.batch_size = max(1, int(batch_size))
        self.fallback = PillowDecoder(preprocess_cfg, threads=1)
        self.io = ThreadPoolExecutor(self.threads)
        self.pipe = self._build()

    def _build(self):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import Pipeline

        cubic = self.cfg.get("interpolation", "bicubic") != "bilinear"
        interp = types.INTERP_CUBIC if cubic else types.INTERP_LINEAR
        mean = [255.0 * m for m in self.cfg.get("mean", (0.48145466, 0.4578275, 0.40821073))]
        std = [255.0 * s for s in self.cfg.get("std", (0.26862954, 0.26130258, 0.27577711))]
        gpu = self.device == "gpu"
        pipe = Pipeline(batch_size=self.batch_size, num_threads=self.threads,
                        device_id=torch.cuda.current_device() if gpu else None,
                        exec_async=False, exec_pipelined=False, prefetch_queue_depth=1)
        with pipe:
            enc = fn.external_source(name="enc", dtype=types.UINT8, ndim=1)
            box = fn.external_source(name="box", dtype=types.INT64, ndim=1)      # (y0, x0, h, w)
            plan = fn.external_source(name="plan", dtype=types.FLOAT, ndim=1)    # (rh, rw, pos_y, pos_x)
            # Pillow ignores EXIF orientation here and upsamples chroma like libjpeg's default.
            img = fn.decoders.image(enc, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                    adjust_orientation=False, jpeg_fancy_upsampling=True)
            img = fn.slice(img, box[0:2], box[2:4], axes=(0, 1), out_of_bounds_policy="pad", fill_values=0)
            # torchvision resizes PIL images with Pillow's antialiased filters (kernel widened by the
            # downscale factor); DALI's antialias=True does the same.
            img = fn.resize(img, size=plan[0:2], interp_type=interp, antialias=True)
            out = fn.crop_mirror_normalize(img, crop=self.size, crop_pos_y=plan[2], crop_pos_x=plan[3],
                                           rounding="truncate", mean=mean, std=std, dtype=types.FLOAT,
                                           output_layout="CHW")
            pipe.set_outputs(out)
        pipe.build()
        return pipe

    def _read(self, ref: ImageRef):
        """(bytes, box, plan) for a DALI-able image, else None (Pillow decides)."""
        from PIL import Image

        try:
            data = read_image_bytes(ref.uri)
            im = Image.open(io.BytesIO(data))
            raw = im.tile[0].args if im.tile else None
            raw = raw[0] if isinstance(raw, tuple) else raw
            if raw not in _DALI_RAW.get(im.format, ()) or not data.rstrip(b"\0").endswith(_END[im.format]):
                return None
            w, h = im.size
        except Exception:
            return None
        if ref.crop is None:
            y0, x0, bh, bw = 0, 0, h, w
        else:
            x, y, cw, ch = ref.crop
            x0, y0, x1, y1 = int(x), int(y), int(x + cw), int(y + ch)  # as Pillow's crop box
            bh, bw = y1 - y0, x1 - x0
            if bh <= 0 or bw <= 0:
                return None
        return (np.frombuffer(data, dtype=np.uint8), np.array([y0, x0, bh, bw], dtype=np.int64),
                np.array(_plan(bw, bh, self.mode, self.size), dtype=np.float32))

    def _run(self, items: list) -> np.ndarray:
        self.pipe.feed_input("enc", [it[0] for it in items])
        self.pipe.feed_input("box", [it[1] for it in items])
        self.pipe.feed_input("plan", [it[2] for it in items])
        (out,) = self.pipe.run()
        if self.device == "gpu":
            out = out.as_cpu()
        return out.as_array()  # (n, 3, H, W) float32

    def _decode(self, items: list, idx: list[int], pixels: torch.Tensor, ok: np.ndarray) -> list[int]:
        """Decode ``items`` into ``pixels[idx]``; returns the positions DALI could not decode."""
        for s in range(0, len(items), self.batch_size):
            part, pidx = items[s:s + self.batch_size], idx[s:s + self.batch_size]
            try:
                pixels[pidx] = torch.from_numpy(self._run(part))
                ok[pidx] = True
                continue
            except Exception as exc:  # one bad image fails the batch: retry one by one
                log.info("DALI batch of %d failed (%s); retrying image by image", len(part), exc)
                self.pipe = self._build()
            bad = []
            for it, i in zip(part, pidx):
                try:
                    pixels[i] = torch.from_numpy(self._run([it])[0])
                    ok[i] = True
                except Exception:
                    self.pipe = self._build()
                    bad.append(i)
            return bad + self._decode(items[s + self.batch_size:], idx[s + self.batch_size:], pixels, ok)
        return []

    def __call__(self, batch: dict) -> dict:
        refs: list[ImageRef] = list(batch["ref"])
        n = len(refs)
        pixels = torch.zeros((n, 3, *self.size), dtype=torch.float32)
        ok = np.zeros(n, dtype=bool)
        error: list[str | None] = [None] * n
        read = list(self.io.map(self._read, refs))
        idx = [i for i, r in enumerate(read) if r is not None]
        rest = [i for i, r in enumerate(read) if r is None]
        if idx:
            rest += self._decode([read[i] for i in idx], idx, pixels, ok)
        if rest:  # the Pillow reference path: decodes what it can, records the rest
            rest.sort()
            fb = self.fallback({"ref": [refs[i] for i in rest]})
            for j, i in enumerate(rest):
                ok[i] = bool(fb["ok"][j])
                error[i] = fb["error"][j]
                if ok[i]:
                    pixels[i] = fb["pixels"][j]
        return {**batch, "pixels": pixels, "ok": ok, "error": error}
