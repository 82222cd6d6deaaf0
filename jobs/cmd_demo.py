"""`hardrank demo`: the toy checkpoints on the toy world, then where everything is and what to run next."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hardrank.config import EmbedOptions, EvalConfig, SuiteOptions, build, flat_fields, opt
from hardrank.errors import EXIT_OK, DataError
from hardrank.evaluate import evaluate, plan
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, options_from_args
from hardrank.jobs.grid import print_plan
from hardrank.jobs.progress import make_progress
from hardrank.scoring.results import format_table
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world, world_config
from hardrank.toyworld.amodal import build_amodal_world

__all__ = ["add_demo_parser", "next_steps", "DemoConfig"]


@dataclass(frozen=True)
class DemoConfig:
    """The demo: where its world and results go, and how the toy checkpoints are embedded and scored
    (the model, checkpoints, suites and their inputs are the demo's own)."""

    evaluation: EvalConfig
    world: str | None = opt(None, "toy world folder (default: OUT/toy_world)", path=True)


# the options of `demo`: an allow-list, so an option added to EvalConfig (a suite's inputs, say) stays off it
_DEMO_OPTIONS = ("world", "out", "budget_mb", "shard_gallery", "shard_gallery_above_mb", "rank_precision", "tie_rule",
                 *(name for name, _, _ in flat_fields(EmbedOptions)))


def _shown(path: str | os.PathLike) -> str:
    """A path as the user should type it: relative to the working folder when below it."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(p)


def next_steps(out: str, store: str, world: str, amodal: str, checkpoint: str) -> str:
    """Where the demo's results, store and worlds are, and three commands that reuse them."""
    o, s, w, a, c = (_shown(x) for x in (out, store, world, amodal, checkpoint))
    mined = _shown(Path(out).parent / "demo_mined") if Path(out).name == "demo" else f"{o}_mined"
    return "\n".join([
        "",
        "where things are:",
        f"  results    {o}/<checkpoint>/<suite>.json + .parquet (noisy/: a toy mask predictor, not a checkpoint)",
        f"  store      {s}  (embeddings by content, one folder per checkpoint: hardrank store list {s})",
        f"  toy world  {w}  (images, annotations; the mask suite's world: {a})",
        "next:",
        f"  hardrank report {o}",
        "      # leaderboard.csv, report.html and report.md in " + f"{o}/report",
        f"  hardrank eval --model toy-clip --checkpoint {c} --suite toy --data {w} --store {s} --out {o}_mine",
        "      # your own checkpoint: put it after --checkpoint; the store already holds this one, nothing is encoded",
        f"  hardrank mine --model toy-clip --checkpoint {c} --queries {w}/karpathy_test.json --images {w}/images "
        f"--corpus {w}/images/test --store {s} -k 5 --out {mined} --export-training {mined}/negclip.tsv",
        "      # hard negatives per caption (ids: image paths relative to --images, captions as text) and a "
        "NegCLIP training TSV",
    ])


def _cmd_demo(args) -> int:
    out = Path(args.out)
    world = Path(args.world) if args.world else out / "toy_world"
    amodal = world.parent / "toy_amodal"
    ckpts = tuple(str(p) for p in sorted(TOY_CHECKPOINTS.glob("*.safetensors")))
    if not ckpts:
        raise DataError(f"no toy checkpoints in {TOY_CHECKPOINTS}; run `make toy-checkpoints`")
    cfg = options_from_args(DemoConfig, args, model=str(TOY_MODEL), checkpoints=ckpts, suites=("toy",),
                            data=str(world), store=args.store or str(out / "store")).evaluation
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    if args.dry_run:  # builds nothing: the worlds are reported, not made
        print_plan(plan(cfg), echo=print)
        if not amodal.is_dir():
            print(f"  then the toy mask suite: its world would be built in {amodal}")
        return EXIT_OK
    build_world(world, world_config(world) or WorldConfig())  # a world already there is used as it is
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=echo)
    print(format_table(report.table_rows()))
    amodal = build_amodal_world(amodal)
    cfg = replace(cfg, suites=("amodal",), suite_options=build(SuiteOptions, {
        "data": str(amodal), "predictions": str(amodal / "predictions" / "noisy"), "baseline": "clip-regions",
        "tie_rule": cfg.suite_options.tie_rule}))
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=echo)
    print("\ntoy amodal (gIoU / cIoU, %): clip-regions baseline per checkpoint, and a noisy mask predictor")
    print(format_table(report.table_rows()))
    print(next_steps(str(out), cfg.embed.store_root(), str(world), str(amodal), ckpts[-1]))
    return EXIT_OK


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank demo``."""
    dm = subparsers.add_parser(
        "demo", help=COMMANDS["demo"], formatter_class=Formatter,
        description="Build the toy world (rendered shapes with RoCOCO-style perturbations) in OUT/toy_world, "
                    "evaluate the six bundled toy-clip checkpoints on it with the store in OUT/store, score the "
                    "toy mask suite, then print where everything is and three commands to try next.",
        epilog="examples:\n  hardrank demo --out results/demo\n"
               "  hardrank demo --out results/demo --dry-run\n  hardrank report results/demo")
    add_options(dm, DemoConfig, only=_DEMO_OPTIONS, required=("out",))
    add_cli_flags(dm, "quiet", "dry_run", help={"dry_run": "print the plan (suites, items, store hits per "
                                                           "checkpoint); build, encode and write nothing"})
    dm.set_defaults(func=_cmd_demo)
    return dm
