"""Options defined once: config dataclasses whose fields carry their help, parsed specs, the device.

Every option is a field of a frozen dataclass below, declared with ``opt(default, help, ...)``. The
same field is a ``--flag`` of the command line (``hardrank.jobs.cli`` builds argparse from
``flat_fields``), a key of a TOML job file's ``[options]`` table and a keyword of the Python API
(both through ``build``). Nested dataclass fields (``EvalConfig.embed``) flatten into one
namespace of unique names, so ``batch_size`` means the same thing everywhere. A suite's own options
are declared beside its loader and registered with it (``hardrank.suite_registry``); they join this
namespace where ``SuiteOptions.own`` stands.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import threading
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hardrank import suite_registry, urls
from hardrank.cpus import check_threads
from hardrank.errors import UsageError
from hardrank.kernels import PRECISIONS as RANK_PRECISIONS
from hardrank.kernels import TIE_RULES
from hardrank.options import check_options, opt
from hardrank.options import option_label as _named
from hardrank.scoring import backends, rerank
from hardrank.scoring.backends import RANKS, TOPK, SearchSpec
from hardrank.scoring.statistics import RESAMPLES
from hardrank.text import CAPTION_PROTOCOLS

__all__ = ["DATA_DIR", "PRECISIONS", "RANK_PRECISIONS", "EXECUTORS", "DECODERS", "KEY_BY", "TIE_RULES",
           "DIRECTIONS", "opt", "check_options", "flat_fields", "option_kind", "build", "cache_dir",
           "default_store",
           "check_writable_dir", "check_store_root",
           "EmbedOptions", "SuiteOptions", "EvalConfig", "MineOptions", "MineConfig", "IndexBuildConfig", "LOGGERS",
           "LogTarget",
           "parse_log_to"]

DATA_DIR = Path(__file__).resolve().parent / "assets"  # bundled model configs, toy checkpoints, vocabularies

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
EXECUTORS = ("local", "ray")
DECODERS = ("pillow", "dali", "pillow-draft")
KEY_BY = ("content", "id")  # = hardrank.store.idkeys.KEY_BY
DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text"), "t2t": ("text", "text"), "i2i": ("image", "image")}
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")


def cache_dir() -> Path:
    """``$HARDRANK_CACHE``, else ``~/.cache/hardrank``: the default store and the toy world live here."""
    return Path(os.environ.get("HARDRANK_CACHE") or Path.home() / ".cache" / "hardrank")


def default_store() -> str:
    return str(cache_dir() / "store")


def check_writable_dir(path: str | os.PathLike, option: str) -> Path | str:
    """``path`` as a folder this process can write, created if missing; otherwise a UsageError naming
    ``option`` (e.g. ``out (--out)``), raised before any work is done. A URL (``s3://...``) is checked
    by writing and removing a probe object (credentials fail here) and returned as it is."""
    if urls.is_url(os.fspath(path)):
        urls.check_writable_url(os.fspath(path), option)
        return os.fspath(path)
    p = Path(urls.local_path(path)).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"option {option} is {str(p)!r}, which is a file, not a folder; pass a folder "
                         f"(it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".hardrank-write-test-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"option {option} is {str(p)!r}, which cannot be written ({exc.strerror or exc}); "
                         f"pass a writable folder") from None
    return p


def check_store_root(path: str | os.PathLike, option: str = "store (--store)") -> None:
    """The store root, before any work: an existing folder passes, writable or not (a shared, read-only
    cache serves the embeddings it holds; each model's folder is checked when the run opens it, and a run
    that would have to write where it cannot stops before encoding: ``hardrank.embed.pipeline``); a missing
    one must be creatable, a URL writable (``check_writable_dir``), else a UsageError naming ``option``."""
    if not urls.is_url(os.fspath(path)) and Path(urls.local_path(path)).expanduser().is_dir():
        return
    check_writable_dir(path, option)


# -- training dashboards (hardrank.dashboards logs to them) --------------------------------------------
# logger -> (what follows the colon, the extra and package that provide it)
LOGGERS = {"tensorboard": ("DIR", "tensorboard"), "wandb": ("PROJECT", "wandb"), "mlflow": ("URI", "mlflow")}
_SPELLING = ", ".join(f"{k}:{v[0]}" for k, v in LOGGERS.items())


@dataclass(frozen=True)
class LogTarget:
    """One ``--log-to KIND:WHERE``."""

    kind: str    # tensorboard | wandb | mlflow
    where: str   # the folder, project or tracking URI


def parse_log_to(spec: str) -> LogTarget:
    """``tensorboard:runs/exp1`` -> LogTarget; UsageError naming the spelling for anything else."""
    kind, sep, where = str(spec).partition(":")
    if kind not in LOGGERS:
        raise UsageError(f"--log-to {spec!r}: unknown logger {kind!r}; use one of {_SPELLING}")
    if not sep or not where:
        raise UsageError(f"--log-to {spec!r}: {kind} needs its {LOGGERS[kind][0]} after the colon, e.g. "
                         f"{kind}:{ {'tensorboard': 'runs/exp1', 'wandb': 'my-project', 'mlflow': 'mlruns'}[kind]}")
    return LogTarget(kind, where)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def flat_fields(cls) -> list[tuple[str, dataclasses.Field, object]]:
    """(name, field, type) of every option of ``cls``, nested options dataclasses flattened; the options
    the registered suites declare stand where ``SuiteOptions.own`` is (``hardrank.suite_registry``)."""
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(flat_fields(tp))
        elif f.metadata.get("declared_by") == "suites":
            out.extend((name, fld, _hints(owner)[name])
                       for name, (fld, owner, _) in suite_registry.own_fields().items())
        else:
            out.append((f.name, f, tp))
    return out


def _nested_fields(cls) -> dict[str, type]:
    """Field name -> options dataclass, for every nested options field at any depth."""
    out = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out[f.name] = hints[f.name]
            out.update(_nested_fields(hints[f.name]))
    return out


def option_kind(tp) -> tuple[object, bool, bool]:
    """(scalar type, is a list, may be None) of an option's type hint."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0]
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        if typing.get_origin(item) in (typing.Union, types.UnionType):  # tuple[str | None, ...]
            item = [a for a in typing.get_args(item) if a is not type(None)][0]
        return item, True, optional
    return tp, False, optional


def _shown(v) -> str:
    """A received value as a message shows it: a plain value's repr on one line, cut at 60 characters; any
    other object by its type alone (a model's repr runs to dozens of lines)."""
    if isinstance(v, (str, int, float, bool, os.PathLike, list, tuple, dict)) or v is None:
        r = " ".join(repr(v).split())
        return r if len(r) <= 60 else r[:57] + "..."
    return f"(a {type(v).__module__}.{type(v).__qualname__} object)"


def _coerce(name: str, value, tp, where: str, takes: str = ""):
    """A job-file / keyword value checked against the option's type; lists become tuples. ``takes``: the
    option's help, said when the value is refused."""
    takes = f"; {name}: {takes}" if takes else ""
    scalar, is_list, optional = option_kind(tp)
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    inner = tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)][0]
    item_optional = is_list and type(None) in typing.get_args(typing.get_args(inner)[0])  # tuple[str | None, ...]

    def one(v):
        if v is None and item_optional:
            return None
        ok = (isinstance(v, bool) if scalar is bool else
              isinstance(v, (int, float)) and not isinstance(v, bool) if scalar is float else
              isinstance(v, int) and not isinstance(v, bool) if scalar is int else
              isinstance(v, (str, os.PathLike)) if scalar is str else True)
        if not ok:
            what = names.get(scalar, str(scalar))
            what = f"a list of {what}s" if is_list else ("an " if what[0] in "aeiou" else "a ") + what
            raise UsageError(f"{where}option {name!r} must be {what}, got {type(v).__name__} {_shown(v)}{takes}")
        return float(v) if scalar is float else (os.fspath(v) if scalar is str else v)

    if value is None:
        if optional:
            return None
        raise UsageError(f"{where}option {name!r} cannot be empty")
    if is_list:
        if isinstance(value, (str, int, float, os.PathLike)) and not isinstance(value, bool):
            value = [value]  # a single value where a list is expected is fine
        if not isinstance(value, (list, tuple)):
            raise UsageError(f"{where}option {name!r} must be a list, got {type(value).__name__} {_shown(value)}"
                             f"{takes}")
        return tuple(one(v) for v in value)
    return one(value)


