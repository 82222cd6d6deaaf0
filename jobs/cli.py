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
from hardrank.config import EvalConfig
from hardrank.errors import (
    EXIT_CODES_HELP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    INPUT_FILE_ERRORS,
    HardrankError,
    Terminated,
    TooManyFailures,
    exit_code,
)
from hardrank.evaluate import evaluate, plan
from hardrank.inputs import registry
from hardrank.jobs.bench import add_bench_parser
from hardrank.jobs.cmd_attack import add_attack_parser
from hardrank.jobs.cmd_compare import add_compare_parser
from hardrank.jobs.cmd_demo import add_demo_parser
from hardrank.jobs.cmd_export import add_export_parser
from hardrank.jobs.cmd_index import add_index_parser
from hardrank.jobs.cmd_mine import add_mine_parser
from hardrank.jobs.cmd_perturb import add_perturb_parser
from hardrank.jobs.cmd_store import add_store_parser
from hardrank.jobs.cmd_toy import add_toy_parser
from hardrank.jobs.cmd_watch import add_watch_parser
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, expand_globs, options_from_args
from hardrank.jobs.grid import add_run_parser, print_plan
from hardrank.jobs.progress import make_progress
from hardrank.jobs.report import add_report_parser
from hardrank.scoring.results import format_table

__all__ = ["main", "build_parser"]

def _echo(args):
    return (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))


def _run_eval(cfg: EvalConfig, args, title: str | None = None) -> None:
    if args.dry_run:
        print_plan(plan(cfg), echo=print)
        return
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=_echo(args))
    if title:
        print(title)
    print(format_table(report.table_rows(), intervals=report.table_intervals()))


def _cmd_eval(args) -> int:
    cfg = options_from_args(EvalConfig, args, checkpoints=expand_globs(args.checkpoints))
    _run_eval(cfg, args)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
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
    add_cli_flags(ap, "verbose")
    sub = ap.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="evaluate checkpoints on benchmark suites", formatter_class=Formatter,
                        epilog="--embeddings takes (recognised in this order; another file is read as a Parquet "
                               "of kind, id, embedding):\n" + registry.help_text("embeddings", by_id=True) + "\n"
                               "the first two examples reuse what `hardrank demo --out results/demo` made\nexamples:\n"
                               "  hardrank eval --model toy-clip --checkpoint "
                               "engine/assets/toy_checkpoints/*.safetensors --suite toy --data results/demo/toy_world "
                               "--store results/demo/store --out results/toy\n"
                               "  hardrank eval --embeddings results/demo_emb.parquet --suite toy "
                               "--data results/demo/toy_world --out results/byo   # after hardrank store export\n"
                               "  hardrank eval --model ViT-B-32 --pretrained openai --suite rococo "
                               "--annotations data/rococo --images /data/coco --image-variants mix_0.9 "
                               "--seeds 1 10 100 --out results/b32\n"
                               "  hardrank eval --model ViT-B-32 --checkpoint a.pt --suite karpathy "
                               "--annotations coco_karpathy_test.json --images /data/coco --out results/k\n"
                               "  hardrank eval --suite amodal --data amodal/ --predictions preds/ --out results/masks")
    add_options(ev, EvalConfig, required=("suites", "out"))
    add_cli_flags(ev, "quiet", "dry_run")
    ev.set_defaults(func=_cmd_eval)

    add_demo_parser(sub)
    add_mine_parser(sub)
    add_index_parser(sub)

    add_toy_parser(sub)
    add_perturb_parser(sub)
    add_attack_parser(sub)
    add_run_parser(sub)
    add_report_parser(sub)
    add_compare_parser(sub)
    add_store_parser(sub)
    add_export_parser(sub)
    add_bench_parser(sub)
    add_watch_parser(sub)
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
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
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
