"""hardrank results as CLIP_benchmark result JSON: its dataset, task and metric names, values as fractions.

CLIP_benchmark (``clip_benchmark eval``) writes one JSON per (model, pretrained, dataset):
``{"dataset", "model", "pretrained", "task", "metrics", "language"}``, ``metrics`` flat and in
[0, 1], and ``clip_benchmark build`` turns a set of them into one CSV row each (metrics as columns,
``model_fullname`` = model + " " + pretrained). ``export_clip_benchmark`` writes the same for every
hardrank result below a folder, so that CSV and the dashboards built on it read hardrank's numbers.

Mapping (a hardrank suite becomes one CLIP_benchmark dataset, or several named ``<suite>/<part>`` the
way CLIP_benchmark names SugarCrepe's files ``sugar_crepe/add_att``):

- retrieval (``karpathy``, ``rococo``, ``wds``, ``xm3600``): task ``zeroshot_retrieval``.
  ``image_retrieval_recall@K`` is text -> image (hardrank ``t2i`` R@K / 100), ``text_retrieval_recall@K``
  image -> text (``i2t``), for every K the result reports (``--recall-k``; 1, 5, 10 by default). Each record
  states ``caption_protocol``: ``raw`` (captions as written, as CLIP_benchmark feeds them) or ``blip``
  (BLIP's ``pre_caption``, hardrank's default for Karpathy files: not CLIP_benchmark's protocol, so its
  numbers differ slightly); results written before the option existed used ``blip``. ``language`` is the
  result's (``xm3600-<lang>`` results: dataset ``crossmodal3600``, one record per language), else ``en``.
  ``karpathy`` is ``mscoco_captions`` / ``flickr30k`` / ``flickr8k`` by its annotation file
  (else ``karpathy``); RoCOCO's clean view is ``rococo``, each variant view ``rococo/<view>`` with the
  recall of the direction it enlarges plus ``{image,text}_retrieval_false_rate`` (not a CLIP_benchmark
  metric: the share of queries whose top-1 is an added item).
- choice suites: task ``image_caption_selection`` with its ``acc``, ``text_acc``, ``image_acc``.
  One image and K captions (SugarCrepe, ARO, order, hard positives): ``text_acc`` = ``acc`` = the
  suite's accuracy and ``image_acc`` = 1.0, which is what CLIP_benchmark computes for one image (a
  lone image is always its caption's nearest). SugarCrepe files -> ``sugar_crepe/<file>``; ARO ->
  ``aro/visual_genome/relation`` / ``attribution`` (+ ``macro_acc``, the reference's macro accuracy),
  ``coco_order`` / ``flickr_order`` -> ``aro/coco/order`` / ``aro/flickr/order`` (CLIP_benchmark's
  compositionality names). InpaintCOCO's 2x2 (Winoground-style) -> ``text_acc`` = text score,
  ``image_acc`` = image score, ``acc`` = group score, per concept as ``inpaintcoco/<concept>``.
  Hard positives: ``acc`` = original accuracy (c vs c_N, what CLIP_benchmark would compute) plus
  ``augmented_acc`` and ``brittleness`` (hardrank's names), per set ``hard_positives/<set>``.
- classification (``imagefolder``, ``classification``, ``toy-classify``): task ``zeroshot_classification``
  with ``acc1``, ``acc5``, ``mean_per_class_recall``; the clean images are the dataset named after the
  suite (the ImageFolder / WebDataset root's folder name for ``imagefolder`` / ``classification``), each
  image variant (a corruption at a severity and seed, or its mean over seeds) ``<dataset>/<variant>``
  with ``relative_robustness`` (variant acc1 / clean acc1; not a CLIP_benchmark metric).
- linear probe (``linear_probe``): task ``linear_probe`` with ``lp_acc1``, ``lp_acc5``,
  ``lp_mean_per_class_recall`` and the probe's ``weight_decay``, ``epochs``, ``seed``, ``fewshot_k``,
  ``normalized``, as CLIP_benchmark writes them; the dataset is the WebDataset root's folder name.
- datasets by name (``wds/vtab/cifar10``, ``cifar10``, ... of ``hardrank.suites.datasets``): the dataset is
  the name as given, as CLIP_benchmark writes its ``--dataset``; the task is the one run.
- mask suites (``amodal``) and collection results: no CLIP_benchmark task; skipped and reported.

Files are named by ``--output``, a template like CLIP_benchmark's own (default
``{dataset}_{pretrained}_{model}_{language}_{task}.json``; ``{dataset}`` the name without ``wds/``, '/' as
'_', and ``{pretrained}`` the checkpoint's folder, as it slugs them; also ``{pretrained_full_path}``).

Protocol differences to know: CLIP_benchmark breaks ties by ``argmax``/``topk`` order (the first
candidate, i.e. the positive, wins a choice tie); hardrank counts choice ties as wrong (ARO order:
the original wins, as there) and ranks by the recorded ``tie_rule``. With real-valued embeddings
ties are rare; the hardrank result holds their count.
"""
from __future__ import annotations

