"""`hardrank run JOB.toml`: grids of models x checkpoints x suites from a TOML job file, and dry-run plans."""
from __future__ import annotations

import argparse
import difflib
import glob
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["JobFile", "JobModel", "JobOptions", "JobFileError", "load_job", "plan", "add_run_parser"]

EXIT_OK, EXIT_USAGE, EXIT_DATA, EXIT_FAILURES = 0, 2, 3, 4

EXAMPLE = """\
# results go to <out>/<model name>/<checkpoint>/<suite>.json; relative paths are relative to this file
out = "results/grid"
suites = ["rococo", "karpathy"]        # default suites of every [[model]]

[options]                              # optional; the same names as the `hardrank eval` flags
annotations = "data/rococo"
images = "/data/coco"
image_variants = ["mix_0.9"]
seeds = [1, 10, 100]
batch_size = 256

[[model]]
model = "ViT-B-32"                     # open_clip name, config .json, or local-dir:<folder>
checkpoints = ["runs/exp1/checkpoints/epoch_*.pt"]

[[model]]
name = "mine"                          # results folder name (default: from model / embeddings)
embeddings = "my_model.parquet"        # precomputed embeddings instead of a model
suites = ["rococo"]                    # overrides the top-level suites
"""


class JobFileError(ValueError):
    """The job file is not valid TOML or does not follow the schema (a usage error: exit code 2)."""


@dataclass(frozen=True)
class JobOptions:
    store: str | None = None                  # embedding store root (default: $HARDRANK_CACHE/store)
    precision: str = "auto"                   # auto | fp32 | fp16 | bf16
    device: str = "auto"                      # auto | cpu | cuda | cuda:N
    batch_size: int = 256                     # images/texts per encoder batch
    decode_threads: int = 2                   # Pillow decode threads
    budget_mb: int = 256                      # kernel score-tile memory budget, MiB
    max_failures: int = 100                   # unreadable images tolerated before a run stops
    tie_rule: str = "index"                   # index | optimistic | pessimistic
    data: str | None = None                   # suite data folder
    images: str | None = None                 # image root the annotation paths are relative to
    annotations: str | None = None            # Karpathy/RoCOCO annotation file or folder
    image_variants: tuple[str, ...] = ()      # RoCOCO altered galleries, e.g. ("mix_0.9",)
    seeds: tuple[int, ...] = (1,)             # seeds of the image variants (averaged)
    text_variants: tuple[str, ...] | None = None  # RoCOCO caption files (default: all present)


@dataclass(frozen=True)
class JobModel:
    name: str                                 # results sub-folder: <out>/<name>/<checkpoint>/
    model: str | None                         # open_clip name, config .json or local-dir: (or None with embeddings)
    embeddings: str | None                    # precomputed embeddings Parquet instead of a model
    checkpoints: tuple[str | None, ...]       # expanded globs; (None,) = random init
    suites: tuple[str, ...]


@dataclass(frozen=True)
class JobFile:
    path: Path
    out: str
    models: tuple[JobModel, ...]
    options: JobOptions


_CHOICES = {"precision": ("auto", "fp32", "fp16", "bf16"), "tie_rule": ("index", "optimistic", "pessimistic")}
_PATHS = ("store", "data", "images", "annotations")
_TOP_KEYS = ("out", "suites", "options", "model")
_MODEL_KEYS = ("name", "model", "embeddings", "checkpoints", "suites")


def _unknown(where: str, keys, known, path: Path) -> None:
    bad = [k for k in keys if k not in known]
    if bad:
        hint = difflib.get_close_matches(bad[0], known, n=1)
        raise JobFileError(f"{path}: unknown key {bad[0]!r} in {where}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                           + f"; known keys: {', '.join(known)}")


def _typed(path: Path, where: str, key: str, value, kind: str):
    """Check one value against a kind: str, int, [str], [int]. Lists come back as tuples."""
    def bad(expected):
        return JobFileError(f"{path}: {where} key {key!r} must be {expected}, got {type(value).__name__} {value!r}")

    if kind == "str":
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    item = kind[1:-1]
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]  # a single value where a list is expected is fine
    if not isinstance(value, list):
        raise bad(f"a list of {item}s")
    return tuple(_typed(path, where, key, v, item) for v in value)


