"""`hardrank compare`: two checkpoints' results, metric by metric, with paired tests: which is better where."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from hardrank.atomic import write_json_atomic
from hardrank.compare import compare_checkpoints, format_comparison, pick
from hardrank.config import check_options, opt
from hardrank.errors import EXIT_OK
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_options, options_from_args
from hardrank.scoring.statistics import RESAMPLES

__all__ = ["CompareConfig", "add_compare_parser"]


@dataclass(frozen=True)
class CompareConfig:
    """Which two checkpoints, which suites, and how the paired tests resample."""

    results: str = opt("", "a results folder (what `hardrank eval --out` wrote)", positional=True,
                       metavar="RESULTS_DIR", path=True)
    other: str | None = opt(None, "a second results folder: A comes from RESULTS_DIR, B from this one",
                            positional=True, metavar="OTHER_DIR", path=True)
    a: str | None = opt(None, "checkpoint A (its folder name); default: the one before B in step order, or the only "
                        "one of RESULTS_DIR", flag="--a", metavar="CHECKPOINT")
    b: str | None = opt(None, "checkpoint B; default: the last in step order, or the only one of OTHER_DIR",
                        flag="--b", metavar="CHECKPOINT")
    suites: tuple[str, ...] = opt((), "only these suites (default: every suite both checkpoints have)",
                                  flag="--suite")
    resamples: int = opt(RESAMPLES, "bootstrap resamples for the intervals, permutations for the paired tests",
                         minimum=1)
    seed: int = opt(0, "seed of the resampling", minimum=0)
    json: str | None = opt(None, "also write every compared metric to this JSON file", path=True, metavar="FILE")

    def __post_init__(self):
        check_options(self)


def _cmd_compare(args) -> int:
    cfg = options_from_args(CompareConfig, args)
    a, b = pick(cfg.results, cfg.other, cfg.a, cfg.b)
    comparison = compare_checkpoints(a, b, suites=list(cfg.suites) or None, resamples=cfg.resamples, seed=cfg.seed)
    print(format_comparison(comparison))
    if cfg.json:
        write_json_atomic(cfg.json, _finite(comparison.as_dict()))
    return EXIT_OK


def _finite(obj):
    """NaN and infinities as null: JSON has no spelling for them."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def add_compare_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank compare RESULTS_DIR [OTHER_DIR] [--a A] [--b B]``."""
    p = subparsers.add_parser(
        "compare", help=COMMANDS["compare"],
        description="Compare two checkpoints evaluated on the same suites: for every number of the terminal table, "
                    "B - A with its 95% paired-bootstrap interval over the suite's units (images, items) and a "
                    "p-value (the exact McNemar test for right/wrong metrics such as R@K and accuracies, a paired "
                    "permutation test for the others), Holm-adjusted over all the metrics compared; then which "
                    "checkpoint is better where. One results folder: its last two checkpoints by step, or the two "
                    "named; two folders: one checkpoint from each. Both must have been evaluated on the same items "
                    "(the same files, the same lite subset).",
        formatter_class=Formatter,
        epilog="examples:\n  hardrank compare results/demo\n"
               "  hardrank compare results/demo --a toy-clip_step0200 --b toy-clip_step0700 --suite toy-rococo\n"
               "  hardrank compare results/run1 results/run2 --a epoch_10 --b epoch_10 --json cmp.json")
    add_options(p, CompareConfig, required=("results",))
    p.set_defaults(func=_cmd_compare)
    return p
