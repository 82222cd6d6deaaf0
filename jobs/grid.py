"""`hardrank run JOB.toml`: grids of models x checkpoints x suites from a TOML job file, and dry-run plans."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import glob
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib

from hardrank import suite_registry
from hardrank.config import EvalConfig, SuiteOptions, build, flat_fields, opt, split_per_suite
from hardrank.errors import EXIT_OK, INPUT_FILE_ERRORS, HardrankError, TooManyFailures, UsageError, exit_code
from hardrank.evaluate import evaluate, plan
from hardrank.executors import executor
from hardrank.jobs.commands import COMMANDS
from hardrank.jobs.flags import Formatter, add_cli_flags, add_options, options_from_args
from hardrank.jobs.progress import make_progress
from hardrank.models import spec
from hardrank.scoring.results import format_table

__all__ = ["JobFile", "JobModel", "JobFileError", "load_job", "print_plan", "add_run_parser", "option_keys",
           "RunConfig"]

EXAMPLE = """\
# results go to <out>/<model name>/<checkpoint>/<suite>.json; relative paths are relative to this file
out = "results/grid"
suites = ["rococo", "karpathy"]        # default suites of every [[model]]

[options]                              # optional; the names of the `hardrank eval` flags
annotations = "data/rococo"
images = "/data/coco"
image_variants = ["mix_0.9"]
seeds = [1, 10, 100]
batch_size = 256
executor = "local"                     # or "ray"
decoder = "pillow"                     # or "dali"
search = "exhaustive"                  # or "faiss:IVF1024,Flat"

[[model]]
model = "ViT-B-32"                     # as --model: a name, config .json, hf-hub:, local-dir:, hf: or blip:
pretrained = "laion2b_s34b_b79k"       # its weights from the local cache (no checkpoints given)

[[model]]
name = "exp1"
run = "logs/exp1"                      # an open_clip training run: params.txt + checkpoints/epoch_*.pt

[[model]]
name = "mine"                          # results folder name (default: from model / embeddings)
embeddings = "my_model.parquet"        # precomputed embeddings instead of a model
suites = ["rococo"]                    # overrides the top-level suites
"""

EXAMPLE_PER_SUITE = """\
# suites as tables: each suite's own data (any suite option; paths relative to this file)
out = "results/compositional"

[suites.sugarcrepe]
data = "data/sugarcrepe"
images = "/data/coco/val2017"

[suites.aro]
data = "data/aro"
images = "/data/vg_images"

[options]                              # every suite's, unless its table says otherwise
batch_size = 256