_OPTION_KINDS = {"store": "str", "precision": "str", "device": "str", "batch_size": "int", "decode_threads": "int",
                 "budget_mb": "int", "max_failures": "int", "tie_rule": "str", "data": "str", "images": "str",
                 "annotations": "str", "image_variants": "[str]", "seeds": "[int]", "text_variants": "[str]"}
_MODEL_KINDS = {"name": "str", "model": "str", "embeddings": "str", "checkpoints": "[str]", "suites": "[str]"}


def _resolve(base: Path, p: str) -> str:
    p = os.path.expanduser(p)
    return p if os.path.isabs(p) else os.fspath(base / p)


def _expand(base: Path, patterns: tuple[str, ...], path: Path, name: str) -> tuple[str, ...]:
    out = []
    for pat in patterns:
        full = _resolve(base, pat)
        matches = sorted(glob.glob(full))
        if not matches and glob.has_magic(pat):
            raise JobFileError(f"{path}: [[model]] {name!r}: checkpoint pattern {pat!r} matches no file ({full})")
        out.extend(matches or [full])
    return tuple(out)


def _safe_name(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s).strip("._") or "model"


def _default_name(model: str | None, embeddings: str | None) -> str:
    if embeddings:
        return _safe_name(Path(embeddings).stem)
    if model.startswith("local-dir:"):
        return _safe_name(Path(model[len("local-dir:"):]).name)
    return _safe_name(Path(model).stem if model.endswith(".json") else model)


def load_job(path: str | os.PathLike) -> JobFile:
    """Parse and validate a job file. Unknown keys, wrong types and bad values raise JobFileError
    naming the file, the table and the key."""
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise JobFileError(f"job file {path} does not exist; see `hardrank run --help` for an example")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML ({exc})") from exc
    base = path.resolve().parent
    _unknown("the top level", raw, _TOP_KEYS, path)
    if "out" not in raw:
        raise JobFileError(f'{path}: missing key "out" (the results folder), e.g. out = "results/grid"')
    out = _resolve(base, _typed(path, "the top level", "out", raw["out"], "str"))
    default_suites = _typed(path, "the top level", "suites", raw["suites"], "[str]") if "suites" in raw else None

    opts_raw = raw.get("options", {})
    if not isinstance(opts_raw, dict):
        raise JobFileError(f"{path}: options must be a table ([options]), got {type(opts_raw).__name__}")
    _unknown("[options]", opts_raw, [f.name for f in fields(JobOptions)], path)
    opts = {}
    for k, v in opts_raw.items():
        v = _typed(path, "[options]", k, v, _OPTION_KINDS[k])
        if k in _CHOICES and v not in _CHOICES[k]:
            raise JobFileError(f"{path}: [options] {k} must be one of {list(_CHOICES[k])}, got {v!r}")
        if k in ("batch_size", "decode_threads", "budget_mb") and v < 1:
            raise JobFileError(f"{path}: [options] {k} must be >= 1, got {v}")
        opts[k] = _resolve(base, v) if k in _PATHS else v
    options = JobOptions(**opts)

    entries = raw.get("model")
    if not entries:
        raise JobFileError(f"{path}: no [[model]] entries; add at least one with model = ... and checkpoints = [...]"
                           f" (or embeddings = ...)")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise JobFileError(f"{path}: model must be an array of tables ([[model]] ...)")
    models, names = [], set()
    for i, e in enumerate(entries):
        where = f"[[model]] #{i + 1}"
        _unknown(where, e, _MODEL_KEYS, path)
        e = {k: _typed(path, where, k, v, _MODEL_KINDS[k]) for k, v in e.items()}
        if ("model" in e) == ("embeddings" in e):
            raise JobFileError(f"{path}: {where} needs exactly one of model = ... or embeddings = ...")
        if "embeddings" in e and "checkpoints" in e:
            raise JobFileError(f"{path}: {where} gives embeddings and checkpoints; checkpoints need a model")
        suites = e.get("suites", default_suites)
        if not suites:
            raise JobFileError(f"{path}: {where} has no suites; set suites = [...] at the top level or in the entry")
        model = e.get("model")
        if model is not None and (model.endswith(".json") or model.startswith("local-dir:")):
            model = ("local-dir:" + _resolve(base, model[10:])) if model.startswith("local-dir:") else _resolve(base, model)
        embeddings = _resolve(base, e["embeddings"]) if "embeddings" in e else None
        name = e.get("name") or _default_name(model, embeddings)
        if name in names:
            raise JobFileError(f"{path}: two [[model]] entries write to {name!r}; give one a distinct name = ...")
        names.add(name)
        ckpts = _expand(base, e["checkpoints"], path, name) if e.get("checkpoints") else (None,)
        models.append(JobModel(name=name, model=model, embeddings=embeddings, checkpoints=ckpts, suites=tuple(suites)))
    return JobFile(path=path, out=out, models=tuple(models), options=options)


