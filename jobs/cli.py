"""The `hardrank` command line: eval, demo, toy world and checkpoints (more commands register from jobs/*)."""
from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
from pathlib import Path

from hardrank.config import DATA_DIR

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_USAGE, EXIT_DATA, EXIT_FAILURES = 0, 2, 3, 4
EXIT_CODES = ("exit codes: 0 ok, 2 usage (bad flags or job file), 3 bad data (missing/malformed files), "
              "4 too many unreadable images (--max-failures), 1 anything else")


def _default_store() -> str:
    base = os.environ.get("HARDRANK_CACHE") or str(Path.home() / ".cache" / "hardrank")
    return str(Path(base) / "store")


def _progress(quiet: bool):
    from hardrank.jobs.progress import make_progress

    return make_progress(quiet)


def _expand_checkpoints(items: list[str] | None) -> tuple:
    if not items:
        return (None,)
    out = []
    for it in items:
        matches = sorted(glob.glob(it))
        out.extend(matches if matches else [it])
    return tuple(out)


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="results folder (one sub-folder per checkpoint)")
    p.add_argument("--store", default=None, help="embedding store root (default: $HARDRANK_CACHE/store "
                   "or ~/.cache/hardrank/store); reused across runs")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "bf16"],
                   help="auto = fp16 on CUDA, fp32 on CPU")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--decode-threads", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    p.add_argument("--budget-mb", type=int, default=256, help="kernel score-tile memory budget")
    p.add_argument("--max-failures", type=int, default=100,
                   help="unreadable images tolerated (recorded, skipped) before the run stops")
    p.add_argument("--tie-rule", default="index", choices=["index", "optimistic", "pessimistic"])
    p.add_argument("--executor", default="local", choices=["local", "ray"],
                   help="local (default): in-process threads, no cluster start-up, best for small jobs and CI; "
                        "ray: Ray Data actor pools (decode actors, one encoder per GPU holding all checkpoints); "
                        "joins --ray-address / $RAY_ADDRESS or starts a local cluster")
    p.add_argument("--decoder", default="pillow", choices=["pillow", "dali"],
                   help="pillow (default): the model's own transform, the reference; dali: NVIDIA DALI decode + "
                        "resize (GPU if present, else CPU), within a tested bound of pillow, stored separately")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join with --executor ray "
                   "(default: $RAY_ADDRESS, else a local cluster)")
    p.add_argument("--quiet", action="store_true", help="no progress output (bars on a terminal, "
                   "periodic lines in logs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (suites, unique items, store hits per "
                   "checkpoint) and encode nothing")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hardrank", description="Stress-test image-text matching models: "
                                 "exact benchmark metrics, fast, for many checkpoints.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="examples:\n  hardrank demo --out results/demo\n"
                                        "  hardrank eval --model ViT-B-32 --checkpoint ckpt/epoch_*.pt "
                                        "--suite rococo --annotations data/rococo --images coco --out results/run1\n"
                                        "  hardrank run grid.toml --dry-run\n"
                                        "  hardrank report results/run1\n"
                                        "  hardrank bench pipeline\n\n" + EXIT_CODES)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)

    ev = sub.add_parser("eval", help="evaluate checkpoints on benchmark suites",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n"
                               "  hardrank eval --model toy-clip --checkpoint engine/data/toy_checkpoints/*.safetensors "
                               "--suite toy --out results/toy\n"
                               "  hardrank eval --model ViT-B-32 --checkpoint openai.pt --suite rococo "
                               "--annotations data/rococo --images /data/coco --image-variants mix_0.9 "
                               "--seeds 1 10 100 --out results/b32\n"
                               "  hardrank eval --model ViT-B-32 --checkpoint a.pt --suite karpathy "
                               "--annotations coco_karpathy_test.json --images /data/coco --out results/k")
    ev.add_argument("--model", default=None, help="open_clip model name, config .json, or local-dir:<folder> "
                    "(not needed with --embeddings, or --suite amodal --predictions)")
    ev.add_argument("--embeddings", default=None, help="score precomputed embeddings instead of a model: Parquet "
                    "with columns kind (image|text), id (image path / caption as in the annotation file), embedding")
    ev.add_argument("--checkpoint", nargs="+", default=None, help="checkpoint files (globs ok); one result per file")
    ev.add_argument("--suite", nargs="+", required=True,
                    help="suites: toy, rococo, karpathy, hard_positives, inpaintcoco; amodal (on its own)")
    ev.add_argument("--data", default=None, help="suite data folder")
    ev.add_argument("--images", default=None, help="image root the annotation paths are relative to")
    ev.add_argument("--annotations", default=None, help="Karpathy/RoCOCO annotation file or folder")
    ev.add_argument("--image-variants", nargs="*", default=[], help="RoCOCO altered galleries, e.g. mix_0.9 patch_0.9")
    ev.add_argument("--seeds", nargs="+", type=int, default=[1], help="seeds of the image variants (averaged)")
    ev.add_argument("--text-variants", nargs="*", default=None, help="RoCOCO caption files (default: all present)")
    ev.add_argument("--predictions", default=None, help="amodal: folder of mask predictions to score (no model needed)")
    ev.add_argument("--baseline", default=None, choices=["clip-regions"],
                    help="amodal: answer each question with the instance crop most similar to it (needs --model)")
    ev.add_argument("--search", default="exhaustive", help="ranking search: exhaustive (exact kernels) or "
                    "faiss:<factory> (per-group top-k; mean/median rank become lower bounds, see README)")
    _add_eval_args(ev)

    dm = sub.add_parser("demo", help="build the toy world and evaluate all toy checkpoints on it",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  hardrank demo --out results/demo\n"
                               "  hardrank demo --out results/demo --dry-run\n  hardrank report results/demo")
    dm.add_argument("--world", default=None, help="toy world folder (default: <out>/toy_world)")
    _add_eval_args(dm)

    from hardrank.jobs.mine import add_mine_parser

    add_mine_parser(sub)

    toy = sub.add_parser("toy", help="toy world and toy checkpoints", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="examples:\n  hardrank toy world --out /tmp/toy_world\n  hardrank toy train")
    tsub = toy.add_subparsers(dest="toy_command", required=True)
    tw = tsub.add_parser("world", help="build the toy world", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="examples:\n  hardrank toy world --out /tmp/toy_world")
    tw.add_argument("--out", required=True)
    tt = tsub.add_parser("train", help="train the toy checkpoints (regenerates engine/data/toy_checkpoints)",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="examples:\n  hardrank toy train\n  hardrank toy train --out /tmp/ckpts --world /tmp/toy_world")
    tt.add_argument("--out", default=str(DATA_DIR / "toy_checkpoints"))
    tt.add_argument("--world", default=None, help="toy world folder (default: the cache)")
    from hardrank.jobs.perturb import add_perturb_parser

    add_perturb_parser(sub)
    _add_module_commands(sub)
    return ap


