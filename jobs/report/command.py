"""The `hardrank report` sub-command: its flags, its help with examples, and the paths it prints."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from hardrank.config import check_options, opt
from hardrank.errors import EXIT_OK
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import add_options, options_from_args
from hardrank.jobs.report.build import build_report

__all__ = ["add_report_parser", "ReportConfig"]


@dataclass(frozen=True)
class ReportConfig:
    """One report: the results folder it reads, where it goes, how many failures it lists."""

    results: str = opt("", "a results folder (what `hardrank eval --out` or `hardrank run` wrote)", positional=True,
                       metavar="RESULTS_DIR", path=True)
    out: str | None = opt(None, "report folder (default: RESULTS_DIR/report)", path=True)
    top: int = opt(20, "worst failures listed per suite", minimum=0)

    def __post_init__(self):
        check_options(self)


def _cmd_report(args) -> int:
    cfg = options_from_args(ReportConfig, args)
    paths = build_report(cfg.results, cfg.out, top=cfg.top)
    for k in ("csv", "html", "md"):
        print(paths[k])
    return EXIT_OK


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank report RESULTS_DIR [--out DIR] [--top N]``."""
    p = subparsers.add_parser(
        "report", help=COMMANDS["report"],
        description="Turn a results folder (<checkpoint>/<suite>.json + .parquet, from `hardrank eval`) into "
                    "leaderboard.csv, a self-contained report.html (plots embedded) and report.md. Checkpoints are "
                    "ordered by the step in their name (step0200, epoch_3, ...); those without one (a predictions "
                    "folder, 'final') are listed after them by name. Every suite type shows: ranking, choice and "
                    "mask (gIoU / cIoU, visible and amodal). leaderboard.csv columns: checkpoint, step (empty "
                    "when unknown), step_unit, order, suite, task_type, main_metric, main, then every headline "
                    "number. Plots need matplotlib: pip install 'hardrank[report]'.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hardrank report results/demo\n"
               "  hardrank report results/demo --out results/demo_report --top 50\n"
               "  xdg-open results/demo/report/report.html   # or benchmarks/screenshot_report.sh results/demo")
    add_options(p, ReportConfig, required=("results",))
    p.set_defaults(func=_cmd_report)
    return p