# -- plans (dry runs) ------------------------------------------------------------------------
def plan(*, model: str | None, checkpoints: tuple, suites: tuple, suite_options, store: str,
         precision: str = "auto", device: str = "auto", embeddings: str | None = None, echo=print) -> dict:
    """Print what a run would do, encoding nothing: the suites and their tasks, the unique items,
    and per checkpoint how many items the store already holds. Loads the models (for their
    fingerprints) and reads every image once (for its content key)."""
    from hardrank.items import Tables
    from hardrank.suites import load_suites

    tables = Tables.empty()
    loaded = load_suites(list(suites), tables, suite_options)
    out = {"suites": {}, "images": len(tables.images), "texts": len(tables.texts), "checkpoints": []}
    echo(f"plan: {len(loaded)} suite(s), nothing will be encoded (dry run)")
    for s in loaded:
        tasks = []
        for t in s.ranking:
            tasks.append(f"{t.name}: {t.num_queries} queries x {len(t.gallery_items)} gallery items, "
                         f"{len(t.views)} views ({', '.join(t.views)})")
        for t in s.choice:
            tasks.append(f"{t.name}: {len(t.ids)} rows of {t.left.shape[1]}x{t.right.shape[1]} ({t.rule})")
        out["suites"][s.name] = tasks
        echo(f"  {s.name}")
        for line in tasks:
            echo(f"    {line}")
    keys = {m: tables.of(m).keys() for m in ("image", "text")}
    unreadable = len(tables.images.failed)
    out["unreadable"] = unreadable
    echo(f"unique items: {len(tables.images)} images ({unreadable} unreadable), {len(tables.texts)} texts")
    if embeddings:
        echo(f"embeddings: from {embeddings} (no model, nothing to encode)")
        return out
    from hardrank.models import ModelSpec, load_model
    from hardrank.store import EmbeddingStore

    total = {"image": 0, "text": 0}
    echo(f"store: {store}")
    for c in checkpoints:
        m = load_model(ModelSpec(model, c, precision, device))
        row = {"label": m.label, "fingerprint": m.fingerprint}
        hits = {}
        for mod in ("image", "text"):
            good = [k for i, k in enumerate(keys[mod]) if k and i not in tables.of(mod).failed]
            n_hit = 0
            if (Path(store) / m.fingerprint / "manifest.json").is_file():  # never create a store in a dry run
                st = EmbeddingStore(store, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype)
                n_hit = int(st.contains(mod, list(dict.fromkeys(good))).sum())
            n_unique = len(set(good))
            hits[mod] = (n_hit, n_unique)
            total[mod] += n_unique - n_hit
            row[f"{mod}_hits"], row[f"{mod}_to_encode"] = n_hit, n_unique - n_hit
        out["checkpoints"].append(row)
        echo(f"  {m.label:<24} {m.fingerprint}  store hits: images {hits['image'][0]}/{hits['image'][1]}, "
             f"texts {hits['text'][0]}/{hits['text'][1]}")
    out["to_encode"] = total
    echo(f"would encode {total['image']} images and {total['text']} texts (summed over {len(checkpoints)} "
         f"checkpoint(s); each image is decoded once for all of them)")
    return out


