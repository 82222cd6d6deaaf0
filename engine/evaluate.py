"""Evaluate checkpoints on suites: load tasks, embed what the store lacks, score every task type, write."""
from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import open_clip
import pyarrow as pa
import torch

from hardrank import suite_registry, urls
from hardrank.atomic import write_json_atomic
from hardrank.config import EvalConfig, build, check_writable_dir
from hardrank.dashboards import Dashboards
from hardrank.devices import resolve_device
from hardrank.embed import EmbedPipeline, make_scan_mapper
from hardrank.embed.itm import ItmScorer
from hardrank.errors import DataError, UsageError, exit_code
from hardrank.executors import executor
from hardrank.inputs import registry, scan_with
from hardrank.items import Tables
from hardrank.models.blip import has_itm
from hardrank.models.runs import model_specs, object_spec
from hardrank.models.spec import ModelSpec, split_live
from hardrank.scoring import backends
from hardrank.scoring.backends import Backend
from hardrank.scoring.backends.sharded import for_ranking
from hardrank.scoring.choice_macro import suite_aggregates
from hardrank.scoring.classify import classify_metrics, classify_outcomes, classify_ranks
from hardrank.scoring.counts import embed_line, item_counts
from hardrank.scoring.mask_score import CLIP_REGIONS_TIE_RULE, PROTOCOL, clip_regions, mask_outcomes, score_predictions
from hardrank.scoring.metrics import add_drops, average_views, choice_metrics, ranking_metrics
from hardrank.scoring.probe import probe_outcomes, run_probe
from hardrank.scoring.rank import score_choice, score_ranking
from hardrank.scoring.rerank import CANDIDATE_RULE, FILL, rerank_ranks
from hardrank.scoring.rerank import PROTOCOL as RERANK_PROTOCOL
from hardrank.scoring.results import (
    RESULT_VERSION,
    outcome_schema,
    summary_intervals,
    summary_row,
    verdict_map,
    write_result,
)
from hardrank.scoring.statistics import annotate
from hardrank.settings import RunSettings, start_run
from hardrank.subsets import subset_suites
from hardrank.suite_registry import result_stem
from hardrank.suites import expand_suites, load_suites
from hardrank.suites.collections import collection_result, collection_tasks, tasklist_option
from hardrank.suites.toy import TOY_SUITES, pending_world
from hardrank.tasks import MaskTask, Suite

__all__ = ["evaluate", "plan", "EvalReport", "SuitesNotLoaded"]

log = logging.getLogger("hardrank.eval")


class SuitesNotLoaded(DataError):
    """Some suites of a run could not be loaded (the others ran and wrote their results); the exit code is
    the first failure's own (3 for a bad file, 2 for a missing option)."""

    def __init__(self, failed: dict[str, Exception]):
        lines = "".join("\n  " + (str(exc) if str(exc).startswith(f"{n}: ") else f"suite {n}: {exc}")
                        for n, exc in failed.items())  # one line each: the suite (a dataset's name) and the fix
        super().__init__(f"{len(failed)} suite(s) not run ({', '.join(failed)}); the others' results are written:"
                         f"{lines}")
        self.failed = failed
        self.exit_code = exit_code(next(iter(failed.values())))


@dataclass
class EvalReport:
    results: list[dict] = field(default_factory=list)      # the written result dicts
    files: list[Path] = field(default_factory=list)
    embed_stats: dict = field(default_factory=dict)        # modality -> EmbedStats.as_dict()
    subsets: dict = field(default_factory=dict)            # suite -> its --subset record (results' "subset")
    failed_suites: dict[str, Exception] = field(default_factory=dict)  # suites that could not be loaded
    finished: dict[tuple[str, str], dict] = field(default_factory=dict)  # (checkpoint, suite) results kept as found
    collections_done: set[str] = field(default_factory=set)  # checkpoints whose collection results are written

    def table_rows(self) -> list[tuple[str, dict]]:
        """One row per checkpoint (its suites' columns side by side), or, where two of its results share a column
        (xm3600's languages, karpathy beside wds), one row per (checkpoint, suite) labelled with both: a shared
        column would otherwise hold only the last suite's number."""
        parts: dict[str, list[tuple[str, dict]]] = {}
        for r in self.results:
            parts.setdefault(r["checkpoint"], []).append((r["suite"], summary_row(r)))
        rows = []
        for ckpt, ps in parts.items():
            cols = [c for _, row in ps for c in row]
            if len(cols) == len(set(cols)):
                rows.append((ckpt, {c: v for _, row in ps for c, v in row.items()}))
            else:
                rows.extend((f"{ckpt} {suite}", row) for suite, row in ps)
        return rows

    def table_intervals(self) -> dict[str, dict[str, tuple[float, float]]]:
        """{checkpoint: {column: (low, high)}}: the 95% interval of each of ``table_rows``' numbers."""
        out: dict[str, dict] = {}
        for r in self.results:
            out.setdefault(r["checkpoint"], {}).update(summary_intervals(r))
        return out

    def raise_failures(self) -> None:
        """Raise ``SuitesNotLoaded`` if a suite could not be loaded (the command line's nonzero exit at the
        end of a run whose other suites ran)."""
        if self.failed_suites:
            raise SuitesNotLoaded(self.failed_suites)


