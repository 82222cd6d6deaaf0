"""`hardrank bench`: per-stage and end-to-end throughput, against a naive pipeline measured in the same run."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

__all__ = ["add_bench_parser", "PipelineBenchConfig", "bench_pipeline", "naive_rank"]

EXIT_OK, EXIT_ERROR = 0, 1


@dataclass(frozen=True)
class PipelineBenchConfig:
    model: str                                # open_clip name / config .json / local-dir:
    checkpoints: tuple[str | None, ...]       # K checkpoints of one architecture
    suites: tuple[str, ...] = ("toy",)
    suite_options: object = None              # engine.suites.SuiteOptions (None = defaults)
    device: str = "auto"                      # auto | cpu | cuda[:i]
    batch_size: int = 256                     # encoder batch, both pipelines
    decode_threads: int = 2                   # engine decode threads = naive DataLoader workers
    budget_mb: int = 256                      # kernel tile budget
    sample: int = 2048                        # unique items per modality for the isolated stage timings
    naive: bool = True                        # also run the naive baseline end to end
    work_dir: str | None = None               # temporary store/results (default: system temp)


# -- small timing helpers ---------------------------------------------------------------------
def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


class _Clock:
    """Accumulates seconds per stage name (synchronising the device around each block)."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.s: dict[str, float] = {}
        self.n: dict[str, int] = {}

    def __call__(self, stage: str, items: int = 0):
        clock = self

        class _Block:
            def __enter__(self):
                _sync(clock.device)
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                _sync(clock.device)
                clock.s[stage] = clock.s.get(stage, 0.0) + time.perf_counter() - self.t
                clock.n[stage] = clock.n.get(stage, 0) + items

        return _Block()


def _bare_gemm_gflops(m: int, n: int, k: int, device: str, dtype=None, reps: int = 3, chunk: int = 4096) -> float:
    """GFLOP/s of ``(m, k) @ (k, n)`` in query chunks of ``chunk`` rows (so an (m, n) matrix is
    never held), after a warm-up: the hardware limit the rank and encode stages are held to."""
    import torch

    dtype = dtype or (torch.float16 if str(device).startswith("cuda") else torch.float32)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(min(m, chunk), k, generator=g).to(device, dtype)
    b = torch.randn(n, k, generator=g).to(device, dtype)
    full, rest = divmod(m, chunk) if m > chunk else (1, 0)
    a_rest = a[:rest] if rest else None
    a @ b.T  # warm-up
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        for _ in range(full):
            a @ b.T
        if a_rest is not None:
            a_rest @ b.T
    _sync(device)
    dt = (time.perf_counter() - t) / reps
    return 2.0 * m * n * k / dt / 1e9


def _flops_per_item(fn, x) -> float | None:
    """FLOPs of ``fn(x)`` per row of x (torch's FLOP counter), or None where it cannot count."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            fn(x)
        return fc.get_total_flops() / len(x) or None
    except Exception:
        return None


# -- the naive baseline (what CLIP_benchmark-style code does) ----------------------------------
class _ImageList:
    """torch Dataset: Pillow decode + the model's transform, one item at a time (DataLoader workers)."""

    def __init__(self, refs, transform, size):
        self.refs, self.transform, self.size = refs, transform, size

    def __len__(self):
        return len(self.refs)

    def __getitem__(self, i):
        import torch

        from hardrank.items import decode_image

        try:
            return self.transform(decode_image(self.refs[i]))
        except Exception:  # the naive tools crash here; we keep going so the timing finishes
            return torch.zeros(3, *self.size)


