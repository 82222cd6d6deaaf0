"""The amodal mask suite: AmodalReasonSeg-style predictions scored as they are, or the clip-regions baseline
(the annotations' and predictions' format: hardrank.formats.amodal)."""
from __future__ import annotations

from dataclasses import dataclass

from hardrank.config import SuiteOptions, opt
from hardrank.errors import UsageError
from hardrank.formats.amodal import clip_regions_items, load_amodal
from hardrank.items import Tables
from hardrank.tasks import MaskTask, Suite

__all__ = ["load_amodal_suite", "AmodalOptions", "amodal_needs_model", "BASELINES"]


BASELINES = ("clip-regions",)  # answer with the candidate region most similar to the question


@dataclass(frozen=True)
class AmodalOptions:
    """The mask suite's own options."""

    predictions: str | None = opt(None, "folder of mask predictions to score", path=True,
                                  fetch=True)
    baseline: str | None = opt(None, "answer each question with the candidate region "
                               "most similar to it, embedded by the model", choices=BASELINES)


def amodal_needs_model(own: AmodalOptions) -> bool:
    """Predictions are scored as they are; only the baseline embeds (a model, or precomputed embeddings)."""
    return own.baseline is not None


def load_amodal_suite(tables: Tables, opts: SuiteOptions, own: AmodalOptions, name: str = "amodal") -> Suite:
    """The amodal suite as mask tasks: ``own.predictions`` scored as they are, and/or the
    ``clip-regions`` baseline (its question texts and candidate crops are added to ``tables``)."""
    if own.predictions is None and own.baseline is None:
        raise UsageError("suite amodal needs --predictions DIR and/or --baseline clip-regions")
    path = opts.annotations or opts.data
    if path is None:
        raise UsageError("suite amodal needs --data DIR (holding annotations.json) or --annotations FILE")
    data = load_amodal(path, opts.images)
    tasks = []
    if own.predictions is not None:
        tasks.append(MaskTask("predictions", data, predictions=own.predictions))
    if own.baseline == "clip-regions":
        tasks.append(MaskTask("clip-regions", data, regions=clip_regions_items(data, tables)))
    meta = {"annotations": str(data.path), "questions": len(data.questions), "images": len(data.images)}
    return Suite(name, mask=tasks, tie_rule=opts.tie_rule, meta=meta)