[[model]]
model = "ViT-B-32"
pretrained = "openai"
"""

# set per [[model]] entry, not in [options]; per-suite values go in [suites.NAME] tables
_ENTRY_FIELDS = ("suites", "out", "model", "checkpoints", "pretrained", "random_init", "run", "embeddings",
                 "per_suite")


def option_keys() -> tuple[str, ...]:
    """The keys of [options]: every option of `hardrank eval` but those of an entry (the suites' own included)."""
    return tuple(name for name, _, _ in flat_fields(EvalConfig) if name not in _ENTRY_FIELDS)


def _suite_keys() -> tuple[str, ...]:
    """The keys of a [suites.NAME] table: every suite option (the shared ones and the suites' own)."""
    return tuple(name for name, _, _ in flat_fields(SuiteOptions) if name != "per_suite")
_TOP_KEYS = ("out", "suites", "options", "model")


class JobFileError(UsageError):
    """The job file is not valid TOML or does not follow the schema (a usage error: exit code 2)."""


@dataclass(frozen=True)
class _Entry:
    """The keys of one [[model]] table."""

    name: str | None = opt(None, "results sub-folder: <out>/<name>/<checkpoint>/")
    model: str | None = opt(None, "the model", listing="models")
    pretrained: str | None = opt(None, "open_clip pretrained tag")
    random_init: bool = opt(False, "random weights on purpose")
    run: str | None = opt(None, "an open_clip training run folder", path=True)
    embeddings: str | None = opt(None, "precomputed embeddings Parquet instead of a model", path=True)
    checkpoints: tuple[str, ...] = opt((), "checkpoint files or globs")
    suites: tuple[str, ...] | None = opt(None, "suites of this entry (default: the top-level suites)")


@dataclass(frozen=True)
class JobModel:
    """One [[model]] entry: its results folder name and its whole evaluation config."""

    name: str
    config: EvalConfig

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def embeddings(self) -> str | None:
        return self.config.embeddings

    @property
    def checkpoints(self) -> tuple:
        return self.config.checkpoints

    @property
    def suites(self) -> tuple[str, ...]:
        return self.config.suites


@dataclass(frozen=True)
class JobFile:
    path: Path
    out: str
    models: tuple[JobModel, ...]
    options: dict  # the [options] table as validated values


def _known(where: str, keys, known, path: Path) -> None:
    bad = [k for k in keys if k not in known]
    if bad:
        hint = difflib.get_close_matches(bad[0], known, n=1)
        did = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise JobFileError(f"{path}: unknown key {bad[0]!r} in {where}{did}; known keys: {', '.join(known)}")


def _resolve(base: Path, p: str) -> str:
    p = os.path.expanduser(p)
    return p if os.path.isabs(p) or "://" in p else os.fspath(base / p)


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


def _check_name(name: str, path: Path, where: str) -> None:
    """A name is one folder inside ``out``: a separator or ``..`` would put results elsewhere."""
    bad = [c for c in ("/", "\\", "\0") if c in name]
    if bad or name in ("", ".", ".."):
        why = f"it holds {bad[0]!r}" if bad else "it is empty" if not name else f"{name!r} is out or its parent"
        raise JobFileError(f"{path}: {where}: name {name!r} is not a folder name ({why}); results go to "
                           f"<out>/<name>/<checkpoint>/, so a name holds no '/', '\\' or NUL and is not '.' or "
                           f"'..': use e.g. name = {_safe_name(name)!r}")


def _default_name(model: str | None, embeddings: str | None, run: str | None = None,
                  pretrained: str | None = None) -> str:
    if embeddings:
        return _safe_name(Path(embeddings).stem)
    if run:
        return _safe_name(Path(run).name)
    if pretrained:
        return _safe_name(f"{model}-{pretrained}")
    return _safe_name(spec.label(model))


def _model_path(base: Path, model: str | None) -> str | None:
    """A model's local path is relative to the job file, as its kind reads it (``hardrank.models.spec.rebased``);
    a model name is not a path."""
    return None if model is None else spec.rebased(model, base)


def _suite_tables(raw, path: Path) -> tuple[tuple[str, ...] | None, dict]:
    """(the default suites, {suite: {option: value}}) of the top-level ``suites``: a list of names, or
    tables ``[suites.NAME]`` (each suite with its own option values; its order is the suites')."""
    if "suites" not in raw:
        return None, {}
    value = raw["suites"]
    if not isinstance(value, dict):
        try:
            return build(_Entry, {"suites": value}).suites, {}
        except UsageError as exc:
            raise JobFileError(f"{path}: the top level: {exc}") from exc
    for name, table in value.items():
        if not suite_registry.is_suite(name):
            names = sorted([*suite_registry.names(), *suite_registry.aliases()])
            hint = difflib.get_close_matches(name, names, n=1)
            raise JobFileError(f"{path}: [suites.{name}]: no suite is named {name!r}"
                               + (f" (did you mean {hint[0]!r}?)" if hint else "") + f"; suites: {', '.join(names)}")
        if not isinstance(table, dict):
            raise JobFileError(f"{path}: suites.{name} must be a table ([suites.{name}] with option = value lines), "
                               f"got {type(table).__name__} {table!r}")
        _known(f"[suites.{name}]", table, _suite_keys(), path)
    return tuple(value), {name: dict(table) for name, table in value.items() if table}


def _split_options(opts: dict, per: dict, path: Path) -> dict:
    """[options] with each per-suite value (``data = {aro = "..."}``, ``"aro=..."``) moved into ``per``, where a
    suite's [suites.NAME] table wins."""
    fields = {name: f for name, f, _ in flat_fields(SuiteOptions)}
    out = dict(opts)
    for k, v in opts.items():
        if k in fields and fields[k].metadata.get("per_suite"):
            try:
                default, pairs = split_per_suite(fields[k], v, "[options] ")
            except UsageError as exc:
                raise JobFileError(f"{path}: {exc}") from exc
            if default is None:
                out.pop(k)
            else:
                out[k] = default
            for suite, value in pairs:
                per.setdefault(suite, {}).setdefault(k, value)
    return out


def _for_suites(opts: dict, per: dict, suites) -> dict:
    """The options of an entry running ``suites``: the suite options none of them takes left out (another
    entry's), and the per-suite tables of those suites."""
    names = set(suite_registry.expand(suites))
    own = suite_registry.own_fields()
    kept = {k: v for k, v in opts.items() if k not in own or set(own[k][2]) & names}
    tables = {s: t for s, t in per.items() if set(suite_registry.expand([s])) & names}
    return {**kept, **({"per_suite": tables} if tables else {})}


def load_job(path: str | os.PathLike) -> JobFile:
    """Parse and validate a job file. Unknown keys, wrong types and bad values raise JobFileError
    naming the file, the table and the key."""
    path = Path(path)
    if not path.is_file():
        raise JobFileError(f"job file {path} does not exist; see `hardrank run --help` for an example")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise JobFileError(f"{path}: not valid TOML ({exc})") from exc
    base = path.resolve().parent
    _known("the top level", raw, _TOP_KEYS, path)
    if "out" not in raw:
        raise JobFileError(f'{path}: missing key "out" (the results folder), e.g. out = "results/grid"')
    if not isinstance(raw["out"], str):
        raise JobFileError(f"{path}: out must be a string (the results folder), got {raw['out']!r}")
    out = _resolve(base, raw["out"])
    opts = raw.get("options", {})
    if not isinstance(opts, dict):
        raise JobFileError(f"{path}: options must be a table ([options]), got {type(opts).__name__}")
    _known("[options]", opts, option_keys(), path)
    default_suites, per = _suite_tables(raw, path)
    opts = _split_options(opts, per, path)

    entries = raw.get("model")
    if not entries:
        raise JobFileError(f"{path}: no [[model]] entries; add at least one with model = ... and checkpoints = [...]"
                           f" (or embeddings = ...)")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise JobFileError(f"{path}: model must be an array of tables ([[model]] ...)")
    parsed = []
    for i, raw_entry in enumerate(entries):
        where = f"[[model]] #{i + 1}"
        _known(where, raw_entry, [f.name for f in dataclasses.fields(_Entry)], path)
        try:
            e = build(_Entry, raw_entry, base=base)
        except UsageError as exc:
            raise JobFileError(f"{path}: {where}: {exc}") from exc
        if not (e.suites or default_suites):
            raise JobFileError(f"{path}: {where} has no suites; set suites = [...] at the top level or in the entry")
        parsed.append((where, e, e.suites or default_suites))
    every = [s for _, _, suites in parsed for s in suites]
    try:  # the options alone, checked once against every suite the job runs; then the per-suite tables
        build(EvalConfig, {**opts, "suites": every}, base=base)
    except UsageError as exc:
        raise JobFileError(f"{path}: [options] {exc}") from exc
    try:
        build(EvalConfig, {**opts, "per_suite": per, "suites": every}, base=base)
    except UsageError as exc:
        raise JobFileError(f"{path}: per-suite options: {exc}") from exc

    models, names = [], set()
    for where, e, suites in parsed:
        if sum(v is not None for v in (e.model, e.embeddings, e.run)) != 1:
            raise JobFileError(f"{path}: {where} needs exactly one of model = ..., run = ... or embeddings = ...")
        if e.embeddings and e.checkpoints:
            raise JobFileError(f"{path}: {where} gives embeddings and checkpoints; checkpoints need a model")
        model = _model_path(base, e.model)
        if e.name is not None:
            _check_name(e.name, path, where)
        name = e.name or _default_name(model, e.embeddings, e.run, e.pretrained)
        if name in names:
            raise JobFileError(f"{path}: two [[model]] entries write to {name!r}; give one a distinct name = ...")
        names.add(name)
        ckpts = _expand(base, e.checkpoints, path, name) if e.checkpoints else (None,)
        try:
            cfg = build(EvalConfig, {**_for_suites(opts, per, suites), "suites": suites,
                                     "out": os.path.join(out, name), "model": model, "checkpoints": ckpts,
                                     "pretrained": e.pretrained, "random_init": e.random_init, "run": e.run,
                                     "embeddings": e.embeddings}, base=base)
        except UsageError as exc:
            raise JobFileError(f"{path}: {where}: {exc}") from exc
        models.append(JobModel(name=name, config=cfg))
    return JobFile(path=path, out=out, models=tuple(models), options=dict(raw.get("options", {})))


# -- plans (dry runs) ------------------------------------------------------------------------
def print_plan(p: dict, echo=print) -> None:
    """The dry-run plan of ``hardrank.evaluate.plan`` as text."""
    echo(f"plan: {len(p['suites'])} suite(s), nothing will be encoded or written (dry run)")
    if p.get("would_build"):
        w = p["would_build"]
        echo(f"  the toy world is not built yet: a real run first builds it in {w['toy world']} (about 30 s); "
             f"{', '.join(w['suites'])} are counted once it exists")
    if not p["suites"]:
        return
    for name, tasks in p["suites"].items():
        inputs = (p.get("inputs") or {}).get(name)
        echo(f"  {name}" + (f"  ({', '.join(f'{k} {v}' for k, v in inputs.items())})" if inputs else ""))
        for line in tasks:
            echo(f"    {line}")
    dup = p.get("image_duplicates", 0)
    read = f"{p['unreadable']} unreadable" if "unreadable" in p else "image files not read"
    echo(f"items: {p['images']} images ({read}"
         + (f", {dup} duplicates of another image's content, embedded once" if dup else "")
         + f"), {p['texts']} texts (distinct normalised captions)")
    if not p["checkpoints"]:
        echo("nothing to encode (precomputed embeddings, suites that score predictions, or none loaded)")
        return
    echo(f"store: {p['store']}")
    for row in p["checkpoints"]:
        echo(f"  {row['label']:<24} {row['fingerprint']}  store hits: "
             f"images {row['image_hits']}/{row['image_unique']}, texts {row['text_hits']}/{row['text_unique']}")
    n = len(p["checkpoints"])
    echo(f"would encode {p['to_encode']['image']} images and {p['to_encode']['text']} texts (summed over {n} "
         f"checkpoint(s); each image is decoded once for all of them)")


# -- `hardrank run` --------------------------------------------------------------------------
def _run_entry(job: JobFile, m: JobModel, args) -> None:
    if args.dry_run:
        print_plan(plan(m.config), echo=print)
        return
    echo = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    runners = getattr(args, "runners", None)  # set by `_cmd_run`: executors shared by the job's entries
    report = evaluate(m.config, progress=make_progress(args.quiet), echo=echo,
                      runner=_shared_runner(m.config, runners) if runners is not None else None)
    print(format_table(report.table_rows()))
    report.raise_failures()  # a suite that could not be loaded: the others ran; exit nonzero now


def _shared_runner(cfg: EvalConfig, runners: dict):
    """One Ray executor per cluster address for every entry of a job file (``--executor ray``): the Ray
    session started (or joined) for the first entry serves the later ones, instead of a ``ray.init`` and
    ``ray.shutdown`` per entry. None for the in-process executor (each entry uses its own live models)."""
    ex = executor(cfg.embed)
    key = ex.shared_runner_key()
    if key is None or cfg.embeddings is not None:
        return None
    if key not in runners:
        runners[key] = ex.embed_runner([])
    return runners[key]


@dataclass(frozen=True)
class RunConfig:
    """A grid run: the job file; its entries and their options are all in it."""

    job: str = opt("", "the job file", positional=True, metavar="JOB.toml", path=True)


def _cmd_run(args) -> int:
    try:
        job = load_job(options_from_args(RunConfig, args).job)
    except JobFileError as exc:
        print(f"hardrank run: {exc}", file=sys.stderr)
        return exit_code(exc)
    n = sum(len(m.checkpoints) * len(m.suites) for m in job.models)
    print(f"{job.path}: {len(job.models)} model(s), {n} checkpoint x suite runs -> {job.out}", file=sys.stderr)
    codes = []
    args.runners = runners = {}  # cluster address -> the Ray executor shared by the entries (closed at the end)
    try:
        _run_entries(job, args, codes)
    finally:
        for r in runners.values():
            r.close()
    failed = [m.name for m, c in zip(job.models, codes) if c]
    if failed:
        print(f"hardrank run: {len(failed)} of {len(codes)} entries failed: {', '.join(failed)}; the others' "
              f"results are written", file=sys.stderr)
    return next((c for c in codes if c), EXIT_OK)


def _run_entries(job: JobFile, args, codes: list) -> None:
    for i, m in enumerate(job.models):
        print(f"[{i + 1}/{len(job.models)}] {m.name}: {len(m.checkpoints)} checkpoint(s) x {', '.join(m.suites)}",
              file=sys.stderr, flush=True)
        try:
            _run_entry(job, m, args)
            codes.append(EXIT_OK)
        except TooManyFailures as exc:
            print(f"hardrank run: {m.name}: stopped: {exc}", file=sys.stderr)
            codes.append(exit_code(exc))
        except (HardrankError, *INPUT_FILE_ERRORS) as exc:
            print(f"hardrank run: {m.name}: error: {exc}", file=sys.stderr)  # a failing entry: the others still run
            codes.append(exit_code(exc))
        except Exception as exc:  # anything else (a library's error on a garbage file, a bug): reported, go on
            print(f"hardrank run: {m.name}: error: {type(exc).__name__}: {exc}"
                  f"{'' if getattr(args, 'verbose', False) else ' (hardrank -v run ... shows the traceback)'}",
                  file=sys.stderr)
            if getattr(args, "verbose", False):
                traceback.print_exc()
            codes.append(exit_code(exc))


def add_run_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``hardrank run JOB.toml [--dry-run] [--quiet]``."""
    p = subparsers.add_parser(
        "run", help=COMMANDS["run"],
        description="Run every [[model]] of a TOML job file on its suites (each model's checkpoints share one "
                    "decode). Entries that fail (for any reason) are reported and the others still run; the exit "
                    "code is that of the first failure (2 bad job file or options, 3 bad data, 4 too many "
                    "unreadable images, 5 no space left, 1 anything else; 130 Ctrl-C, 143 SIGTERM). [options] takes "
                    f"the names of the `hardrank eval` flags: {', '.join(option_keys())}; [suites.NAME] tables "
                    "(instead of a top-level suites = [...] list) give a suite its own values of the suite options "
                    "(docs/evaluate.md).",
        formatter_class=Formatter,
        epilog="examples:\n  hardrank run grid.toml --dry-run\n  hardrank run grid.toml --quiet > grid.log\n\n"
               "a job file:\n\n" + EXAMPLE + "\nor, each suite with its own data:\n\n" + EXAMPLE_PER_SUITE)
    add_options(p, RunConfig, required=("job",))
    add_cli_flags(p, "dry_run", "quiet")
    p.set_defaults(func=_cmd_run)
    return p