def _add_module_commands(sub) -> None:
    """Commands that live in their own modules register here (each sets ``func`` on its parser)."""
    from hardrank.jobs.bench import add_bench_parser
    from hardrank.jobs.grid import add_run_parser
    from hardrank.jobs.report import add_report_parser

    add_run_parser(sub)
    add_report_parser(sub)
    add_bench_parser(sub)


def _cmd_eval(args, *, model: str | None, checkpoints: tuple, suites: tuple, suite_opts, embeddings=None) -> int:
    if getattr(args, "dry_run", False):
        from hardrank.jobs.grid import plan

        plan(model=model, checkpoints=checkpoints, suites=suites, suite_options=suite_opts,
             store=args.store or _default_store(), precision=args.precision, device=args.device, embeddings=embeddings)
        return EXIT_OK
    from hardrank.evaluate import EvalConfig, evaluate
    from hardrank.results import format_table

    if args.ray_address and args.executor != "ray":
        print("hardrank: --ray-address needs --executor ray", file=sys.stderr)
        return EXIT_USAGE
    cfg = EvalConfig(model=model, checkpoints=checkpoints, suites=suites, out=args.out,
                     store=args.store or _default_store(), suite_options=suite_opts, precision=args.precision,
                     device=args.device, batch_size=args.batch_size, decode_threads=args.decode_threads,
                     budget_mb=args.budget_mb, max_failures=args.max_failures, embeddings=embeddings,
                     search=getattr(args, "search", "exhaustive"),
                     executor=args.executor, decoder=args.decoder)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    runner = None
    if args.executor == "ray" and not embeddings:
        from hardrank.jobs.ray_executor import RayRunner

        runner = RayRunner(address=args.ray_address)
    try:
        report = evaluate(cfg, progress=_progress(args.quiet), echo=echo, runner=runner)
    finally:
        if runner is not None:
            runner.close()
    print(format_table(report.table_rows()))
    return EXIT_OK


