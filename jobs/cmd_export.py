"""`hardrank export`: a results folder in another tool's format (CLIP_benchmark result JSON)."""
from __future__ import annotations

import argparse
import sys

from hardrank.errors import EXIT_OK
from hardrank.jobs.flags import Formatter
from hardrank.scoring.clip_benchmark_export import FORMATS, export_clip_benchmark

__all__ = ["add_export_parser"]


def _cmd_export(args) -> int:
    s = export_clip_benchmark(args.results, args.out)
    print(f"{len(s['written'])} CLIP_benchmark result file(s) in {args.out}")
    for path, why in s["skipped"]:
        print(f"  skipped {path}: {why}", file=sys.stderr)
    return EXIT_OK


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank export RESULTS_DIR --format clip_benchmark --out DIR``."""
    p = subparsers.add_parser(
        "export", help="write a results folder in another tool's format (CLIP_benchmark JSON)",
        formatter_class=Formatter,
        description="Write every result below RESULTS_DIR as CLIP_benchmark result JSON: one file per "
                    "(checkpoint, CLIP_benchmark dataset) with keys dataset, model, pretrained, task, metrics "
                    "(CLIP_benchmark's metric names, as fractions) and language, named as `clip_benchmark eval` "
                    "names its files, so `clip_benchmark build DIR/*.json` and dashboards built on its CSV read "
                    "them. Retrieval suites become zeroshot_retrieval (image_retrieval_recall@K = text->image), "
                    "choice suites image_caption_selection (acc, text_acc, image_acc); mask suites have no "
                    "counterpart and are skipped (listed). The mapping is in the README.",
        epilog="examples:\n  hardrank export results/demo --format clip_benchmark --out results/demo_cb\n"
               "  clip_benchmark build results/demo_cb/*.json --output benchmark.csv")
    p.add_argument("results", metavar="RESULTS_DIR", help="a results folder (the --out of eval / run / demo)")
    p.add_argument("--format", required=True, choices=FORMATS, help="the format to write")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the files (created)")
    p.set_defaults(func=_cmd_export)
    return p
