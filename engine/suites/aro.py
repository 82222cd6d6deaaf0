"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution and COCO/Flickr-Order choice tasks."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError, read_bbox, read_json, require_keys
from hardrank.formats.karpathy import merge_repeated_images, read_karpathy
from hardrank.items import ImageRef, Tables
from hardrank.scoring.choice_macro import ChoiceAggregate, attach_aggregates
from hardrank.suites._common import SuiteOptions, find_annotation
from hardrank.tasks import ChoiceTask, Suite
from hardrank.text import pre_caption
from hardrank.word_tags import WORD_LISTS, OrderTagger, order_tagger

__all__ = ["load_aro", "load_coco_order", "load_flickr_order", "order_perturbations", "order_tagger",
           "OrderTagger", "WORD_LISTS", "ARO_FILES", "ARO_SYMMETRIC_RELATIONS", "ORDER_PERTURBATIONS"]

log = logging.getLogger("hardrank.suites")

# task name -> released annotation file
ARO_FILES = {"vg_relation": "visual_genome_relation.json", "vg_attribution": "visual_genome_attribution.json"}
MIN_ATTRIBUTE_ITEMS = 25  # VG-Attribution macro: attribute pairs with at least this many items [ref]

# Relations the reference notebook leaves out of the VG-Relation macro accuracy ("symmetric": swapping
# subject and object does not make the caption false). Transcribed from the ARO repository's
# notebooks/Replicate ARO! VG-Relation, VG-Attribution.ipynb (157 names).
ARO_SYMMETRIC_RELATIONS = frozenset("""
adjusting|attached to|between|bigger than|biting|boarding|brushing|chewing|cleaning|climbing|close to|
coming from|coming out of|contain|crossing|dragging|draped over|drinking|drinking from|driving|
driving down|driving on|eating from|eating in|enclosing|exiting|facing|filled with|floating in|
floating on|flying|flying above|flying in|flying over|flying through|full of|going down|going into|
going through|grazing in|growing in|growing on|guiding|hanging from|hanging in|hanging off|hanging over|
higher than|holding onto|hugging|in between|jumping off|jumping on|jumping over|kept in|larger than|
leading|leaning over|leaving|licking|longer than|looking in|looking into|looking out|looking over|
looking through|lying next to|lying on top of|making|mixed with|mounted on|moving|on the back of|
on the edge of|on the front of|on the other side of|opening|painted on|parked at|parked beside|
parked by|parked in|parked in front of|parked near|parked next to|perched on|petting|piled on|playing|
playing in|playing on|playing with|pouring|reaching for|reading|reflected on|riding on|running in|
running on|running through|seen through|sitting behind|sitting beside|sitting by|sitting in front of|
sitting near|sitting next to|sitting under|skiing down|skiing on|sleeping in|sleeping on|smiling at|
sniffing|splashing|sprinkled on|stacked on|standing against|standing around|standing behind|
standing beside|standing in front of|standing near|standing next to|staring at|stuck in|surrounding|
swimming in|swinging|talking to|topped with|touching|traveling down|traveling on|tying|typing on|
underneath|wading in|waiting for|walking across|walking by|walking down|walking next to|walking through|
working in|working on|worn on|wrapped around|wrapped in|by|of|near|next to|with|beside|on the side of|
around""".replace("\n", "").split("|"))


# -- VG-Relation / VG-Attribution ------------------------------------------------------------------
def _vg_label(path: Path, task: str, i: int, item: dict) -> str:
    if task == "vg_relation":
        require_keys(path, i, item, ("relation_name",), {"relation_name": str})
        return item["relation_name"]
    require_keys(path, i, item, ("attributes",))
    a = item["attributes"]
    if not isinstance(a, list) or len(a) < 2 or not all(isinstance(x, str) for x in a[:2]):
        raise SuiteFormatError(f"{path}: item {i} 'attributes' is {a!r}, expected a list of two attribute strings")
    return f"{a[0]}_{a[1]}"  # the reference's attribute-pair key


