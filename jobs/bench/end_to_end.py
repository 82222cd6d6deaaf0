"""`hardrank bench pipeline`: the engine end to end and stage by stage, against the naive pipeline in the same run."""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch

from hardrank.atomic import write_text_atomic
from hardrank.config import EvalConfig
from hardrank.devices import resolve_device
from hardrank.embed import EmbedPipeline
from hardrank.errors import EXIT_OK, MissingExtra, UsageError
from hardrank.evaluate import evaluate
from hardrank.items import Tables, read_image_bytes
from hardrank.jobs.bench.naive import NaivePipeline
from hardrank.jobs.bench.options import PipelineBenchConfig
from hardrank.jobs.bench.stages import time_stages
from hardrank.jobs.bench.timing import Clock, bare_gemm_gflops, timed
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, expand_globs, options_from_args
from hardrank.jobs.report import plot_bench
from hardrank.settings import start_run
from hardrank.suites import load_suites
from hardrank.suites.toy import default_world_dir
from hardrank.toyworld import demo_inputs

__all__ = ["PipelineBenchConfig", "bench_pipeline", "format_bench", "write_bench", "add_pipeline_parser"]

# options that would make the comparison unfair or that the naive baseline cannot follow: the bench
# embeds into a fresh temporary store (cold, then warm), in-process, with Pillow, under the index rule
_NOT_FLAGS = ("store", "executor", "decoder", "ray_address", "tie_rule", "predictions", "baseline", "work_dir")