# -- `hardrank run` --------------------------------------------------------------------------
def _suite_options(o: JobOptions):
    from hardrank.suites import SuiteOptions

    return SuiteOptions(data=o.data, images=o.images, annotations=o.annotations, image_variants=o.image_variants,
                        seeds=o.seeds, text_variants=o.text_variants, tie_rule=o.tie_rule)


def _run_entry(job: JobFile, m: JobModel, args) -> None:
    from hardrank.jobs.cli import _default_store

    o = job.options
    store = o.store or _default_store()
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    if args.dry_run:
        plan(model=m.model, checkpoints=m.checkpoints, suites=m.suites, suite_options=_suite_options(o),
             store=store, precision=o.precision, device=o.device, embeddings=m.embeddings, echo=print)
        return
    from hardrank.evaluate import EvalConfig, evaluate
    from hardrank.results import format_table
    from hardrank.jobs.progress import make_progress

    cfg = EvalConfig(model=m.model, checkpoints=m.checkpoints, suites=m.suites, out=os.path.join(job.out, m.name),
                     store=store, suite_options=_suite_options(o), precision=o.precision, device=o.device,
                     batch_size=o.batch_size, decode_threads=o.decode_threads, budget_mb=o.budget_mb,
                     max_failures=o.max_failures, embeddings=m.embeddings)
    report = evaluate(cfg, progress=make_progress(args.quiet), echo=echo)
    print(format_table(report.table_rows()))


def _cmd_run(args) -> int:
    from hardrank.embed import TooManyFailures

    try:
        job = load_job(args.job)
    except JobFileError as exc:
        print(f"hardrank run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    n = sum(len(m.checkpoints) * len(m.suites) for m in job.models)
    print(f"{job.path}: {len(job.models)} model(s), {n} checkpoint x suite runs -> {job.out}", file=sys.stderr)
    codes = []
    for i, m in enumerate(job.models):
        print(f"[{i + 1}/{len(job.models)}] {m.name}: {len(m.checkpoints)} checkpoint(s) x {', '.join(m.suites)}",
              file=sys.stderr, flush=True)
        try:
            _run_entry(job, m, args)
            codes.append(EXIT_OK)
        except TooManyFailures as exc:
            print(f"hardrank run: {m.name}: stopped: {exc}", file=sys.stderr)
            codes.append(EXIT_FAILURES)
        except (FileNotFoundError, ValueError, KeyError) as exc:  # SuiteFormatError is a ValueError
            print(f"hardrank run: {m.name}: error: {exc}", file=sys.stderr)
            codes.append(EXIT_DATA)
    failed = [m.name for m, c in zip(job.models, codes) if c]
    if failed:
        print(f"hardrank run: {len(failed)} of {len(codes)} entries failed: {', '.join(failed)}", file=sys.stderr)
    return next((c for c in codes if c), EXIT_OK)


def add_run_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank run JOB.toml [--dry-run] [--quiet]``."""
    p = subparsers.add_parser(
        "run", help="run a grid of models x checkpoints x suites from a TOML job file",
        description="Run every [[model]] of a TOML job file on its suites (each model's checkpoints share one "
                    "decode). Entries that fail are reported and the others still run; the exit code is that of the "
                    "first failure (2 bad job file, 3 bad data, 4 too many unreadable images).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hardrank run grid.toml --dry-run\n  hardrank run grid.toml --quiet > grid.log\n\n"
               "a job file:\n\n" + EXAMPLE)
    p.add_argument("job", metavar="JOB.toml", help="the job file")
    p.add_argument("--dry-run", action="store_true", help="print the plan (suites, unique items, store hits per "
                   "checkpoint) and encode nothing")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_run)
    return p