def naive_rank(xq, xb, pos_ptr, pos_idx):
    """Full ``(nq, nb)`` score matrix + stable descending argsort (lower index wins ties, the index
    rule). Returns ``rank (nq,)`` of each query's best positive (0 = top-1) and ``top1 (nq,)``.
    The slow, obviously correct twin of the engine's ranking (and the baseline it is timed against)."""
    import torch

    s = xq @ xb.T                                                        # (nq, nb)
    order = torch.argsort(s, dim=1, descending=True, stable=True)        # (nq, nb)
    inv = torch.empty_like(order)
    inv.scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    pos_ptr = torch.as_tensor(pos_ptr, device=order.device)
    pos_idx = torch.as_tensor(pos_idx, device=order.device)
    q_of = torch.repeat_interleave(torch.arange(len(xq), device=order.device), pos_ptr[1:] - pos_ptr[:-1])
    big = torch.full((len(xq),), order.shape[1], dtype=torch.int64, device=order.device)
    rank = big.scatter_reduce(0, q_of, inv[q_of, pos_idx], reduce="amin")
    return rank, order[:, 0]


def _size(preprocess_cfg: dict) -> tuple[int, int]:
    size = preprocess_cfg["size"]
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def _loader(cfg: PipelineBenchConfig, transform, refs, size):
    from torch.utils.data import DataLoader

    return DataLoader(_ImageList(refs, transform, size), batch_size=cfg.batch_size, shuffle=False,
                      num_workers=cfg.decode_threads)


def _view_slice(t, view: str):
    """Gallery positions of one view of a ranking task, and its positives remapped into them (CSR)."""
    import numpy as np

    gi = sorted(t.groups.index(g) for g in t.views[view])
    pos = np.concatenate([np.arange(t.group_bounds[g], t.group_bounds[g + 1]) for g in gi])
    remap = np.full(len(t.gallery_items), -1, dtype=np.int64)
    remap[pos] = np.arange(len(pos))
    p = remap[t.pos_idx]
    keep = p >= 0
    ptr = np.concatenate([[0], np.cumsum(keep)])[t.pos_ptr]
    return pos, ptr, p[keep]


