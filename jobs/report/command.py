"""The `hardrank report` sub-command: its flags, its help with examples, and the paths it prints."""
from __future__ import annotations

import argparse
import sys

from hardrank.jobs.report.build import build_report

__all__ = ["add_report_parser"]


def _cmd_report(args) -> int:
    if args.top < 0:
        print(f"hardrank report: --top must be >= 0, got {args.top}", file=sys.stderr)
        return 2
    paths = build_report(args.results, args.out, top=args.top)
    for k in ("csv", "html", "md"):
        print(paths[k])
    return 0


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank report RESULTS_DIR [--out DIR] [--top N]``."""
    p = subparsers.add_parser(
        "report", help="leaderboard CSV + HTML/Markdown report with plots from a results folder",
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
    p.add_argument("results", metavar="RESULTS_DIR", help="the --out folder of `hardrank eval` / `hardrank run`")
    p.add_argument("--out", default=None, help="report folder (default: RESULTS_DIR/report)")
    p.add_argument("--top", type=int, default=20, help="worst failures listed per suite (default 20)")
    p.set_defaults(func=_cmd_report)
    return p
