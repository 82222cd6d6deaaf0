"""DALI decode + preprocess stage matching open_clip's eval transform, with a per-image Pillow fallback.

The only module importing nvidia.dali (the ``dali`` extra)."""
from __future__ import annotations

import io
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import nvidia.dali.fn as fn
import nvidia.dali.types as types
import torch
from nvidia.dali import Pipeline
from PIL import Image

from hardrank.devices import resolve_device
from hardrank.encoding.decode import PillowDecoder, image_size
from hardrank.errors import DataError, UsageError
from hardrank.items import ImageRef, read_image_bytes

__all__ = ["DaliDecoder"]

log = logging.getLogger("hardrank.dali")

# Images DALI takes: 8-bit RGB / greyscale JPEG and PNG, decoded to RGB (open_clip resizes a greyscale
# image before converting it; resizing the three equal channels is the same, within the tested bound).
# Anything else (1-bit, palette, alpha, 16-bit, CMYK, GIF, WebP, TIFF...), whose pixels depend on
# open_clip resizing in the image's own mode and converting after, or a file whose header or end marker
# looks wrong, goes to the Pillow reference path, which runs the model's transform exactly or records why
# it cannot.
_DALI_RAW = {"JPEG": ("RGB", "L"), "PNG": ("RGB", "L")}
_END = {"JPEG": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


def _geometry(cfg: dict) -> tuple[str, tuple[int, int]]:
    hw = image_size(cfg)
    mode = cfg.get("resize_mode", "shortest")
    if mode == "shortest" and hw[0] != hw[1]:
        raise UsageError(f"DALI decoding supports resize_mode 'shortest' with a square size, got size={hw}; "
                         f"use --decoder pillow for this model")
    if mode not in ("shortest", "squash"):
        raise UsageError(f"DALI decoding supports resize_mode 'shortest' or 'squash', got {mode!r}; "
                         f"use --decoder pillow for this model")
    if cfg.get("interpolation", "bicubic") not in ("bicubic", "bilinear", "random"):
        raise DataError(f"unknown interpolation {cfg.get('interpolation')!r} in the model's preprocess config")
    return mode, hw


def _plan(w: int, h: int, mode: str, out_hw: tuple[int, int]) -> np.ndarray:
    """Resize ROI (y0, x0, y1, x1) in input pixels whose resize to ``out_hw`` equals torchvision's
    ``Resize(int)`` + ``CenterCrop`` on a (h, w) image: the long side is int()-truncated, the crop
    offset uses Python's round(). Resampling only the crop window samples the same points with the
    same filter scale as resizing the whole image and then cropping, at ~3/4 of the cost."""
    th, tw = out_hw
    if mode == "squash":
        return np.array([0.0, 0.0, h, w], dtype=np.float32)
    if w <= h:
        nw, nh = th, int(th * h / w)
    else:
        nh, nw = th, int(th * w / h)
    top, left = int(round((nh - th) / 2.0)), int(round((nw - tw) / 2.0))
    sy, sx = h / nh, w / nw
    return np.array([top * sy, left * sx, (top + th) * sy, (left + tw) * sx], dtype=np.float32)


class DaliDecoder:
    """Stage: ``{"ref": [ImageRef]}`` -> ``{"pixels": (B, 3, H, W) float32, "ok": (B,) bool,
    "error": [str|None]}``, the same contract (and the same failure messages) as ``PillowDecoder``.

    A DALI pipeline decodes encoded bytes fed through ``external_source``, slices the ref's crop
    (zero padding outside the image, as Pillow's ``crop``), resamples the centre-crop window of the
    size torchvision would resize to (the model's interpolation, antialiased), and normalises to
    CHW float in ``crop_mirror_normalize``. Each call feeds exactly its rows (variable batch size), so no row is
    duplicated or dropped (the reason for ``LastBatchPolicy.PARTIAL`` with iterators); rows stay
    in input order. DALI fails a whole batch on one bad image, so a failing batch is retried image
    by image, and images DALI cannot take go to the Pillow path.

    device: "cpu" (``device_id=None``, CPU-only DALI), "gpu" (``decoders.image(device="mixed")``),
    or "auto" (gpu when CUDA is available). Pixels are returned on the CPU either way.
    """

    def __init__(self, preprocess_cfg: dict, threads: int = 2, batch_size: int = 256, device: str = "cpu"):
        self.mode, self.size = _geometry(preprocess_cfg)
        self.cfg = dict(preprocess_cfg)
        if device == "auto":
            device = "gpu" if resolve_device("auto").startswith("cuda") else "cpu"
        if device not in ("cpu", "gpu"):
            raise UsageError(f"DaliDecoder device must be 'cpu', 'gpu' or 'auto', got {device!r}")
        self.device = device
        self.threads = max(1, int(threads))
        self.batch_size = max(1, int(batch_size))
        self.fallback = PillowDecoder(preprocess_cfg, threads=1)
        self.io = ThreadPoolExecutor(self.threads)
        self._pipes: dict[bool, object] = {}

    def _build(self, crop: bool):
        """The pipeline for images without (``crop=False``) or with a ref crop (an extra slice)."""
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
            roi = fn.external_source(name="roi", dtype=types.FLOAT, ndim=1)      # (y0, x0, y1, x1)
            # Pillow ignores EXIF orientation here and upsamples chroma like libjpeg's default.
            img = fn.decoders.image(enc, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                    adjust_orientation=False, jpeg_fancy_upsampling=True)
            if crop:  # Pillow's crop box, zero-padded outside the image
                box = fn.external_source(name="box", dtype=types.INT64, ndim=1)  # (y0, x0, h, w)
                img = fn.slice(img, box[0:2], box[2:4], axes=(0, 1), out_of_bounds_policy="pad", fill_values=0)
            # torchvision resizes PIL images with Pillow's antialiased filters (kernel widened by the
            # downscale factor); DALI's antialias=True does the same.
            img = fn.resize(img, size=self.size, roi_start=roi[0:2], roi_end=roi[2:4], roi_relative=False,
                            interp_type=interp, antialias=True)
            out = fn.crop_mirror_normalize(img, mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW")
            pipe.set_outputs(out)
        pipe.build()
        return pipe

    def _read(self, ref: ImageRef):
        """(bytes, box, plan) for a DALI-able image, else None (Pillow decides)."""
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
            box = None
            bh, bw = h, w
        else:
            x, y, cw, ch = ref.crop
            x0, y0, x1, y1 = int(x), int(y), int(x + cw), int(y + ch)  # as Pillow's crop box
            bh, bw = y1 - y0, x1 - x0
            if bh <= 0 or bw <= 0:
                return None
            box = np.array([y0, x0, bh, bw], dtype=np.int64)
        return np.frombuffer(data, dtype=np.uint8), box, _plan(bw, bh, self.mode, self.size)

    def _run(self, items: list) -> np.ndarray:
        crop = items[0][1] is not None
        pipe = self._pipes.get(crop) or self._pipes.setdefault(crop, self._build(crop))
        pipe.feed_input("enc", [it[0] for it in items])
        pipe.feed_input("roi", [it[2] for it in items])
        if crop:
            pipe.feed_input("box", [it[1] for it in items])
        (out,) = pipe.run()
        if self.device == "gpu":
            out = out.as_cpu()
        return out.as_array()  # (n, 3, H, W) float32

    def _decode(self, items: list, idx: list[int], pixels: torch.Tensor, ok: np.ndarray,
                batched: bool = True) -> list[int]:
        """Decode ``items`` (all with or all without a crop) into ``pixels[idx]``; returns the
        positions DALI could not decode. ``batched=False``: image by image straight away."""
        bad = []
        for s in range(0, len(items), self.batch_size):
            part, pidx = items[s:s + self.batch_size], idx[s:s + self.batch_size]
            try:
                if batched:
                    pixels[pidx] = torch.from_numpy(self._run(part))
                    ok[pidx] = True
                    continue
            except Exception as exc:  # one bad image fails the batch: retry one by one
                log.info("DALI batch of %d failed (%s); retrying image by image", len(part), exc)
                self._pipes.clear()  # a pipeline that raised is not reused
            for it, i in zip(part, pidx):
                try:
                    pixels[i] = torch.from_numpy(self._run([it])[0])
                    ok[i] = True
                except Exception:
                    self._pipes.clear()
                    bad.append(i)
        return bad

    def __call__(self, batch: dict) -> dict:
        refs: list[ImageRef] = list(batch["ref"])
        n = len(refs)
        error: list[str | None] = [None] * n
        read = list(self.io.map(self._read, refs)) if self.threads > 1 else [self._read(r) for r in refs]
        batched = True
        if 0 < n <= self.batch_size and all(r is not None for r in read) and len({r[1] is None for r in read}) == 1:
            try:  # the common case: one DALI run, its output is the batch (no second copy)
                pixels = torch.from_numpy(self._run(read))
                return {**batch, "pixels": pixels, "ok": np.ones(n, dtype=bool), "error": error}
            except Exception as exc:  # one bad image fails the batch: retry one by one
                log.info("DALI batch of %d failed (%s); retrying image by image", n, exc)
                self._pipes.clear()
                batched = False
        pixels = torch.empty((n, 3, *self.size), dtype=torch.float32)
        ok = np.zeros(n, dtype=bool)
        rest = [i for i, r in enumerate(read) if r is None]
        for crop in (False, True):
            idx = [i for i, r in enumerate(read) if r is not None and (r[1] is not None) == crop]
            if idx:
                rest += self._decode([read[i] for i in idx], idx, pixels, ok, batched)
        if rest:  # the Pillow reference path: decodes what it can, records the rest
            rest.sort()
            fb = self.fallback({"ref": [refs[i] for i in rest]})
            for j, i in enumerate(rest):
                ok[i] = bool(fb["ok"][j])
                error[i] = fb["error"][j]
                if ok[i]:
                    pixels[i] = fb["pixels"][j]
        pixels[torch.from_numpy(~ok)] = 0.0
        return {**batch, "pixels": pixels, "ok": ok, "error": error}
