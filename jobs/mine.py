"""`hardrank mine`: hard negatives for each query from a corpus, as resumable Parquet shards."""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["add_mine_parser", "run_mine"]

EXIT_OK, EXIT_DATA, EXIT_FAILURES = 0, 3, 4


def _sim(text: str) -> float:
    v = float(text)
    if not -1.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a cosine similarity in [-1, 1]")
    return v


def add_mine_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``mine`` sub-command to a ``hardrank`` sub-parser set."""
    p = subparsers.add_parser(
        "mine", help="mine hard negatives: per query, the top-k corpus items that are not its positives",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="inputs (--corpus / --queries): a Karpathy-format .json (with --images), an image folder, a .parquet "
               "listing (id + path, or id + text), or an embedding store fingerprint folder.\n"
               "examples:\n"
               "  hardrank mine --model ViT-B-32 --checkpoint openai.pt --corpus /data/laion_subset.parquet "
               "--queries coco_karpathy_train.json --images /data/coco --direction t2i -k 20 --out mined/t2i\n"
               "  hardrank mine --corpus ~/.cache/hardrank/store/ViT-B-32-fp16-ab12 --queries "
               "~/.cache/hardrank/store/ViT-B-32-fp16-ab12 --direction t2t --out mined/t2t "
               "--export-training mined/t2t.jsonl")
    p.add_argument("--corpus", required=True, help="where negatives come from")
    p.add_argument("--queries", required=True, help="the queries (may equal --corpus)")
    p.add_argument("--direction", default="t2i", choices=["t2i", "i2t", "t2t", "i2i"],
                   help="query modality 2 corpus modality")
    p.add_argument("--out", required=True, help="output folder: negatives/part-*.parquet, summary.json")
    p.add_argument("-k", "--k", type=int, default=10, help="negatives per query")
    p.add_argument("--model", default=None, help="open_clip model name, config .json, or local-dir:<folder> "
                   "(not needed when both inputs are store folders)")
    p.add_argument("--checkpoint", default=None, help="weights file for --model")
    p.add_argument("--store", default=None, help="embedding store root (default: $HARDRANK_CACHE/store or "
                   "~/.cache/hardrank/store); inputs embedded once and reused")
    p.add_argument("--images", default=None, help="root of the relative image paths in .json/.parquet inputs")
    p.add_argument("--dup-threshold", type=_sim, default=0.95,
                   help="drop candidates more similar than this to any positive (near duplicates)")
    p.add_argument("--dup-filter", action=argparse.BooleanOptionalAction, default=True,
                   help="drop near duplicates of positives (--no-dup-filter keeps them)")
    p.add_argument("--max-sim", type=_sim, default=None, help="drop candidates scoring above this with the query "
                   "(likely unlabelled positives)")
    p.add_argument("--min-sim", type=_sim, default=None, help="drop candidates scoring below this")
    p.add_argument("--search", default="auto", help="auto | exact | faiss:<factory> (e.g. faiss:IVF4096,SQ8, "
                   "faiss:HNSW32, faiss:Flat); auto = exact while the fp32 corpus fits --budget-mb, else IVF")
    p.add_argument("--budget-mb", type=int, default=1024, help="memory budget for the corpus and work buffers")
    p.add_argument("--block-size", type=int, default=8192, help="queries per output shard (unit of resumption)")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists per query (default: tuned to recall@10 "
                   ">= 0.95 on the recall sample)")
    p.add_argument("--recall-sample", type=int, default=1000,
                   help="queries used to measure approximate recall against exact search")
    p.add_argument("--export-training", default=None, metavar="FILE.jsonl",
                   help='also write one line per query: {"query", "positives", "negatives"}')
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--decode-threads", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    p.add_argument("--max-failures", type=int, default=100, help="unreadable images tolerated (skipped)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def run_mine(args) -> int:
    """Run ``hardrank mine`` from parsed arguments; prints the summary's headline; returns an exit code."""
    from hardrank.embed import TooManyFailures
    from hardrank.mine import MineConfig, MineOptions, mine
    from hardrank.suites import SuiteFormatError
    from hardrank.jobs.cli import _default_store

    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    progress = None
    if not args.quiet and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            progress = lambda total, desc: tqdm(total=total, desc=desc, unit="item", leave=False)
        except ImportError:
            pass
    try:
        opts = MineOptions(k=args.k, dup_threshold=args.dup_threshold if args.dup_filter else None,
                           max_sim=args.max_sim, min_sim=args.min_sim, search=args.search, budget_mb=args.budget_mb,
                           block_size=args.block_size, nprobe=args.nprobe, recall_sample=args.recall_sample)
        cfg = MineConfig(corpus=args.corpus, queries=args.queries, out=args.out, direction=args.direction,
                         model=args.model, checkpoint=args.checkpoint, store=args.store or _default_store(),
                         images=args.images, options=opts, export_training=args.export_training,
                         precision=args.precision, device=args.device, batch_size=args.batch_size,
                         decode_threads=args.decode_threads, max_failures=args.max_failures)
        summary = mine(cfg, progress=progress, echo=echo)
    except TooManyFailures as exc:  # before RuntimeError: it is one
        print(f"hardrank mine: stopped: {exc}", file=sys.stderr)
        return EXIT_FAILURES
    except (FileNotFoundError, SuiteFormatError, ValueError, KeyError, RuntimeError) as exc:
        print(f"hardrank mine: error: {exc}", file=sys.stderr)
        return EXIT_DATA
    c = summary["counts"]
    print(json.dumps({"queries": c["queries"], "corpus": c["corpus"], "negatives": c["negatives"],
                      "queries_short": c["queries_short"], "dropped": c["dropped"], "search": summary["search"],
                      "blocks": summary["blocks"], "seconds": summary["timings"].get("total"),
                      "out": args.out}, indent=1))
    return EXIT_OK