def build(cls, values: Mapping, *, where: str = "", base: str | os.PathLike | None = None):
    """``cls`` built from a flat mapping of option names (nested dataclasses filled by field name).
    Unknown names and wrong types raise UsageError naming the option and the closest known one;
    ``path`` options are taken relative to ``base`` when given. ``where`` prefixes messages. A
    ``per_suite`` option's string values follow the flag's grammar (``SUITE=PATH``: ``split_per_suite``)."""
    flat = flat_fields(cls)
    known = {name: (f, tp) for name, f, tp in flat}
    if len(known) < len(flat):
        twice = sorted({n for n, _, _ in flat if sum(m == n for m, _, _ in flat) > 1})
        raise ValueError(f"{cls.__name__}: option name(s) {twice} declared twice (a suite's own option named as "
                         f"another option?); rename one")
    nested = _nested_fields(cls)  # a whole options object may be given under its field name
    for k in values:
        if k in nested:
            if not isinstance(values[k], nested[k]):
                raise UsageError(f"{where}option {k!r} must be a {nested[k].__name__}, got {type(values[k]).__name__}")
            clash = [n for n, _, _ in flat_fields(nested[k]) if n in values]
            if clash:
                raise UsageError(f"{where}give {k} or its options {clash}, not both")
            continue
        if k not in known:
            hint = difflib.get_close_matches(k, list(known), n=1)
            raise UsageError(f"{where}unknown option {k!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                             + f"; known options: {', '.join(sorted(known))}")

    def coerced(name, f, tp, v):
        v = _coerce(name, v, tp, where, f.metadata.get("help", ""))
        if base is not None and f.metadata.get("path") and v is not None:
            v = _relative_to(base, v)
        return v

    def make(c):
        hints = _hints(c)
        kw, per = {}, []
        for f in dataclasses.fields(c):
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp):
                kw[f.name] = values[f.name] if f.name in values else make(tp)
            elif f.metadata.get("declared_by") == "suites":  # the suites' own options, as given
                own = suite_registry.own_fields()
                kw[f.name] = tuple((n, coerced(n, fld, t, values[n])) for n, fld, t in flat_fields(c)
                                   if n in values and n in own)
            elif f.metadata.get("per_suite_table"):  # {suite: {option: value}}
                if f.name in values:
                    options = {n: (fld, t) for n, fld, t in flat_fields(c) if not fld.metadata.get("per_suite_table")}
                    per += [(s, n, coerced(n, *options[n], v))
                            for s, n, v in _per_suite_items(values[f.name], options, where)]
            elif f.metadata.get("per_suite") and f.name in values:  # a value for every suite, and SUITE=VALUE
                default, pairs = split_per_suite(f, values[f.name], where)
                kw[f.name] = None if default is None else coerced(f.name, f, tp, default)
                per += [(s, f.name, coerced(f.name, f, tp, v)) for s, v in pairs]
            elif f.name in values:
                kw[f.name] = coerced(f.name, f, tp, values[f.name])
        if per:
            kw["per_suite"] = tuple(per)
        return c(**kw)

    return make(cls)


