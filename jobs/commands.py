"""The `hardrank` front page: its sub-commands (the line `--help` shows for each) and the command line's own
flags, all read without importing a command (their modules import torch)."""
from __future__ import annotations

import argparse

__all__ = ["COMMANDS", "CLI_FLAGS", "add_cli_flags", "Formatter"]

# in the order `hardrank --help` lists them; each command's module builds its parser with its line from here
# (``hardrank.jobs.cli`` imports a command's module, and with it torch, only when the command is named)
COMMANDS = {
    "eval": "evaluate checkpoints on benchmark suites",
    "demo": "build the toy world and evaluate all toy checkpoints on it",
    "mine": "mine hard negatives: per query, the top-k corpus items that are not its positives",
    "index": "FAISS indexes of a corpus kept in a folder: build once, mine many times",
    "toy": "toy world and toy checkpoints",
    "perturb": "make RoCOCO-style perturbed captions or altered images, or ImageNet-C corrupted images",
    "attack": "find, per checkpoint, the caption substitutions and image partners that break it; write them as "
              "RoCOCO variant files",
    "run": "run a grid of models x checkpoints x suites from a TOML job file",
    "report": "leaderboard CSV + HTML/Markdown report with plots from a results folder",
    "compare": "two checkpoints' results compared per metric, with intervals and paired tests",
    "store": "the embedding store: list its folders, export embeddings with their ids",
    "export": "write a results folder in another tool's format (CLIP_benchmark JSON)",
    "bench": "measure throughput: the pipeline stage by stage, the ranking kernels",
    "watch": "evaluate each new checkpoint of an open_clip training run as it appears",
}


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's example lines as written."""


# The only flags that are no option of a config: they steer the command line itself (what it prints,
# whether it does the work at all), never the work, so no config, job file or Python call has them.
CLI_FLAGS = {
    "quiet": (("--quiet",), "no progress output (bars on a terminal, periodic lines in logs)"),
    "dry_run": (("--dry-run",), "print the plan (suites, unique items, store hits per checkpoint) and encode nothing"),
    "verbose": (("-v", "--verbose"), "log what happens (INFO), Ray's and transformers' own messages included; "
                "`hardrank run` also prints a failing entry's traceback"),
    "version": (("--version",), "print hardrank's version and exit"),
}


class _Version(argparse.Action):
    """``--version``: hardrank's version from its installed metadata (read only when asked), on stdout."""

    def __init__(self, option_strings, dest, help=None, **kwargs):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version
        try:
            found = version("hardrank")
        except PackageNotFoundError:  # a checkout on sys.path, never installed
            found = "unknown (not installed: pip install -e .)"
        print(f"hardrank {found}")
        parser.exit()


def add_cli_flags(parser: argparse.ArgumentParser, *names: str, help: dict[str, str] | None = None) -> None:
    """The command-line-only flags ``names`` (keys of ``CLI_FLAGS``); ``help`` rewords one for a command."""
    for name in names:
        flags, text = CLI_FLAGS[name]
        parser.add_argument(*flags, dest=name, action=_Version if name == "version" else "store_true",
                            help=(help or {}).get(name, text))
