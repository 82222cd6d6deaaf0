"""The engine's stages timed in isolation on a sample, each against its naive counterpart and a hardware limit."""
from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hardrank.embed import EmbedPipeline, ImageEncoder, PillowDecoder, TextEncoder, encode_text, make_transform
from hardrank.items import ItemTable, Tables, decode_image
from hardrank.jobs.bench.naive import naive_loader, view_slice
from hardrank.jobs.bench.options import PipelineBenchConfig
from hardrank.jobs.bench.timing import Clock, bare_gemm_gflops, flops_per_item
from hardrank.kernels.reference import naive_rank
from hardrank.scoring.rank import score_ranking
from hardrank.store.embedding_store import EmbeddingStore

__all__ = ["STAGES", "time_stages", "stage_rows"]

# (stage, what one item is), in pipeline order: the rows of the bench table
STAGES = [("key/read", "images"), ("decode", "images"), ("preprocess", "images"),
          ("decode+preprocess", "images"), ("image encode", "image x ckpt"), ("tokenise", "texts"),
          ("text encode", "text x ckpt"), ("rank", "query x view"), ("write", "embeddings")]


class _StageTimer:
    """The K loaded checkpoints, and the engine and naive clocks every stage adds to; ``limits``
    collects each stage's hardware limit (FLOPs per item, or the rank's FLOPs and GEMM rate)."""

    def __init__(self, cfg: PipelineBenchConfig, models: list):
        self.cfg, self.models = cfg, models
        self.m0 = models[0]
        self.dev = self.m0.device
        self.bs = cfg.embed.batch_size
        self.clock, self.naive = Clock(self.dev), Clock(self.dev)
        self.limits: dict[str, dict] = {}

    def key_read(self, refs) -> None:
        """Read every byte and hash it (a fresh table: nothing cached)."""
        fresh = ItemTable("image")
        fresh.add_many(refs)
        with self.clock("key/read", len(refs)):
            fresh.keys()

    def decode(self, refs) -> torch.Tensor:
        """Decode and preprocess, separately and fused (as the engine's decoder runs them), and the
        naive DataLoader on the same sample. Returns the pixels ``(n, 3, H, W) float32``."""
        cfg, clock = self.cfg, self.clock
        with ThreadPoolExecutor(cfg.embed.decode_threads) as pool:
            with clock("decode", len(refs)):
                pil = list(pool.map(decode_image, refs, chunksize=16))
            transform = make_transform(self.m0.preprocess_cfg)
            with clock("preprocess", len(refs)):
                pix = list(pool.map(transform, pil, chunksize=16))
        del pil
        decoder = PillowDecoder(self.m0.preprocess_cfg, threads=cfg.embed.decode_threads)
        with clock("decode+preprocess", len(refs)):
            for s in range(0, len(refs), self.bs):
                decoder({"ref": refs[s:s + self.bs]})
        pixels = torch.stack(pix)                                          # (n, 3, H, W) float32
        del pix
        # naive: Pillow in DataLoader workers, one item at a time
        with self.naive("decode+preprocess", len(refs)):
            for _ in naive_loader(refs, transform, self.m0.preprocess_cfg, self.bs, cfg.loader_workers):
                pass
        return pixels

    def image_encode(self, pixels: torch.Tensor) -> None:
        """K checkpoints per batch (the engine's encoder) vs one model at a time over the same
        batches (no sharing to lose at this stage); FLOPs from torch's counter."""
        m0, dev, bs, n, K = self.m0, self.dev, self.bs, len(pixels), len(self.models)
        enc = ImageEncoder(self.models)
        enc({"pixels": pixels[:min(8, n)]})  # warm-up
        with self.clock("image encode", n * K):
            for s in range(0, n, bs):
                enc({"pixels": pixels[s:s + bs]})
        with torch.inference_mode():
            f = flops_per_item(lambda x: m0.model.encode_image(x.to(dev, m0.dtype)), pixels[:4])
        if f:
            self.limits["image encode"] = {"flops_per_item": f}
        with self.naive("image encode", n * K), torch.inference_mode():
            for m in self.models:
                for s in range(0, n, bs):
                    m.model.encode_image(pixels[s:s + bs].to(dev, m.dtype))

    def text(self, texts: list[str]) -> None:
        """Tokenise once per tokenizer (engine) vs once per checkpoint (naive: counted per item); then
        the engine's encode (texts in length order, each batch cut to its longest caption: the
        ``encode_text`` the embed stage runs) vs each model's full-length ``encode_text``."""
        m0, dev, bs, K = self.m0, self.dev, self.bs, len(self.models)
        by_length = sorted(texts, key=len)  # what the embed stage batches
        with self.clock("tokenise", len(texts)):
            toks = [m0.tokenizer(by_length[s:s + bs]) for s in range(0, len(texts), bs)]
        with self.naive("tokenise", len(texts)):
            naive_toks = [m0.tokenizer(texts[s:s + bs]) for s in range(0, len(texts), bs)]
        TextEncoder(self.models)({"text": texts[:8]})  # warm-up
        with self.clock("text encode", len(texts) * K), torch.inference_mode():
            for m in self.models:
                for tok in toks:
                    encode_text(m.model, tok.to(dev))
        with self.naive("text encode", len(texts) * K), torch.inference_mode():
            for m in self.models:
                for tok in naive_toks:
                    m.model.encode_text(tok.to(dev))
        with torch.inference_mode():
            f = flops_per_item(lambda x: m0.model.encode_text(x.to(dev)), toks[0][:4]) if toks else None
        if f:
            self.limits["text encode"] = {"flops_per_item": f}

    def rank(self, emb: dict[str, np.ndarray], suites) -> None:
        """The engine's one pass over the union of groups vs a full matrix + argsort per view; the
        limit is a bare GEMM of each task's shape."""
        dev, budget = self.dev, self.cfg.budget_mb << 20
        rank_flops, gemm_same = 0.0, []
        for suite in suites:
            for t in suite.ranking:
                xq, xb = emb[t.query_modality], emb[t.gallery_modality]
                score_ranking(t, xq, xb, tie_rule=suite.tie_rule, device=dev, budget_bytes=budget)  # warm-up
                with self.clock("rank", t.num_queries * len(t.views)):
                    score_ranking(t, xq, xb, tie_rule=suite.tie_rule, device=dev, budget_bytes=budget)
                nb, d = len(t.gallery_items), xq.shape[1]
                rank_flops += 2.0 * t.num_queries * nb * d
                gemm_same.append((2.0 * t.num_queries * nb * d, bare_gemm_gflops(t.num_queries, nb, d, dev)))
                q = torch.from_numpy(np.ascontiguousarray(xq[t.query_items], dtype=np.float32)).to(dev)
                for view in t.views:
                    pos, ptr, idx = view_slice(t, view)
                    g = torch.from_numpy(np.ascontiguousarray(xb[t.gallery_items[pos]], dtype=np.float32)).to(dev)
                    with self.naive("rank", t.num_queries):
                        naive_rank(q, g, ptr, idx)
        if gemm_same and self.clock.s.get("rank"):
            flops = sum(f for f, _ in gemm_same)
            self.limits["rank"] = {"flops": rank_flops,
                                   "gemm_gflops": flops / sum(f / (g * 1e9) for f, g in gemm_same) / 1e9}

    def write(self, n: int) -> None:
        """n random embeddings written to K fresh stores."""
        m0, K = self.m0, len(self.models)
        with tempfile.TemporaryDirectory(dir=self.cfg.work_dir) as tmp:
            e = np.random.default_rng(0).standard_normal((n, m0.embed_dim)).astype(m0.store_dtype)
            keys = [f"k{i}" for i in range(n)]
            with self.clock("write", n * K):
                for i in range(K):
                    EmbeddingStore(tmp, f"bench{i}", dim=m0.embed_dim, dtype=m0.store_dtype).write("image", keys, e)