_SUITE_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")  # what a mistyped suite name before '=' looks like


def split_per_suite(f: dataclasses.Field, value, where: str = "") -> tuple[str | None, list[tuple[str, str]]]:
    """(the value for every suite, [(suite, value)]) of a ``per_suite`` option ``f`` as given: a string, a
    list of strings (the command line's ``--data DIR sugarcrepe=DIR2``) or a mapping ``{suite: value}``.
    A string ``NAME=REST`` is a value for suite NAME only when NAME is a registered suite or alias (so
    ``C:\\data``, ``s3://b/k=v`` and ``a/b=c`` are plain values); a plain word before '=' that names no suite,
    where no such path exists, is taken for a mistyped suite name (UsageError listing the suites; a path
    holding '=' is written ``./NAME=REST``). Path objects are values as they are. At most one plain value."""
    if value is None:
        return None, []
    if isinstance(value, Mapping):
        items = list(value.items())
        for k, v in items:
            if not isinstance(k, str) or not suite_registry.is_suite(k):
                raise UsageError(f"{where}option {_named(f)}: {_no_suite(k)}")
            if not isinstance(v, (str, os.PathLike)):
                raise UsageError(f"{where}option {_named(f)} for suite {k}: expected a path, got "
                                 f"{type(v).__name__} {v!r}")
        return None, _once(f, [(k, os.fspath(v)) for k, v in items], where)
    tokens = [value] if isinstance(value, (str, os.PathLike)) else value
    if not isinstance(tokens, (list, tuple)):
        raise UsageError(f"{where}option {_named(f)} must be a path, a list of SUITE=PATH or a mapping "
                         f"{{suite: path}}, got {type(value).__name__} {value!r}")
    default, pairs = None, []
    for t in tokens:
        if not isinstance(t, (str, os.PathLike)):
            raise UsageError(f"{where}option {_named(f)} takes paths, got {type(t).__name__} {t!r}")
        key, eq, rest = t.partition("=") if isinstance(t, str) else ("", "", "")
        if eq and suite_registry.is_suite(key):
            if not rest:
                raise UsageError(f"{where}option {_named(f)}: {t!r} gives suite {key} no value; write {key}=PATH")
            pairs.append((key, rest))
            continue
        if eq and _SUITE_WORD.match(key) and not urls.is_url(t) and not os.path.exists(os.path.expanduser(t)):
            raise UsageError(f"{where}option {_named(f)}: {t!r} is SUITE=PATH (one suite's own path), but "
                             f"{_no_suite(key)}; a path holding '=' is written ./{t}")
        if default is not None:
            raise UsageError(f"{where}option {_named(f)} has two values for every suite, {default!r} and "
                             f"{os.fspath(t)!r}; give one, and SUITE=PATH for the others")
        default = os.fspath(t)
    return default, _once(f, pairs, where)


def _once(f, pairs, where):
    seen = [s for s, _ in pairs]
    twice = sorted({s for s in seen if seen.count(s) > 1})
    if twice:
        raise UsageError(f"{where}option {_named(f)} gives suite {twice[0]} two values; give one")
    return pairs


def _no_suite(name) -> str:
    """``'x' names no suite (did you mean 'y'?); suites: ...``: the message part for a per-suite key."""
    known = [*suite_registry.names(), *suite_registry.aliases()]
    hint = difflib.get_close_matches(str(name), known, n=1)
    return (f"{name!r} names no suite" + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; suites: {', '.join(sorted(known))}")


def _per_suite_items(table, options: dict, where: str) -> list[tuple[str, str, object]]:
    """(suite, option, value) of a ``{suite: {option: value}}`` table, names checked."""
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}option 'per_suite' must be a mapping {{suite: {{option: value}}}}, got "
                         f"{type(table).__name__} {table!r}")
    out = []
    for s, opts in table.items():
        if not isinstance(s, str) or not suite_registry.is_suite(s):
            raise UsageError(f"{where}per-suite options: {_no_suite(s)}")
        if not isinstance(opts, Mapping):
            raise UsageError(f"{where}the options of suite {s} must be a table {{option: value}}, got "
                             f"{type(opts).__name__} {opts!r}")
        for k, v in opts.items():
            if k not in options:
                hint = difflib.get_close_matches(k, list(options), n=1)
                raise UsageError(f"{where}suite {s}: unknown option {k!r}"
                                 + (f" (did you mean {hint[0]!r}?)" if hint else "")
                                 + f"; a suite takes: {', '.join(sorted(options))}")
            out.append((s, k, v))
    return out


