"""`hardrank store`: list the store's fingerprint folders, export embeddings under human ids."""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from hardrank.config import EvalConfig, SuiteOptions, default_store, flat_fields, opt
from hardrank.errors import EXIT_OK
from hardrank.exports.store_ids import export_embeddings, list_stores
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_options, expand_globs, options_from_args
from hardrank.models.spec import forms_help

__all__ = ["add_store_parser", "StoreListConfig", "StoreExportConfig"]


@dataclass(frozen=True)
class StoreListConfig:
    """Which store root to list, and how."""

    root: str | None = opt(None, "store root (default: $HARDRANK_CACHE/store or ~/.cache/hardrank/store)",
                           positional=True, metavar="STORE", path=True)
    json: bool = opt(False, "print the list as JSON")


@dataclass(frozen=True)
class StoreExportConfig:
    """Whose embeddings (a fingerprint folder, or the model options that name one in the store), of
    the items of which suites, into which Parquet file."""

    evaluation: EvalConfig  # suites, model and store; its scoring and results options play no part here
    folder: str | None = opt(None, "a store fingerprint folder (instead of --model/--checkpoint/--run)",
                             positional=True, metavar="FINGERPRINT_DIR", path=True)
    file: str = opt("", "the Parquet file to write", flag="--out", metavar="FILE.parquet", path=True)


# the options of `store export`: an allow-list, so an option added to EvalConfig stays off it until it applies; the
# suite options (shared and the suites' own) decide which items the suites hold, all but the tie rule (scoring only)
_EXPORT_OPTIONS = ("folder", "file", "suites", "model", "checkpoints", "pretrained", "random_init", "run", "store",
                   "precision", "device", "decoder", "key_by")
_NOT_EXPORT_SUITE_OPTIONS = ("tie_rule", "per_suite")


def _export_options() -> tuple[str, ...]:
    return _EXPORT_OPTIONS + tuple(n for n, _, _ in flat_fields(SuiteOptions) if n not in _NOT_EXPORT_SUITE_OPTIONS)


_EXPORT_HELP = {"model": f"the model that made the embeddings (with --checkpoint or --pretrained): {forms_help()}",
                "checkpoints": "the checkpoint that made the embeddings (one)"}


def _cmd_list(args) -> int:
    cfg = options_from_args(StoreListConfig, args)
    root = cfg.root or default_store()
    rows = list_stores(root)
    if cfg.json:
        print(json.dumps(rows, indent=1))
        return EXIT_OK
    print(f"store {root}: {len(rows)} fingerprint folder(s)")
    for r in rows:
        rows_ = r["rows"] or {}
        newer = "" if r["readable"] else (f"  (store format version {r['schema_version']}: not readable by this "
                                          f"hardrank, left as it is)")
        print(f"  {r['fingerprint']}  {r['arch']} {r['precision']} {r['decoder'] or ''}  "
              f"images {rows_.get('image', 0)}, texts {rows_.get('text', 0)}  {_checkpoint_words(r)}{newer}")
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
    cfg = options_from_args(StoreExportConfig, args, checkpoints=expand_globs(args.checkpoints))
    s = export_embeddings(cfg.evaluation, out=cfg.file, folder=cfg.folder)
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
        "store", help=COMMANDS["store"],
        formatter_class=Formatter,
        description="The store keeps one folder per model fingerprint (architecture + checkpoint hash + "
                    "precision + preprocessing), its rows keyed by content. `list` says which folder is which "
                    "checkpoint; `export` writes a store's embeddings under the ids the suites' annotation files "
                    "use, in the format `hardrank eval --embeddings` reads (bring your own).",
        epilog="examples:\n  hardrank store list results/demo/store\n"
               "  hardrank store export --model toy-clip --checkpoint "
               "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite toy --data results/demo/toy_world "
               "--store results/demo/store --out results/demo_emb.parquet")
    sub = p.add_subparsers(dest="store_command", required=True)

    ls = sub.add_parser("list", help="the fingerprint folders of a store root: model, checkpoint, rows",
                        formatter_class=Formatter,
                        epilog="examples:\n  hardrank store list results/demo/store\n  hardrank store list --json")
    add_options(ls, StoreListConfig)
    ls.set_defaults(func=_cmd_list)

    ex = sub.add_parser(
        "export", help="write a store's embeddings with their human ids (the format `eval --embeddings` reads)",
        formatter_class=Formatter,
        description="Write one row per image and text the suites use: kind (image|text), id (image: the path as "
                    "the annotation file writes it, or relative to --images / the suite's data folder, with "
                    "@crop:x,y,w,h for a cropped region; text: the caption as written), embedding "
                    "(fixed_size_list<float32>[D], L2-normalised) and key (the store's content key). "
                    "`hardrank eval --embeddings FILE` on the same suites gives the same metrics, and `hardrank "
                    "mine` takes the file as its corpus or its queries. Name the embeddings by a fingerprint folder "
                    "(hardrank store list) or by the model and checkpoint that made them. Items the store lacks "
                    "(an image that failed to decode is never stored) are left out and listed in "
                    "OUT.missing.jsonl.",
        epilog="examples:\n"
               "  hardrank store export --model toy-clip --checkpoint "
               "engine/assets/toy_checkpoints/toy-clip_step0700.safetensors --suite toy --data results/demo/toy_world "
               "--store results/demo/store --out results/demo_emb.parquet\n"
               "  hardrank store export ~/.cache/hardrank/store/ViT-B-32-fp16-ab12 --suite rococo --annotations "
               "data/rococo --images /data/coco --out b32.parquet")
    add_options(ex, StoreExportConfig, only=_export_options(), required=("suites", "file"), help=_EXPORT_HELP)
    ex.set_defaults(func=_cmd_export)
    return p
