"""The `hardrank` command line: one sub-command per job, flags from the config dataclasses, one exit-code map."""
from __future__ import annotations

import argparse
import logging
import sys

from hardrank.config import DATA_DIR, EvalConfig, SuiteOptions
from hardrank.errors import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    INPUT_FILE_ERRORS,
    HardrankError,
    TooManyFailures,
    exit_code,
)
from hardrank.evaluate import evaluate, plan
from hardrank.inputs.convert import write_karpathy_shards
from hardrank.jobs.bench import add_bench_parser
from hardrank.jobs.cmd_attack import add_attack_parser
from hardrank.jobs.cmd_demo import add_demo_parser
from hardrank.jobs.cmd_export import add_export_parser
from hardrank.jobs.cmd_mine import add_mine_parser
from hardrank.jobs.cmd_perturb import add_perturb_parser
from hardrank.jobs.cmd_store import add_store_parser
from hardrank.jobs.cmd_watch import add_watch_parser
from hardrank.jobs.flags import Formatter, add_options, expand_globs, options_from_args
from hardrank.jobs.grid import add_run_parser, print_plan
from hardrank.jobs.progress import make_progress
from hardrank.jobs.report import add_report_parser
from hardrank.scoring.results import format_table
from hardrank.suites.toy import default_world_dir, ensure_world
from hardrank.toyworld import build_world
from hardrank.toyworld.train import train_toy

__all__ = ["main", "build_parser"]

def _echo(args):
    return (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress output (bars on a terminal, periodic lines "
                   "in logs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (suites, unique items, store hits per "
                   "checkpoint) and encode nothing")


def _run_eval(cfg: EvalConfig, args, title: str | None = None) -> None:
    if args.dry_run:
        print_plan(plan(cfg), echo=print)
        return
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=_echo(args))
    if title:
        print(title)
    print(format_table(report.table_rows()))


def _cmd_eval(args) -> int:
    cfg = options_from_args(EvalConfig, args, checkpoints=expand_globs(args.checkpoints))
    _run_eval(cfg, args)
    return EXIT_OK


def _cmd_toy(args) -> int:
    if args.toy_command == "world":
        print(build_world(args.out))
        return EXIT_OK
    if args.toy_command == "shards":
        world = ensure_world(SuiteOptions(data=args.world))  # a world of any config, as the toy suites use it
        print(write_karpathy_shards(str(world / "karpathy_test.json"), str(world / "images"), args.out,
                                    per_shard=args.per_shard))
        return EXIT_OK
    world = build_world(args.world or default_world_dir())
    for p in train_toy(world, args.out):
        print(p)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hardrank", description="Stress-test image-text matching models: "
                                 "exact benchmark metrics, fast, for many checkpoints.", formatter_class=Formatter,
                                 epilog="the first five examples reuse what `hardrank demo --out "
                                        "results/demo` made (its store and toy world)\nexamples:\n"
                                        "  hardrank demo --out results/demo\n"
                                        "  hardrank report results/demo\n"
                                        "  hardrank store list results/demo/store\n"
                                        "  hardrank eval --model toy-clip --checkpoint "
                                        "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite toy "
                                        "--data results/demo/toy_world --store results/demo/store --out results/mine\n"
                                        "  hardrank mine --model toy-clip --checkpoint "
                                        "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --queries "
                                        "results/demo/toy_world/karpathy_test.json "
                                        "--images results/demo/toy_world/images "
                                        "--corpus results/demo/toy_world/images/test --store results/demo/store "
                                        "-k 5 --out results/demo_mined --export-training "
                                        "results/demo_mined/negclip.tsv\n"
                                        "  hardrank eval --model ViT-B-32 --checkpoint ckpt/epoch_*.pt "
                                        "--suite rococo --annotations data/rococo --images coco --out results/run1\n"
                                        "  hardrank eval --run logs/exp1 --suite rococo --annotations data/rococo "
                                        "--images coco --out results/exp1\n"
                                        "  hardrank watch logs/exp1 --suite toy --out results/exp1\n"
                                        "  hardrank run grid.toml --dry-run\n"
                                        "  hardrank bench pipeline\n\n" + EXIT_CODES_HELP)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="evaluate checkpoints on benchmark suites", formatter_class=Formatter,
                        epilog="the first two examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
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
    _common(ev)
    ev.set_defaults(func=_cmd_eval)

    add_demo_parser(sub)
    add_mine_parser(sub)

    toy = sub.add_parser("toy", help="toy world and toy checkpoints", formatter_class=Formatter,
                         epilog="examples:\n  hardrank toy world --out /tmp/toy_world\n  hardrank toy train")
    tsub = toy.add_subparsers(dest="toy_command", required=True)
    tw = tsub.add_parser("world", help="build the toy world", formatter_class=Formatter,
                         epilog="examples:\n  hardrank toy world --out /tmp/toy_world")
    tw.add_argument("--out", required=True)
    ts = tsub.add_parser("shards", help="write the toy world's test split as WebDataset tar shards (local or a URL)",
                         formatter_class=Formatter,
                         epilog="examples:\n"
                                "  hardrank toy shards --world results/demo/toy_world --out /tmp/toy_shards\n"
                                "  hardrank toy shards --out s3://bucket/toy_shards --per-shard 250")
    ts.add_argument("--out", required=True, help="folder or URL for 00000.tar, 00001.tar, ...")
    ts.add_argument("--world", default=None, help="toy world folder (default: the cache; built if missing)")
    ts.add_argument("--per-shard", type=int, default=250, help="samples per shard (default: 250)")
    tt = tsub.add_parser("train", help="train the toy checkpoints (regenerates engine/assets/toy_checkpoints)",
                         formatter_class=Formatter,
                         epilog="examples:\n  hardrank toy train\n"
                                "  hardrank toy train --out /tmp/ckpts --world /tmp/toy_world")
    tt.add_argument("--out", default=str(DATA_DIR / "toy_checkpoints"))
    tt.add_argument("--world", default=None, help="toy world folder (default: the cache)")
    toy.set_defaults(func=_cmd_toy)

    add_perturb_parser(sub)
    add_attack_parser(sub)
    add_run_parser(sub)
    add_report_parser(sub)
    add_store_parser(sub)
    add_export_parser(sub)
    add_bench_parser(sub)
    add_watch_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("hardrank: interrupted; finished work is kept (committed store shards, written results and "
              "mining shards): run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TooManyFailures as exc:
        print(f"hardrank: stopped: {exc}", file=sys.stderr)
        return exit_code(exc)
    except (HardrankError, *INPUT_FILE_ERRORS) as exc:  # anything else is a bug: its traceback, exit 1
        print(f"hardrank: error: {exc}", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
