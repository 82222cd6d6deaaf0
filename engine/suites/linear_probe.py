"""Linear probe (CLIP_benchmark's linear_probe task) on a CLIP_benchmark WebDataset root's train and test splits."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardrank import urls
from hardrank.errors import DataError, UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.items import ImageRef, Tables
from hardrank.scoring.probe import ProbeOptions, fewshot_pick, short_classes, split_by_proportion
from hardrank.suites._common import SuiteOptions
from hardrank.suites.classification import (
    CB_CLASSNAMES,
    ClassNamesOptions,
    read_classnames,
    read_wds_split,
    wds_split_exists,
)
from hardrank.tasks import ProbeTask, Suite

__all__ = ["load_linear_probe", "LinearProbeOptions"]


@dataclass(frozen=True)
class LinearProbeOptions(ProbeOptions, ClassNamesOptions):
    """Suite linear_probe's own options: the probe's training (``ProbeOptions``) and the class names, which it
    shares with the zero-shot suites (``--classnames``)."""


def _rows(tables: Tables, samples, prefix: str) -> np.ndarray:
    """Image-table rows of ``samples``; ids ``<prefix><shard>#<key>`` (test: as the zero-shot suite names them)."""
    return np.array([tables.images.add(ImageRef(s.image), prefix + s.id, s.image_key) for s in samples],
                    dtype=np.int64).reshape(-1)


def _split(root: str, split: str, classnames: list[str], role: str):
    if not wds_split_exists(root, split):
        fix = {"train": "trains on it; CLIP_benchmark's dataset mirrors hold train/ beside test/ for the datasets "
                        "it probes (clip_benchmark_export_wds --split train writes one), or name another split with "
                        "--train-split",
               "validation": "chooses the weight decay on it; write that split, or hold part of the train split "
                             "out with --val-proportion instead",
               "test": "is scored on it (CLIP_benchmark's layout: test/0.tar ...)"}[role]
        raise DataError(f"{root}: no {split} split ({urls.join(root, split)}/0.tar ... with nshards.txt); the "
                        f"linear probe {fix}")
    return read_wds_split(root, split, classnames)


def load_linear_probe(tables: Tables, opts: SuiteOptions, own: LinearProbeOptions, name: str = "linear_probe") -> Suite:
    """A linear probe: ``--images`` is CLIP_benchmark's WebDataset root (``classnames.txt``, ``train/`` and
    ``test/`` shards with ``cls`` members, a ``val/`` split with ``--val-split``). The training images are picked
    here (``--val-proportion`` held out, ``--fewshot-k`` per class, by ``--probe-seed``), so only those are encoded;
    the probe trains once every checkpoint's embeddings are in the store (``hardrank.scoring.probe``)."""
    o = own
    if not opts.images:
        raise UsageError(f"suite {name} needs --images: CLIP_benchmark's WebDataset root (classnames.txt, "
                         f"{o.train_split}/*.tar and test/*.tar)")
    root = opts.images
    if own.classnames:
        classnames = read_classnames(own.classnames)
    elif urls.exists(urls.join(root, CB_CLASSNAMES)):
        classnames = read_classnames(urls.join(root, CB_CLASSNAMES))
    elif not urls.is_dir(root):
        raise FileNotFoundError(f"{root} does not exist (expected CLIP_benchmark's WebDataset root: {CB_CLASSNAMES}, "
                                f"{o.train_split}/ and test/ shards)")
    else:
        raise SuiteFormatError(f"{root}: no {CB_CLASSNAMES} (one class name a line, in label order: CLIP_benchmark's "
                               f"WebDataset root); add it, or pass --classnames FILE")
    _, train, train_labels = _split(root, o.train_split, classnames, "train")
    _, test, test_labels = _split(root, "test", classnames, "test")
    val, val_labels = [], np.zeros(0, dtype=np.int64)
    pos = np.arange(len(train))
    if o.val_split is not None:
        _, val, val_labels = _split(root, o.val_split, classnames, "validation")
    elif o.val_proportion is not None:
        pos, held = split_by_proportion(len(train), o.val_proportion, o.probe_seed)
        val, val_labels = [train[i] for i in held], train_labels[held]
    if o.fewshot_k > 0:
        short = short_classes(train_labels[pos], o.fewshot_k)
        if short:
            where = f"split {o.train_split}" + (f" less the {o.val_proportion} held out" if o.val_proportion else "")
            shown = ", ".join(f"{classnames[c]!r} (label {c}) has {n}" for c, n in short[:5])
            least = min(n for _, n in short)
            raise DataError(f"{root}: --fewshot-k {o.fewshot_k} needs {o.fewshot_k} training images per class, but "
                            f"in {where} class {shown}" + (f" and {len(short) - 5} more" if len(short) > 5 else "")
                            + f"; use --fewshot-k {least} or less, or -1 for every image")
    pos = pos[fewshot_pick(train_labels[pos], o.fewshot_k, o.probe_seed)]
    task = ProbeTask(name=name, classnames=list(classnames),
                     train_items=_rows(tables, [train[i] for i in pos], f"{o.train_split}/"),
                     train_labels=train_labels[pos], val_items=_rows(tables, val, f"{o.val_split or o.train_split}/"),
                     val_labels=np.asarray(val_labels, dtype=np.int64), test_items=_rows(tables, test, ""),
                     test_labels=test_labels, test_ids=[s.id for s in test], options=o)
    task.validate()
    present = np.unique(train_labels[pos])
    return Suite(name=name, probe=[task],
                 meta={"images": root, "layout": "clip_benchmark_wds", "classes": len(classnames),
                       "train_split": o.train_split, "train_images": len(pos), "train_split_images": len(train),
                       "val": (f"split {o.val_split}" if o.val_split else f"{o.val_proportion} of {o.train_split}"
                               if o.val_proportion else None), "val_images": len(val), "test_images": len(test),
                       "classes_without_training_images": [classnames[c] for c in range(len(classnames))
                                                           if c not in set(present.tolist())][:50],
                       "classnames_from": own.classnames or "dataset"})
