"""`hardrank bench`: per-stage and end-to-end throughput, against naive baselines measured in the same run."""
from __future__ import annotations

import argparse

from hardrank.jobs.bench.end_to_end import (
    PipelineBenchConfig,
    add_pipeline_parser,
    bench_pipeline,
    format_bench,
    write_bench,
)
from hardrank.jobs.bench.kernel_bench import add_kernels_parser, bench_kernels
from hardrank.jobs.bench.options import KernelBenchConfig
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter

__all__ = ["add_bench_parser", "PipelineBenchConfig", "bench_pipeline", "format_bench", "write_bench",
           "KernelBenchConfig", "bench_kernels"]


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank bench`` with its sub-commands. Add one with a function taking the
    sub-parsers object (like ``add_pipeline_parser``) that ends with ``set_defaults(func=...)``."""
    p = subparsers.add_parser("bench", help=COMMANDS["bench"],
                              formatter_class=Formatter,
                              epilog="examples:\n  hardrank bench pipeline\n  hardrank bench pipeline --help\n"
                                     "  hardrank bench kernels --help")
    bsub = p.add_subparsers(dest="bench_command", required=True, metavar="{pipeline,kernels}")
    add_pipeline_parser(bsub)
    add_kernels_parser(bsub)
    return p