def time_stages(cfg: PipelineBenchConfig, pipe: EmbedPipeline, tables: Tables, suites, gemm: float) -> list[dict]:
    """Each engine stage on a sample of ``cfg.sample`` unique items per modality, against its
    naive counterpart; ``pipe``'s stores hold the tables' embeddings (the rank stage reads them).
    Returns the table's rows (``stage_rows``)."""
    tables.images.keys()  # fills tables.images.failed: the sample skips unreadable images
    refs = [r for i, r in enumerate(tables.images.entries) if i not in tables.images.failed][:cfg.sample]
    texts = tables.texts.entries[:cfg.sample]
    timer = _StageTimer(cfg, pipe.models)
    timer.key_read(refs)
    pixels = timer.decode(refs)
    timer.image_encode(pixels)
    del pixels
    timer.text(texts)
    timer.rank(pipe.embeddings(0, tables, np.float32), suites)
    timer.write(len(refs))
    return stage_rows(timer.clock, timer.naive, timer.limits, gemm)


def stage_rows(clock: Clock, naive: Clock, limits: dict, gemm: float) -> list[dict]:
    """One row per timed stage: engine and naive items/s, the speed-up, and the fraction of the
    stage's hardware limit reached (rank: a bare GEMM of the same shapes; encoders: FLOPs per item
    at the bare-GEMM rate ``gemm`` GFLOP/s)."""
    rows = []
    for stage, unit in STAGES:
        if stage not in clock.s:
            continue
        e_s, e_n = clock.s[stage], clock.n.get(stage, 0)
        row = {"stage": stage, "unit": unit, "engine_items": e_n, "engine_s": round(e_s, 4),
               "engine_items_per_s": round(e_n / e_s, 1) if e_s > 0 else None,
               "naive_items": None, "naive_s": None, "naive_items_per_s": None, "speedup": None,
               "limit_fraction": None, "limit": None}
        if stage in naive.s and naive.s[stage] > 0:
            n_s, n_n = naive.s[stage], naive.n.get(stage, 0)
            row.update(naive_items=n_n, naive_s=round(n_s, 4), naive_items_per_s=round(n_n / n_s, 1))
            if row["engine_items_per_s"]:
                row["speedup"] = round(row["engine_items_per_s"] / row["naive_items_per_s"], 2)
        lim = limits.get(stage)
        if lim and stage == "rank" and e_s > 0:
            achieved = lim["flops"] / e_s / 1e9
            row["limit_fraction"] = round(achieved / lim["gemm_gflops"], 3)
            row["limit"] = f"bare GEMM of the same shapes, {lim['gemm_gflops']:.1f} GFLOP/s"
        elif lim and e_s > 0 and gemm:
            achieved = lim["flops_per_item"] * e_n / e_s / 1e9
            row["limit_fraction"] = round(achieved / gemm, 3)
            row["limit"] = f"{lim['flops_per_item'] / 1e6:.1f} MFLOP/item vs bare GEMM {gemm:.1f} GFLOP/s"
        rows.append(row)
    return rows
