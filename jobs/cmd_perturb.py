"""`hardrank perturb texts|images`: make RoCOCO-style caption files and altered image folders."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hardrank.atomic import copy_into
from hardrank.config import PRECISIONS
from hardrank.errors import UsageError
from hardrank.inputs import is_sample_source, parse_captions, read_samples, sample_captions
from hardrank.models.openclip import ModelSpec, load_model
from hardrank.perturb.images import alter_images
from hardrank.perturb.shards import alter_shards, perturb_shard_texts
from hardrank.perturb.texts import KINDS, embedding_influence, load_vocab, write_variant_file
from hardrank.suites.karpathy import N_PERTURBED, read_karpathy

__all__ = ["add_perturb_parser", "run_perturb"]



def add_perturb_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``perturb texts`` and ``perturb images`` to the ``hardrank`` sub-commands."""
    p = subparsers.add_parser("perturb", help="make RoCOCO-style perturbed captions or altered images",
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="examples:\n"
                                     "  hardrank perturb texts --model ViT-B-32 --pretrained openai "
                                     "--annotations flickr_test.json --out data/roflickr\n"
                                     "  hardrank perturb images --method mix --lam 0.9 --seed 1 --images /data/coco "
                                     "--annotations coco_karpathy_test.json --out /data/coco")
    p.set_defaults(func=run_perturb)  # (was missing: `hardrank perturb` stopped with an AttributeError)
    sub = p.add_subparsers(dest="perturb_command", required=True)

    t = sub.add_parser("texts", help="replace the lowest-embedding-influence noun of every caption "
                       "(one <kind>.json per kind, RoCOCO format)")
    t.add_argument("--model", required=True, help="open_clip model name, config .json, hf-hub:ORG/NAME or "
                   "local-dir:<folder>; its text encoder ranks the words")
    t.add_argument("--checkpoint", default=None, help="weights file")
    t.add_argument("--pretrained", default=None, help="open_clip pretrained tag (its weights from the local cache "
                   "when no --checkpoint is given)")
    t.add_argument("--random-init", action="store_true", help="rank words with a random text encoder (tests only)")
    t.add_argument("--annotations", required=True, help="Karpathy-format JSON (image + caption list per item), or "
                   "tar shards ('dir/{00000..00009}.tar', local or a URL): variant shards go to <out>/<kind>/")
    t.add_argument("--captions", default="txt", help="tar shards: where the captions are: txt or json:KEY")
    t.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--out", required=True, help="folder for <kind>.json (the annotation file is copied there "
                   "too, so `hardrank eval --suite rococo --annotations <out>/<file>` finds both)")
    t.add_argument("--vocab", default=None, help="vocabulary JSON (default: the bundled concepts.json)")
    t.add_argument("--batch-size", type=int, default=512, help="texts per text-encoder pass")
    t.add_argument("--precision", default="auto", choices=PRECISIONS)
    t.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    t.add_argument("--overwrite", action=argparse.BooleanOptionalAction, default=False,
                   help="regenerate <kind>.json files that exist (default: skip them)")

    i = sub.add_parser("images", help="mix or CutMix every image with another (RoCOCO mix_images)")
    i.add_argument("--method", required=True, choices=["mix", "patch"])
    i.add_argument("--lam", type=float, default=0.9, help="weight of the original image (default 0.9)")
    i.add_argument("--seed", type=int, default=1)
    i.add_argument("--quality", type=int, default=75,
                   help="JPEG quality of the altered images (75 = PIL default, as the reference)")
    i.add_argument("--images", required=True, help="image root the annotation paths are relative to, or tar shards "
                   "('dir/{00000..00009}.tar', local or a URL: altered shards go to <out>/<method>_<lam>_s<seed>/)")
    i.add_argument("--annotations", default=None, help="Karpathy-format JSON naming the images (not for shards)")
    i.add_argument("--out", required=True, help="altered images go to <out>/<method>_<lam>_s<seed>/<image path> "
                   "(shards: <out>/<method>_<lam>_s<seed>/<shard>); use the --images root of `hardrank eval` (the "
                   "shards' folder) so --image-variants finds them")
    return p