def _relative_to(base, v):
    def one(p):
        if p is None:  # checkpoints: (None,) is the model's random init
            return None
        p = os.path.expanduser(p)
        if "://" in p or os.path.isabs(p):
            return p
        return os.fspath(Path(base) / p)

    return tuple(one(p) for p in v) if isinstance(v, tuple) else one(v)


# -- the options ----------------------------------------------------------------------------------
_RANK_PRECISION_HELP = ("first GEMM of the exact kernels (ranks, exact top-k): auto = bf16/fp16 where the "
                        "hardware multiplies them fast (AMX, AVX512-BF16, CUDA tensor cores) and the problem is "
                        "large, else fp32; results are identical either way (scores the low-precision bound leaves "
                        "undecided are re-scored exactly); fp32 forces fp32")

@dataclass(frozen=True)
class EmbedOptions:
    """How items become embeddings: the store, the encoder's precision and device, the executor."""

    store: str | None = opt(None, "embedding store root (default: $HARDRANK_CACHE/store or "
                            "~/.cache/hardrank/store); reused across runs", path=True)
    precision: str = opt("auto", "encoder precision: auto = fp16 on CUDA, fp32 on CPU; bf16 on a CPU "
                         "with AVX512-BF16/AMX: ~1.8x faster image towers, embeddings within ~2e-3 of fp32 "
                         "(benchmarks/README.md)", choices=PRECISIONS)
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    batch_size: int = opt(256, "images/texts per encoder batch", minimum=1)
    decode_threads: int | None = opt(None, "image decode threads, 1 to 4 per CPU (default: the thread budget, "
                                     "--threads, at most 8)", minimum=1, check=check_threads)
    threads: int | None = opt(None, "threads this process computes with, 1 to 4 per CPU: torch, decoding, FAISS, Ray "
                              "actors (default: the cores it may use, min of CPU affinity and cgroup quota, less "
                              "those busy at start; $HARDRANK_THREADS or $OMP_NUM_THREADS also set it); results do "
                              "not depend on it", minimum=1, check=check_threads)
    max_failures: int | None = opt(100, "unreadable images tolerated (recorded, skipped) before the run stops",
                                   minimum=0)
    executor: str = opt("local", "local: in-process threads, no cluster start-up (best for small jobs and CI); "
                        "ray: long-lived Ray actors (decode actors, one encoder per GPU holding all checkpoints; "
                        "CPU only: one actor per node), joining --ray-address / $RAY_ADDRESS or starting a local "
                        "cluster", choices=EXECUTORS)
    decoder: str = opt("pillow", "pillow: the model's own transform, the reference; dali: NVIDIA DALI decode + "
                       "resize (GPU if present, else CPU), within a tested bound of pillow, stored separately; "
                       "pillow-draft: pillow decoding large JPEGs at 1/2-1/8 scale first (faster; within a tested "
                       "bound of pillow, identical for images under 2x the model's size), stored separately",
                       choices=DECODERS)
    ray_address: str | None = opt(None, "Ray cluster to join with --executor ray (default: $RAY_ADDRESS, "
                                  "else a local cluster)")
    key_by: str = opt("content", "how store hits are decided: content (hash every image's bytes first: finds "
                      "duplicates before encoding) or id (path + size + mtime, URL + ETag, or shard sample: no "
                      "image is read to decide; new images are hashed by the workers that decode them)",
                      choices=KEY_BY)

    def __post_init__(self):
        check_options(self)
        if not _DEVICE.match(self.device):
            raise UsageError(f"option device (--device) must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.ray_address and self.executor != "ray":
            raise UsageError("option ray_address (--ray-address) needs executor 'ray' (--executor ray)")

    def store_root(self) -> str:
        return self.store or default_store()

    def check_store(self) -> None:
        """The usage check of a run that embeds, before any image is read: the store root exists (a shared,
        read-only cache serves what it holds) or can be created (``check_store_root``)."""
        check_store_root(self.store_root())


@dataclass(frozen=True)
class SuiteOptions:
    """Where suites' files are and how their protocols are configured. The options here are shared by
    several suites; a suite's own options (xm3600's ``languages``, ...) are declared beside its loader and
    registered with it (``hardrank.suites``), and ``own`` holds those given. ``data``, ``images`` and
    ``annotations`` also take a value per suite (``--data sugarcrepe=DIR``, ``data={"aro": DIR}``), and
    ``per_suite`` any suite option per suite (a job file's ``[suites.NAME]`` table); a suite sees its own
    values in place of the common ones (``for_suite``)."""

    data: str | None = opt(None, "suite data folder (annotations, Parquet shards, ...); SUITE=DIR for one suite "
                           "(--data sugarcrepe=DIR aro=DIR2; a plain DIR is every other suite's)", path=True,
                           per_suite=True, fetch=True, metavar="[SUITE=]DIR")
    images: str | None = opt(None, "image root the annotation paths are relative to (a folder or URL); suite wds: "
                             "tar shards ('dir/{00000..00099}.tar'), an img2dataset folder or .parquet files; "
                             "SUITE=ROOT for one suite", path=True, per_suite=True, metavar="[SUITE=]ROOT")
    annotations: str | None = opt(None, "Karpathy/RoCOCO annotation file or folder; SUITE=FILE for one suite",
                                  path=True, per_suite=True, fetch=True, metavar="[SUITE=]FILE")
    image_variants: tuple[str, ...] = opt((), "image variant folders <variants-dir>/<variant>_s<seed>: RoCOCO's "
                                          "altered galleries (mix_0.9 patch_0.9) and ImageNet-C corruptions "
                                          "(gaussian_noise_3 ...: also queries, task i2t@<variant>_s<seed>)")
    seeds: tuple[int, ...] = opt((1,), "seeds of the image variants (results averaged over them)", minimum=0)
    variants_dir: str | None = opt(None, "the folder holding the image variant folders <variant>_s<seed>/ (tar "
                                   "shards: the variant shard folders), where `perturb images --out` wrote them; "
                                   "default: --images (shards: their folder)", path=True)
    text_variants: tuple[str, ...] | None = opt(None, "RoCOCO caption files to use (default: all present)")
    tie_rule: str = opt("index", "ranking tie rule: index (an equal score beats the positive iff it comes "
                        "first in gallery order), optimistic, pessimistic", choices=TIE_RULES)
    caption_protocol: str | None = opt(None, "how retrieval suites (karpathy, rococo, wds, xm3600) feed captions to "
                                       "the text encoder: blip = BLIP's pre_caption (lowercase, .!\"()*#:;~ removed, "
                                       "first 30 words: RoCOCO's reference protocol), raw = as written "
                                       "(CLIP_benchmark's); default: the suite's own (blip; xm3600: raw)",
                                       choices=CAPTION_PROTOCOLS)
    # the options suites declare as their own, as given: (name, value), flags and keys like the fields above
    own: tuple[tuple[str, object], ...] = field(default=(), metadata={"declared_by": "suites", "cli": False})
    per_suite: tuple[tuple[str, str, object], ...] = field(default=(), metadata={
        "help": "values for one suite: {suite: {option: value}} (a job file's [suites.NAME] tables); kept as "
                "(suite, option, value)", "cli": False, "per_suite_table": True, "path": False})

    def __post_init__(self):
        check_options(self)
        per = [*self._per_suite_given()]
        for f in dataclasses.fields(self):  # a mapping {suite: value} for a per-suite field
            if f.metadata.get("per_suite") and isinstance(getattr(self, f.name), Mapping):
                _, pairs = split_per_suite(f, getattr(self, f.name))
                object.__setattr__(self, f.name, None)
                per = [p for p in per if p[1] != f.name or p[0] not in dict(pairs)] + \
                    [(s, f.name, v) for s, v in pairs]
        object.__setattr__(self, "per_suite", tuple(per))
        own = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in dict(self.own).items())
        object.__setattr__(self, "own", own)
        declared = suite_registry.own_fields() if own or per else {}
        for k, _ in own:
            if k not in declared:
                hint = difflib.get_close_matches(k, list(declared), n=1)
                raise UsageError(f"unknown suite option {k!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                                 + f"; the suites declare: {', '.join(sorted(declared)) or 'none'}")
        common = {f.name for f in dataclasses.fields(self) if f.name not in ("own", "per_suite")}
        for s, k, _ in per:
            if not suite_registry.is_suite(s):
                raise UsageError(f"per-suite options: {_no_suite(s)}")
            if k not in common and k not in declared:
                raise UsageError(f"suite {s}: unknown option {k!r}; a suite takes: "
                                 f"{', '.join(sorted(common | set(declared)))}")
            members = suite_registry.expand([s], self)
            if k in declared and not any(suite_registry.takes(m, k) for m in members):
                raise UsageError(f"option {_named(declared[k][0])} is for suites {', '.join(declared[k][2])}, "
                                 f"not {s}")
        for s in dict.fromkeys(s for s, _, _ in per):  # each suite's values pass its checks now, not at load
            try:
                for m in suite_registry.expand([s], self):
                    self.for_suite(m)
                    self.own_options(m)
            except UsageError as exc:
                raise UsageError(f"suite {s}: {exc}") from None
        if own:
            for cls in {declared[k][1] for k, _ in own}:
                self._own_instance(cls, {k: v for k, v in own if k in {f.name for f in dataclasses.fields(cls)}})

    def _per_suite_given(self):
        """``per_suite`` as (suite, option, value) triples, also when given as {suite: {option: value}}."""
        if isinstance(self.per_suite, Mapping):
            return [(s, k, tuple(v) if isinstance(v, list) else v) for s, opts in self.per_suite.items()
                    for k, v in (opts.items() if isinstance(opts, Mapping) else ())]
        return list(self.per_suite)

    def _values_for(self, name: str) -> dict:
        """The per-suite values suite ``name`` gets: those of aliases it belongs to, then its own."""
        keys = [a for a, members in suite_registry.aliases(self).items() if name in members] + [name]
        return {k: v for key in keys for s, k, v in self.per_suite if s == key}

    def for_suite(self, name: str) -> SuiteOptions:
        """These options as suite ``name`` sees them: its per-suite values in place of the common ones."""
        common = {f.name for f in dataclasses.fields(self)}
        over = {k: v for k, v in self._values_for(name).items() if k in common}
        return dataclasses.replace(self, **over, per_suite=()) if over or self.per_suite else self

    def own_options(self, name: str):
        """Suite ``name``'s own options (an instance of the class it registered; None when it declares none):
        the values given for it, else the class's defaults."""
        cls = suite_registry.get(name).options
        if cls is None:
            return None
        names = {f.name for f in dataclasses.fields(cls)}
        given = {**{k: v for k, v in self.own if k in names},
                 **{k: v for k, v in self._values_for(name).items() if k in names}}
        return self._own_instance(cls, given)

    @staticmethod
    def _own_instance(cls, given: dict):
        inst = cls(**given)
        check_options(inst)
        return inst

    def record(self, name: str) -> dict:
        """The options suite ``name`` was loaded with, for its results (``provenance.suite_options``): the
        common ones as it saw them and its own."""
        mine = self.for_suite(name)
        out = {f.name: getattr(mine, f.name) for f in dataclasses.fields(mine) if f.name not in ("own", "per_suite")}
        own = self.own_options(name)
        return {**out, **(dataclasses.asdict(own) if own is not None else {})}

    def check_suites(self, names: list[str]) -> None:
        """The options given for particular suites fit the run's suites ``names`` (aliases expanded): each own
        option is taken by one of them, each per-suite value names one of them (UsageError otherwise)."""
        declared = suite_registry.own_fields() if self.own else {}
        for k, _ in self.own:
            f, _, takers = declared[k]
            if not any(suite_registry.takes(n, k) for n in names):
                raise UsageError(f"option {_named(f)} is for suites {', '.join(takers)}; this run's suites are "
                                 f"{', '.join(names)}: drop it, or add one of those suites")
        for s in dict.fromkeys(s for s, _, _ in self.per_suite):
            if not set(suite_registry.expand([s], self)) & set(names):
                given = sorted({k for t, k, _ in self.per_suite if t == s})
                what = f"option {given[0]} is" if len(given) == 1 else f"options {', '.join(given)} are"
                raise UsageError(f"{what} given for suite {s}, which this run does not evaluate (its suites: "
                                 f"{', '.join(names)}); drop it, or add suite {s}")

    def fetching(self, fetch: Callable[[str, str], str]) -> SuiteOptions:
        """These options with every ``fetch`` option's value (an input file: annotations, data, a suite's
        predictions...), common, own or per suite, replaced by ``fetch(option, value)`` (a URL's local copy)."""
        declared = suite_registry.own_fields() if self.own or self.per_suite else {}
        fields_ = {f.name: f for f in dataclasses.fields(self)}

        def wanted(k):
            f = fields_.get(k) or declared.get(k, (None,))[0]
            return f is not None and f.metadata.get("fetch")

        def one(k, v):
            return fetch(k, v) if wanted(k) and isinstance(v, str) else v

        return dataclasses.replace(
            self, **{k: one(k, getattr(self, k)) for k in fields_ if k not in ("own", "per_suite")},
            own=tuple((k, one(k, v)) for k, v in self.own),
            per_suite=tuple((s, k, one(k, v)) for s, k, v in self.per_suite))


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation: checkpoints of one model (or precomputed embeddings) on suites."""

    suites: tuple[str, ...] = opt((), "suites", flag="--suite", listing="suites")
    out: str = opt("", "results folder (one sub-folder per checkpoint)", path=True)
    model: str | None = opt(None, "the model (not needed with --embeddings, --run, or mask suites scoring "
                            "--predictions)", listing="models")
    checkpoints: tuple[str | None, ...] = opt((None,), "checkpoint files (globs ok; for hf: models also "
                                              "save_pretrained folders); one result per checkpoint",
                                              flag="--checkpoint", path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag (openai, laion2b_s34b_b79k, webli, ...): the "
                                 "preprocessing and activation its authors used, and without --checkpoint its "
                                 "weights from the local Hugging Face / open_clip cache (never downloaded)")
    random_init: bool = opt(False, "evaluate random weights on purpose (a model without --checkpoint or "
                            "--pretrained is refused otherwise)")
    run: str | None = opt(None, "an open_clip training run folder (params.txt, checkpoints/epoch_*.pt): the model, "
                          "its preprocessing and every complete epoch's checkpoint come from it (--checkpoint picks "
                          "some; --model names a custom architecture's config .json)", path=True,
                          metavar="RUN_DIR")
    embeddings: str | None = opt(None, "score precomputed embeddings instead of a model: any input holding "
                                 "embeddings by id (listed below; e.g. a Parquet with columns kind (image|text), id "
                                 "(image path / caption as in the annotation file), embedding); no image file is "
                                 "read", path=True)
    search: str = opt("exhaustive", backends.search_help(RANKS))
    budget_mb: int = opt(256, "kernel score-tile memory budget, MiB", minimum=1)
    shard_gallery: int = opt(0, "split each ranking gallery over N Ray actors (per-shard counts add up to the "
                             "exact ranks of the one-process pass); 0: only with --executor ray, for galleries "
                             "above --shard-gallery-above-mb", minimum=0)
    shard_gallery_above_mb: int = opt(8192, "with --executor ray: a ranking gallery whose fp32 matrix exceeds this "
                                      "many MiB is sharded, one Ray actor per this many MiB", minimum=1)
    suite_options: SuiteOptions = SuiteOptions()
    embed: EmbedOptions = EmbedOptions()
    rank_precision: str = opt("auto", _RANK_PRECISION_HELP, choices=RANK_PRECISIONS)
    recall_k: tuple[int, ...] = opt((1, 5, 10), "retrieval: which R@K are reported (CLIP_benchmark's recall_k option), "
                                    "e.g. 1 5 10 50; R@1, every table's headline, always is; rsum (R@1+5+10 both "
                                    "ways) needs 5 and 10")
    rerank: str | None = opt(None, "two-stage retrieval, itm:K: each query's top K of the gallery (the union of "
                             "its views) by the dual encoder re-scored by the model's cross-encoder as "
                             "itm_logit[:, 1] + similarity, every other item -100 (BLIP's protocol as RoCOCO "
                             "evaluates it: itm:256 for COCO); needs a model with an image-text matching head "
                             "(--model blip:<folder>)", metavar="itm:K")
    bootstrap: int = opt(RESAMPLES, "resamples of the seeded bootstrap over each suite's units that gives every "
                         "metric its 95 percent interval (result field ci95); 0: no intervals", minimum=0)
    subset: int = opt(0, "a lite run: evaluate a stratified sample of N units per suite (retrieval: images with "
                      "their captions; choice: items, by task and subset; classification: images, by class); 0: "
                      "all", minimum=0, metavar="N")
    seed: int = opt(0, "seed of the --subset draw and of the bootstrap", minimum=0)
    log_to: tuple[str, ...] = opt((), "log each checkpoint's headline metrics at its step to a training dashboard: "
                                  "tensorboard:DIR (event files), wandb:PROJECT (offline unless WANDB_MODE says "
                                  "otherwise) or mlflow:URI (a folder: a local file store); repeatable",
                                  metavar="KIND:WHERE", repeat=True)

    def __post_init__(self):
        check_options(self)
        object.__setattr__(self, "suites", tuple(self.suites))
        ks = tuple(self.recall_k)
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise UsageError(f"option recall_k (--recall-k) takes whole numbers >= 1, got {list(ks)}")
        object.__setattr__(self, "recall_k", tuple(sorted(set(ks) | {1})))
        object.__setattr__(self, "checkpoints", tuple(self.checkpoints) or (None,))
        spec = backends.parse(self.search, RANKS)
        if not self.suites:
            raise UsageError("option suites is empty; name at least one suite (--suite toy)")
        self.suite_options.check_suites(suite_registry.expand(self.suites, self.suite_options))
        if self.model is not None and self.embeddings is not None or self.run and self.embeddings:
            raise UsageError("give --model (with --checkpoint/--pretrained), --run or --embeddings, not several")
        if self.run and self.pretrained:
            raise UsageError("--run reads the pretrained tag from the run's params.txt; drop --pretrained")
        if self.shard_gallery and not backends.get(spec).gallery_shards:
            split = " or ".join(b.name for b in backends.registered(RANKS) if b.gallery_shards)
            raise UsageError(f"--shard-gallery splits the {split} ranking pass over actors; search {self.search!r} "
                             f"cannot be split: drop --shard-gallery or use --search {split}")
        for spec_ in self.log_to:
            parse_log_to(spec_)
        object.__setattr__(self, "log_to", tuple(self.log_to))
        if rerank.parse(self.rerank) is not None:
            if self.embeddings is not None:
                raise UsageError(f"--rerank {self.rerank} re-scores with the model's cross-encoder; precomputed "
                                 f"--embeddings bring none: give --model (e.g. blip:<folder>)")
            drop = ([] if backends.get(spec).gallery_shards else [f"--search {self.search}"]) + \
                (["--shard-gallery"] if self.shard_gallery else [])  # gallery_shards: the exact kernels' pass
            if drop:
                raise UsageError(f"--rerank {self.rerank} takes its candidates from the exact top K in one process; "
                                 f"drop {' and '.join(drop)}")

    @property
    def rerank_spec(self) -> rerank.RerankSpec | None:
        return rerank.parse(self.rerank)

    @property
    def search_spec(self) -> SearchSpec:
        return backends.parse(self.search, RANKS)


@dataclass(frozen=True)
class MineOptions:
    """What counts as a hard negative and how the corpus is searched."""

    k: int = opt(10, "negatives per query", minimum=1, flag="-k")
    dup_threshold: float | None = opt(0.95, "drop candidates more similar than this to any positive (near "
                                      "duplicates); --no-dup-filter keeps them")
    max_sim: float | None = opt(None, "drop candidates scoring above this with the query (likely unlabelled "
                                "positives)")
    min_sim: float | None = opt(None, "drop candidates scoring below this with the query")
    search: str = opt("auto", backends.search_help(TOPK))
    budget_mb: int = opt(1024, "memory budget of the search, MiB: its index (exact search: the fp32 corpus it "
                         "scores) and work tiles; the vectors read from the inputs come on top (docs/mining.md)",
                         minimum=1)
    block_size: int = opt(8192, "queries per output shard (the unit of resumption)", minimum=1)
    nprobe: int | None = opt(None, "IVF lists (HNSW efSearch) per query (default: tuned to recall@10 >= "
                             "--recall-target on the recall sample)", minimum=1)
    recall_sample: int = opt(1000, "queries whose written negatives are checked against an exact search of the "
                             "same vectors (recall@k in summary.json; 0: not checked)", minimum=0)
    recall_target: float = opt(0.95, "recall@k the written negatives should reach: nprobe is tuned to it, and a "
                               "run that misses it says so (with the budget that would reach it)")
    seed: int = opt(0, "sampling seed (recall sample, IVF training)")
    rank_precision: str = opt("auto", _RANK_PRECISION_HELP, choices=RANK_PRECISIONS)
    shards: int | None = opt(None, "with --executor ray: corpus shards, each held by a Ray actor within "
                             "--budget-mb (default: one per CPU of the cluster)", minimum=1)
    dup_filter: bool = opt(True, "drop near duplicates of positives (--no-dup-filter keeps them)")
    index: str | None = opt(None, "search this FAISS index folder, built before for this corpus (hardrank index "
                            "build, or --index-out): checked against the corpus, nothing is built", path=True,
                            metavar="IDX")
    index_out: str | None = opt(None, "build the search's FAISS index in this folder (or resume its build, or reuse "
                                "it when complete), to mine again later with --index; an index too large for "
                                "--budget-mb goes to OUT/index otherwise", path=True, metavar="IDX")

    def __post_init__(self):
        check_options(self)
        if self.index and self.index_out:
            raise UsageError(f"give --index (reuse the index in {self.index}) or --index-out (build one in "
                             f"{self.index_out}), not both")
        if not self.dup_filter:  # the filter off is a threshold of None, the one thing the miner reads
            object.__setattr__(self, "dup_threshold", None)
        for name in ("dup_threshold", "max_sim", "min_sim"):
            v = getattr(self, name)
            if v is not None and not -1.0 <= float(v) <= 1.0:
                raise UsageError(f"option {name} is a cosine similarity in [-1, 1], got {v!r}")
        if not 0.0 < float(self.recall_target) <= 1.0:
            raise UsageError(f"option recall_target is a recall in (0, 1], got {self.recall_target!r}")
        if self.min_sim is not None and self.max_sim is not None and self.min_sim >= self.max_sim:
            raise UsageError(f"option min_sim ({self.min_sim}) must be below max_sim ({self.max_sim})")
        backends.parse(self.search, TOPK)

    @property
    def search_spec(self) -> SearchSpec:
        return backends.parse(self.search, TOPK)


@dataclass(frozen=True)
class IndexBuildConfig:
    """A FAISS IVF index of a corpus of embeddings, built into a folder once, for `hardrank mine --index`."""

    corpus: str = opt("", "the corpus: an input holding embeddings (a clip-retrieval output folder, an embeddings "
                      ".parquet, an embedding store folder)", path=True)
    out: str = opt("", "the index folder (a killed build resumes there)", path=True, metavar="IDX")
    modality: str = opt("image", "which of the corpus's embeddings to index", choices=("image", "text"))
    factory: str = opt("auto", "a FAISS IVF index_factory string (e.g. IVF4096,PQ128, IVF65536_HNSW32,PQ128), or "
                       "auto: sized for the corpus and --budget-mb (docs/mining.md)")
    budget_mb: int = opt(1024, "memory budget, MiB: the training sample, a block of rows and its codes; lists "
                         "larger than half of it are kept on disk, memory-mapped", minimum=1)
    seed: int = opt(0, "sampling seed (training sample, k-means)")

    def __post_init__(self):
        check_options(self)
        for name in ("corpus", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} is required")
        if self.factory != "auto" and not re.match(r"IVF\d+", self.factory.strip()):
            raise UsageError(f"option factory must be auto or a FAISS IVF index_factory string (IVF4096,PQ128, "
                             f"IVF65536_HNSW32,PQ128, IVF1024,SQ8), got {self.factory!r}")


@dataclass(frozen=True)
class MineConfig:
    """One mining run: queries against a corpus, negatives written to ``out``."""

    corpus: str = opt("", "where negatives come from: a file, folder, URL or shard pattern of any input kind "
                      "(listed below: hardrank.inputs.registry), e.g. a Karpathy-format .json (with --images), an "
                      "image folder or an embeddings .parquet", path=True)
    queries: str = opt("", "the queries, same kinds (may equal --corpus)", path=True)
    out: str = opt("", "output folder: negatives/part-*.parquet, summary.json", path=True)
    direction: str = opt("t2i", "query modality 2 corpus modality", choices=tuple(DIRECTIONS))
    model: str | None = opt(None, "the model (not needed when both inputs are store folders)", listing="models")
    checkpoint: str | None = opt(None, "weights file for --model", path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag: its preprocessing, and without --checkpoint its "
                                 "weights from the local cache")
    random_init: bool = opt(False, "mine with random weights on purpose")
    images: str | None = opt(None, "root of the relative image paths in .json/.parquet inputs", path=True)
    captions: str = opt("txt", "tar shard / img2dataset inputs: where each sample's captions are: txt or json:KEY")
    export_training: str | None = opt(None, "also write training data: FILE.tsv / .csv, a NegCLIP-style table "
                                      "(filepath, title, neg_caption, neg_image) for open_clip hard-negative "
                                      'training; FILE.jsonl, one line per query {"query", "positives", '
                                      '"negatives", "scores"}', path=True, metavar="FILE")
    options: MineOptions = MineOptions()
    embed: EmbedOptions = EmbedOptions()

    def __post_init__(self):
        check_options(self)
        for name in ("corpus", "queries", "out"):
            if not getattr(self, name):
                raise UsageError(f"option {name} is required")
