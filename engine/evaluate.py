"""Evaluate checkpoints on suites: load tasks, embed what the store lacks, score, write results."""
from __future__ import annotations

import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from .choice_macro import suite_aggregates
from .embed import DECODERS, embed_tables, table_embeddings
from .items import Tables
from .metrics import add_drops, average_views, choice_metrics, ranking_metrics
from .models import LoadedModel, ModelSpec, load_model
from .results import outcome_schema, summary_row, write_result
from .search import score_choice, score_ranking
from .store import EmbeddingStore
from .suites import SuiteOptions, load_suites
from .tasks import Suite

__all__ = ["EvalConfig", "evaluate", "EvalReport"]

log = logging.getLogger("hardrank.eval")
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class EvalConfig:
    model: str                              # open_clip name, config .json, or local-dir:
    checkpoints: tuple[str | None, ...]     # one result set per checkpoint (None = random init)
    suites: tuple[str, ...]                 # suite names or aliases ("toy")
    out: str                                # results folder
    store: str                              # embedding store root (shared across runs)
    suite_options: SuiteOptions = SuiteOptions()
    precision: str = "auto"                 # auto | fp32 | fp16 | bf16
    device: str = "auto"                    # auto | cpu | cuda[:i]
    batch_size: int = 256                   # images/texts per encoder batch
    decode_threads: int = 2                 # Pillow decode threads
    budget_mb: int = 256                    # kernel tile budget (score tiles), MiB
    max_failures: int | None = 100          # unreadable images tolerated before stopping
    embeddings: str | None = None           # precomputed embeddings (Parquet: kind, id, embedding) instead of a model
    search: str = "exhaustive"              # ranking search: exhaustive (kernels) | faiss:<factory> (engine.faiss_search)
    executor: str = "local"                 # local (in-process) | ray (Ray Data; evaluate() then needs a runner)
    decoder: str = "pillow"                 # pillow (reference) | dali (within a tested bound; own store fingerprint)

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")


@dataclass
class EvalReport:
    results: list[dict] = field(default_factory=list)      # the written result dicts
    files: list[Path] = field(default_factory=list)
    embed_stats: dict = field(default_factory=dict)        # modality -> EmbedStats.as_dict()

    def table_rows(self) -> list[tuple[str, dict]]:
        rows: dict[str, dict] = {}
        for r in self.results:
            rows.setdefault(r["checkpoint"], {}).update(summary_row(r))
        return list(rows.items())


def _versions() -> dict:
    import numpy
    import open_clip
    import pyarrow
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "open_clip": open_clip.__version__,
            "numpy": numpy.__version__, "pyarrow": pyarrow.__version__, "hardrank": _hardrank_version()}


def _hardrank_version() -> str:
    try:
        from importlib.metadata import version

        return version("hardrank")
    except Exception:
        return "unknown"


def _drop_failed(suite: Suite, tables: Tables) -> Suite:
    bad_img = np.zeros(len(tables.images), dtype=bool)
    if tables.images.failed:
        bad_img[list(tables.images.failed)] = True
    bad = {"image": bad_img, "text": np.zeros(len(tables.texts), dtype=bool)}
    suite.ranking = [t.drop(bad[t.query_modality][t.query_items], bad[t.gallery_modality][t.gallery_items])
                     for t in suite.ranking]
    suite.choice = [t.drop(bad[t.left_modality][t.left], bad[t.right_modality][t.right]) for t in suite.choice]
    return suite