@dataclass
class _EmbeddingSource:
    """Embeddings to score: one checkpoint of the model, or a precomputed embeddings file."""

    label: str                                  # results sub-folder
    ident: dict                                 # checkpoint_path, model_fingerprint, provenance
    device: str                                 # where scoring runs
    embeddings: Callable[[], dict[str, np.ndarray]]  # whole-table (rows, d) arrays per modality
    embed: dict = field(default_factory=dict)   # provenance.embed: this checkpoint's store hits and encodes
    scorer: Callable[[], ItmScorer] | None = None  # its cross-encoder stage, with --rerank


def _versions() -> dict:
    try:
        hardrank_version = version("hardrank")
    except PackageNotFoundError:
        hardrank_version = "unknown"
    return {"python": platform.python_version(), "torch": torch.__version__, "open_clip": open_clip.__version__,
            "numpy": np.__version__, "pyarrow": pa.__version__, "hardrank": hardrank_version}


def _config(cfg: EvalConfig | None, options: dict) -> tuple[EvalConfig, ModelSpec | None]:
    """The run's config, and the spec of a model object given as ``model=`` (None for a ``--model`` spelling)."""
    if cfg is not None and options:
        raise UsageError(f"pass an EvalConfig or keyword options, not both (got {sorted(options)})")
    live, options = split_live(options)
    cfg = cfg if cfg is not None else build(EvalConfig, options)
    return cfg, None if live is None else object_spec(live, precision=cfg.embed.precision, device=cfg.embed.device)


def _specs(cfg: EvalConfig, live: ModelSpec | None) -> list[ModelSpec]:
    """The checkpoints' specs: the model object's, else those the options name."""
    return [live] if live is not None else model_specs(cfg)


def _drop_failed(suite: Suite, tables: Tables) -> Suite:
    bad_img = np.zeros(len(tables.images), dtype=bool)
    if tables.images.failed:
        bad_img[list(tables.images.failed)] = True
    bad = {"image": bad_img, "text": np.zeros(len(tables.texts), dtype=bool)}
    suite.ranking = [t.drop(bad[t.query_modality][t.query_items], bad[t.gallery_modality][t.gallery_items])
                     for t in suite.ranking]
    suite.choice = [t.drop(bad[t.left_modality][t.left], bad[t.right_modality][t.right]) for t in suite.choice]
    suite.classify = [t.drop(bad_img[t.query_items]) for t in suite.classify]
    suite.probe = [t.drop(bad_img) for t in suite.probe]
    return suite


