"""`perturb texts` and `perturb images` as one call each: their configs and entry points (folders or tar shards)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from hardrank import urls
from hardrank.atomic import copy_into
from hardrank.config import PRECISIONS, build, check_options, opt
from hardrank.errors import DataError, UsageError
from hardrank.formats.karpathy import merge_repeated_images, read_karpathy
from hardrank.formats.variants import N_PERTURBED, variants_beside
from hardrank.inputs import is_sample_source, parse_captions, read_samples, sample_captions
from hardrank.models.load import load_model
from hardrank.models.runs import user_specs
from hardrank.perturb.corruptions import (
    CORRUPTIONS,
    IMAGE_SUFFIXES,
    JPEG_QUALITY,
    SEVERITIES,
    corrupt_images,
    parse_corruptions,
    walk_images,
)
from hardrank.perturb.images import METHODS, alter_images, variant_name
from hardrank.perturb.shards import alter_shards, corrupt_shards, perturb_shard_texts
from hardrank.perturb.texts import KINDS, embedding_influence, load_vocab, write_variant_file

__all__ = ["PerturbTextsConfig", "PerturbImagesConfig", "perturb_texts", "perturb_images"]

CB_CLASSNAMES = "classnames.txt"  # beside test/*.tar: CLIP_benchmark's classification root (suites.classification's)


@dataclass(frozen=True)
class PerturbTextsConfig:
    """RoCOCO-style caption variants: each caption's lowest-embedding-influence noun replaced, one
    ``<kind>.json`` per kind (RoCOCO format), or text-only variant shards for tar shard inputs."""

    model: str = opt("", "the model whose text encoder ranks the words", listing="models")
    checkpoint: str | None = opt(None, "weights file", path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag (its weights from the local cache when no "
                                 "--checkpoint is given)")
    random_init: bool = opt(False, "rank words with a random text encoder (tests only)")
    annotations: str = opt("", "Karpathy-format JSON (image + caption list per item), or tar shards "
                           "('dir/{00000..00009}.tar', local or a URL): variant shards go to <out>/<kind>/", path=True)
    captions: str = opt("txt", "tar shards: where the captions are: txt or json:KEY")
    kinds: tuple[str, ...] = opt(KINDS, "the variants to write", choices=KINDS)
    seed: int = opt(1, "seed of the replacement words (each draw depends on the seed, the kind and the caption)")
    out: str = opt("", "folder for <kind>.json (the annotation file is copied there too, so `hardrank eval --suite "
                   "rococo --annotations <out>/<file>` finds both)", path=True)
    vocab: str | None = opt(None, "vocabulary JSON (default: the bundled concepts.json)", path=True)
    batch_size: int = opt(512, "texts per text-encoder pass", minimum=1)
    precision: str = opt("auto", "text encoder precision: auto = fp16 on CUDA, fp32 on CPU", choices=PRECISIONS)
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    overwrite: bool = opt(False, "regenerate <kind>.json files that exist (otherwise they are skipped)")

    def __post_init__(self):
        object.__setattr__(self, "kinds", tuple(dict.fromkeys(self.kinds)))
        check_options(self)
        for name in ("model", "annotations", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} (--{name}) is required")
        if not self.kinds:
            raise UsageError(f"option kinds (--kinds) is empty; name at least one of {list(KINDS)}")


@dataclass(frozen=True)
class PerturbImagesConfig:
    """RoCOCO's altered galleries (every image mixed or CutMix-patched with another) or ImageNet-C's common
    corruptions, written where ``eval --image-variants <variant> --seeds <seed>`` finds them."""

    method: str | None = opt(None, "mix: the image blended with its partner; patch: a box of the partner pasted "
                             "in (CutMix); corrupt:<name>[,<name>...] or corrupt:all: ImageNet-C corruptions ("
                             + ", ".join(CORRUPTIONS) + ")")
    lam: float = opt(0.9, "mix/patch: weight of the original image")
    severity: tuple[int, ...] = opt(SEVERITIES, "corrupt: the severities to write (1..5, ImageNet-C's levels); "
                                    "one folder per corruption and severity", choices=SEVERITIES)
    seed: int = opt(1, "seed of the partners and patch boxes, or of the corruptions' noise; the folder's "
                    "_s<seed> suffix (>= 0: a folder <variant>_s-1 would not read as a variant folder)", minimum=0)
    quality: int | None = opt(None, "JPEG quality of the written images (default: 75 for mix/patch, PIL's default "
                              "as RoCOCO; 85 for corrupt, as ImageNet-C); corrupt keeps a PNG input PNG")
    frost_dir: str | None = opt(None, "corrupt:frost: folder of ImageNet-C's frost1.png..frost6.jpg (default: the "
                                "ones the imagecorruptions package ships: pip install 'hardrank[corrupt]')",
                                path=True)
    images: str = opt("", "image root the annotation paths are relative to, or tar shards ('dir/{00000..00009}.tar', "
                      "local or a URL: altered shards go to <out>/<variant>_s<seed>/)", path=True)
    annotations: str | None = opt(None, "Karpathy-format JSON naming the images (not for shards); corrupt without "
                                  "it: every image file under --images (an ImageFolder tree)", path=True)
    out: str = opt("", "altered images go to <out>/<variant>_s<seed>/<image path> (shards: "
                   "<out>/<variant>_s<seed>/<shard>), <variant> = <method>_<lam> or <corruption>_<severity>; "
                   "`hardrank eval --images` finds them there when <out> is its image root (the shards' folder), "
                   "else with `eval --variants-dir <out>`; an ImageFolder tree (no --annotations) needs an <out> "
                   "outside it, e.g. <images>-variants (inside, its subfolders would count as classes)", path=True)

    def __post_init__(self):
        object.__setattr__(self, "severity", tuple(dict.fromkeys(self.severity)))
        check_options(self)
        for name in ("method", "images", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} (--{name}) is required")
        if self.method not in METHODS:
            if not self.method.startswith("corrupt:"):
                raise UsageError(f"option method (--method) must be one of {list(METHODS)} or corrupt:<name> / "
                                 f"corrupt:all, got {self.method!r}")
            parse_corruptions(self.method)
            if not self.severity:
                raise UsageError("option severity (--severity) is empty; name at least one of 1..5")
        if not 0.0 <= self.lam <= 1.0:
            raise UsageError(f"option lam (--lam) must be in [0, 1] (the weight of the original image), got {self.lam}")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise UsageError(f"option quality (--quality) must be in [1, 100], got {self.quality}")

    @property
    def corruptions(self) -> tuple[str, ...]:
        """The corruption names of a corrupt:... method; () for mix/patch."""
        return () if self.method in METHODS else parse_corruptions(self.method)


def _echo(echo):
    return echo or (lambda s: None)


def perturb_texts(cfg: PerturbTextsConfig | None = None, *, echo=None, **options) -> list[dict]:
    """Write the caption variants ``cfg.kinds`` of ``cfg.annotations`` into ``cfg.out`` (the options
    as keywords work too: ``perturb_texts(model=..., annotations=..., out=...)``). Returns one report
    per kind written (counts of perturbed, fallback and unchanged captions, the model's fingerprint);
    ``echo`` gets progress and the `eval` command that reads the variants."""
    cfg = _config(PerturbTextsConfig, cfg, options)
    say = _echo(echo)
    if is_sample_source(cfg.annotations):
        return _shard_texts(cfg, say)
    ann, out = Path(cfg.annotations), Path(cfg.out)
    clean = read_karpathy(ann)  # validate before loading the model
    vocab = load_vocab(cfg.vocab)
    todo = [k for k in cfg.kinds if cfg.overwrite or not (out / f"{k}.json").is_file()]
    for k in cfg.kinds:
        if k not in todo:
            say(f"{out / f'{k}.json'} exists, skipped (pass --overwrite to regenerate)")
    out.mkdir(parents=True, exist_ok=True)
    copy = out / ann.name
    copy_into(ann, copy, "the variant files must sit next to the clean file they were made from "
                         "(--annotations): use another --out")
    reports = []
    if todo:
        lm = _load(cfg)
        if lm.info["random_init"]:
            say("warning: --random-init: a randomly initialised text encoder ranks the words")
        sources = list(dict.fromkeys(c for _, caps in clean for c in caps[:N_PERTURBED]))
        t0 = time.perf_counter()
        influence = dict(zip(sources, embedding_influence(lm.model, lm.tokenizer, sources,
                                                          batch_size=cfg.batch_size)))
        dt = time.perf_counter() - t0
        say(f"embedding influence: {len(sources)} captions in {dt:.1f} s "
            f"({len(sources) / max(dt, 1e-9):.0f} captions/s, {lm.device}, {lm.precision})")
        for k in todo:
            report = write_variant_file(copy, out / f"{k}.json", k, lm.model, lm.tokenizer, cfg.seed,
                                        vocab=vocab, influence=influence, batch_size=cfg.batch_size)
            report["model"] = lm.fingerprint
            reports.append(report)
    say(f"evaluate with: hardrank eval --suite rococo --annotations {copy} --text-variants {' '.join(cfg.kinds)} ...")
    return reports


def _shard_texts(cfg: PerturbTextsConfig, say) -> list[dict]:
    """perturb texts on tar shards: text-only variant shards <out>/<kind>/<shard>."""
    how = parse_captions(cfg.captions)  # usage first
    vocab = load_vocab(cfg.vocab)
    lm = _load(cfg)
    sources = list(dict.fromkeys(c for s in read_samples(cfg.annotations, hash_images=False).samples
                                 if s.image is not None for c in sample_captions(s, how)[:N_PERTURBED]))
    influence = dict(zip(sources, embedding_influence(lm.model, lm.tokenizer, sources, batch_size=cfg.batch_size)))
    reports = []
    for k in cfg.kinds:
        report = perturb_shard_texts(cfg.annotations, cfg.out, k, lm.model, lm.tokenizer, cfg.seed,
                                     captions=cfg.captions, vocab=vocab, influence=influence,
                                     batch_size=cfg.batch_size)
        report["model"] = lm.fingerprint
        reports.append(report)
    say(f"evaluate with: hardrank eval --suite wds --images '{cfg.annotations}' --captions {cfg.captions} "
        f"--text-variants {' '.join(cfg.kinds)} ...")
    return reports


def _load(cfg: PerturbTextsConfig):
    (spec,) = user_specs(cfg.model, (cfg.checkpoint,), precision=cfg.precision, device=cfg.device,
                         pretrained=cfg.pretrained, random_init=cfg.random_init)
    return load_model(spec)


def perturb_images(cfg: PerturbImagesConfig | None = None, *, echo=None, **options) -> dict:
    """Write the ``cfg.method`` copy of every image under ``cfg.out/<method>_<lam>_s<seed>/`` (folders:
    the images ``cfg.annotations`` names; tar shards: every sample). Returns the report (images,
    written, skipped, self_pairs, where); ``echo`` gets the `eval` flags that read them."""
    cfg = _config(PerturbImagesConfig, cfg, options)
    say = _echo(echo)
    if cfg.corruptions:
        return _corrupt(cfg, say)
    quality = 75 if cfg.quality is None else cfg.quality
    if is_sample_source(cfg.images):
        report = alter_shards(cfg.images, cfg.out, method=cfg.method, lam=cfg.lam, seed=cfg.seed,
                              quality=quality)
        say(f"{report['images']} images in {len(report['shards'])} shard(s), {report['self_pairs']} mixed with "
            f"themselves; evaluate with {_shards_eval(cfg.images, cfg.out)} --image-variants "
            f"{cfg.method}_{cfg.lam:g} --seeds {cfg.seed}")
        return report
    if not cfg.annotations:
        raise UsageError("perturb images --images FOLDER needs --annotations (a Karpathy JSON naming the images); "
                         "tar shards need none")
    images_root = Path(cfg.images)
    if not images_root.is_dir():
        raise FileNotFoundError(f"--images {images_root} is not a folder")
    # one altered copy per image, in the order the suites list them (an image listed twice is one image)
    paths = [im for im, _ in merge_repeated_images(cfg.annotations, read_karpathy(cfg.annotations))[0]]
    report = alter_images(images_root, paths, Path(cfg.out), method=cfg.method, lam=cfg.lam, seed=cfg.seed,
                          quality=quality)
    say(f"{variant_name(cfg.method, cfg.lam, cfg.seed)}: {report.get('self_pairs')} images were mixed with "
        f"themselves (RoCOCO keeps these); evaluate with {_folder_eval(cfg.images, cfg.out)} --image-variants "
        f"{cfg.method}_{cfg.lam:g} --seeds {cfg.seed}")
    return report


def _corrupt(cfg: PerturbImagesConfig, say) -> dict:
    """perturb images --method corrupt:...: one folder (or shard set) per corruption and severity."""
    quality = JPEG_QUALITY if cfg.quality is None else cfg.quality
    names = [f"{c}_{s}" for c in cfg.corruptions for s in cfg.severity]
    t0 = time.perf_counter()
    if is_sample_source(cfg.images):
        report = corrupt_shards(cfg.images, cfg.out, corruptions=cfg.corruptions, severities=cfg.severity,
                                seed=cfg.seed, quality=quality, frost_dir=cfg.frost_dir)
        where = _shards_eval(cfg.images, cfg.out)
    else:
        images_root = Path(cfg.images)
        if not images_root.is_dir():
            raise FileNotFoundError(f"--images {images_root} is not a folder")
        if cfg.annotations:
            paths = [im for im, _ in merge_repeated_images(cfg.annotations, read_karpathy(cfg.annotations))[0]]
        else:
            paths = walk_images(images_root)
            if not paths:
                raise DataError(f"--images {images_root} holds no image files ({', '.join(IMAGE_SUFFIXES)}); "
                                + (_cb_root_hint(images_root) or "point it at the image root, or name the images "
                                   "with --annotations"))
            _refuse_out_inside(images_root, Path(cfg.out))
        report = corrupt_images(images_root, paths, Path(cfg.out), corruptions=cfg.corruptions,
                                severities=cfg.severity, seed=cfg.seed, quality=quality, frost_dir=cfg.frost_dir)
        where = _folder_eval(cfg.images, cfg.out)
    dt = time.perf_counter() - t0
    report["seconds"] = round(dt, 3)
    say(f"{report['written']} corrupted images written, {report['skipped']} kept, {len(names)} variant(s) of "
        f"{report['images']} images in {dt:.1f} s ({report['written'] / max(dt, 1e-9):.1f} images/s); evaluate with "
        f"{where} --image-variants {' '.join(names)} --seeds {cfg.seed}")
    return report


def _same_dir(a: str, b: str) -> bool:
    if urls.is_url(a) or urls.is_url(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _folder_eval(images: str, out: str) -> str:
    """The `eval` flags that find variant folders written to ``out`` for images under ``images``."""
    return f"--images {images}" + ("" if _same_dir(images, out) else f" --variants-dir {out}")


def _shards_eval(spec: str, out: str) -> str:
    """The `eval` flags that read the variants of tar shards ``spec`` written to ``out``: CLIP_benchmark's
    classification layout (``ROOT/classnames.txt`` beside ``ROOT/test/*.tar``, samples labelled by ``cls``) is
    evaluated as --suite classification --images ROOT; any other shards as --suite wds."""
    first = urls.brace_expand(spec)[0] if "{" in spec else spec
    folder = first.rsplit("/", 1)[0] if "/" in first else "."
    here = "" if _same_dir(folder, out) else f" --variants-dir {out}"
    root = folder.rsplit("/", 1)[0] if "/" in folder.rstrip("/") else "."
    if urls.exists(urls.join(root, CB_CLASSNAMES)):
        return f"--suite classification --images {root}{here}"
    return f"--suite wds --images '{spec}'{here}"


def _cb_root_hint(folder: Path) -> str | None:
    """For CLIP_benchmark's WebDataset root given as a folder of images: its shards are the input."""
    test = folder / "test"
    if not (folder / CB_CLASSNAMES).is_file() or not test.is_dir():
        return None
    n = len(list(test.glob("*.tar")))
    return (f"it is CLIP_benchmark's WebDataset root: corrupt its shards, --images '{test}/{{0..{max(n - 1, 0)}}}.tar' "
            f"--out {test} (then eval --suite classification --images {folder} finds them)")


def _refuse_out_inside(images: Path, out: Path) -> None:
    """An ImageFolder tree (every image file under ``images``) cannot take its variants inside: torchvision and
    CLIP_benchmark would count each variant folder as a class, and a later run would walk (and corrupt) an
    ``--out`` below ``images`` again."""
    ri, ro = images.resolve(), out.resolve()
    if ro == ri or ri in ro.parents:
        beside = variants_beside(str(images))
        raise UsageError(f"--out {out} is inside --images {images}: without --annotations every image file there is "
                         f"corrupted, and variant folders inside an ImageFolder tree count as classes (torchvision, "
                         f"CLIP_benchmark) and are walked again by the next run; write them beside it: --out {beside} "
                         f"(then eval --images {images} --variants-dir {beside})")


def _config(cls, cfg, options: dict):
    """``cfg``, or ``cls`` built from keyword options (not both)."""
    if cfg is not None and options:
        raise UsageError(f"pass a {cls.__name__} or keyword options, not both (got {sorted(options)})")
    return cfg if cfg is not None else build(cls, options)