import os
import string
from pathlib import Path

from hardrank.atomic import write_json_atomic
from hardrank.config import check_writable_dir
from hardrank.errors import DataError, UsageError
from hardrank.scoring.results import read_results

__all__ = ["export_clip_benchmark", "clip_benchmark_records", "FORMATS", "DEFAULT_OUTPUT", "check_output"]

FORMATS = ("clip_benchmark",)
DEFAULT_OUTPUT = "{dataset}_{pretrained}_{model}_{language}_{task}.json"  # CLIP_benchmark eval's --output default
_FIELDS = ("dataset", "pretrained", "pretrained_full_path", "model", "language", "task")
_RETRIEVAL_DATASETS = (("coco", "mscoco_captions"), ("flickr30k", "flickr30k"), ("flickr8k", "flickr8k"))
_ARO = {"vg_relation": ("aro/visual_genome/relation", "vg_relation_macro"),
        "vg_attribution": ("aro/visual_genome/attribution", "vg_attribution_macro")}
_ORDER = {"coco_order": "aro/coco/order", "flickr_order": "aro/flickr/order"}
_SUGARCREPE = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")


def _frac(v) -> float | None:
    return None if v is None else round(float(v) / 100.0, 8)


def _retrieval(dirs: dict, false_rate: bool) -> dict:
    out = {}
    for direction, prefix in (("t2i", "image_retrieval"), ("i2t", "text_retrieval")):
        m = dirs.get(direction)
        if not isinstance(m, dict):
            continue
        ks = sorted(int(k[2:]) for k in m if k.startswith("R@") and k[2:].isdigit())
        for k in ks:
            out[f"{prefix}_recall@{k}"] = _frac(m[f"R@{k}"])
        if false_rate and "false_rate" in m:
            out[f"{prefix}_false_rate"] = _frac(m["false_rate"])
    return out


def _karpathy_name(result: dict) -> str:
    ann = Path(str((result.get("suite_meta") or {}).get("annotations") or "")).name.lower()
    return next((name for tag, name in _RETRIEVAL_DATASETS if tag in ann), "karpathy")


def _one_image(all_: dict) -> dict:
    """image_caption_selection metrics of a task with one image and K captions."""
    if "statement_accuracy" in all_:  # MMVP-VLM: each caption picks one of two images; a pair counts when both do
        return {"acc": _frac(all_["accuracy"]), "image_acc": _frac(all_["accuracy"])}
    if "accuracy" in all_:
        acc = _frac(all_["accuracy"])
        return {"acc": acc, "text_acc": acc, "image_acc": 1.0}
    if "original_accuracy" in all_:  # hard positives: c vs c_N is the CLIP_benchmark-style choice
        acc = _frac(all_["original_accuracy"])
        out = {"acc": acc, "text_acc": acc, "image_acc": 1.0}
        if "augmented_accuracy" in all_:
            out["augmented_acc"] = _frac(all_["augmented_accuracy"])
        if "brittleness" in all_:
            out["brittleness"] = _frac(all_["brittleness"])
        return out
    if "group_score" in all_:  # a 2x2 of images and captions: Winoground's scores
        return {"acc": _frac(all_["group_score"]), "text_acc": _frac(all_.get("text_score")),
                "image_acc": _frac(all_.get("image_score"))}
    return {}


