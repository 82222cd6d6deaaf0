"""`hardrank eval`: checkpoints (or precomputed embeddings) on benchmark suites, one results table."""
from __future__ import annotations

import argparse
import sys

from hardrank import suite_registry
from hardrank.config import EvalConfig
from hardrank.errors import EXIT_OK
from hardrank.evaluate import evaluate, plan
from hardrank.inputs import registry
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, expand_globs, options_from_args
from hardrank.jobs.grid import print_plan
from hardrank.jobs.progress import make_progress
from hardrank.scoring.results import format_table

__all__ = ["add_eval_parser"]


def _echo(args):
    return (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))


def _run_eval(cfg: EvalConfig, args, title: str | None = None) -> None:
    if args.dry_run:
        print_plan(plan(cfg), echo=print)
        return
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=_echo(args))
    if title:
        print(title)
    print(format_table(report.table_rows(), intervals=report.table_intervals()))
    report.raise_failures()  # a suite that could not be loaded: the others ran; exit nonzero now


def _cmd_eval(args) -> int:
    cfg = options_from_args(EvalConfig, args, checkpoints=expand_globs(args.checkpoints))
    _run_eval(cfg, args)
    return EXIT_OK


def add_eval_parser(subparsers: argparse._SubParsersAction) -> None:
    ev = subparsers.add_parser(
        "eval", help=COMMANDS["eval"], formatter_class=Formatter,
        epilog="suites (--suite; --data/--images/--annotations SUITE=PATH give one suite its own "
               "path):\n" + suite_registry.describe() + "\n"
               "--embeddings takes (recognised in this order; another file is read as a Parquet "
               "of kind, id, embedding):\n" + registry.help_text("embeddings", by_id=True) + "\n"
               "the first two examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
               "  hardrank eval --model toy-clip --checkpoint "
               "engine/assets/toy_checkpoints/*.safetensors --suite toy --data results/demo/toy_world "
               "--store results/demo/store --out results/toy\n"
               "  hardrank eval --embeddings results/demo_emb.parquet --suite toy "
               "--data results/demo/toy_world --out results/byo   # after hardrank store export\n"
               "  hardrank eval --model ViT-B-32 --pretrained openai --suite rococo "
               "--annotations data/rococo --images /data/coco --image-variants mix_0.9 "
               "--seeds 1 10 100 --out results/b32\n"
               "  hardrank eval --model ViT-B-32 --checkpoint a.pt --suite karpathy "
               "--annotations coco_karpathy_test.json --images /data/coco --out results/k\n"
               "  hardrank eval --suite amodal --data amodal/ --predictions preds/ --out results/masks")
    add_options(ev, EvalConfig, required=("suites", "out"))
    add_cli_flags(ev, "quiet", "dry_run")
    ev.set_defaults(func=_cmd_eval)
