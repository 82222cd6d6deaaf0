"""`hardrank attack texts|images`: flags -> the attack's config, one call (hardrank.attack_run), a few lines."""
from __future__ import annotations

import argparse
import sys

from hardrank.attack_run import AttackImagesConfig, AttackTextsConfig, attack_images, attack_texts
from hardrank.errors import EXIT_OK
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, expand_globs, options_from_args
from hardrank.jobs.progress import make_progress

__all__ = ["add_attack_parser"]

_REQUIRED = ("model", "annotations", "images", "out")


def add_attack_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``attack texts`` and ``attack images`` to the ``hardrank`` sub-commands."""
    p = subparsers.add_parser("attack", help=COMMANDS["attack"], formatter_class=Formatter,
                              epilog="the examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
                                     "  hardrank attack texts --model toy-clip --checkpoint "
                                     "engine/assets/toy_checkpoints/toy-clip_step0200.safetensors "
                                     "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite rococo "
                                     "--annotations results/demo/toy_world/karpathy_test.json --data "
                                     "results/demo/toy_world/rococo --images results/demo/toy_world/images "
                                     "--store results/demo/store --out results/attack_texts\n"
                                     "  hardrank attack images --model toy-clip --checkpoint "
                                     "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --annotations "
                                     "results/demo/toy_world/karpathy_test.json --images "
                                     "results/demo/toy_world/images --store results/demo/store --out "
                                     "results/attack_images")
    sub = p.add_subparsers(dest="attack_command", required=True)
    t = sub.add_parser("texts", help="per caption, the one-word substitution that most outscores the true caption",
                       formatter_class=Formatter)
    add_options(t, AttackTextsConfig, required=_REQUIRED)
    add_cli_flags(t, "quiet")
    t.set_defaults(func=_cmd_texts)
    i = sub.add_parser("images", help="per image, the Mix/Patch partner among its k nearest images that most "
                       "outranks the original for its captions", formatter_class=Formatter)
    add_options(i, AttackImagesConfig, required=_REQUIRED)
    add_cli_flags(i, "quiet")
    i.set_defaults(func=_cmd_images)
    return p


def _echo(args):
    return (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))


def _cmd_texts(args) -> int:
    cfg = options_from_args(AttackTextsConfig, args, checkpoints=expand_globs(args.checkpoints))
    s = attack_texts(cfg, progress=make_progress(args.quiet), echo=_echo(args))
    for p in s["checkpoints"]:
        a = p["adversarial"]
        print(f"{p['checkpoint']}: attack success {p['success_rate']:.1f}% of captions; i2t R@1 "
              f"{p['clean']['R@1']:.1f} clean -> {a['R@1']:.1f} adversarial (false rate {a['false_rate']:.1f})")
    _echo(args)(f"summary: {cfg.out}/summary_texts.json; transfer matrix: {cfg.out}/transfer_texts.json; "
                f"report: hardrank report {cfg.out}")
    return EXIT_OK


def _cmd_images(args) -> int:
    cfg = options_from_args(AttackImagesConfig, args, checkpoints=expand_globs(args.checkpoints))
    s = attack_images(cfg, progress=make_progress(args.quiet), echo=_echo(args))
    for p in s["checkpoints"]:
        a = p["adversarial"]
        print(f"{p['checkpoint']}: altered copy beats the original for {p['caption_success_rate']:.1f}% of captions; "
              f"t2i R@1 {p['clean']['R@1']:.1f} clean -> {a['R@1']:.1f} adversarial (false rate {a['false_rate']:.1f})")
    _echo(args)(f"summary: {cfg.out}/summary_images.json; report: hardrank report {cfg.out}")
    return EXIT_OK
