"""`hardrank index build`: a corpus's FAISS index built once into a folder, for `hardrank mine --index`."""
from __future__ import annotations

import argparse
import sys

from hardrank.config import IndexBuildConfig
from hardrank.errors import EXIT_OK
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, options_from_args
from hardrank.mining.index import build_index

__all__ = ["add_index_parser"]


def _cmd_build(args) -> int:
    cfg = options_from_args(IndexBuildConfig, args)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    m = build_index(cfg, echo=echo)
    size = sum(f["bytes"] for f in m["files"].values())
    print(f"index {m['factory']} of {m['rows']:,} x {m['dim']} {m['identity']['modality']} rows: {cfg.out} "
          f"({size / 1e6:,.1f} MB, lists {m['lists']}); mine with: hardrank mine --corpus {cfg.corpus} "
          f"--index {cfg.out} ...")
    return EXIT_OK


def add_index_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank index build``."""
    p = subparsers.add_parser(
        "index", help=COMMANDS["index"],
        formatter_class=Formatter,
        description="An IVF index of a corpus of embeddings, written to a folder with the corpus's ids: `hardrank "
                    "mine --index FOLDER` reuses it for any query set, k and filters after checking it was built "
                    "from that corpus (fingerprint, rows, dimension). Lists larger than half the memory budget "
                    "stay on disk, memory-mapped. The build commits each block of rows as it finishes: a killed "
                    "build, run again, resumes at the first block missing.",
        epilog="examples:\n  hardrank index build --corpus /data/laion_clip_retrieval --out /data/laion.idx\n"
               "  hardrank index build --corpus images.parquet --factory IVF4096,PQ128 --budget-mb 2048 --out idx")
    sub = p.add_subparsers(dest="index_command", required=True)
    b = sub.add_parser("build", help="build (or resume building) a corpus's index in a folder",
                       formatter_class=Formatter,
                       epilog="examples:\n  hardrank index build --corpus /data/laion_clip_retrieval --out "
                              "/data/laion.idx")
    add_options(b, IndexBuildConfig, required=("corpus", "out"))
    add_cli_flags(b, "quiet")
    b.set_defaults(func=_cmd_build)
    return p
