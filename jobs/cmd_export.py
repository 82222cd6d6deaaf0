"""`hardrank export`: a results folder in another tool's format (CLIP_benchmark result JSON)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from hardrank.config import check_options, opt
from hardrank.errors import EXIT_OK, UsageError
from hardrank.exports.clip_benchmark import DEFAULT_OUTPUT, FORMATS, check_output, export_clip_benchmark
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_options, options_from_args

__all__ = ["add_export_parser", "ExportConfig"]


@dataclass(frozen=True)
class ExportConfig:
    """One export: a results folder, the format, where the files go."""

    results: str = opt("", "a results folder (what `hardrank eval --out`, `run` or `demo` wrote)", positional=True,
                       metavar="RESULTS_DIR", path=True)
    format: str | None = opt(None, "the format to write", choices=FORMATS)
    out: str = opt("", "folder for the files (created)", metavar="DIR", path=True)
    output: str = opt(DEFAULT_OUTPUT, "each file's name below --out, a template like CLIP_benchmark eval's --output: "
                      "{dataset} (its name without wds/, '/' as '_'), {pretrained} (the checkpoint's folder), "
                      "{pretrained_full_path}, {model}, {language}, {task}", metavar="TEMPLATE")

    def __post_init__(self):
        check_options(self)
        for name in ("results", "format", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} is required")
        check_output(self.output)


def _cmd_export(args) -> int:
    cfg = options_from_args(ExportConfig, args)
    s = export_clip_benchmark(cfg.results, cfg.out, cfg.output)
    print(f"{len(s['written'])} CLIP_benchmark result file(s) in {cfg.out}")
    for path, why in s["skipped"]:
        print(f"  skipped {path}: {why}", file=sys.stderr)
    return EXIT_OK


def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank export RESULTS_DIR --format clip_benchmark --out DIR``."""
    p = subparsers.add_parser(
        "export", help=COMMANDS["export"],
        formatter_class=Formatter,
        description="Write every result below RESULTS_DIR as CLIP_benchmark result JSON: one file per "
                    "(checkpoint, CLIP_benchmark dataset) with keys dataset, model, pretrained, task, metrics "
                    "(CLIP_benchmark's metric names, as fractions) and language, named as `clip_benchmark eval` "
                    "names its files, so `clip_benchmark build DIR/*.json` and dashboards built on its CSV read "
                    "them. Retrieval suites become zeroshot_retrieval (image_retrieval_recall@K = text->image), "
                    "choice suites image_caption_selection (acc, text_acc, image_acc), classification suites "
                    "zeroshot_classification (acc1, acc5, mean_per_class_recall); mask suites have no "
                    "counterpart and are skipped (listed). The mapping is in docs/results.md.",
        epilog="examples:\n  hardrank export results/demo --format clip_benchmark --out results/demo_cb\n"
               "  clip_benchmark build results/demo_cb/*.json --output benchmark.csv")
    add_options(p, ExportConfig, required=("results", "format", "out"))
    p.set_defaults(func=_cmd_export)
    return p
