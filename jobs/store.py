"""`hardrank store`: list the store's fingerprint folders, export embeddings under human ids."""
from __future__ import annotations

import argparse
import json
import os

from hardrank.config import EvalConfig, default_store
from hardrank.errors import EXIT_OK
from hardrank.store_export import export_embeddings, list_stores

from .flags import Formatter, add_options, expand_globs, options_from_args

__all__ = ["add_store_parser"]

# eval options that have no say in which embeddings are exported or how they are named
_NOT_EXPORT = ("out", "embeddings", "search", "budget_mb", "tie_rule", "batch_size", "decode_threads", "max_failures",
               "executor", "ray_address", "baseline")


def _cmd_list(args) -> int:
    root = args.root or default_store()
    rows = list_stores(root)
    if args.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"store {root}: {len(rows)} fingerprint folder(s)")
    for r in rows:
        rows_ = r["rows"] or {}
        print(f"  {r['fingerprint']}  {r['arch']} {r['precision']} {r['decoder'] or ''}  "
              f"images {rows_.get('image', 0)}, texts {rows_.get('text', 0)}  {_checkpoint_words(r)}")
    return EXIT_OK


def _checkpoint_words(row: dict) -> str:
    """``checkpoint PATH``, relative to this folder when below it, and whether the file is gone."""
    ck = row["checkpoint"]
    if not ck:
        return "checkpoint - (the model's own weights)"
    if row.get("checkpoint_exists") is None:
        return f"checkpoint {ck}"
    shown = ck
    if os.path.isabs(ck):
        rel = os.path.relpath(ck)
        shown = ck if rel.startswith("..") else rel
    if row["checkpoint_exists"]:
        return f"checkpoint {shown}"
    if os.path.isabs(ck):
        return f"checkpoint {shown} (no longer exists)"
    return f"checkpoint {shown} (recorded relative to the folder of that run; not found from here)"


def _cmd_export(args) -> int:
    cfg = options_from_args(EvalConfig, args, checkpoints=expand_globs(args.checkpoints))
    s = export_embeddings(cfg, out=args.out, folder=args.folder)
    c = s["counts"]
    print(f"{s['out']}: {c['image']['rows']} images, {c['text']['rows']} texts, dim {s['dim']}, from "
          f"{s['fingerprint']}")
    if s["missing_list"]:
        n_img, n_txt = len(s["missing"]["image"]), len(s["missing"]["text"])
        print(f"not in the store, so not exported: {n_img} images, {n_txt} texts, e.g. "
              f"{(s['missing']['image'] + s['missing']['text'])[:3]}; all listed in {s['missing_list']}")
        print("  an image that failed to decode is never stored (eval lists it in its results' failures); "
              "items no run embedded: run `hardrank eval` with this model on these suites and --store, then "
              "export again")
    return EXIT_OK


def add_store_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank store list`` and ``hardrank store export``."""
    p = subparsers.add_parser(
        "store", help="the embedding store: list its folders, export embeddings with their ids",
        formatter_class=Formatter,
        description="The store keeps one folder per model fingerprint (architecture + checkpoint hash + "
                    "precision + preprocessing), its rows keyed by content. `list` says which folder is which "
                    "checkpoint; `export` writes a store's embeddings under the ids the suites' annotation files "
                    "use, in the --embeddings (bring your own) format.",
        epilog="examples:\n  hardrank store list results/demo/store\n"
               "  hardrank store export --model toy-clip --checkpoint "
               "engine/data/toy_checkpoints/toy-clip_step0700.safetensors --suite toy --data results/demo/toy_world "
               "--store results/demo/store --out results/demo_emb.parquet")
    sub = p.add_subparsers(dest="store_command", required=True)

    ls = sub.add_parser("list", help="the fingerprint folders of a store root: model, checkpoint, rows",
                        formatter_class=Formatter,
                        epilog="examples:\n  hardrank store list results/demo/store\n  hardrank store list --json")
    ls.add_argument("root", nargs="?", default=None, metavar="STORE",
                    help="store root (default: $HARDRANK_CACHE/store or ~/.cache/hardrank/store)")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=_cmd_list)

    ex = sub.add_parser(
        "export", help="write a store's embeddings with their human ids (the --embeddings format)",
        formatter_class=Formatter,
        description="Write one row per image and text the suites use: kind (image|text), id (image: the path as "
                    "the annotation file writes it, or relative to --images / the suite's data folder, with "
                    "@crop:x,y,w,h for a cropped region; text: the caption as written), embedding "
                    "(fixed_size_list<float32>[D], L2-normalised) and key (the store's content key). "
                    "`hardrank eval --embeddings FILE` on the same suites gives the same metrics, and `hardrank "
                    "mine` takes the file as --corpus / --queries. Name the embeddings by a fingerprint folder "
                    "(hardrank store list) or by the model and checkpoint that made them. Items the store lacks "
                    "(an image that failed to decode is never stored) are left out and listed in "
                    "OUT.missing.jsonl.",
        epilog="examples:\n"
               "  hardrank store export --model toy-clip --checkpoint "
               "engine/data/toy_checkpoints/toy-clip_step0700.safetensors --suite toy --data results/demo/toy_world "
               "--store results/demo/store --out results/demo_emb.parquet\n"
               "  hardrank store export ~/.cache/hardrank/store/ViT-B-32-fp16-ab12 --suite rococo --annotations "
               "data/rococo --images /data/coco --out b32.parquet")
    ex.add_argument("folder", nargs="?", default=None, metavar="FINGERPRINT_DIR",
                    help="a store fingerprint folder (instead of --model/--checkpoint/--run)")
    ex.add_argument("--out", required=True, metavar="FILE.parquet", help="the Parquet file to write")
    add_options(ex, EvalConfig, skip=_NOT_EXPORT, required=("suites",))
    ex.set_defaults(func=_cmd_export)
    return p
