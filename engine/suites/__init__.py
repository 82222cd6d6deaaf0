"""Suite loaders: each compiles a benchmark's published files into tasks over shared tables.

A suite is one module (its loader, and its own options as a frozen dataclass of ``opt(...)`` fields beside it)
plus one ``register`` line below: its flags, job-file keys, keywords and help come from that line.
"""
from __future__ import annotations

from hardrank import suite_registry
from hardrank.errors import INPUT_FILE_ERRORS, HardrankError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.items import Tables
from hardrank.scoring.blind import mark_blind
from hardrank.suite_registry import SuiteSpec, alias, register, unregister
from hardrank.suites._common import SuiteOptions
from hardrank.suites.amodal import AmodalOptions, amodal_needs_model, load_amodal_suite
from hardrank.suites.aro import load_aro, load_coco_order, load_flickr_order
from hardrank.suites.classification import ClassificationOptions, load_classification
from hardrank.suites.cola import load_cola
from hardrank.suites.collections import CB_COLLECTIONS, datacomp_members
from hardrank.suites.crepe import CrepeOptions, load_crepe
from hardrank.suites.datasets import PLAIN_NAMES, DatasetOptions, is_dataset_name, load_dataset
from hardrank.suites.eqben import load_eqben
from hardrank.suites.hard_positives import load_hard_positives
from hardrank.suites.inpaintcoco import load_inpaintcoco
from hardrank.suites.karpathy import load_karpathy, load_rococo
from hardrank.suites.linear_probe import LinearProbeOptions, load_linear_probe
from hardrank.suites.mmvp import load_mmvp_vlm
from hardrank.suites.sugarcrepe import load_sugarcrepe
from hardrank.suites.sugarcrepe_pp import load_sugarcrepe_pp
from hardrank.suites.toy import TOY_SUITES, load_toy
from hardrank.suites.valse import load_valse
from hardrank.suites.webdataset import WdsOptions, load_wds
from hardrank.suites.whatsup import load_whatsup
from hardrank.suites.winoground import load_winoground
from hardrank.suites.xm3600 import XM3600Options, load_xm3600
from hardrank.tasks import Suite

__all__ = ["SUITES", "ALIASES", "SuiteOptions", "SuiteSpec", "SuiteFormatError", "load_suites", "expand_suites",
           "register", "unregister", "alias"]

# the registry: name, loader, its own options (or None), one line of help
register("karpathy", load_karpathy, None, "image-text retrieval on a Karpathy-format file (COCO, Flickr30k)")
register("rococo", load_rococo, None, "retrieval with RoCOCO's perturbed captions and altered images")
register("hard_positives", load_hard_positives, None, "a paraphrase (hard positive) above a hard negative")
register("inpaintcoco", load_inpaintcoco, None, "InpaintCOCO's 2x2 image-caption pairs")
register("sugarcrepe", load_sugarcrepe, None, "SugarCrepe: caption vs a fluent hard negative")
register("aro", load_aro, None, "ARO VG-Relation + VG-Attribution (whichever files --data holds)")
register("coco_order", load_coco_order, None, "ARO COCO-Order from a Karpathy file (--annotations, --images)")
register("flickr_order", load_flickr_order, None, "ARO Flickr30k-Order from a Karpathy file")
register("winoground", load_winoground, None, "Winoground: two images, two captions of the same words (examples.jsonl "
         "+ images/)")
register("mmvp_vlm", load_mmvp_vlm, None, "MMVP-VLM: image pairs CLIP confuses, one statement each, per visual "
         "pattern (Questions.csv + MLLM_VLM Images/)")
register("whatsup", load_whatsup, None, "What's Up: spatial relations (Controlled-A/-B, COCO- and GQA-spatial)")
register("sugarcrepe_pp", load_sugarcrepe_pp, None, "SugarCrepe++: two paraphrased positives vs a negative, "
         "image-to-text and text-only (--images COCO val2017)")
