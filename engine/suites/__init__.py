"""Suite loaders: each compiles a benchmark's published files into tasks over shared tables."""
from __future__ import annotations

from hardrank.errors import UsageError
from hardrank.items import Tables
from hardrank.suites._common import SuiteFormatError, SuiteOptions
from hardrank.suites.amodal import load_amodal_suite
from hardrank.suites.aro import load_aro, load_coco_order, load_flickr_order
from hardrank.suites.classification import load_classification
from hardrank.suites.hard_positives import load_hard_positives
from hardrank.suites.inpaintcoco import load_inpaintcoco
from hardrank.suites.karpathy import load_karpathy, load_rococo
from hardrank.suites.linear_probe import load_linear_probe
from hardrank.suites.sugarcrepe import load_sugarcrepe
from hardrank.suites.toy import TOY_SUITES, load_toy
from hardrank.suites.webdataset import load_wds
from hardrank.suites.xm3600 import load_xm3600
from hardrank.tasks import Suite

__all__ = ["SUITES", "ALIASES", "SuiteOptions", "SuiteFormatError", "load_suites", "expand_suites"]

SUITES = {
    "karpathy": load_karpathy,
    "rococo": load_rococo,
    "hard_positives": load_hard_positives,
    "inpaintcoco": load_inpaintcoco,
    "sugarcrepe": load_sugarcrepe,
    "aro": load_aro,                  # VG-Relation + VG-Attribution (whichever files --data holds)
    "coco_order": load_coco_order,    # ARO COCO-Order from a Karpathy file (--annotations, --images)
    "flickr_order": load_flickr_order,
    "amodal": load_amodal_suite,      # AmodalReasonSeg-style masks: --predictions and/or --baseline clip-regions
    "wds": load_wds,                  # Karpathy-style retrieval from WebDataset shards / img2dataset outputs
    "xm3600": load_xm3600,            # Crossmodal-3600 captions.jsonl: one retrieval suite per --language
    # zero-shot classification: an ImageFolder tree, CLIP_benchmark's WebDataset root, or --annotations table
    "imagefolder": lambda tables, opts: load_classification(tables, opts, "imagefolder"),
    "classification": load_classification,
    "linear_probe": load_linear_probe,  # CLIP_benchmark's linear_probe: train + test splits of its WebDataset root
    **{name: (lambda tables, opts, _n=name: load_toy(tables, opts, _n)) for name in TOY_SUITES},
}
ALIASES = {"toy": list(TOY_SUITES)}


def expand_suites(names: list[str]) -> list[str]:
    out = []
    for n in names:
        for m in ALIASES.get(n, [n]):
            if m not in SUITES:
                raise UsageError(f"unknown suite {m!r}; choose from {sorted(SUITES) + sorted(ALIASES)}")
            if m not in out:
                out.append(m)
    return out


def load_suites(names: list[str], tables: Tables, opts: SuiteOptions) -> list[Suite]:
    """Load every named suite (aliases such as ``toy`` expanded) into the shared ``tables``. A loader returns
    one Suite, or a list (xm3600: one per language, each its own result)."""
    out = []
    for n in expand_suites(names):
        loaded = SUITES[n](tables, opts)
        out.extend(loaded if isinstance(loaded, list) else [loaded])
    return out
