"""Cross-encoder stage: (image, text) pairs of table rows -> the model's image-text matching logit, batched.

A pair needs the image's vision states ``(1 + patches, Dv)`` and the text's token ids, not the stored pooled
embeddings: images are decoded again by the run's decoder (the pixels its embeddings came from), their
states computed once per checkpoint and kept in host memory while ``cache_bytes`` allows (an image is a
candidate of many text queries; the reference keeps every image's states on the host too); captions are
tokenised once. Each call runs one forward over all its pairs, the encoders'
batch shape: ``(B, L)`` ids against ``(B, 1 + patches, Dv)`` states.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from hardrank.encoding.job import DecodeStage, EmbedJob
from hardrank.errors import DataError
from hardrank.items import Tables
from hardrank.models.spec import LoadedModel

__all__ = ["ItmScorer"]


class ItmScorer:
    """Stage: ``(image_rows (n,), text_rows (n,))`` -> ``(n,)`` float32 ``itm_logit[:, 1]`` of model ``model``
    (one with ``model.model.itm``, e.g. BLIP) over the run's ``tables``. ``stats`` counts the work."""

    def __init__(self, model: LoadedModel, tables: Tables, *, batch_size: int = 256, decoder: str = "pillow",
                 decode_threads: int = 2, cache_bytes: int = 16 << 30):
        self.model, self.tables, self.batch_size, self.cache_bytes = model, tables, batch_size, cache_bytes
        job = EmbedJob("image", np.zeros(0, dtype=np.int64), (), (), (), dict(model.preprocess_cfg), decoder=decoder,
                       batch_size=batch_size, decode_threads=decode_threads)
        self.decode = DecodeStage(job)
        self._states: dict[int, torch.Tensor] = {}  # image row -> (1 + patches, Dv), host memory
        self._ids: dict[int, torch.Tensor] = {}     # text row -> (L,) int64
        self._bytes = 0
        self.stats = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {"pairs": 0, "forwards": 0, "images_encoded": 0, "image_cache_hits": 0,
                "seconds": {"decode": 0.0, "vision": 0.0, "tokenize": 0.0, "itm": 0.0}}

    def take_stats(self) -> dict:
        """The counts and seconds since the last call (the cache stays)."""
        out, self.stats = self.stats, self._zero()
        return {**out, "seconds": {k: round(v, 4) for k, v in out["seconds"].items()},
                "cached_images": len(self._states), "cache_bytes": self._bytes}

    def _time(self, stage: str, t0: float) -> None:
        self.stats["seconds"][stage] += time.perf_counter() - t0

    def _vision(self, rows: list[int]) -> dict[int, torch.Tensor]:
        """States of image ``rows`` (distinct), from the cache or decoded and encoded now in batches."""
        m = self.model
        have = {r: self._states[r] for r in rows if r in self._states}
        self.stats["image_cache_hits"] += len(have)
        todo = [r for r in rows if r not in have]
        for s in range(0, len(todo), self.batch_size):
            part = todo[s:s + self.batch_size]
            t0 = time.perf_counter()
            d = self.decode({"modality": "image", "rows": np.asarray(part), "items": [self.tables.images.entries[r]
                                                                                       for r in part]})
            self._time("decode", t0)
            if not np.all(d["ok"]):
                bad = part[int(np.argmin(d["ok"]))]
                raise DataError(f"--rerank: image {self.tables.images.entries[bad].uri} decoded for its embedding "
                                f"but not for the cross-encoder ({d['error'][part.index(bad)]}); was it changed "
                                f"during the run? Run again")
            t0 = time.perf_counter()
            with torch.inference_mode():
                states = m.model.vision_states(d["pixels"].to(m.device).to(m.dtype))  # (b, 1 + patches, Dv)
            self._time("vision", t0)
            self.stats["images_encoded"] += len(part)
            for r, st in zip(part, states.cpu()):
                have[r] = st
                size = st.numel() * st.element_size()
                if self._bytes + size <= self.cache_bytes:
                    self._states[r], self._bytes = st, self._bytes + size
        return have

    def _tokens(self, rows: list[int]) -> None:
        todo = [r for r in dict.fromkeys(rows) if r not in self._ids]
        if todo:
            t0 = time.perf_counter()
            ids = self.model.tokenizer([self.tables.texts.entries[r] for r in todo])  # (n, L)
            self._ids.update(zip(todo, ids))
            self._time("tokenize", t0)

    def __call__(self, image_rows: np.ndarray, text_rows: np.ndarray) -> np.ndarray:
        image_rows, text_rows = [int(r) for r in image_rows], [int(r) for r in text_rows]
        if not image_rows:
            return np.zeros(0, dtype=np.float32)
        m = self.model
        states = self._vision(list(dict.fromkeys(image_rows)))
        self._tokens(text_rows)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ids = torch.stack([self._ids[r] for r in text_rows]).to(m.device)  # (B, L)
            enc = torch.stack([states[r] for r in image_rows]).to(m.device)     # (B, 1 + patches, Dv)
            out = m.model.itm(ids, enc).cpu().numpy()
        self._time("itm", t0)
        self.stats["pairs"] += len(image_rows)
        self.stats["forwards"] += 1
        return out
