"""`hardrank watch RUN_DIR`: evaluate each checkpoint of a training run as it appears, and refresh the report."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hardrank.config import EvalConfig, check_options, opt
from hardrank.dashboards import Dashboards
from hardrank.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, MissingExtra, Terminated, UsageError
from hardrank.evaluate import evaluate
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, options_from_args
from hardrank.jobs.progress import make_progress
from hardrank.jobs.report import build_report
from hardrank.models.runs import checkpoint_complete, read_params, run_checkpoints
from hardrank.scoring.results import format_table
from hardrank.suite_registry import result_stem
from hardrank.suites import expand_suites

__all__ = ["watch", "add_watch_parser", "WatchConfig"]

def _ready(path: Path, settle: float, now: float) -> bool:
    """Complete (whole archive / all safetensors data) and unchanged for ``settle`` seconds: a file
    the trainer is still writing is neither."""
    try:
        return now - path.stat().st_mtime >= settle and checkpoint_complete(path)
    except FileNotFoundError:
        return False


def _evaluated(cfg: EvalConfig, label: str) -> bool:
    out = Path(cfg.out) / label
    return all((out / f"{result_stem(s)}.json").is_file()
               for s in expand_suites(list(cfg.suites), cfg.suite_options))


def watch(cfg: EvalConfig, *, interval: float = 60.0, settle: float = 10.0, until: int | None = None,
          once: bool = False, report: bool = True, echo=print, progress=None) -> list[str]:
    """Poll ``cfg.run``'s checkpoints/ every ``interval`` seconds; evaluate each complete checkpoint
    not yet in ``cfg.out`` (all of them in one pass when several wait), then rebuild the report.
    Returns the labels evaluated. Stops after epoch ``until`` is evaluated, after one look with
    ``once``, or on Ctrl-C or SIGTERM (KeyboardInterrupt propagates after the current checkpoint's results
    are written: they are written atomically, so nothing is half done). ``cfg.log_to``'s dashboards stay
    open over the whole watch: each checkpoint is logged at its epoch as it is evaluated."""
    read_params(cfg.run)  # a folder that is no run fails now, not at the first checkpoint
    with Dashboards(cfg.log_to, run=cfg.out) as dashboards:  # one dashboard run for the whole watch
        return _watch(cfg, interval, settle, until, once, report, echo, progress, dashboards)


def _watch(cfg: EvalConfig, interval: float, settle: float, until: int | None, once: bool, report: bool, echo,
           progress, dashboards: Dashboards) -> list[str]:
    done: list[str] = []
    while True:
        now = time.time()
        waiting = [p for p in run_checkpoints(cfg.run) if not _evaluated(cfg, p.stem)]
        ready = [p for p in waiting if _ready(p, settle, now)]
        if ready:
            echo(f"watch: evaluating {', '.join(p.stem for p in ready)}")
            rep = evaluate(replace(cfg, checkpoints=tuple(str(p) for p in ready)), progress=progress, echo=echo,
                           dashboards=dashboards)
            done.extend(p.stem for p in ready)
            echo(format_table(rep.table_rows(), intervals=rep.table_intervals()))
            if report:
                try:
                    paths = build_report(cfg.out)
                    echo(f"watch: report refreshed: {paths['html']}")
                except MissingExtra as exc:
                    echo(f"watch: report not refreshed: {exc}")
                    report = False
            rep.raise_failures()  # a suite that cannot load would be retried at every look: stop, as a load error did
        if once or (until is not None and f"epoch_{until}" in done + [p.stem for p in run_checkpoints(cfg.run)
                                                                      if _evaluated(cfg, p.stem)]):
            return done
        if waiting and not ready:
            echo(f"watch: waiting for {', '.join(p.stem for p in waiting)} to be complete")
        time.sleep(interval)


@dataclass(frozen=True)
class WatchConfig:
    """Following a training run: the evaluation of each new checkpoint (its ``run`` is the run folder)
    and how the run's checkpoints/ folder is polled."""

    evaluation: EvalConfig  # the run's model, preprocessing and checkpoints come from evaluation.run
    interval: float = opt(60.0, "seconds between looks at checkpoints/", minimum=0)
    settle: float = opt(10.0, "a checkpoint must be unchanged this long, in seconds", minimum=0)
    until: int | None = opt(None, "stop once this epoch is evaluated", metavar="EPOCH")
    once: bool = opt(False, "evaluate the complete checkpoints there now, then exit")
    report: bool = opt(True, "rebuild the report after each evaluation (needs hardrank[report])")

    def __post_init__(self):
        check_options(self)
        if not self.evaluation.run:
            raise UsageError("watch needs a training run folder (RUN_DIR)")


# options of `eval` that a watched run decides itself: its checkpoints and their weights
_NOT_WATCH = ("checkpoints", "pretrained", "random_init", "embeddings")
_WATCH_HELP = {
    "run": "the training run folder (params.txt, checkpoints/): what open_clip_train writes under its `--logs`",
    "model": "a config .json for a custom architecture the run's params.txt names but open_clip does not know "
             "(default: the run's own model)",
}


def _cmd_watch(args) -> int:
    w = options_from_args(WatchConfig, args)
    cfg = w.evaluation
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    try:
        done = watch(cfg, interval=w.interval, settle=w.settle, until=w.until, once=w.once,
                     report=w.report, echo=echo, progress=make_progress(args.quiet))
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (a service manager stopping it: see cli.main)
        print(f"hardrank watch: stopped; the results so far are in {cfg.out}", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    print(f"hardrank watch: evaluated {len(done)} checkpoint(s): {', '.join(done) or 'none new'}; results in {cfg.out}")
    return EXIT_OK


def add_watch_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank watch RUN_DIR --suite ... --out ...``."""
    p = subparsers.add_parser(
        "watch", help=COMMANDS["watch"],
        description="Follow an open_clip training run (the folder with params.txt and checkpoints/): every complete "
                    "epoch_<N>.pt not yet evaluated is evaluated with the run's own model and preprocessing, and the "
                    "report under --out is rebuilt. A checkpoint still being written is left until it is whole and "
                    "unchanged for --settle seconds. Ctrl-C stops cleanly (exit 130).",
        formatter_class=Formatter,
        epilog="examples:\n  hardrank watch logs/exp1 --suite rococo --annotations data/rococo --images /data/coco "
               "--out results/exp1\n  hardrank watch logs/exp1 --suite toy --out results/exp1 --once\n"
               "  hardrank watch logs/exp1 --suite karpathy --annotations test.json --images coco --out r --until 32")
    add_options(p, WatchConfig, skip=_NOT_WATCH, required=("suites", "out", "run"), positional=("run",),
                help=_WATCH_HELP)
    add_cli_flags(p, "quiet")
    p.set_defaults(func=_cmd_watch)
    return p
