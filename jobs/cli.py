"""The `hardrank` command line: one sub-command per job, flags from the config dataclasses, one exit-code map."""
from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import signal
import sys
import threading

from hardrank.atomic import no_space
from hardrank.errors import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    INPUT_FILE_ERRORS,
    HardrankError,
    Terminated,
    TooManyFailures,
    exit_code,
)
from hardrank.jobs.commands import COMMANDS, Formatter, add_cli_flags

__all__ = ["main", "build_parser"]

_FRONT = ("-h", "--help", "--version")  # answered by the front page alone: no command's module imported
_LIBRARY_VERBOSITY = ("TRANSFORMERS_VERBOSITY", "HF_HUB_VERBOSITY")  # their log levels, read when they load


def _add_command(subparsers: argparse._SubParsersAction, name: str) -> None:
    """The sub-command ``name``'s parser, from its module (imported here: the commands import torch)."""
    if name == "eval":
        from hardrank.jobs.cmd_eval import add_eval_parser as add
    elif name == "demo":
        from hardrank.jobs.cmd_demo import add_demo_parser as add
    elif name == "mine":
        from hardrank.jobs.cmd_mine import add_mine_parser as add
    elif name == "index":
        from hardrank.jobs.cmd_index import add_index_parser as add
    elif name == "toy":
        from hardrank.jobs.cmd_toy import add_toy_parser as add
    elif name == "perturb":
        from hardrank.jobs.cmd_perturb import add_perturb_parser as add
    elif name == "attack":
        from hardrank.jobs.cmd_attack import add_attack_parser as add
    elif name == "run":
        from hardrank.jobs.grid import add_run_parser as add
    elif name == "report":
        from hardrank.jobs.report.command import add_report_parser as add
    elif name == "compare":
        from hardrank.jobs.cmd_compare import add_compare_parser as add
    elif name == "store":
        from hardrank.jobs.cmd_store import add_store_parser as add
    elif name == "export":
        from hardrank.jobs.cmd_export import add_export_parser as add
    elif name == "bench":
        from hardrank.jobs.bench import add_bench_parser as add
    elif name == "watch":
        from hardrank.jobs.cmd_watch import add_watch_parser as add
    else:
        raise ValueError(f"no sub-command {name!r} in hardrank.jobs.commands.COMMANDS")
    add(subparsers)


def _named(argv: list[str]) -> str | None:
    """The sub-command ``argv`` names, or None where the front page answers it (``--help``, ``--version``, no
    command, an unknown one). The options before a command take no values, so its name is the first word."""
    for arg in argv:
        if arg in _FRONT or arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The ``hardrank`` parser. ``commands``: the sub-commands whose parsers are built (their modules imported;
    default all); the others are listed (``--help``) but parse nothing."""
    ap = argparse.ArgumentParser(prog="hardrank", description="Stress-test image-text matching models: "
                                 "exact benchmark metrics, fast, for many checkpoints.", formatter_class=Formatter,
                                 epilog="the first five examples reuse what `hardrank demo --out "
                                        "results/demo` made (its store and toy world)\nexamples:\n"
                                        "  hardrank demo --out results/demo\n"
                                        "  hardrank report results/demo\n"
                                        "  hardrank store list results/demo/store\n"
                                        "  hardrank eval --model toy-clip --checkpoint "
                                        "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite toy "
                                        "--data results/demo/toy_world --store results/demo/store --out results/mine\n"
                                        "  hardrank mine --model toy-clip --checkpoint "
                                        "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --queries "
                                        "results/demo/toy_world/karpathy_test.json "
                                        "--images results/demo/toy_world/images "
                                        "--corpus results/demo/toy_world/images/test --store results/demo/store "
                                        "-k 5 --out results/demo_mined --export-training "
                                        "results/demo_mined/negclip.tsv\n"
                                        "  hardrank eval --model ViT-B-32 --checkpoint ckpt/epoch_*.pt "
                                        "--suite rococo --annotations data/rococo --images coco --out results/run1\n"
                                        "  hardrank eval --run logs/exp1 --suite rococo --annotations data/rococo "
                                        "--images coco --out results/exp1\n"
                                        "  hardrank watch logs/exp1 --suite toy --out results/exp1\n"
                                        "  hardrank run grid.toml --dry-run\n"
                                        "  hardrank bench pipeline\n\n" + EXIT_CODES_HELP)
    add_cli_flags(ap, "verbose", "version")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, line in COMMANDS.items():
        if commands is None or name in commands:
            _add_command(sub, name)
        else:
            sub.add_parser(name, help=line, add_help=False)
    return ap


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While the command runs, SIGTERM (what Slurm, Kubernetes and systemd send to stop a job) raises
    ``Terminated`` in the main thread, as Ctrl-C raises KeyboardInterrupt: the same cleanup runs (encoded
    embeddings are flushed to the store) instead of the default death that drops them. Later SIGTERMs
    are ignored, so they cannot cut that cleanup short (a SIGKILL still can)."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = _named(argv)
    args = build_parser(() if named is None else (named,)).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # transformers' and the Hugging Face hub's own warnings, here and in Ray's workers (which
        for var in _LIBRARY_VERBOSITY:  # inherit the environment), only with -v (Ray's: executors.ray_embed)
            os.environ.setdefault(var, "error")
    kept = ("finished work is kept (committed store shards, written results and mining shards): run the same "
            "command again to resume")
    try:
        with _sigterm_as_interrupt():
            return args.func(args)
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            print(f"hardrank: terminated (SIGTERM); {kept}", file=sys.stderr)
            return EXIT_TERMINATED
        print(f"hardrank: interrupted; {kept}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except TooManyFailures as exc:
        print(f"hardrank: stopped: {exc}", file=sys.stderr)
        return exit_code(exc)
    except (HardrankError, *INPUT_FILE_ERRORS) as exc:  # anything else is a bug: its traceback, exit 1
        print(f"hardrank: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except OSError as exc:  # a full disk at a write that did not name itself (e.g. creating a folder)
        full = no_space(exc)
        if full is None:
            raise
        print(f"hardrank: error: {full}", file=sys.stderr)
        return exit_code(full)


def entry() -> None:
    """The ``hardrank`` command: ``main`` and a quick exit. Once the command has returned (its outputs
    written and closed), the atexit handlers run (Ray's shutdown, temporary folders) and the process ends
    without tearing down every module: Python's finalisation of torch, torchvision and open_clip takes
    0.5-1.2 s on a 2-core CPU, a tenth of a short evaluation. A crash (a bug's traceback) exits as usual."""
    rc = main()
    shutdown_threads = getattr(threading, "_shutdown", None)  # what the interpreter's exit does first: thread
    if shutdown_threads is not None:                          # pools told to stop, non-daemon threads joined
        shutdown_threads()
    atexit._run_exitfuncs()  # then the atexit handlers (logging's flush among them)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(rc if isinstance(rc, int) else 0 if rc is None else 1)


if __name__ == "__main__":
    entry()