def _choice(suite: str, metrics: dict, counts: dict) -> list[tuple[str, dict]]:
    entries = {k: v for k, v in metrics.items() if isinstance(v, dict) and isinstance(v.get("all"), dict)
               and (counts.get(k) or {}).get("rule") != "text_triplet"}  # a text-only task selects no caption
    out = []
    if suite == "sugarcrepe":
        return [(f"sugar_crepe/{t}", _one_image(entries[t]["all"])) for t in _SUGARCREPE if t in entries]
    if suite == "aro":
        for task, (name, macro) in _ARO.items():
            if task in entries:
                m = _one_image(entries[task]["all"])
                if macro in entries and entries[macro]["all"].get("accuracy") is not None:
                    m["macro_acc"] = _frac(entries[macro]["all"]["accuracy"])
                out.append((name, m))
        return out
    if suite in _ORDER:  # the seeds' mean when there are several
        key = "order" if "order" in entries else next((k for k in entries if k.startswith("order_s")), None)
        return [(_ORDER[suite], _one_image(entries[key]["all"]))] if key else []
    for task, m in entries.items():
        if "over" in m:  # a suite-level aggregate (micro/macro over tasks): no dataset of its own
            continue
        name = suite if len(entries) == 1 else f"{suite}/{task}"
        out.append((name, _one_image(m["all"])))
        for subset, sm in m.items():  # per concept / relation: InpaintCOCO concepts, ...
            if subset not in ("all", "members") and isinstance(sm, dict) and "group_score" in sm:
                out.append((f"{name}/{subset}", _one_image(sm)))
    return out


def _classification_name(result: dict) -> str:
    suite = result["suite"]
    if suite not in ("imagefolder", "classification"):
        return suite
    images = str((result.get("suite_meta") or {}).get("images") or "").rstrip("/")
    return Path(images).name or suite


def _classification(result: dict) -> list[tuple[str, dict]]:
    name = _classification_name(result)
    out = []
    for task, groups in result["metrics"].items():
        base = name if len(result["metrics"]) == 1 else f"{name}/{task}"
        for group, m in groups.items():
            if not isinstance(m, dict) or "acc1" not in m or group == "variants_mean":
                continue
            rec = {"acc1": _frac(m["acc1"]), "acc5": _frac(m.get("acc5")),
                   "mean_per_class_recall": _frac(m.get("mean_per_class_recall"))}
            if "relative_robustness" in m and m["relative_robustness"] is not None:
                rec["relative_robustness"] = round(float(m["relative_robustness"]), 8)
            out.append((base if group == "clean" else f"{base}/{group}", rec))
    return out


def _linear_probe(result: dict) -> list[tuple[str, dict]]:
    """CLIP_benchmark's linear_probe record: its ``lp_*`` metrics (fractions) and the probe's settings."""
    meta = result.get("suite_meta") or {}
    name = result["suite"] if meta.get("dataset") else (
        Path(str(meta.get("images") or "").rstrip("/")).name or result["suite"])
    out = []
    for task, m in result["metrics"].items():
        o = ((result.get("probe") or {}).get(task) or {}).get("options") or {}
        rec = {"lp_acc1": _frac(m.get("acc1")), "lp_acc5": _frac(m.get("acc5")),
               "lp_mean_per_class_recall": _frac(m.get("mean_per_class_recall")),
               "weight_decay": m.get("weight_decay"), "epochs": o.get("fewshot_epochs"), "seed": o.get("probe_seed"),
               "fewshot_k": o.get("fewshot_k"), "normalized": True}
        out.append((name if len(result["metrics"]) == 1 else f"{name}/{task}", rec))
    return out