def _score_suite(suite: Suite, device: str, emb: dict[str, np.ndarray], cfg: EvalConfig) -> tuple[dict, list]:
    outcomes: list[pa.Table] = []
    timings = {}
    search_info: dict = {}
    if suite.ranking:
        metrics: dict = {}
        counts: dict = {}
        for task in suite.ranking:
            t0 = time.perf_counter()
            ranks = score_ranking(task, emb[task.query_modality], emb[task.gallery_modality],
                                  tie_rule=suite.tie_rule, device=device, budget_bytes=cfg.budget_mb << 20,
                                  search=cfg.search)
            timings[f"rank_{task.name}"] = time.perf_counter() - t0
            if getattr(ranks, "info", None):
                search_info[task.name] = ranks.info
            per_view, outs = ranking_metrics(task, ranks)
            for view, m in per_view.items():
                metrics.setdefault(view, {})[task.name] = m
                counts.setdefault(view, {})[task.name] = {"queries": task.num_queries, "gallery": task.view_size(view)}
                o = outs[view]
                n = len(o["rank"])
                outcomes.append(pa.Table.from_pydict({
                    "kind": ["ranking"] * n, "task": [task.name] * n, "view": [view] * n,
                    "query_id": task.query_ids, "rank": o["rank"].astype(np.int64),
                    "top1_id": [task.gallery_ids[i] for i in o["top1"]],
                    "top1_group": [task.groups[g] for g in o["top1_group"]],
                    "subset": [None] * n, "scores": [None] * n, "correct": (o["rank"] == 0).tolist(),
                }, schema=outcome_schema()))
            counts.setdefault("skipped", {})[task.name] = task.skipped
        if "original" in metrics and {"i2t", "t2i"} <= set(metrics["original"]):
            o = metrics["original"]
            o["rsum"] = sum(o[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
            o["mean"] = {f"R@{k}": (o["i2t"][f"R@{k}"] + o["t2i"][f"R@{k}"]) / 2 for k in (1, 5, 10)}
        add_drops(metrics)
        average_views(metrics, suite.view_average)
        return {"task_type": "ranking", "metrics": metrics, "counts": counts, "timings": timings,
                "search": search_info}, outcomes
    metrics, counts, verdicts_by_task = {}, {}, {}
    for task in suite.choice:
        t0 = time.perf_counter()
        scores = score_choice(task, emb[task.left_modality], emb[task.right_modality], device=device)
        timings[f"score_{task.name}"] = time.perf_counter() - t0
        m, verdicts = choice_metrics(task, scores)
        metrics[task.name] = m
        verdicts_by_task[task.name] = verdicts
        counts[task.name] = {"items": len(task.ids), "candidates": int(task.left.shape[1] * task.right.shape[1]),
                             "skipped": task.skipped}
        main = verdicts.get("correct", verdicts.get("augmented", verdicts.get("group")))
        n = len(task.ids)
        outcomes.append(pa.Table.from_pydict({
            "kind": ["choice"] * n, "task": [task.name] * n, "view": [None] * n, "query_id": task.ids,
            "rank": [None] * n, "top1_id": [None] * n, "top1_group": [None] * n,
            "subset": task.subset if task.subset is not None else [None] * n,
            "scores": scores.reshape(n, -1).tolist(), "correct": main.tolist(),
        }, schema=outcome_schema()))
    for avg, members in suite.view_average.items():  # e.g. REPLACE = mean(attribute, relation)
        if all(mb in metrics for mb in members):
            keys = [k for k, v in metrics[members[0]]["all"].items() if isinstance(v, float)]
            metrics[avg] = {"all": {k: float(np.mean([metrics[mb]["all"][k] for mb in members])) for k in keys},
                            "members": members}
    metrics.update(suite_aggregates(suite, verdicts_by_task))
    return {"task_type": "choice", "metrics": metrics, "counts": counts, "timings": timings}, outcomes


def evaluate(cfg: EvalConfig, *, progress=None, echo=None, runner=None) -> EvalReport:
    """Run every checkpoint on every suite. K checkpoints of one architecture share one decode.

    runner: the embed runner for ``cfg.executor == "ray"`` (``jobs.ray_executor.RayRunner``; the
    engine never imports Ray). None for the local executor."""
    if cfg.executor == "ray" and runner is None and not cfg.embeddings:
        raise ValueError("executor 'ray' needs a runner: evaluate(cfg, runner=jobs.ray_executor.RayRunner(...)); "
                         "`hardrank eval --executor ray` passes one")
    if cfg.executor == "local" and runner is not None:
        raise ValueError("a runner was given but cfg.executor is 'local'; set executor='ray' or drop the runner")
    echo = echo or (lambda s: None)
    t_start = time.perf_counter()
    tables = Tables.empty()
    t0 = time.perf_counter()
    suites = load_suites(list(cfg.suites), tables, cfg.suite_options)
    t_load = time.perf_counter() - t0
    echo(f"loaded {len(suites)} suite(s): {len(tables.images)} unique images, {len(tables.texts)} unique texts "
         f"({t_load:.1f}s)")
    if cfg.embeddings:
        sources, report, failures = _byo_sources(cfg, tables)
    else:
        sources, report, failures, suites = _model_sources(cfg, tables, suites, progress, echo, runner)
    for label, ident, device, get_emb in sources:
        emb = get_emb()
        for suite in suites:
            res, outcomes = _score_suite(suite, device, emb, cfg)
            result = {
                "suite": suite.name, "checkpoint": label, **ident, "model": cfg.model, "tie_rule": suite.tie_rule,
                "task_type": res["task_type"], "counts": res["counts"], "metrics": res["metrics"],
                "suite_meta": suite.meta, "failures": failures[:1000], "failed_items": len(failures),
            }
            result["provenance"] = {
                **result.pop("provenance"), "versions": _versions(), "embed": report.embed_stats,
                "timings": {**res["timings"], "suite_load": t_load},
                "config": {k: v for k, v in asdict(cfg).items() if k != "suite_options"},
                "suite_options": asdict(cfg.suite_options),
            }
            if res.get("search"):
                result["provenance"]["search"] = res["search"]
            files = write_result(Path(cfg.out) / label, suite.name, result, outcomes)
            report.results.append(result)
            report.files.extend(files)
    echo(f"done in {time.perf_counter() - t_start:.1f}s; results in {cfg.out}")
    return report


def _model_sources(cfg: EvalConfig, tables: Tables, suites: list[Suite], progress, echo, runner=None):
    models = [load_model(ModelSpec(cfg.model, c, cfg.precision, cfg.device)) for c in cfg.checkpoints]
    # DALI pixels differ from Pillow's (within a tested bound): never mix the two in one store
    suffix = "" if cfg.decoder == "pillow" else f"-{cfg.decoder}"
    labels = _unique_labels([m.label for m in models])
    stores = [EmbeddingStore(cfg.store, m.fingerprint + suffix, dim=m.embed_dim, dtype=m.store_dtype,
                             meta={"arch": m.arch_name, "checkpoint": m.spec.checkpoint, "precision": m.precision,
                                   "preprocess": m.preprocess_cfg, "decoder": cfg.decoder}) for m in models]
    stats = embed_tables(tables, models, stores, batch_size=cfg.batch_size, decode_threads=cfg.decode_threads,
                         decoder=cfg.decoder, max_failures=cfg.max_failures, progress=progress, runner=runner)
    report = EvalReport(embed_stats={k: v.as_dict() for k, v in stats.items()})
    for mod, st in stats.items():
        echo(f"{mod}s: {st.total} unique, {st.from_store} from the store, {st.encoded} encoded "
             f"x {len(models)} checkpoint(s), {st.failed} failed ({st.seconds:.1f}s)")
    suites[:] = [_drop_failed(s, tables) for s in suites]
    failures = [{"modality": mod, "row": r, "source": u, "reason": w}
                for mod, st in stats.items() for r, u, w in st.failures]
    sources = []
    for model, store, label in zip(models, stores, labels):
        ident = {"checkpoint_path": model.spec.checkpoint, "model_fingerprint": store.fingerprint,
                 "provenance": {"architecture": model.arch_name, "precision": model.precision, "device": model.device,
                                "checkpoint_hash": model.checkpoint_hash}}
        sources.append((label, ident, model.device, lambda st=store: {
            "image": table_embeddings(st, tables.images), "text": table_embeddings(st, tables.texts)}))
    return sources, report, failures, suites


def _byo_sources(cfg: EvalConfig, tables: Tables):
    from .byo import embeddings_for_tables
    from .models import file_hash

    path = Path(cfg.embeddings)
    emb = embeddings_for_tables(path, tables)
    device = "cuda" if cfg.device == "auto" and _cuda() else ("cpu" if cfg.device == "auto" else cfg.device)
    ident = {"checkpoint_path": str(path), "model_fingerprint": f"embeddings-{file_hash(path)[:16]}",
             "provenance": {"architecture": "precomputed", "precision": "float32", "device": device,
                            "checkpoint_hash": None}}
    report = EvalReport(embed_stats={m: {"total": len(tables.of(m)), "from_file": len(tables.of(m))}
                                     for m in ("image", "text")})
    return [(path.stem, ident, device, lambda: emb)], report, []


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _unique_labels(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for l in labels:
        n = seen.get(l, 0)
        seen[l] = n + 1
        out.append(l if n == 0 else f"{l}-{n}")
    return out