def run_perturb(args) -> int:
    """Run ``hardrank perturb ...``; errors (missing files, malformed annotations) propagate as
    FileNotFoundError / ValueError for the caller's handler."""
    if args.perturb_command == "texts":
        return _texts(args)
    if args.perturb_command == "images":
        return _images(args)
    raise UsageError(f"unknown perturb command {args.perturb_command!r}; expected texts or images")


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _shard_texts(args) -> int:
    """perturb texts on tar shards: text-only variant shards <out>/<kind>/<shard>."""
    parse_captions(args.captions)  # usage first
    vocab = load_vocab(args.vocab)
    lm = load_model(ModelSpec(arch=args.model, checkpoint=args.checkpoint, precision=args.precision,
                              device=args.device, pretrained=args.pretrained, random_init=args.random_init))
    how = parse_captions(args.captions)
    sources = list(dict.fromkeys(c for s in read_samples(args.annotations, hash_images=False).samples
                                 if s.image is not None for c in sample_captions(s, how)[:N_PERTURBED]))
    influence = dict(zip(sources, embedding_influence(lm.model, lm.tokenizer, sources, batch_size=args.batch_size)))
    kinds = list(dict.fromkeys(args.kinds))
    for k in kinds:
        report = perturb_shard_texts(args.annotations, args.out, k, lm.model, lm.tokenizer, args.seed,
                                     captions=args.captions, vocab=vocab, influence=influence,
                                     batch_size=args.batch_size)
        report["model"] = lm.fingerprint
        print(json.dumps(report))
    _say(f"evaluate with: hardrank eval --suite wds --images '{args.annotations}' --captions {args.captions} "
         f"--text-variants {' '.join(kinds)} ...")
    return 0


def _texts(args) -> int:
    if is_sample_source(args.annotations):
        return _shard_texts(args)
    ann, out = Path(args.annotations), Path(args.out)
    clean = read_karpathy(ann)  # validate before loading the model
    vocab = load_vocab(args.vocab)
    kinds = list(dict.fromkeys(args.kinds))
    todo = [k for k in kinds if args.overwrite or not (out / f"{k}.json").is_file()]
    for k in kinds:
        if k not in todo:
            _say(f"{out / f'{k}.json'} exists, skipped (pass --overwrite to regenerate)")
    out.mkdir(parents=True, exist_ok=True)
    copy = out / ann.name
    copy_into(ann, copy, "the variant files must sit next to the clean file they were made from "
                                   "(--annotations): use another --out")
    if todo:
        lm = load_model(ModelSpec(arch=args.model, checkpoint=args.checkpoint, precision=args.precision,
                                  device=args.device, pretrained=args.pretrained, random_init=args.random_init))
        if lm.info["random_init"]:
            _say("warning: --random-init: a randomly initialised text encoder ranks the words")
        sources = list(dict.fromkeys(c for _, caps in clean for c in caps[:N_PERTURBED]))
        t0 = time.perf_counter()
        influence = dict(zip(sources, embedding_influence(lm.model, lm.tokenizer, sources,
                                                          batch_size=args.batch_size)))
        dt = time.perf_counter() - t0
        _say(f"embedding influence: {len(sources)} captions in {dt:.1f} s "
             f"({len(sources) / max(dt, 1e-9):.0f} captions/s, {lm.device}, {lm.precision})")
        for k in todo:
            report = write_variant_file(copy, out / f"{k}.json", k, lm.model, lm.tokenizer, args.seed,
                                        vocab=vocab, influence=influence, batch_size=args.batch_size)
            report["model"] = lm.fingerprint
            print(json.dumps(report))
    _say(f"evaluate with: hardrank eval --suite rococo --annotations {copy} --text-variants {' '.join(kinds)} ...")
    return 0


def _images(args) -> int:
    if not 0.0 <= args.lam <= 1.0:
        raise UsageError(f"--lam must be in [0, 1] (the weight of the original image), got {args.lam}")
    if is_sample_source(args.images):
        report = alter_shards(args.images, args.out, method=args.method, lam=args.lam, seed=args.seed,
                              quality=args.quality)
        print(json.dumps(report, default=str))
        _say(f"{report['images']} images in {len(report['shards'])} shard(s), {report['self_pairs']} mixed with "
             f"themselves; evaluate with --suite wds --images '{args.images}' --image-variants "
             f"{args.method}_{args.lam:g} --seeds {args.seed}")
        return 0
    if not args.annotations:
        raise UsageError("perturb images --images FOLDER needs --annotations (a Karpathy JSON naming the images); "
                         "tar shards need none")
    images_root = Path(args.images)
    if not images_root.is_dir():
        raise FileNotFoundError(f"--images {images_root} is not a folder")
    paths = [im for im, _ in read_karpathy(args.annotations)]
    name = f"{args.method}_{args.lam:g}_s{args.seed}"  # = hardrank.suites.karpathy.image_variant_names
    report = alter_images(images_root, paths, Path(args.out), method=args.method, lam=args.lam,
                          seed=args.seed, quality=args.quality)
    print(json.dumps(report, default=str))
    _say(f"{name}: {report.get('self_pairs')} images were mixed with themselves (RoCOCO keeps these); "
         f"evaluate with --image-variants {args.method}_{args.lam:g} --seeds {args.seed}")
    return 0