def _vg_task(tables: Tables, path: Path, images: Path, task: str, download: Path) -> ChoiceTask:
    """``download``: ``DATA/images``, where ARO's download puts the images: used instead of ``--images`` when
    that lacks the first item's image and this folder holds it (one ``--images`` then serves other suites)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise SuiteFormatError(f"{path}: expected a JSON list of test cases, got a {type(data).__name__}")
    refs, caps, labels = [], [], []
    for i, item in enumerate(data):
        require_keys(path, i, item, ("image_path", "true_caption", "false_caption"),
                     {"image_path": str, "true_caption": str, "false_caption": str})
        if i == 0 and not (images / item["image_path"]).exists() and (download / item["image_path"]).exists():
            images = download
        labels.append(_vg_label(path, task, i, item))
        refs.append(ImageRef(os.fspath(images / item["image_path"]), read_bbox(path, i, item, required=True)))
        caps.append((item["true_caption"], item["false_caption"]))
    # the reference takes argmax over [false, true] and needs index 1: true strictly above false.
    # With candidates ordered (true, false) that is first_strict (a tie is wrong).
    t = ChoiceTask(name=task, rule="first_strict", left_modality="image", right_modality="text",
                   left=tables.images.add_many(refs).reshape(-1, 1),
                   right=tables.texts.add_many(c for pair in caps for c in pair).reshape(-1, 2),
                   ids=[f"{task}/{i}" for i in range(len(data))], subset=labels)
    t.validate()
    return t


def load_aro(tables: Tables, opts: SuiteOptions, name: str = "aro") -> Suite:
    """VG-Relation and VG-Attribution, whichever of their files ``--data`` holds. Images (cropped to each
    item's bbox) are under ``--images`` or ``DATA/images``. Metrics: per task micro accuracy (``all``),
    per relation / attribute pair, and the reference's macro accuracies ``vg_relation_macro`` (mean
    over relations, symmetric ones excluded) and ``vg_attribution_macro`` (mean over attribute pairs
    with >= 25 items)."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding {' and/or '.join(ARO_FILES.values())}")
    root = Path(opts.data)
    images = Path(opts.images) if opts.images else root / "images"
    tasks, missing = [], []
    for task, fname in ARO_FILES.items():
        path = root / fname
        if path.is_file():
            tasks.append(_vg_task(tables, path, images, task, root / "images"))
        else:
            missing.append(fname)
    if not tasks:
        raise FileNotFoundError(f"{root}: neither {' nor '.join(ARO_FILES.values())} found")
    aggs = []
    for t in tasks:
        if t.name == "vg_relation":
            aggs.append(ChoiceAggregate("vg_relation_macro", (t.name,), over="subsets",
                                        exclude=tuple(sorted(ARO_SYMMETRIC_RELATIONS))))
        else:
            aggs.append(ChoiceAggregate("vg_attribution_macro", (t.name,), over="subsets",
                                        min_items=MIN_ATTRIBUTE_ITEMS))
    suite = Suite(name=name, choice=tasks, tie_rule="first_strict",
                  meta={"files_found": [ARO_FILES[t.name] for t in tasks], "files_missing": missing,
                        "items": {t.name: len(t.ids) for t in tasks}, "images": str(images),
                        "macro": "vg_relation_macro: mean over relations minus the reference's symmetric list; "
                                 "vg_attribution_macro: mean over attribute pairs with >= "
                                 f"{MIN_ATTRIBUTE_ITEMS} items"})
    return attach_aggregates(suite, aggs)


# -- COCO-Order / Flickr30k-Order -----------------------------------------------------------------
ORDER_PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                       "shuffle_trigrams")

def _permute(tokens: list[str], idx: list[int], rng: np.random.Generator) -> None:
    if len(idx) > 1:
        vals = [tokens[i] for i in idx]
        for i, j in zip(idx, rng.permutation(len(vals))):
            tokens[i] = vals[j]


def _trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i:i + 3] for i in range(0, len(tokens), 3)]


def _shuffles(toks: list[str], tags: list[str], tri_toks: list[str], rng: np.random.Generator) -> list[str]:
    a = list(toks)
    _permute(a, [i for i, g in enumerate(tags) if g == "noun"], rng)
    _permute(a, [i for i, g in enumerate(tags) if g == "adj"], rng)
    b = list(toks)
    _permute(b, [i for i, g in enumerate(tags) if g == "other"], rng)
    c = []
    for tri in _trigrams(tri_toks):
        c.extend(tri[j] for j in rng.permutation(len(tri)))
    tris = _trigrams(tri_toks)
    d = [t for j in rng.permutation(len(tris)) for t in tris[j]]
    return [" ".join(x) for x in (a, b, c, d)]