def _cmd_amodal(args) -> int:
    from hardrank.amodal_eval import AmodalConfig, evaluate_amodal
    from hardrank.results import format_table

    if len(args.suite) > 1:
        raise ValueError(f"run --suite amodal on its own (got {args.suite}): it scores masks, not embeddings")
    if (args.annotations or args.data) is None:
        raise ValueError("suite amodal needs --data DIR (holding annotations.json) or --annotations FILE")
    if args.predictions is None and args.baseline is None:
        raise ValueError("suite amodal needs --predictions DIR and/or --baseline clip-regions")
    if args.baseline is not None and args.model is None:
        raise ValueError("--baseline clip-regions needs --model (and --checkpoint) to embed crops and questions")
    cfg = AmodalConfig(annotations=args.annotations or args.data, out=args.out, predictions=args.predictions,
                       baseline=args.baseline, images=args.images, model=args.model,
                       checkpoints=_expand_checkpoints(args.checkpoint), store=args.store or _default_store(),
                       precision=args.precision, device=args.device, batch_size=args.batch_size,
                       decode_threads=args.decode_threads, max_failures=args.max_failures)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    results = evaluate_amodal(cfg, progress=_progress(args.quiet), echo=echo)
    print(format_table([(r["checkpoint"], {f"{role} {k}": v for role, m in r["metrics"].items() for k, v in m.items()})
                        for r in results]))
    return EXIT_OK


def _demo_amodal(args, model: str, ckpts: tuple, world: Path) -> int:
    """The toy amodal suite: the clip-regions baseline of every checkpoint + a noisy mask predictor."""
    from hardrank.amodal_eval import AmodalConfig, evaluate_amodal
    from hardrank.results import format_table
    from hardrank.toy_amodal import build_amodal_world

    world = build_amodal_world(world)
    cfg = AmodalConfig(annotations=str(world), out=args.out, predictions=str(Path(world) / "predictions" / "noisy"),
                       baseline="clip-regions", model=model, checkpoints=ckpts, store=args.store,
                       precision=args.precision, device=args.device, batch_size=args.batch_size,
                       decode_threads=args.decode_threads, max_failures=args.max_failures)
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    results = evaluate_amodal(cfg, progress=_progress(args.quiet), echo=echo)
    print("\ntoy amodal (gIoU / cIoU, %): clip-regions baseline per checkpoint, and a noisy mask predictor")
    print(format_table([(r["checkpoint"], {f"{role} {k}": v for role, m in r["metrics"].items() for k, v in m.items()})
                        for r in results]))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from hardrank.embed import TooManyFailures
    from hardrank.suites import SuiteFormatError, SuiteOptions

    try:
        if getattr(args, "func", None) is not None:  # commands registered by jobs/* modules
            return args.func(args)
        if args.command == "eval" and "amodal" in args.suite:
            return _cmd_amodal(args)
        if args.command == "eval":
            opts = SuiteOptions(data=args.data, images=args.images, annotations=args.annotations,
                                image_variants=tuple(args.image_variants), seeds=tuple(args.seeds),
                                text_variants=tuple(args.text_variants) if args.text_variants is not None else None,
                                tie_rule=args.tie_rule)
            if args.search != "exhaustive" and not (args.search.startswith("faiss:") and len(args.search) > 6):
                print(f"hardrank eval: --search must be exhaustive or faiss:<factory>, got {args.search!r}",
                      file=sys.stderr)
                return EXIT_USAGE
            if (args.model is None) == (args.embeddings is None):
                print("hardrank eval: give --model (with --checkpoint files) or --embeddings FILE.parquet",
                      file=sys.stderr)
                return EXIT_USAGE
            return _cmd_eval(args, model=args.model, checkpoints=_expand_checkpoints(args.checkpoint),
                             suites=tuple(args.suite), suite_opts=opts, embeddings=args.embeddings)
        if args.command == "mine":
            from hardrank.jobs.mine import run_mine

            return run_mine(args)
        if args.command == "demo":
            from hardrank.jobs.demo import demo_inputs

            model, ckpts, world = demo_inputs(args.world or str(Path(args.out) / "toy_world"))
            if args.store is None:
                args.store = str(Path(args.out) / "store")
            rc = _cmd_eval(args, model=model, checkpoints=ckpts, suites=("toy",),
                           suite_opts=SuiteOptions(data=world, tie_rule=args.tie_rule))
            if rc != EXIT_OK:
                return rc
            return _demo_amodal(args, model, ckpts, Path(world).parent / "toy_amodal")
        if args.command == "perturb":
            from hardrank.jobs.perturb import run_perturb

            return run_perturb(args)
        if args.command == "toy":
            from hardrank.toyworld import build_world

            if args.toy_command == "world":
                print(build_world(args.out))
                return EXIT_OK
            from hardrank.suites.toy import default_world_dir
            from hardrank.toyworld.train import train_toy

            world = build_world(args.world or default_world_dir())
            for p in train_toy(world, args.out):
                print(p)
            return EXIT_OK
    except (FileNotFoundError, SuiteFormatError, ValueError, KeyError) as exc:
        print(f"hardrank: error: {exc}", file=sys.stderr)
        return EXIT_DATA
    except TooManyFailures as exc:
        print(f"hardrank: stopped: {exc}", file=sys.stderr)
        return EXIT_FAILURES
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
