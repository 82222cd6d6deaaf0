"""`hardrank perturb texts|images`: flags -> the config, one call (hardrank.perturb), its reports as JSON lines."""
from __future__ import annotations

import argparse
import json
import sys

from hardrank.errors import EXIT_OK
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_options, options_from_args
from hardrank.perturb import PerturbImagesConfig, PerturbTextsConfig, perturb_images, perturb_texts

__all__ = ["add_perturb_parser", "run_perturb"]


def add_perturb_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``perturb texts`` and ``perturb images`` to the ``hardrank`` sub-commands."""
    p = subparsers.add_parser("perturb", help=COMMANDS["perturb"],
                              formatter_class=Formatter,
                              epilog="examples:\n"
                                     "  hardrank perturb texts --model ViT-B-32 --pretrained openai "
                                     "--annotations flickr_test.json --out data/roflickr\n"
                                     "  hardrank perturb images --method mix --lam 0.9 --seed 1 --images /data/coco "
                                     "--annotations coco_karpathy_test.json --out /data/coco\n"
                                     "  hardrank perturb images --method corrupt:all --severity 1 2 3 4 5 --seed 0 "
                                     "--images /data/imagenet/val --out /data/imagenet/val")
    p.set_defaults(func=run_perturb)
    sub = p.add_subparsers(dest="perturb_command", required=True)
    t = sub.add_parser("texts", help="replace the lowest-embedding-influence noun of every caption "
                       "(one <kind>.json per kind, RoCOCO format)", formatter_class=Formatter)
    add_options(t, PerturbTextsConfig, required=("model", "annotations", "out"))
    i = sub.add_parser("images", help="mix or CutMix every image with another (RoCOCO mix_images), or corrupt it "
                       "(ImageNet-C's 15 common corruptions, severities 1..5)",
                       formatter_class=Formatter)
    add_options(i, PerturbImagesConfig, required=("method", "images", "out"))
    return p


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_perturb(args) -> int:
    """Run ``hardrank perturb ...``: each report on its own stdout line, hints on stderr. Errors
    (missing files, malformed annotations) propagate for the caller's handler."""
    if args.perturb_command == "texts":
        for report in perturb_texts(options_from_args(PerturbTextsConfig, args), echo=_say):
            print(json.dumps(report))
        return EXIT_OK
    report = perturb_images(options_from_args(PerturbImagesConfig, args), echo=_say)
    print(json.dumps(report, default=str))
    return EXIT_OK