register("valse", load_valse, None, "VALSE: caption vs foil per linguistic phenomenon, validated items (its piece "
         "files + the source datasets' images)")
register("cola", load_cola, None, "COLA: multi-object image pairs (image score) and single-object class mAP")
register("eqben", load_eqben, None, "EqBen: two frames with a minimal visual change, two captions (Winoground-style "
         "annotation of the released subset)")
register("crepe", load_crepe, CrepeOptions, "CREPE: a Visual Genome region's caption among its hard negatives, R@1 "
         "(systematicity and productivity CSVs)")
register("amodal", load_amodal_suite, AmodalOptions, "AmodalReasonSeg-style masks: predictions, or the "
         "clip-regions baseline", needs_model=amodal_needs_model)
register("wds", load_wds, WdsOptions, "retrieval over WebDataset shards' / img2dataset outputs' own captions")
register("xm3600", load_xm3600, XM3600Options, "Crossmodal-3600: retrieval, one result per caption language")
register("imagefolder", load_classification, ClassificationOptions, "zero-shot classification: an ImageFolder "
         "tree, CLIP_benchmark's WebDataset root or a table")
register("classification", load_classification, ClassificationOptions, "the same as imagefolder")
register("linear_probe", load_linear_probe, LinearProbeOptions, "CLIP_benchmark's linear probe: a WebDataset root's "
         "train split trains a logistic-regression probe on the embeddings, its test split scores it")
for _name, _help in zip(TOY_SUITES, ("RoCOCO-style retrieval", "hard positives", "inpaint-style 2x2 pairs",
                                     "zero-shot classification")):
    register(_name, load_toy, None, f"the built-in toy world (--data WORLD): {_help}")
alias("toy", TOY_SUITES)
register("wds/<name>", load_dataset, DatasetOptions, "a dataset by CLIP_benchmark's name: wds/vtab/cifar10, or "
         "the plain names (cifar10, imagenet1k, vtab/pets, mscoco_captions) and DataComp's task keys; its root from "
         "--data-root, its task from --task", match=is_dataset_name, examples=PLAIN_NAMES)
for _name, _members in CB_COLLECTIONS.items():  # CLIP_benchmark's collections: vtab, vtab+, retrieval, ...
    alias(_name, _members)
alias("datacomp", datacomp_members)


SUITES = suite_registry.SUITES    # name -> SuiteSpec (live; callable: SUITES[name](tables, opts) loads it)
ALIASES = suite_registry.ALIASES  # alias -> the suites it stands for


def expand_suites(names: list[str], opts: SuiteOptions | None = None) -> list[str]:
    """Suite names with aliases (``toy``, ``vtab``; ``datacomp`` by ``opts``' task list) replaced by their members;
    an unknown name is a UsageError."""
    return suite_registry.expand(names, opts)


def load_suites(names: list[str], tables: Tables, opts: SuiteOptions,
                failures: dict[str, Exception] | None = None) -> list[Suite]:
    """Load every named suite (aliases such as ``toy`` expanded) into the shared ``tables``, each with the
    options as it sees them (its per-suite values, its own options), recorded on it (``Suite.options``). A
    loader returns one Suite, or a list (xm3600: one per language, each its own result). Choice tasks get their
    blind check (``scoring.blind``). With ``failures`` (a dict), a suite that cannot be loaded (a file missing,
    malformed or of another release, an option it lacks) is recorded there under its name, the rows it had added
    are removed, and the other suites load; without it the first such error is raised."""
    out = []
    for n in expand_suites(names, opts):
        marks = (len(tables.images), len(tables.texts))
        try:
            loaded = suite_registry.get(n)(tables, opts)
        except (HardrankError, *INPUT_FILE_ERRORS) as exc:
            if failures is None:
                raise
            tables.images.truncate(marks[0])
            tables.texts.truncate(marks[1])
            failures[n] = exc
            continue
        record = opts.record(n)
        for s in loaded if isinstance(loaded, list) else [loaded]:
            s.options = record
            out.append(mark_blind(s, tables.texts.entries))
    return out
