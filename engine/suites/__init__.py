"""Suite loaders: each compiles a benchmark's published files into tasks over shared tables."""
from __future__ import annotations

from hardrank.errors import INPUT_FILE_ERRORS, HardrankError, UsageError
from hardrank.items import Tables
from hardrank.scoring.blind import mark_blind
from hardrank.suites._common import SuiteFormatError, SuiteOptions
from hardrank.suites.amodal import load_amodal_suite
from hardrank.suites.aro import load_aro, load_coco_order, load_flickr_order
from hardrank.suites.classification import load_classification
from hardrank.suites.hard_positives import load_hard_positives
from hardrank.suites.inpaintcoco import load_inpaintcoco
from hardrank.suites.karpathy import load_karpathy, load_rococo
from hardrank.suites.mmvp import load_mmvp_vlm
from hardrank.suites.sugarcrepe import load_sugarcrepe
from hardrank.suites.sugarcrepe_pp import load_sugarcrepe_pp
from hardrank.suites.toy import TOY_SUITES, load_toy
from hardrank.suites.webdataset import load_wds
from hardrank.suites.whatsup import load_whatsup
from hardrank.suites.winoground import load_winoground
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
    "winoground": load_winoground,    # examples.jsonl + images/ (the facebook/winoground data/ folder)
    "mmvp_vlm": load_mmvp_vlm,        # Questions.csv + "MLLM_VLM Images/<Type>/" (MMVP/MMVP_VLM)
    "whatsup": load_whatsup,          # What's Up's data/ folder: Controlled-A/-B, COCO- and GQA-spatial
    "sugarcrepe_pp": load_sugarcrepe_pp,  # SugarCrepe++'s data/ files (--images COCO val2017)
    "amodal": load_amodal_suite,      # AmodalReasonSeg-style masks: --predictions and/or --baseline clip-regions
    "wds": load_wds,                  # Karpathy-style retrieval from WebDataset shards / img2dataset outputs
    "xm3600": load_xm3600,            # Crossmodal-3600 captions.jsonl: one retrieval suite per --language
    # zero-shot classification: an ImageFolder tree, CLIP_benchmark's WebDataset root, or --annotations table
    "imagefolder": lambda tables, opts: load_classification(tables, opts, "imagefolder"),
    "classification": load_classification,
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


def load_suites(names: list[str], tables: Tables, opts: SuiteOptions,
                failures: dict[str, Exception] | None = None) -> list[Suite]:
    """Load every named suite (aliases such as ``toy`` expanded) into the shared ``tables``. A loader returns
    one Suite, or a list (xm3600: one per language, each its own result). Choice tasks get their blind
    check (``scoring.blind``). With ``failures`` (a dict), a suite that cannot be loaded (a file missing,
    malformed or of another release, an option it lacks) is recorded there under its name, the rows it
    had added are removed, and the other suites load; without it the first such error is raised."""
    out = []
    for n in expand_suites(names):
        marks = (len(tables.images), len(tables.texts))
        try:
            loaded = SUITES[n](tables, opts)
        except (HardrankError, *INPUT_FILE_ERRORS) as exc:
            if failures is None:
                raise
            tables.images.truncate(marks[0])
            tables.texts.truncate(marks[1])
            failures[n] = exc
            continue
        out.extend(mark_blind(s, tables.texts.entries) for s in (loaded if isinstance(loaded, list) else [loaded]))
    return out