def bench_pipeline(cfg: PipelineBenchConfig, echo=print) -> dict:
    """Engine end to end (cold store, then warm), the naive pipeline end to end, and each engine
    stage on a sample against its naive counterpart. Returns the JSON-able result."""
    device = resolve_device(cfg.embed.device)
    settings = start_run(cfg.embed.threads, cfg.embed.decode_threads)  # one run: every pass below uses these
    cfg = replace(cfg, embed=replace(cfg.embed, decode_threads=settings.decode_threads))  # the naive one's workers too
    K = len(cfg.checkpoints)
    tables = Tables.empty()
    suites = load_suites(list(cfg.suites), tables, cfg.suite_options)
    # warm the page cache so neither pipeline pays the first read of the files
    for ref in tables.images.entries:
        try:
            read_image_bytes(ref.uri)
        except (OSError, ValueError):
            pass
    gemm = bare_gemm_gflops(2048, 2048, 2048, device)
    echo(f"bare GEMM 2048^3: {gemm:.1f} GFLOP/s on {device}")
    out: dict = {"config": asdict(cfg),
                 "environment": {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                                 "thread_budget": settings.record(),
                                 "cpus": os.cpu_count(), "platform": platform.platform(),
                                 "python": platform.python_version()},
                 "bare_gemm_gflops": round(gemm, 2)}
    with tempfile.TemporaryDirectory(dir=cfg.work_dir) as tmp:
        ecfg = EvalConfig(model=cfg.model, checkpoints=cfg.checkpoints, pretrained=cfg.pretrained,
                          random_init=cfg.checkpoints == (None,) and not cfg.pretrained, suites=cfg.suites,
                          out=os.path.join(tmp, "results"), suite_options=cfg.suite_options, budget_mb=cfg.budget_mb,
                          embed=replace(cfg.embed, store=os.path.join(tmp, "store")))
        echo(f"hardrank end to end, {K} checkpoint(s), cold store ...")
        cold, rep = timed(lambda: evaluate(ecfg, settings=settings), device)
        warm = timed(lambda: evaluate(ecfg, settings=settings), device)[0]
        echo(f"  cold {cold:.2f}s, warm (all from the store) {warm:.2f}s")
        engine_metrics = _engine_r1(rep.results)
        naive_metrics, naive_clock = None, Clock(device)
        naive_s = None
        if cfg.naive:
            echo(f"naive end to end: {K} separate passes, Pillow + DataLoader, score matrix + argsort per view ...")
            naive_s, naive_metrics = timed(NaivePipeline(cfg, naive_clock).run, device)
            echo(f"  {naive_s:.2f}s")
        echo("stages, isolated, on a sample ...")
        pipe = EmbedPipeline.from_checkpoints(cfg.model, cfg.checkpoints, ecfg.embed, pretrained=cfg.pretrained,
                                              random_init=ecfg.random_init, settings=settings)
        out["stages"] = time_stages(cfg, pipe, tables, suites, gemm)
    emb = rep.embed_stats
    n_img, n_txt = emb.get("image", {}).get("total", 0), emb.get("text", {}).get("total", 0)
    out["end_to_end"] = {
        "engine_cold_s": round(cold, 3), "engine_warm_s": round(warm, 3),
        "naive_s": round(naive_s, 3) if naive_s else None, "speedup": round(naive_s / cold, 2) if naive_s else None,
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
    """{(checkpoint, suite, view, direction): R@1} of the engine's ranking results."""
    out = {}
    for r in results:
        if r["task_type"] != "ranking":
            continue
        for view, dirs in r["metrics"].items():
            for d, m in dirs.items() if isinstance(dirs, dict) else ():
                if isinstance(m, dict) and "R@1" in m and d != "mean" and "members" not in dirs:
                    out[(r["checkpoint"], r["suite"], view, d)] = m["R@1"]
    return out


def _num(v, places: int = 0) -> str:
    return "-" if v is None else f"{v:,.{places}f}"


def format_bench(b: dict) -> str:
    """The one table a bench prints."""
    lines = [f"{'stage':<18} {'unit':<13} {'hardrank/s':>11} {'naive/s':>11} {'speed-up':>8} {'% limit':>8}  limit"]
    for r in b["stages"]:
        speedup = (_num(r["speedup"], 2) + "x") if r["speedup"] else "-"
        limit = (_num(100 * r["limit_fraction"], 1) + "%") if r["limit_fraction"] is not None else "-"
        lines.append(f"{r['stage']:<18} {r['unit']:<13} {_num(r['engine_items_per_s']):>11} "
                     f"{_num(r['naive_items_per_s']):>11} {speedup:>8} {limit:>8}  {r['limit'] or ''}")
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


def write_bench(b: dict, out: str | Path) -> list[Path]:
    """Write ``bench_pipeline.json`` and, with matplotlib (the ``report`` extra), its chart
    ``bench_pipeline.png`` into ``out``; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench_pipeline.json"]
    write_text_atomic(written[0], json.dumps(b, indent=2, default=str))
    try:
        written.append(plot_bench(b, out / "bench_pipeline.png"))
    except MissingExtra:
        print("hardrank bench pipeline: bench_pipeline.png not written: the plot needs matplotlib: "
              "pip install 'hardrank[report]'", file=sys.stderr)
    return written


# -- CLI ------------------------------------------------------------------------------------------
def _cmd_pipeline(args) -> int:
    if args.model is None and args.checkpoints:
        raise UsageError("bench pipeline: --checkpoint needs --model (leave both out for the toy model)")
    if args.model is None:
        model, ckpts, world = demo_inputs(args.data or str(default_world_dir()))
        cfg = options_from_args(PipelineBenchConfig, args, model=model, checkpoints=ckpts, data=world)
    else:
        cfg = options_from_args(PipelineBenchConfig, args, checkpoints=expand_globs(args.checkpoints))
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    b = bench_pipeline(cfg, echo=echo)
    written = write_bench(b, cfg.out)
    print(format_bench(b))
    print(f"\nwrote {' and '.join(str(p) for p in written)}")
    return EXIT_OK


def add_pipeline_parser(bsub) -> None:
    """Register ``hardrank bench pipeline`` on the ``bench`` sub-parsers."""
    p = bsub.add_parser(
        "pipeline", help="per-stage and end-to-end throughput vs a naive pipeline", formatter_class=Formatter,
        description="Time the engine end to end (cold store, then warm) and the naive pipeline people usually "
                    "write (Pillow + DataLoader, one checkpoint at a time, a full score matrix + argsort per view), "
                    "on the same data in the same run; then each engine stage on a sample against its naive "
                    "counterpart and the hardware limit (a bare GEMM measured here). Prints one table, writes "
                    "bench_pipeline.json and bench_pipeline.png.",
        epilog="examples:\n"
               "  hardrank bench pipeline                      # the toy model, its checkpoints, the toy world\n"
               "  hardrank bench pipeline --model engine/assets/models/toy-clip.json \\\n"
               "      --checkpoint engine/assets/toy_checkpoints/*.safetensors --suite toy --out results/bench\n"
               "  hardrank bench pipeline --model ViT-B-32 --checkpoint a.pt b.pt --suite rococo \\\n"
               "      --annotations data/rococo --images /data/coco --no-naive")
    add_options(p, PipelineBenchConfig, skip=_NOT_FLAGS)
    add_cli_flags(p, "quiet")
    p.set_defaults(func=_cmd_pipeline)