def clip_benchmark_records(result: dict, pretrained: str) -> tuple[list[dict], str | None]:
    """(CLIP_benchmark result dicts of one hardrank result, why none when it maps to nothing).
    ``pretrained``: the name CLIP_benchmark shows next to the model (the checkpoint's results folder)."""
    suite, metrics = result["suite"], result["metrics"]
    model = ((result.get("provenance") or {}).get("architecture")) or str(result.get("model") or "unknown")
    base = {"model": model, "pretrained": pretrained, "language": result.get("language") or "en"}
    task_type = result.get("task_type")
    if task_type == "ranking":
        name = (_karpathy_name(result) if suite == "karpathy" else
                "crossmodal3600" if suite.startswith("xm3600-") and result.get("language") else suite)
        pairs = [(name if view == "original" else f"{name}/{view}", _retrieval(dirs, view != "original"))
                 for view, dirs in metrics.items() if isinstance(dirs, dict)]
        task = "zeroshot_retrieval"
        # every caption went through pre_caption before the option existed (results without the field)
        base["caption_protocol"] = (result.get("caption_protocol")
                                    or (result.get("suite_meta") or {}).get("caption_protocol") or "blip")
    elif task_type == "choice":
        pairs, task = _choice(suite, metrics, result.get("counts") or {}), "image_caption_selection"
    elif task_type == "classification":
        pairs, task = _classification(result), "zeroshot_classification"
    elif task_type == "linear_probe":
        pairs, task = _linear_probe(result), "linear_probe"
    else:
        return [], f"task type {task_type!r} ({suite}) has no CLIP_benchmark counterpart"
    records = [{**base, "dataset": d, "task": task, "metrics": m} for d, m in pairs if m]
    return records, None if records else f"no metric of {suite} maps to a CLIP_benchmark metric"


def _slug(s: str) -> str:
    """A field as one file-name part: separators become ``_``, and so does a value of dots alone (``..`` from a
    result file's model name would have named the folder above ``--out``)."""
    s = str(s).replace("/", "_").replace(os.sep, "_")
    return "_" * len(s) if s and set(s) == {"."} else s


def check_output(template: str) -> str:
    """``--output`` checked: a relative file name template of CLIP_benchmark's fields (UsageError otherwise)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise UsageError(f"--output {template!r}: not a template ({exc}); e.g. {DEFAULT_OUTPUT}") from None
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown or "dataset" not in fields:
        raise UsageError(f"--output {template!r}: " + (f"unknown field(s) {unknown}" if unknown else "no {dataset}")
                         + f"; CLIP_benchmark's fields are {', '.join('{' + f + '}' for f in _FIELDS)} and each "
                         f"dataset needs a file of its own, e.g. {DEFAULT_OUTPUT}")
    if os.path.isabs(template) or ".." in Path(template).parts:
        raise UsageError(f"--output {template!r}: a file name below --out, not a path outside it")
    return template


def _file_name(template: str, rec: dict, checkpoint_path) -> str:
    """A record's file name, its fields slugged as CLIP_benchmark's eval slugs them (the dataset without ``wds/``)."""
    dataset = str(rec["dataset"])
    return template.format(dataset=_slug(dataset[4:] if dataset.startswith("wds/") else dataset),
                           pretrained=_slug(rec["pretrained"]), model=_slug(rec["model"]),
                           language=_slug(rec["language"]), task=_slug(rec["task"]),
                           pretrained_full_path=_slug(checkpoint_path or rec["pretrained"]))


def export_clip_benchmark(results_dir: str | os.PathLike, out: str | os.PathLike,
                          output: str = DEFAULT_OUTPUT) -> dict:
    """Write one CLIP_benchmark JSON per (checkpoint, dataset) of every result below ``results_dir``
    into ``out``, named by ``output`` as ``clip_benchmark eval`` names its files (default
    ``{dataset}_{pretrained}_{model}_{language}_{task}.json``, ``/`` as ``_``), atomically.
    Returns ``{"written": [paths], "skipped": [(result path, why)]}``."""
    check_output(output)
    root, out = Path(results_dir), Path(out)
    results = read_results(root, skip=out)
    check_writable_dir(out, "out (--out)")  # before any file is written
    written, skipped, names = [], [], {}
    for r in results:
        pretrained = r.path.parent.relative_to(root).as_posix() if r.path.parent != root else r.data["checkpoint"]
        records, why = clip_benchmark_records(r.data, pretrained)
        if why:
            skipped.append((str(r.path), why))
        for rec in records:
            name = _file_name(output, rec, r.data.get("checkpoint_path"))
            if name in names:
                raise DataError(f"{r.path} and {names[name]} both map to {out / name} (same checkpoint folder, "
                                f"model and dataset); export them to separate folders, or name them apart with "
                                f"--output (fields {', '.join('{' + f + '}' for f in _FIELDS)})")
            names[name] = r.path
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / name, rec)
            written.append(str(out / name))
    return {"written": written, "skipped": skipped}