def order_perturbations(caption: str, rng: np.random.Generator, tagger: OrderTagger = WORD_LISTS) -> list[str]:
    """The four ARO order perturbations of a raw caption, in ``ORDER_PERTURBATIONS`` order (before
    ``pre_caption``): nouns among nouns and adjectives among adjectives; everything else among itself;
    tokens within each trigram; the trigrams themselves. ``tagger``: the word lists by default;
    the loaders use ``order_tagger()`` (spaCy when installed)."""
    (toks, tags), = tagger.tag_many([caption])
    return _shuffles(toks, tags, tagger.trigram_tokens(caption), rng)


def _load_order(tables: Tables, opts: SuiteOptions, name: str, default_name: str, max_words: int = 30) -> Suite:
    ann = find_annotation(opts, default_name, f"suite {name}")
    errors = [] if opts.images is not None else [
        ValueError(f"suite {name} needs --images DIR (the folder the paths in {ann.name} are relative to)")]
    clean, _, repeated = merge_repeated_images(ann, read_karpathy(ann))
    images = Path(opts.images or "")  # no --images: the paths as written (ids for bring-your-own embeddings)
    img_rows = tables.images.add_many(ImageRef(os.fspath(images / im)) for im, _ in clean)
    tagger = order_tagger()
    caps_all = [cap for _, caps in clean for cap in caps]
    tagged = iter(list(zip(tagger.tag_many(caps_all), map(tagger.trigram_tokens, caps_all))) * len(opts.seeds))
    tasks, same = [], {}
    for seed in opts.seeds:
        left, texts, ids, n_same = [], [], [], 0
        for i, (im, caps) in enumerate(clean):
            for j, cap in enumerate(caps):
                # one stream per (seed, image, caption): a caption's shuffles never depend on the others
                rng = np.random.default_rng([int(seed), i, j])
                orig = pre_caption(cap, max_words)
                (toks, tags), tri = next(tagged)
                pert = [pre_caption(p, max_words) for p in _shuffles(toks, tags, tri, rng)]
                n_same += sum(p == orig for p in pert)
                left.append(img_rows[i])
                texts.extend([orig, *pert])
                ids.append(f"{im}#{j}")
        t = ChoiceTask(name=f"order_s{seed}", rule="first_ties_win", left_modality="image", right_modality="text",
                       left=np.asarray(left, dtype=np.int64).reshape(-1, 1),
                       right=tables.texts.add_many(texts).reshape(-1, 1 + len(ORDER_PERTURBATIONS)), ids=ids)
        t.validate()
        tasks.append(t)
        same[t.name] = n_same
    members = [t.name for t in tasks]
    return Suite(name=name, choice=tasks, tie_rule="first_ties_win", image_errors=errors,
                 view_average={"order": members} if len(members) > 1 else {},
                 meta={"annotations": str(ann), "images": len(clean), "captions": len(tasks[0].ids) if tasks else 0,
                       "seeds": list(opts.seeds), "perturbations": list(ORDER_PERTURBATIONS),
                       "perturbed_equal_original": same,
                       "pos_tagger": tagger.name, "trigram_tokenizer": tagger.tokenizer,
                       "normalise": f"pre_caption(max_words={max_words}) on the original and on each shuffle",
                       **({"repeated_images": repeated} if repeated else {})})


def load_coco_order(tables: Tables, opts: SuiteOptions, name: str = "coco_order") -> Suite:
    """COCO-Order: each Karpathy test caption vs its 4 seeded shuffles (one task per seed in
    ``opts.seeds``); correct iff no shuffle scores above the original (ties go to the original)."""
    return _load_order(tables, opts, name, "coco_karpathy_test.json")


def load_flickr_order(tables: Tables, opts: SuiteOptions, name: str = "flickr_order") -> Suite:
    """Flickr30k-Order: as COCO-Order over the Flickr30k Karpathy test file."""
    return _load_order(tables, opts, name, "flickr30k_test.json")