# -- scoring, one function per task type -------------------------------------------------------------
def _score_ranking(suite: Suite, device: str, emb: dict[str, np.ndarray], cfg: EvalConfig,
                   backend: Backend | None = None, scorer: ItmScorer | None = None) -> dict:
    outcomes: list[pa.Table] = []
    timings, search_info, metrics, counts = {}, {}, {}, {}
    for task in suite.ranking:
        t0 = time.perf_counter()
        if scorer is not None:  # --rerank: the dual encoder's top K re-scored by the cross-encoder
            ranks = rerank_ranks(task, emb[task.query_modality], emb[task.gallery_modality], scorer, cfg.rerank_spec,
                                 tie_rule=suite.tie_rule, device=device, budget_bytes=cfg.budget_mb << 20,
                                 pair_batch=cfg.embed.batch_size)
        else:
            ranks = score_ranking(task, emb[task.query_modality], emb[task.gallery_modality], tie_rule=suite.tie_rule,
                                  device=device, budget_bytes=cfg.budget_mb << 20, search=cfg.search_spec,
                                  precision=cfg.rank_precision, backend=backend)
        timings[f"rank_{task.name}"] = time.perf_counter() - t0
        if getattr(ranks, "info", None):
            search_info[task.name] = ranks.info
        per_view, outs = ranking_metrics(task, ranks, cfg.recall_k)
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
                "unit": task.query_unit_ids(), "verdicts": [None] * n,
            }, schema=outcome_schema()))
        counts.setdefault("skipped", {})[task.name] = task.skipped
    if "original" in metrics and {"i2t", "t2i"} <= set(metrics["original"]):
        o = metrics["original"]
        if {1, 5, 10} <= set(cfg.recall_k):  # rsum is the literature's sum of R@1, 5, 10 both ways
            o["rsum"] = sum(o[d][f"R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
        o["mean"] = {f"R@{k}": (o["i2t"][f"R@{k}"] + o["t2i"][f"R@{k}"]) / 2 for k in cfg.recall_k}
    add_drops(metrics)
    average_views(metrics, suite.view_average)
    out = {"task_type": "ranking", "metrics": metrics, "counts": counts, "timings": timings, "outcomes": outcomes}
    if search_info:
        out["search"] = search_info
    if scorer is not None:
        out["extra"] = {"rerank": {"spec": str(cfg.rerank_spec), "protocol": RERANK_PROTOCOL,
                                   "candidates": CANDIDATE_RULE, "fill": FILL, "rank_tie_rule": suite.tie_rule,
                                   "itm_first_token": scorer.model.info.get("itm_first_token"),
                                   "cross_encoder": scorer.take_stats()}}  # this suite's share of its work
    return out


def _score_choice(suite: Suite, device: str, emb: dict[str, np.ndarray]) -> dict:
    outcomes: list[pa.Table] = []
    metrics, counts, verdicts_by_task, timings = {}, {}, {}, {}
    for task in suite.choice:
        t0 = time.perf_counter()
        scores = score_choice(task, emb[task.left_modality], emb[task.right_modality], device=device)
        timings[f"score_{task.name}"] = time.perf_counter() - t0
        m, verdicts = choice_metrics(task, scores)
        metrics[task.name] = m
        verdicts_by_task[task.name] = verdicts
        counts[task.name] = {"items": len(task.ids), "candidates": int(task.left.shape[1] * task.right.shape[1]),
                             "rule": task.rule, "skipped": task.skipped}
        if task.candidates is not None and len(task.candidates):  # retrieval sets of several sizes (CREPE)
            counts[task.name]["candidates_range"] = [int(task.candidates.min()), int(task.candidates.max())]
        main = verdicts.get("correct", verdicts.get("augmented", verdicts.get("group")))
        rank = verdicts.get("rank")  # first_rank: the first candidate's rank (an int, not a verdict)
        n = len(task.ids)
        flat = scores.reshape(n, -1).tolist()
        if task.candidates is not None:  # a row's padding is no candidate: only its real ones' scores
            flat = [row[:int(c)] for row, c in zip(flat, task.candidates)]
        outcomes.append(pa.Table.from_pydict({
            "kind": ["choice"] * n, "task": [task.name] * n, "view": [None] * n, "query_id": task.ids,
            "rank": rank.tolist() if rank is not None else [None] * n, "top1_id": [None] * n,
            "top1_group": [None] * n, "subset": task.subset if task.subset is not None else [None] * n,
            "scores": flat, "correct": main.tolist() if main is not None else [None] * n,
            "unit": task.ids, "verdicts": verdict_map({k: v for k, v in verdicts.items() if k != "rank"}, n),
        }, schema=outcome_schema()))
    for avg, members in suite.view_average.items():  # e.g. REPLACE = mean(attribute, relation)
        if all(mb in metrics for mb in members):
            keys = [k for k, v in metrics[members[0]]["all"].items() if isinstance(v, float)]
            metrics[avg] = {"all": {k: float(np.mean([metrics[mb]["all"][k] for mb in members])) for k in keys},
                            "members": members}
    metrics.update(suite_aggregates(suite, verdicts_by_task))
    return {"task_type": "choice", "metrics": metrics, "counts": counts, "timings": timings, "outcomes": outcomes}


def _score_classify(suite: Suite, device: str, emb: dict[str, np.ndarray], cfg: EvalConfig,
                    backend: Backend | None = None) -> dict:
    """Every classification task: one kernel pass of all its query groups (clean + variants) against its classes."""
    outcomes, metrics, counts, timings, search_info = [], {}, {}, {}, {}
    for task in suite.classify:
        t0 = time.perf_counter()
        ranks = classify_ranks(task, emb["image"], emb["text"], tie_rule=suite.tie_rule, device=device,
                               budget_bytes=cfg.budget_mb << 20, search=cfg.search_spec,
                               precision=cfg.rank_precision, backend=backend)
        timings[f"rank_{task.name}"] = time.perf_counter() - t0
        search_info[task.name] = ranks["info"]
        metrics[task.name] = classify_metrics(task, ranks, suite.meta.get("variant_seeds"))
        counts[task.name] = {"classes": len(task.classnames), "prompts": int(task.prompt_ptr[-1]),
                             "images": task.num_queries, "groups": len(task.groups),
                             "scored": {g: int((ranks["group"] == i).sum()) for i, g in enumerate(task.groups)},
                             "skipped": task.skipped}
        outcomes.append(classify_outcomes(task, ranks))
    return {"task_type": "classification", "metrics": metrics, "counts": counts, "timings": timings,
            "outcomes": outcomes, "search": search_info}


def _score_probe(suite: Suite, device: str, emb: dict[str, np.ndarray]) -> dict:
    """Every linear probe: trained on its training images' embeddings (the weight decay searched on its validation
    images, if any), scored on its test images."""
    outcomes, metrics, counts, timings, extra = [], {}, {}, {}, {}
    for task in suite.probe:
        t0 = time.perf_counter()
        r = run_probe(task, emb["image"], device)
        timings[f"train_{task.name}"] = time.perf_counter() - t0
        metrics[task.name] = r["metrics"]
        counts[task.name] = {"classes": len(task.classnames), "train": len(task.train_items),
                             "val": len(task.val_items), "test": task.num_queries, "final_training": r["final"],
                             "skipped": task.skipped}
        extra[task.name] = {"options": asdict(task.options), "final_training": r["final"],
                            "weight_decay_search": [{"weight_decay": w, "val_acc1": a} for w, a in r["search"]]}
        outcomes.append(probe_outcomes(task, r))
    return {"task_type": "linear_probe", "metrics": metrics, "counts": counts, "timings": timings,
            "outcomes": outcomes, "extra": {"probe": extra}, "tie_rule": "index (a probe's argmax: the lower class)"}


def _score_mask(task: MaskTask, device: str, emb: dict[str, np.ndarray] | None, failed_images: int) -> dict:
    """One mask task: predictions as they are, or the clip-regions baseline on ``emb``."""
    t0 = time.perf_counter()
    if task.regions is None:
        res = score_predictions(task.data, task.predictions, device=device)
        extra = {"predictions": str(task.predictions)}
        tie_rule, answers = "n/a", None
    else:
        res = clip_regions(task.data, task.regions, emb["image"], emb["text"], device=device)
        # an unreadable image leaves zero embeddings for its crops: they score 0 and rarely win; counted
        res["counts"]["unreadable_images"] = failed_images
        extra = {"baseline": task.name}
        tie_rule, answers = CLIP_REGIONS_TIE_RULE, res["answers"]
    metrics = {r: {k: 100.0 * v for k, v in res[r].items()} for r in ("visible", "amodal")}  # percentages
    return {"task_type": "mask", "metrics": metrics, "counts": res["counts"], "outcomes": mask_outcomes(res, answers),
            "timings": {"score": time.perf_counter() - t0}, "tie_rule": tie_rule,
            "extra": {"metrics_unit": "percent", "protocol": PROTOCOL, **extra}}


def _result(suite: Suite, label: str, scored: dict, cfg: EvalConfig, common: dict, ident: dict | None,
            embed: dict | None = None) -> dict:
    model = cfg.model if ident is not None else None  # predictions scored as they are: no model made them
    ident = dict(ident or {})
    # the caption protocol changes the texts encoded, so it stands next to the tie rule (suites that have one)
    protocol = {k: suite.meta[k] for k in ("caption_protocol", "language") if k in suite.meta}
    result = {"suite": suite.name, "checkpoint": label, **ident, "model": model,
              "tie_rule": scored.get("tie_rule", suite.tie_rule), **protocol, "task_type": scored["task_type"],
              "counts": scored["counts"], "metrics": scored["metrics"], **scored.get("extra", {}),
              "suite_meta": suite.meta, "failures": common["failures"][:1000],
              "failed_items": len(common["failures"])}
    result["provenance"] = {
        **result.pop("provenance", {}), "versions": common["versions"],
        "embed": embed if embed is not None else common["embed"],
        "timings": {**scored["timings"], "suite_load": common["t_load"]},
        "config": {**{k: v for k, v in asdict(cfg).items() if k not in ("suite_options", "embed")},
                   **asdict(cfg.embed)},
        "suite_options": suite.options,  # as this suite saw them: its per-suite values, its own options
        "threads": common["threads"],  # how many threads computed it, and why (results do not depend on it)
    }
    if scored.get("search"):
        result["provenance"]["search"] = scored["search"]
    return result


def _write(report: EvalReport, cfg: EvalConfig, label: str, suite_name: str, result: dict, outcomes,
           dashboards: Dashboards | None = None) -> None:
    table = pa.concat_tables(outcomes) if outcomes else outcome_schema().empty_table()
    if cfg.subset:
        result["subset"] = report.subsets.get(suite_name)
    if cfg.bootstrap and table.num_rows:  # the metrics' 95% intervals, from the outcomes written beside them
        annotate(result, table, resamples=cfg.bootstrap, seed=cfg.seed)
    report.files.extend(write_result(Path(cfg.out) / label, result_stem(suite_name), result, [table]))
    report.results.append(result)
    if dashboards is not None:
        dashboards.log(result)


def evaluate(cfg: EvalConfig | None = None, *, progress=None, echo=None, runner=None, dashboards=None,
             settings: RunSettings | None = None, **options) -> EvalReport:
    """Run every checkpoint on every suite and write one result per (checkpoint, suite).

    ``cfg`` or the same options as keywords (the flat names of the CLI flags / job-file keys):
    ``evaluate(model="ViT-B-32", checkpoints=["a.pt"], suites=["rococo"], annotations=..., out=...)``.
    K checkpoints of one architecture share one decode; mask suites scoring predictions need no
    model. ``runner``: an executor object to use instead of the one ``cfg.embed.executor`` names.
    ``dashboards``: open ``hardrank.dashboards.Dashboards`` to log to (``watch`` keeps one run open over
    its evaluations); by default those ``log_to`` names are opened here and closed at the end.
    ``settings``: the run's threads, when a caller that runs several evaluations as one run decided them
    (``hardrank.settings.start_run``, as the attack commands do); else decided here from ``cfg.embed``.

    ``model`` may also be a model object (the Python API only): an open_clip model with ``tokenizer=`` (and
    optionally ``preprocess=``, its eval transform) or a transformers dual encoder with ``processor=``, evaluated
    in this process exactly as the same weights from files, and left as it was found (``hardrank.models.in_memory``);
    its embeddings are stored only under ``fingerprint=`` (e.g. ``"run1-step4000"``), never without one."""
    cfg, live = _config(cfg, options)
    echo = echo or (lambda s: None)
    if not cfg.out:
        raise UsageError("option out (the results folder) is required")
    # the threads first: a bad $HARDRANK_THREADS is a usage error too, refused before any folder is made
    settings = settings or start_run(cfg.embed.threads, cfg.embed.decode_threads)
    _check_usage(cfg, live)
    echo(f"threads: {settings.budget.describe()}")
    own = dashboards is None and bool(cfg.log_to)
    if own:  # a missing logger package fails here, before any work
        dashboards = Dashboards(cfg.log_to, run=cfg.out)
    try:
        with urls.staged_dir(cfg.out) as local_out:
            report = _evaluate(replace(cfg, out=local_out), live, progress, echo, runner, dashboards, settings)
    finally:
        if own:
            dashboards.close()
    if local_out != cfg.out:
        echo(f"results uploaded to {cfg.out}")
    return report


def local_inputs(cfg: EvalConfig) -> EvalConfig:
    """Annotation files, suite data, embeddings and predictions given as URLs, as local copies (cached by
    size and version); image roots and shards stay remote: their bytes are read by the workers."""
    so = cfg.suite_options.fetching(lambda k, v: urls.fetch_input(v, what=f"--{k}") if urls.is_url(v) else v)
    if so != cfg.suite_options:
        cfg = replace(cfg, suite_options=so)
    if urls.is_url(cfg.embeddings or ""):
        cfg = replace(cfg, embeddings=urls.fetch_input(cfg.embeddings, what="--embeddings"))
    return cfg


def _evaluate(cfg: EvalConfig, live: ModelSpec | None, progress, echo, runner, dashboards,
              settings: RunSettings) -> EvalReport:
    cfg = local_inputs(cfg)
    t_start = time.perf_counter()
    pipe = None  # the models first: a bad checkpoint or tag fails before any data is read
    if cfg.embeddings is None and (cfg.model is not None or cfg.run is not None) and _needs_model(cfg):
        pipe = EmbedPipeline(_specs(cfg, live), cfg.embed, runner=runner, settings=settings)
        _check_rerank(cfg, pipe)
    tables = Tables.empty()
    t0 = time.perf_counter()
    world = _pending_world(cfg)
    if world is not None:
        echo(f"building the toy world in {world} (once, about 30 s; --data DIR names another folder)")
    mapper = make_scan_mapper(cfg.embed, settings)
    failed: dict[str, Exception] = {}
    names = expand_suites(list(cfg.suites), cfg.suite_options)
    done = _finished(cfg, pipe, names)  # (checkpoint, suite) pairs a previous run of these options finished
    todo = [n for n in names if pipe is None or not all((lb, n) in done for lb in pipe.labels)]
    if done:
        echo(f"{len(done)} (checkpoint, dataset) result(s) already in {cfg.out} for this model and these options: "
             f"not scored again (--no-skip-existing scores them anew)")
    try:
        with scan_with(mapper):  # with --executor ray, workers read the tar shards, not this process
            suites = load_suites(todo, tables, cfg.suite_options, failures=failed)
    finally:
        if hasattr(mapper, "close"):
            mapper.close()
    if failed and not suites and not done:  # nothing else to run: the error as it is
        raise next(iter(failed.values()))
    for name, exc in failed.items():  # the other suites still run; the command exits nonzero at the end
        log.warning("suite %s not run: %s", name, exc)
    _check_not_empty(suites, "holds no items: is the annotation file empty or of another format?")
    report = EvalReport(failed_suites=failed, finished=done)
    if cfg.subset:  # a lite run: a stratified sample of each suite's units, and only their items in the tables
        suites, tables, report.subsets = subset_suites(suites, tables, cfg.subset, cfg.seed)
        echo("lite subset: " + "; ".join(f"{n}: {r['units']} of {r['of']} {r['unit']}s"
                                          for n, r in report.subsets.items()))
    t_load = time.perf_counter() - t0
    echo(f"loaded {len(suites)} suite(s): {len(tables.images)} images (distinct paths), {len(tables.texts)} texts "
         f"(distinct normalised captions) ({t_load:.1f}s)")
    common = {"failures": [], "versions": _versions(), "embed": {}, "t_load": t_load,
              "threads": settings.record()}
    for suite in suites:  # answers that need no model: scored once, under the predictions' folder name
        for task in [t for t in suite.mask if not t.needs_embeddings]:
            scored = _score_mask(task, resolve_device(cfg.embed.device), None, 0)
            label = Path(task.predictions).resolve().name or "predictions"
            _write(report, cfg, label, suite.name, _result(suite, label, scored, cfg, common, None),
                   scored["outcomes"], dashboards)
    if any(s.needs_embeddings for s in suites):
        sources = _sources(cfg, pipe, tables, suites, report, common, progress, echo, settings)
        backend = for_ranking(backends.get(cfg.search_spec), executor(cfg.embed, settings), cfg.shard_gallery,
                              cfg.shard_gallery_above_mb)
        try:
            for src in sources:
                emb = src.embeddings()
                scorer = src.scorer() if src.scorer is not None else None  # one per checkpoint: its image cache
                for suite in [s for s in suites if s.needs_embeddings]:
                    if (src.label, suite.name) in report.finished:
                        continue
                    for scored in _score_suite(suite, src.device, emb, cfg, len(tables.images.failed), backend,
                                               scorer):
                        if suite.annotate is not None:  # e.g. a collection task's main metric
                            scored["extra"] = {**scored.get("extra", {}), **suite.annotate(scored)}
                        _write(report, cfg, src.label, suite.name,
                               _result(suite, src.label, scored, cfg, common, src.ident, src.embed),
                               scored["outcomes"], dashboards)
                _write_collections(report, cfg, src.label, echo)
        finally:
            backend.close()
    for label in [lb for lb in (pipe.labels if pipe is not None else []) if lb not in report.collections_done]:
        _write_collections(report, cfg, label, echo)  # every dataset of its collections was finished before
    echo(f"done in {time.perf_counter() - t_start:.1f}s; results in {cfg.out}")
    return report


# -- datasets already scored, collections ----------------------------------------------------------------------
_SAME_RESULTS = ("recall_k", "subset", "seed", "bootstrap", "search", "rerank", "rank_precision")  # config keys a
# finished result must share to stand for this run (the suite's own options and the model fingerprint besides)


def _jsonable(v):
    return json.loads(json.dumps(v, default=str))


def _finished(cfg: EvalConfig, pipe: EmbedPipeline | None, names: list[str]) -> dict[tuple[str, str], dict]:
    """The results in ``cfg.out`` this run would write again, by (checkpoint, suite): those of suites whose options
    say ``skip_existing`` (the dataset suites), written for the same model fingerprint, suite options and scoring
    options. A result that cannot be read is not finished."""
    if pipe is None:
        return {}
    out: dict[tuple[str, str], dict] = {}
    config = {k: v for k, v in _jsonable(asdict(cfg)).items() if k in _SAME_RESULTS}
    for name in names:
        if not getattr(cfg.suite_options.own_options(name), "skip_existing", False):
            continue
        record = _jsonable(cfg.suite_options.record(name))
        for i, label in enumerate(pipe.labels):
            try:
                r = json.loads((Path(cfg.out) / label / f"{result_stem(name)}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(r, dict):
                continue
            prov = r.get("provenance") or {}
            if (r.get("suite") == name and r.get("model_fingerprint") == pipe.fingerprint(i)
                    and prov.get("suite_options") == record
                    and {k: v for k, v in (prov.get("config") or {}).items() if k in _SAME_RESULTS} == config):
                out[(label, name)] = r
    return out


def _write_collections(report: EvalReport, cfg: EvalConfig, label: str, echo) -> None:
    """Checkpoint ``label``'s result of each collection the run names (``vtab``, ``datacomp``, ...): every task's
    main metric and the aggregates, from its datasets' results (this run's and those it kept), written as
    ``<out>/<label>/collection_<name>.json``."""
    report.collections_done.add(label)
    results = {r["suite"]: r for r in report.results if r.get("checkpoint") == label}
    results.update({s: r for (lb, s), r in report.finished.items() if lb == label})
    why = {n: str(e) for n, e in report.failed_suites.items()}
    for name in dict.fromkeys(cfg.suites):
        tasks = collection_tasks(name, cfg.suite_options)
        if tasks is None:
            continue
        tasklist = (tasklist_option(cfg.suite_options) or "datacomp (built in)") if name == "datacomp" else None
        doc = collection_result(name, tasks, results, label, why, tasklist)
        path = Path(cfg.out) / label / f"collection_{result_stem(name)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"result_version": RESULT_VERSION, **doc})
        report.files.append(path)
        report.results.append(doc)
        avg = doc["metrics"].get("Average")
        echo(f"{label}: {name}: {doc['scored']} of {doc['of']} tasks scored; average "
             f"{'-' if avg is None else f'{avg:.2f}'}")


def _pending_world(cfg: EvalConfig) -> Path | None:
    """The toy world folder loading these suites would build first, if any."""
    worlds = [pending_world(cfg.suite_options.for_suite(n))
              for n in expand_suites(list(cfg.suites), cfg.suite_options) if n in TOY_SUITES]
    return next((w for w in worlds if w is not None), None)


def _needs_model(cfg: EvalConfig) -> bool:
    """Whether some suite scores embeddings with its options (mask suites scoring --predictions do not)."""
    return any(suite_registry.get(n).needs_model(cfg.suite_options.own_options(n))
               for n in expand_suites(list(cfg.suites), cfg.suite_options))


def _check_usage(cfg: EvalConfig, live: ModelSpec | None) -> None:
    """Everything about the options that can fail, checked before any loading or encoding: a source
    of embeddings where suites need them, the results folder and the store can be written (unless a
    model object without a fingerprint leaves the store alone), the device exists."""
    resolve_device(cfg.embed.device)
    if _needs_model(cfg) and cfg.model is None and cfg.embeddings is None and cfg.run is None:
        raise UsageError("give --model (with --checkpoint or --pretrained), --run RUN_DIR or --embeddings "
                         f"FILE.parquet: suites {expand_suites(list(cfg.suites), cfg.suite_options)} score embeddings")
    check_writable_dir(cfg.out, "out (--out)")
    unstored = live is not None and live.live.fingerprint is None
    if (cfg.model is not None or cfg.run is not None) and cfg.embeddings is None and not unstored:
        cfg.embed.check_store()


def _check_not_empty(suites: list[Suite], why: str) -> None:
    """A task with nothing to score would give empty (null) metrics: an error naming the suite."""
    for s in suites:
        empty = [f"{t.name} ({t.num_queries} queries)" for t in s.ranking if t.num_queries == 0]
        empty += [f"{t.name} (0 rows)" for t in s.choice if len(t.ids) == 0]
        empty += [f"{t.name} (0 questions)" for t in s.mask if len(t.data.questions) == 0]
        empty += [f"{t.name} (0 images)" for t in s.classify
                  if t.num_queries == 0 or (t.valid is not None and not t.valid[0].any())]
        empty += [f"{t.name} ({len(t.train_items)} training, {t.num_queries} test images)" for t in s.probe
                  if t.num_queries == 0 or len(t.train_items) == 0]
        if empty:
            source = s.meta.get("annotations") or s.meta.get("files_found") or s.meta.get("images") or ""
            raise DataError(f"suite {s.name}{f' ({source})' if source else ''}: task(s) {', '.join(empty)} "
                            f"{why}")


def _score_suite(suite: Suite, device: str, emb: dict, cfg: EvalConfig, failed_images: int,
                 backend: Backend | None = None, scorer: ItmScorer | None = None) -> list[dict]:
    if suite.ranking:
        return [_score_ranking(suite, device, emb, cfg, backend, scorer)]
    if suite.choice:
        return [_score_choice(suite, device, emb)]
    if suite.classify:
        return [_score_classify(suite, device, emb, cfg, backend)]
    if suite.probe:
        return [_score_probe(suite, device, emb)]
    return [_score_mask(t, device, emb, failed_images) for t in suite.mask if t.needs_embeddings]


def _sources(cfg: EvalConfig, pipe: EmbedPipeline | None, tables: Tables, suites: list[Suite], report: EvalReport,
             common: dict, progress, echo, settings: RunSettings) -> list[_EmbeddingSource]:
    if cfg.embeddings:
        if any(t.needs_embeddings for s in suites for t in s.mask):
            raise UsageError("the clip-regions baseline embeds region crops with --model; precomputed "
                             "--embeddings hold no crop embeddings")
        return [_byo_source(cfg, tables, report)]
    for s in suites:  # a model reads the images: --images and the altered-image folders must be there
        s.check_images()
    stats = pipe.run(tables, progress=progress)
    report.embed_stats = common["embed"] = {k: v.as_dict() for k, v in stats.items()}
    for mod, st in stats.items():
        echo(embed_line(mod, st, tables.of(mod), len(pipe.models), labels=pipe.labels))
    suites[:] = [_drop_failed(s, tables) for s in suites]
    _check_not_empty(suites, "lost every query to unreadable items (listed above); fix the files or the "
                             "annotations")
    common["failures"] = [{"modality": mod, "row": r, "source": u, "reason": w}
                          for mod, st in stats.items() for r, u, w in st.failures]
    sources = []
    for i, (model, label) in enumerate(zip(pipe.models, pipe.labels)):
        ident = {"checkpoint_path": model.spec.checkpoint, "model_fingerprint": pipe.fingerprint(i),
                 "provenance": {"architecture": model.arch_name, "precision": model.precision, "device": model.device,
                                "checkpoint_hash": model.checkpoint_hash, "model_source": _model_source(model)}}
        embed = {mod: st.for_checkpoint(i) for mod, st in stats.items()}
        scorer = None
        if cfg.rerank_spec is not None:
            e = cfg.embed
            scorer = (lambda m=model: ItmScorer(m, tables, batch_size=e.batch_size, decoder=e.decoder,
                                                decode_threads=settings.decode_threads))
        sources.append(_EmbeddingSource(label, ident, model.device, lambda i=i: pipe.embeddings(i, tables), embed,
                                        scorer))
    return sources


def _check_rerank(cfg: EvalConfig, pipe: EmbedPipeline) -> None:
    """--rerank needs a cross-encoder in every checkpoint: refused before any data is read."""
    if cfg.rerank_spec is None:
        return
    lacking = [m.spec.arch for m in pipe.models if not has_itm(m)]
    if lacking:
        raise UsageError(f"--rerank {cfg.rerank}: model {lacking[0]} has no image-text matching head (a "
                         f"cross-encoder); only models that bring one can re-rank, e.g. BLIP's retrieval model "
                         f"(--model blip:<folder>). Drop --rerank to rank by the dual encoder alone")


def _model_source(model) -> dict:
    """What a result records of where its model came from and how it preprocessed images."""
    i = model.info
    return {"pretrained": i.get("pretrained"), "weights": i.get("weights"), "weights_format": i.get("weights_format"),
            "quick_gelu": i.get("quick_gelu"), "random_init": i.get("random_init"),
            "preprocess": model.preprocess_cfg, "warnings": i.get("warnings", []),
            **({"hf": i["hf"]} if i.get("hf") else {}),  # Hugging Face tokenizer / text tower: names, hashes, folders
            **({"transformers": i["transformers"]} if i.get("transformers") else {})}  # hf: models: class, folder


def _byo_source(cfg: EvalConfig, tables: Tables, report: EvalReport) -> _EmbeddingSource:
    path = Path(cfg.embeddings)
    source = registry.open_embeddings(cfg.embeddings)  # any input kind holding embeddings by id
    emb = source.for_tables(tables)
    device = resolve_device(cfg.embed.device)
    ident = {"checkpoint_path": str(path), "model_fingerprint": source.content_id or source.fingerprint,
             "provenance": {"architecture": "precomputed", "precision": "float32", "device": device,
                            "checkpoint_hash": None}}
    report.embed_stats = {m: {"total": len(tables.of(m)), "from_file": len(tables.of(m))} for m in ("image", "text")}
    return _EmbeddingSource(path.stem, ident, device, lambda: emb)


def plan(cfg: EvalConfig | None = None, **options) -> dict:
    """What ``evaluate`` would do, encoding and writing nothing: the suites and their tasks, the
    unique items, and per checkpoint how many items its store already holds. Loads the models
    (for their fingerprints) and reads every image once (for its content key). ``model`` may be a model
    object, as for ``evaluate``."""
    cfg, live = _config(cfg, options)
    cfg = local_inputs(cfg)
    tables = Tables.empty()
    names, world = expand_suites(list(cfg.suites), cfg.suite_options), _pending_world(cfg)
    if world is not None:  # a plan builds nothing: the toy suites are counted once their world exists
        names = [n for n in names if n not in TOY_SUITES]
    suites = load_suites(names, tables, cfg.suite_options)
    _check_not_empty(suites, "holds no items: is the annotation file empty or of another format?")
    subsets = {}
    if cfg.subset:
        suites, tables, subsets = subset_suites(suites, tables, cfg.subset, cfg.seed)
    out = {"suites": {}, "images": len(tables.images), "texts": len(tables.texts), "checkpoints": [],
           "store": cfg.embed.store_root()}
    if world is not None:
        out["would_build"] = {"toy world": str(world), "suites": list(TOY_SUITES)}
    if subsets:
        out["subsets"] = subsets
    for s in suites:
        tasks = [f"{t.name}: {t.num_queries} queries x {len(t.gallery_items)} gallery items, "
                 f"{len(t.views)} views ({', '.join(t.views)})" for t in s.ranking]
        tasks += [f"{t.name}: {len(t.ids)} rows of {t.left.shape[1]}x{t.right.shape[1]} ({t.rule})" for t in s.choice]
        tasks += [f"{t.name}: {len(t.data.questions)} questions" for t in s.mask]
        tasks += [f"{t.name}: {t.num_queries} images x {len(t.groups)} groups ({', '.join(t.groups)}) against "
                  f"{len(t.classnames)} classes ({int(t.prompt_ptr[-1])} prompts)" for t in s.classify]
        tasks += [f"{t.name}: a probe over {len(t.classnames)} classes trained on {len(t.train_items)} images "
                  f"({len(t.val_items)} to choose the weight decay), scored on {t.num_queries}" for t in s.probe]
        out["suites"][s.name] = tasks
        out.setdefault("inputs", {})[s.name] = {k: s.options[k] for k in ("data", "images", "annotations")
                                                if s.options.get(k)}  # per suite: --data sugarcrepe=DIR
    if cfg.embeddings or not any(s.needs_embeddings for s in suites):
        return out  # no image is read (also when the toy suites, waiting for their world, were all there was)
    for s in suites:
        s.check_images()
    if cfg.embed.key_by == "content":  # (with --key-by id the plan reads no image either)
        counts = item_counts(tables.images)
        out["unreadable"], out["image_duplicates"] = counts["unreadable"], counts["duplicates"]
    else:  # duplicates are unknown until the new images are hashed by the workers
        out["unreadable"], out["image_duplicates"] = 0, 0
    tables.texts.keys()
    rows = EmbedPipeline(_specs(cfg, live), cfg.embed).plan(tables)
    if cfg.embed.key_by == "id":
        out["unreadable"] = len(tables.images.failed)  # missing files (a stat failed)
    out["checkpoints"] = rows
    out["to_encode"] = {m: sum(r[f"{m}_to_encode"] for r in rows) for m in ("image", "text")}
    return out
