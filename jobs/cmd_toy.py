"""`hardrank toy world|shards|train`: the built-in toy world, its test split as tar shards, its checkpoints."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from hardrank.config import DATA_DIR, SuiteOptions, check_options, opt
from hardrank.errors import EXIT_OK
from hardrank.inputs.convert import write_karpathy_shards
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_options, options_from_args
from hardrank.suites.toy import default_world_dir, ensure_world
from hardrank.toyworld import build_world
from hardrank.toyworld.train import train_toy

__all__ = ["add_toy_parser", "ToyWorldConfig", "ToyShardsConfig", "ToyTrainConfig"]


@dataclass(frozen=True)
class ToyWorldConfig:
    """Where to build the toy world."""

    out: str = opt("", "folder to build the world in (images, annotations, variants)", path=True)


@dataclass(frozen=True)
class ToyShardsConfig:
    """The toy world's test split as WebDataset tar shards."""

    out: str = opt("", "folder or URL for 00000.tar, 00001.tar, ...", path=True)
    world: str | None = opt(None, "toy world folder (default: the cache; built if missing)", path=True)
    per_shard: int = opt(250, "samples per shard", minimum=1)

    def __post_init__(self):
        check_options(self)


@dataclass(frozen=True)
class ToyTrainConfig:
    """Training the toy checkpoints."""

    out: str = opt(str(DATA_DIR / "toy_checkpoints"), "folder for the checkpoints", path=True)
    world: str | None = opt(None, "toy world folder (default: the cache)", path=True)


def _cmd_world(args) -> int:
    print(build_world(options_from_args(ToyWorldConfig, args).out))
    return EXIT_OK


def _cmd_shards(args) -> int:
    cfg = options_from_args(ToyShardsConfig, args)
    world = ensure_world(SuiteOptions(data=cfg.world))  # a world of any config, as the toy suites use it
    print(write_karpathy_shards(str(world / "karpathy_test.json"), str(world / "images"), cfg.out,
                                per_shard=cfg.per_shard))
    return EXIT_OK


def _cmd_train(args) -> int:
    cfg = options_from_args(ToyTrainConfig, args)
    world = build_world(cfg.world or default_world_dir())
    for p in train_toy(world, cfg.out):
        print(p)
    return EXIT_OK


def add_toy_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank toy world|shards|train``."""
    toy = subparsers.add_parser("toy", help=COMMANDS["toy"], formatter_class=Formatter,
                                epilog="examples:\n  hardrank toy world --out /tmp/toy_world\n  hardrank toy train")
    tsub = toy.add_subparsers(dest="toy_command", required=True)
    tw = tsub.add_parser("world", help="build the toy world", formatter_class=Formatter,
                         epilog="examples:\n  hardrank toy world --out /tmp/toy_world")
    add_options(tw, ToyWorldConfig, required=("out",))
    tw.set_defaults(func=_cmd_world)
    ts = tsub.add_parser("shards", help="write the toy world's test split as WebDataset tar shards (local or a URL)",
                         formatter_class=Formatter,
                         epilog="examples:\n"
                                "  hardrank toy shards --world results/demo/toy_world --out /tmp/toy_shards\n"
                                "  hardrank toy shards --out s3://bucket/toy_shards --per-shard 250")
    add_options(ts, ToyShardsConfig, required=("out",))
    ts.set_defaults(func=_cmd_shards)
    tt = tsub.add_parser("train", help="train the toy checkpoints (regenerates engine/assets/toy_checkpoints)",
                         formatter_class=Formatter,
                         epilog="examples:\n  hardrank toy train\n"
                                "  hardrank toy train --out /tmp/ckpts --world /tmp/toy_world")
    add_options(tt, ToyTrainConfig)
    tt.set_defaults(func=_cmd_train)
    return toy
