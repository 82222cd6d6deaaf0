"""`hardrank report`: a results folder -> leaderboard.csv, a self-contained report.html and report.md with plots."""
from hardrank.jobs.report.build import build_report, plot_bench
from hardrank.jobs.report.command import add_report_parser
from hardrank.jobs.report.load import parse_step

__all__ = ["build_report", "parse_step", "add_report_parser", "plot_bench"]