class _Naive:
    """One checkpoint at a time: per (suite, task, view) a dataset of the view's queries and gallery,
    encoded from scratch (Pillow + DataLoader, tokenised per checkpoint), then the full score matrix."""

    def __init__(self, cfg: PipelineBenchConfig, clock: _Clock):
        self.cfg, self.clock = cfg, clock

    def _images(self, model, transform, refs):
        import torch

        out = []
        it = iter(_loader(self.cfg, transform, refs, _size(model.preprocess_cfg)))
        while True:
            with self.clock("decode+preprocess", 0):
                x = next(it, None)
            if x is None:
                break
            self.clock.n["decode+preprocess"] += len(x)
            with self.clock("image encode", len(x)), torch.inference_mode():
                e = model.model.encode_image(x.to(model.device, model.dtype)).float()
                out.append(torch.nn.functional.normalize(e, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, model.embed_dim, device=model.device)

    def _texts(self, model, texts):
        import torch

        out = []
        for s in range(0, len(texts), self.cfg.batch_size):
            batch = texts[s:s + self.cfg.batch_size]
            with self.clock("tokenise", len(batch)):
                tok = model.tokenizer(batch)
            with self.clock("text encode", len(batch)), torch.inference_mode():
                e = model.model.encode_text(tok.to(model.device)).float()
                out.append(torch.nn.functional.normalize(e, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, model.embed_dim, device=model.device)

    def _encode(self, model, transform, modality, entries):
        return self._images(model, transform, entries) if modality == "image" else self._texts(model, entries)

    def run(self) -> dict:
        """Metrics per checkpoint label: {(suite, view, task): R@1} and the choice accuracies."""
        import torch

        from hardrank.embed import make_transform
        from hardrank.items import Tables
        from hardrank.metrics import choice_metrics
        from hardrank.models import ModelSpec, load_model
        from hardrank.suites import load_suites

        out = {}
        for ckpt in self.cfg.checkpoints:
            with self.clock("model load", 1):
                model = load_model(ModelSpec(self.cfg.model, ckpt, "auto", self.cfg.device))
            with self.clock("suite load"):
                tables = Tables.empty()
                suites = load_suites(list(self.cfg.suites), tables, self.cfg.suite_options)
            transform = make_transform(model.preprocess_cfg)
            res = out.setdefault(model.label, {})
            for suite in suites:
                for t in suite.ranking:
                    qt, gt = tables.of(t.query_modality), tables.of(t.gallery_modality)
                    for view in t.views:
                        pos, ptr, idx = _view_slice(t, view)
                        xq = self._encode(model, transform, t.query_modality, [qt.entries[r] for r in t.query_items])
                        xb = self._encode(model, transform, t.gallery_modality,
                                          [gt.entries[r] for r in t.gallery_items[pos]])
                        with self.clock("rank", t.num_queries):
                            rank, _ = naive_rank(xq.float(), xb.float(), ptr, idx)
                            res[(suite.name, view, t.name)] = 100.0 * float((rank < 1).float().mean())
                for t in suite.choice:
                    lt, rt = tables.of(t.left_modality), tables.of(t.right_modality)
                    xl = self._encode(model, transform, t.left_modality, [lt.entries[r] for r in t.left.ravel()])
                    xr = self._encode(model, transform, t.right_modality, [rt.entries[r] for r in t.right.ravel()])
                    with self.clock("choice score", len(t.ids)):
                        n, a, b = len(t.ids), t.left.shape[1], t.right.shape[1]
                        s = torch.einsum("nad,nbd->nab", xl.view(n, a, -1), xr.view(n, b, -1))
                        m, _ = choice_metrics(t, s.cpu().numpy())
                    res[(suite.name, "all", t.name)] = m["all"]
            del model
        return out


# -- the engine, stage by stage (isolated, on a sample) -----------------------------------------
def _engine_stages(cfg: PipelineBenchConfig, tables, suites, models, stores, clock: _Clock, naive: _Clock,
                   gemm: float) -> list[dict]:
    import numpy as np
    import torch

    from hardrank.embed import ImageEncoder, PillowDecoder, TextEncoder, make_transform
    from hardrank.items import ItemTable, decode_image
    from hardrank.search import score_ranking
    from hardrank.store import EmbeddingStore

    K = len(models)
    m0 = models[0]
    dev = m0.device
    refs = [r for i, r in enumerate(tables.images.entries) if i not in tables.images.failed][:cfg.sample]
    texts = tables.texts.entries[:cfg.sample]
    limits: dict[str, dict] = {}
    bs = cfg.batch_size
    # key/read: read every byte and hash it (fresh table: nothing cached)
    fresh = ItemTable("image")
    fresh.add_many(refs)
    with clock("key/read", len(refs)):
        fresh.keys()
    # decode and preprocess, separately and fused (as the engine's decoder runs them)
    pool = ThreadPoolExecutor(max(1, cfg.decode_threads))
    with clock("decode", len(refs)):
        pil = list(pool.map(decode_image, refs, chunksize=16))
    transform = make_transform(m0.preprocess_cfg)
    with clock("preprocess", len(refs)):
        pix = list(pool.map(transform, pil, chunksize=16))
    del pil
    decoder = PillowDecoder(m0.preprocess_cfg, threads=cfg.decode_threads)
    with clock("decode+preprocess", len(refs)):
        for s in range(0, len(refs), bs):
            decoder({"ref": refs[s:s + bs]})
    pixels = torch.stack(pix)                                              # (n, 3, H, W) float32
    del pix
    # naive decode+preprocess on the same sample: Pillow in DataLoader workers, one item at a time
    with naive("decode+preprocess", len(refs)):
        for _ in _loader(cfg, transform, refs, _size(m0.preprocess_cfg)):
            pass
    # image encode: K checkpoints per batch; FLOPs from torch's counter
    enc = ImageEncoder(models)
    enc({"pixels": pixels[:min(8, len(pixels))]})  # warm-up
    with clock("image encode", len(refs) * K):
        for s in range(0, len(refs), bs):
            enc({"pixels": pixels[s:s + bs]})
    with torch.inference_mode():
        f = _flops_per_item(lambda x: m0.model.encode_image(x.to(dev, m0.dtype)), pixels[:4])
    if f:
        limits["image encode"] = {"flops_per_item": f}
    # naive image encode: one model at a time, same batches (no sharing to lose at this stage)
    with naive("image encode", len(refs) * K), torch.inference_mode():
        for m in models:
            for s in range(0, len(refs), bs):
                m.model.encode_image(pixels[s:s + bs].to(dev, m.dtype))
    del pixels
    # tokenise once per tokenizer (engine) vs once per checkpoint (naive: counted per item)
    with clock("tokenise", len(texts)):
        toks = [m0.tokenizer(texts[s:s + bs]) for s in range(0, len(texts), bs)]
    with naive("tokenise", len(texts)):
        for s in range(0, len(texts), bs):
            m0.tokenizer(texts[s:s + bs])
    tenc = TextEncoder(models)
    tenc({"text": texts[:8]})
    with clock("text encode", len(texts) * K), torch.inference_mode():
        for m in models:
            for tok in toks:
                m.model.encode_text(tok.to(dev))
    with naive("text encode", len(texts) * K), torch.inference_mode():
        for m in models:
            for tok in toks:
                m.model.encode_text(tok.to(dev))
    with torch.inference_mode():
        f = _flops_per_item(lambda x: m0.model.encode_text(x.to(dev)), toks[0][:4]) if toks else None
    if f:
        limits["text encode"] = {"flops_per_item": f}
    # rank: the engine's one pass over the union of groups vs full matrix + argsort per view
    emb = {mod: _table_embeddings(stores[0], tables, mod) for mod in ("image", "text")}
    rank_flops, gemm_same = 0.0, []
    for suite in suites:
        for t in suite.ranking:
            xq, xb = emb[t.query_modality], emb[t.gallery_modality]
            score_ranking(t, xq, xb, tie_rule=suite.tie_rule, device=dev, budget_bytes=cfg.budget_mb << 20)  # warm-up
            with clock("rank", t.num_queries * len(t.views)):
                score_ranking(t, xq, xb, tie_rule=suite.tie_rule, device=dev, budget_bytes=cfg.budget_mb << 20)
            nb, d = len(t.gallery_items), xq.shape[1]
            rank_flops += 2.0 * t.num_queries * nb * d
            gemm_same.append((2.0 * t.num_queries * nb * d, _bare_gemm_gflops(t.num_queries, nb, d, dev)))
            q = torch.from_numpy(np.ascontiguousarray(xq[t.query_items], dtype=np.float32)).to(dev)
            for view in t.views:
                pos, ptr, idx = _view_slice(t, view)
                g = torch.from_numpy(np.ascontiguousarray(xb[t.gallery_items[pos]], dtype=np.float32)).to(dev)
                with naive("rank", t.num_queries):
                    naive_rank(q, g, ptr, idx)
    if gemm_same and clock.s.get("rank"):
        flops = sum(f for f, _ in gemm_same)
        limits["rank"] = {"flops": rank_flops,
                          "gemm_gflops": flops / sum(f / (g * 1e9) for f, g in gemm_same) / 1e9}
    # write: K stores, fresh
    with tempfile.TemporaryDirectory(dir=cfg.work_dir) as tmp:
        n = len(refs)
        e = np.random.default_rng(0).standard_normal((n, m0.embed_dim)).astype(m0.store_dtype)
        keys = [f"k{i}" for i in range(n)]
        with clock("write", n * K):
            for i in range(K):
                EmbeddingStore(tmp, f"bench{i}", dim=m0.embed_dim, dtype=m0.store_dtype).write("image", keys, e)
    pool.shutdown()
    return _stage_rows(clock, naive, limits, gemm)


def _table_embeddings(store, tables, modality):
    import numpy as np

    t = tables.of(modality)
    keys = t.keys()
    out = np.zeros((len(keys), store.dim), dtype=np.float32)
    good = [i for i, k in enumerate(keys) if k and i not in t.failed]
    if good:
        out[good] = store.read(modality, [keys[i] for i in good])
    return out


_STAGES = [("key/read", "images"), ("decode", "images"), ("preprocess", "images"),
           ("decode+preprocess", "images"), ("image encode", "image x ckpt"), ("tokenise", "texts"),
           ("text encode", "text x ckpt"), ("rank", "query x view"), ("write", "embeddings")]


def _stage_rows(clock: _Clock, naive: _Clock, limits: dict, gemm: float) -> list[dict]:
    rows = []
    for stage, unit in _STAGES:
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


# -- the whole benchmark ---------------------------------------------------------------------------
def bench_pipeline(cfg: PipelineBenchConfig, echo=print) -> dict:
    """Engine end to end (cold store, then warm), the naive pipeline end to end, and each engine
    stage on a sample against its naive counterpart. Returns the JSON-able result."""
    import torch

    from hardrank.config import EmbedOptions, EvalConfig
    from hardrank.embed import EmbedPipeline
    from hardrank.evaluate import evaluate
    from hardrank.items import Tables, read_image_bytes
    from hardrank.suites import SuiteOptions, load_suites

    if not cfg.checkpoints:
        raise ValueError("bench pipeline needs at least one --checkpoint")
    opts = cfg.suite_options or SuiteOptions()
    cfg = replace(cfg, suite_options=opts)
    device = "cuda" if cfg.device == "auto" and torch.cuda.is_available() else (
        "cpu" if cfg.device == "auto" else cfg.device)
    K = len(cfg.checkpoints)
    tables = Tables.empty()
    suites = load_suites(list(cfg.suites), tables, opts)
    # warm the page cache so neither pipeline pays the first read of the files
    for ref in tables.images.entries:
        try:
            read_image_bytes(ref.uri)
        except (OSError, ValueError):
            pass
    gemm = _bare_gemm_gflops(2048, 2048, 2048, device)
    echo(f"bare GEMM 2048^3: {gemm:.1f} GFLOP/s on {device}")
    out: dict = {"config": asdict(cfg),
                 "environment": {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                                 "cpus": os.cpu_count(), "platform": platform.platform(),
                                 "python": platform.python_version()},
                 "bare_gemm_gflops": round(gemm, 2)}
    with tempfile.TemporaryDirectory(dir=cfg.work_dir) as tmp:
        ecfg = EvalConfig(model=cfg.model, checkpoints=tuple(cfg.checkpoints), suites=tuple(cfg.suites),
                          out=os.path.join(tmp, "results"), suite_options=opts, budget_mb=cfg.budget_mb,
                          embed=EmbedOptions(store=os.path.join(tmp, "store"), device=cfg.device,
                                             batch_size=cfg.batch_size, decode_threads=max(1, cfg.decode_threads)))
        echo(f"hardrank end to end, {K} checkpoint(s), cold store ...")
        _sync(device)
        t = time.perf_counter()
        rep = evaluate(ecfg)
        _sync(device)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        evaluate(ecfg)
        warm = time.perf_counter() - t
        echo(f"  cold {cold:.2f}s, warm (all from the store) {warm:.2f}s")
        engine_metrics = _engine_r1(rep.results)
        naive_metrics, naive_clock = None, _Clock(device)
        naive_s = None
        if cfg.naive:
            echo(f"naive end to end: {K} separate passes, Pillow + DataLoader, score matrix + argsort per view ...")
            t = time.perf_counter()
            naive_metrics = _Naive(cfg, naive_clock).run()
            naive_s = time.perf_counter() - t
            echo(f"  {naive_s:.2f}s")
        echo("stages, isolated, on a sample ...")
        pipe = EmbedPipeline.from_checkpoints(cfg.model, cfg.checkpoints, ecfg.embed)
        models, stores = pipe.models, pipe.stores
        tables.images.keys(), tables.texts.keys()
        stage_clock, stage_naive = _Clock(device), _Clock(device)
        stages = _engine_stages(cfg, tables, suites, models, stores, stage_clock, stage_naive, gemm)
    out["stages"] = stages
    emb = rep.embed_stats
    n_img, n_txt = emb.get("image", {}).get("total", 0), emb.get("text", {}).get("total", 0)
    out["end_to_end"] = {
        "engine_cold_s": round(cold, 3), "engine_warm_s": round(warm, 3), "naive_s": round(naive_s, 3) if naive_s else None,
        "speedup": round(naive_s / cold, 2) if naive_s else None,
        "unique_images": n_img, "unique_texts": n_txt, "checkpoints": K,
        "engine_images_per_s": round(n_img / cold, 1) if cold else None,
        "engine_stage_seconds": {m: s.get("stage_seconds") for m, s in emb.items()},
    }
    if naive_s:
        out["naive"] = {"seconds": {k: round(v, 3) for k, v in naive_clock.s.items()},
                        "items": dict(naive_clock.n),
                        "work": {"images_decoded": naive_clock.n.get("decode+preprocess", 0),
                                 "texts_tokenised": naive_clock.n.get("tokenise", 0)}}
        diffs = [abs(engine_metrics[k] - v) for lbl, res in naive_metrics.items() for k0, v in res.items()
                 if isinstance(v, float) and (k := (lbl, *k0)) in engine_metrics]
        out["naive"]["check"] = {"compared": len(diffs), "max_abs_diff_R@1": round(max(diffs), 6) if diffs else None}
        out["end_to_end"]["naive_images_per_s"] = round(n_img / naive_s, 1)
    out["work"] = {"engine": {"images_decoded": n_img, "image_encodes": n_img * K, "texts_tokenised": n_txt,
                              "text_encodes": n_txt * K},
                   "naive": None if not naive_s else {
                       "images_decoded": naive_clock.n.get("decode+preprocess", 0),
                       "image_encodes": naive_clock.n.get("image encode", 0),
                       "texts_tokenised": naive_clock.n.get("tokenise", 0),
                       "text_encodes": naive_clock.n.get("text encode", 0)}}
    return out


def _engine_r1(results: list[dict]) -> dict:
    out = {}
    for r in results:
        if r["task_type"] != "ranking":
            continue
        for view, dirs in r["metrics"].items():
            for d, m in dirs.items() if isinstance(dirs, dict) else ():
                if isinstance(m, dict) and "R@1" in m and d != "mean" and "members" not in dirs:
                    out[(r["checkpoint"], r["suite"], view, d)] = m["R@1"]
    return out


def format_bench(b: dict) -> str:
    """The one table a bench prints."""
    lines = [f"{'stage':<18} {'unit':<13} {'hardrank/s':>11} {'naive/s':>11} {'speed-up':>8} {'% limit':>8}  limit"]
    for r in b["stages"]:
        f = lambda v, p=0: "-" if v is None else f"{v:,.{p}f}"
        lines.append(f"{r['stage']:<18} {r['unit']:<13} {f(r['engine_items_per_s']):>11} "
                     f"{f(r['naive_items_per_s']):>11} {(f(r['speedup'], 2) + 'x') if r['speedup'] else '-':>8} "
                     f"{(f(100 * r['limit_fraction'], 1) + '%') if r['limit_fraction'] is not None else '-':>8}  "
                     f"{r['limit'] or ''}")
    e = b["end_to_end"]
    lines.append("")
    lines.append(f"end to end: {e['unique_images']} unique images, {e['unique_texts']} unique texts, "
                 f"{e['checkpoints']} checkpoint(s)")
    lines.append(f"  hardrank, cold store  {e['engine_cold_s']:8.2f} s   ({e['engine_images_per_s']:,.0f} images/s)")
    lines.append(f"  hardrank, warm store  {e['engine_warm_s']:8.2f} s")
    if e.get("naive_s"):
        lines.append(f"  naive (K passes)      {e['naive_s']:8.2f} s   -> hardrank is {e['speedup']:.2f}x faster")
        w = b["work"]
        lines.append(f"  work: hardrank decoded {w['engine']['images_decoded']:,} images and tokenised "
                     f"{w['engine']['texts_tokenised']:,} texts once for all checkpoints; naive decoded "
                     f"{w['naive']['images_decoded']:,} and tokenised {w['naive']['texts_tokenised']:,}")
        c = b["naive"]["check"]
        if c["compared"]:
            lines.append(f"  check: naive and hardrank R@1 agree within {c['max_abs_diff_R@1']:.4f} points "
                         f"over {c['compared']} (checkpoint, suite, view, direction) values")
    return "\n".join(lines)


# -- CLI ------------------------------------------------------------------------------------------
def _cmd_pipeline(args) -> int:
    from hardrank.jobs.flags import expand_globs
    from hardrank.suites import SuiteOptions

    model, ckpts = args.model, expand_globs(args.checkpoint)
    data = args.data
    if model is None and args.checkpoint:
        print("hardrank bench pipeline: --checkpoint needs --model (leave both out for the toy model)", file=sys.stderr)
        return 2
    if model is None:
        from hardrank.suites.toy import default_world_dir
        from hardrank.toyworld import demo_inputs

        model, ckpts, world = demo_inputs(data or str(default_world_dir()))
        data = world
    opts = SuiteOptions(data=data, images=args.images, annotations=args.annotations,
                        image_variants=tuple(args.image_variants), seeds=tuple(args.seeds))
    cfg = PipelineBenchConfig(model=model, checkpoints=ckpts, suites=tuple(args.suite), suite_options=opts,
                              device=args.device, batch_size=args.batch_size, decode_threads=args.decode_threads,
                              budget_mb=args.budget_mb, sample=args.sample, naive=args.naive)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    b = bench_pipeline(cfg, echo=echo)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_pipeline.json").write_text(json.dumps(b, indent=2, default=str))
    from hardrank.jobs.report import plot_bench

    plot_bench(b, out / "bench_pipeline.png")
    print(format_bench(b))
    print(f"\nwrote {out / 'bench_pipeline.json'} and {out / 'bench_pipeline.png'}")
    return EXIT_OK


def _add_pipeline(bsub) -> None:
    p = bsub.add_parser(
        "pipeline", help="per-stage and end-to-end throughput vs a naive pipeline",
        description="Time the engine end to end (cold store, then warm) and the naive pipeline people usually "
                    "write (Pillow + DataLoader, one checkpoint at a time, a full score matrix + argsort per view), "
                    "on the same data in the same run; then each engine stage on a sample against its naive "
                    "counterpart and the hardware limit (a bare GEMM measured here). Prints one table, writes "
                    "bench_pipeline.json and bench_pipeline.png.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hardrank bench pipeline                      # the toy model, its checkpoints, the toy world\n"
               "  hardrank bench pipeline --model engine/data/models/toy-clip.json \\\n"
               "      --checkpoint engine/data/toy_checkpoints/*.safetensors --suite toy --out results/bench\n"
               "  hardrank bench pipeline --model ViT-B-32 --checkpoint a.pt b.pt --suite rococo \\\n"
               "      --annotations data/rococo --images /data/coco --no-naive")
    p.add_argument("--model", default=None, help="open_clip name, config .json or local-dir: (default: the toy model)")
    p.add_argument("--checkpoint", nargs="+", default=None, help="checkpoints of that model (globs ok)")
    p.add_argument("--suite", nargs="+", default=["toy"])
    p.add_argument("--data", default=None, help="suite data folder")
    p.add_argument("--images", default=None)
    p.add_argument("--annotations", default=None)
    p.add_argument("--image-variants", nargs="*", default=[])
    p.add_argument("--seeds", nargs="+", type=int, default=[1])
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--decode-threads", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                   help="engine decode threads, and the naive DataLoader's workers")
    p.add_argument("--budget-mb", type=int, default=256)
    p.add_argument("--sample", type=int, default=2048, help="unique items per modality for the per-stage timings")
    p.add_argument("--naive", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the naive baseline end to end (default: yes)")
    p.add_argument("--out", default="results/bench", help="folder for bench_pipeline.json/.png")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_pipeline)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank bench`` with its sub-commands. Add one with a function taking the
    sub-parsers object (like ``_add_pipeline``) and a ``set_defaults(func=...)``."""
    p = subparsers.add_parser("bench", help="measure throughput (pipeline; kernels, decode: see their help)",
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="examples:\n  hardrank bench pipeline\n  hardrank bench pipeline --help")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="{pipeline,kernels}")
    _add_pipeline(bsub)
    from hardrank.jobs.bench_kernels import add_kernels_bench

    add_kernels_bench(bsub)
    return p
