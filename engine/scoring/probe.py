"""Linear probes on stored image embeddings: CLIP_benchmark's few-shot pick, weight-decay search and schedule.

The protocol is CLIP_benchmark's ``linear_probe`` task (``clip_benchmark/metrics/linear_probe.py``), written anew
(docs/classification.md, "Linear probe"): a ``Linear(d, C)`` trained by AdamW on cross-entropy, its learning rate
cosine-decayed from ``fewshot_lr`` to 0 over every step (no warm-up), batches drawn afresh each epoch; with a
validation set, the weight decay is chosen on it from a logarithmic grid (CLIP after Radford et al., A.3) and the
final probe trains on train + validation (few-shot: on the few shots only); without one, the weight decay is 0.

Seeds: every draw comes from a private ``torch.Generator`` seeded with ``probe_seed`` afresh for each step (the
validation hold-out, the few-shot pick, each training run), never from torch's global generator; its draws are
the ones CLIP_benchmark makes from the global generator (``random_split``, ``randperm``, a ``Linear``'s own
initialisation, one ``DataLoader`` with ``shuffle=True`` per epoch), so with that generator seeded just before
each step the two pick, initialise and batch alike.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from hardrank.errors import UsageError
from hardrank.options import check_options, opt
from hardrank.scoring.results import outcome_schema
from hardrank.tasks import ProbeTask

__all__ = ["ProbeOptions", "DEFAULT_WEIGHT_DECAYS", "split_by_proportion", "fewshot_pick", "short_classes",
           "train_probe", "search_weight_decay", "probe_metrics", "run_probe", "probe_outcomes"]

# CLIP_benchmark's grid: 97 values 1e-6 .. 1e2 (np.logspace), searched from its 7 coarse values (np.logspace(-6, 2,
# 7): every 16th of the 97) and then around the best with spans 8, 4, 2, 1
DEFAULT_WEIGHT_DECAYS = tuple(np.logspace(-6, 2, num=97).tolist())
_COARSE = tuple(i for i, v in enumerate(DEFAULT_WEIGHT_DECAYS) if v in np.logspace(-6, 2, num=7).tolist())
_SPANS = (8, 4, 2, 1)


@dataclass(frozen=True)
class ProbeOptions:
    """How suite linear_probe picks its training images and trains its probe (CLIP_benchmark's linear_probe)."""

    fewshot_k: int = opt(-1, "linear_probe: training images per class, picked by --probe-seed; -1: every image of "
                         "the train split (CLIP_benchmark's fewshot_k option)", minimum=-1)
    fewshot_epochs: int = opt(10, "linear_probe: training epochs (CLIP_benchmark's fewshot_epochs option)", minimum=1)
    fewshot_lr: float = opt(0.1, "linear_probe: AdamW's learning rate, cosine-decayed to 0 over the run, no warm-up "
                            "(CLIP_benchmark's fewshot_lr option)")
    probe_batch_size: int = opt(64, "linear_probe: training batch (CLIP_benchmark's batch_size option)", minimum=1)
    probe_seed: int = opt(0, "linear_probe: seed of the validation hold-out, the few-shot pick, the initial weights "
                          "and the batch order (CLIP_benchmark's seed option)", minimum=0)
    train_split: str = opt("train", "linear_probe: the split of the --images root the probe trains on "
                           "(<root>/<split>/0.tar ...); it is scored on test")
    val_split: str | None = opt(None, "linear_probe: a split of the root to choose the weight decay on, after which "
                                "the probe trains on train + it (few-shot: on the shots); without it or "
                                "--val-proportion the weight decay is 0 (CLIP_benchmark's val_split option)")
    val_proportion: float | None = opt(None, "linear_probe: hold this share of the train split out to choose the "
                                       "weight decay on, like --val-split (CLIP_benchmark's val_proportion option)")
    weight_decays: tuple[float, ...] | None = opt(None, "linear_probe: the weight decays a validation search tries, "
                                                  "each trained, the first best kept; default: CLIP_benchmark's 97 "
                                                  "values 1e-6..1e2, 7 coarse ones first, then around the best",
                                                  minimum=0)

    def __post_init__(self):
        check_options(self)
        if self.fewshot_k == 0:
            raise UsageError("option fewshot_k (--fewshot-k) is 0; give the training images per class (>= 1), or -1 "
                             "for every image of the train split")
        if not (isinstance(self.fewshot_lr, (int, float)) and math.isfinite(self.fewshot_lr) and self.fewshot_lr > 0):
            raise UsageError(f"option fewshot_lr (--fewshot-lr) must be a number > 0, got {self.fewshot_lr!r}")
        p = self.val_proportion
        if p is not None and not (isinstance(p, (int, float)) and 0 < p < 1):
            raise UsageError(f"option val_proportion (--val-proportion) is the share of the train split held out to "
                             f"choose the weight decay, between 0 and 1 (e.g. 0.2); got {p!r}")
        if p is not None and self.val_split is not None:
            raise UsageError(f"give --val-split {self.val_split} or --val-proportion {p}, not both (CLIP_benchmark "
                             f"takes one): the weight decay is chosen on one validation set")
        if self.weight_decays is not None and not self.weight_decays:
            raise UsageError("option weight_decays (--weight-decays) is empty; give the values to try, or leave it "
                             "out for CLIP_benchmark's grid")
        if self.val_split is not None and self.val_split in (self.train_split, "test"):
            raise UsageError(f"--val-split {self.val_split} is also the probe's {self.val_split} split; name a split "
                             f"of its own (CLIP_benchmark's mirrors: val), or use --val-proportion")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


# -- which images train ------------------------------------------------------------------------------------------
def split_by_proportion(n: int, proportion: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) positions of ``n`` images, ``proportion`` of them held out: torch's ``random_split`` into
    shares ``[1 - p, p]`` (each floored, the remainder dealt one by one from the first) from a generator seeded with
    ``seed``; both in the drawn order, as CLIP_benchmark's ``Subset`` s hold them."""
    parts = torch.utils.data.random_split(range(n), [1 - proportion, proportion], generator=_generator(seed))
    return tuple(np.asarray(p.indices, dtype=np.int64) for p in parts)


def fewshot_pick(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Positions of the training images in training order: a permutation drawn from a generator seeded with
    ``seed``, kept whole (``k < 0``) or, walking it, each image whose class has fewer than ``k`` kept so far.
    ``labels`` (n,) int64."""
    perm = torch.randperm(len(labels), generator=_generator(seed)).numpy()
    if k < 0:
        return perm
    lab = np.asarray(labels)[perm]
    by_class = np.argsort(lab, kind="stable")  # positions of perm grouped by class, each group in perm order
    first = np.searchsorted(lab[by_class], lab[by_class], side="left")
    nth = np.empty(len(lab), dtype=np.int64)
    nth[by_class] = np.arange(len(lab)) - first  # how many of its class come before it in perm
    return perm[nth < k]


def short_classes(labels: np.ndarray, k: int) -> list[tuple[int, int]]:
    """(label, images) of each class present with fewer than ``k`` images: a ``k``-shot pick cannot fill it."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64))
    return [(int(c), int(counts[c])) for c in np.nonzero((counts > 0) & (counts < k))[0]]


# -- training ----------------------------------------------------------------------------------------------------
def train_probe(x: torch.Tensor, y: torch.Tensor, n_classes: int, *, weight_decay: float, lr: float, epochs: int,
                batch_size: int, seed: int) -> torch.nn.Linear:
    """A ``Linear(d, n_classes)`` trained on ``x`` (n, d) float32 / ``y`` (n,) int64 (on one device). Its weights
    start as ``nn.Linear`` initialises them, drawn from a generator seeded with ``seed``, which then gives each
    epoch's order as a shuffling ``DataLoader`` does (a worker seed it does not use, then the sampler's seed);
    AdamW (torch's defaults beside ``lr`` and ``weight_decay``), learning rate ``0.5 (1 + cos(pi s / S)) lr`` at
    step s of S = epochs * ceil(n / batch_size), cross-entropy averaged over the batch."""
    g = _generator(seed)
    n, d = x.shape
    layer = torch.nn.utils.skip_init(torch.nn.Linear, d, n_classes)  # nothing drawn from the global generator
    with torch.no_grad():
        torch.nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=g)
        bound = 1 / math.sqrt(d) if d > 0 else 0
        layer.bias.uniform_(-bound, bound, generator=g)
    layer = layer.to(x.device)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=lr, weight_decay=weight_decay)
    per_epoch = -(-n // batch_size)
    steps = epochs * per_epoch
    for epoch in range(epochs):
        torch.empty((), dtype=torch.int64).random_(generator=g)  # the DataLoader iterator's worker base seed
        order_seed = int(torch.empty((), dtype=torch.int64).random_(generator=g).item())
        order = torch.randperm(n, generator=_generator(order_seed)).to(x.device)
        for i in range(per_epoch):
            step = epoch * per_epoch + i
            for group in optimizer.param_groups:
                group["lr"] = 0.5 * (1 + np.cos(np.pi * step / steps)) * lr
            idx = order[i * batch_size:(i + 1) * batch_size]
            optimizer.zero_grad()
            F.cross_entropy(layer(x[idx]), y[idx]).backward()
            optimizer.step()
    return layer.eval()


def _logits(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x).float()


def _ranks(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(n,) classes ranked above each image's true class: higher logits, and equal ones of a lower class (ties go to
    the lower class, as ``argmax`` picks; CLIP_benchmark's ``topk`` leaves their order to the kernel)."""
    true = logits.gather(1, y.unsqueeze(1))
    cls = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    return ((logits > true) | ((logits == true) & (cls < y.unsqueeze(1)))).sum(1)


def _hits(logits: torch.Tensor, y: torch.Tensor, k: int) -> int:
    """Images whose class is among the ``k`` top logits."""
    return int((_ranks(logits, y) < k).sum())


def _acc1(logits: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy as a fraction: hits / n exactly, so equal counts compare equal."""
    return _hits(logits, y, 1) / len(y) if len(y) else 0.0


def search_weight_decay(val_acc1: Callable[[float], float], grid: tuple[float, ...] | None = None,
                        ) -> tuple[float, list[tuple[float, float]]]:
    """(the chosen weight decay, [(weight decay, validation top-1)] in the order tried). ``val_acc1(wd)`` trains a
    probe and scores it on the validation set. ``grid`` None: CLIP_benchmark's search over its 97 values (the 7
    coarse ones, then the best's neighbours at spans 8, 4, 2, 1, keeping the first best of each round; a round
    whose probes all score 0 falls back to the grid's first value, as there); a grid given: every value, the first
    best kept. A value is trained once (a probe is a function of its seed)."""
    tried: dict[int, float] = {}
    values = DEFAULT_WEIGHT_DECAYS if grid is None else tuple(grid)

    def best(idxs) -> int:
        pick, top = 0, 0.0  # as find_peak: the grid's first value unless a probe scores above 0
        for i in idxs:
            if i not in tried:
                tried[i] = val_acc1(values[i])
            if top < tried[i]:
                pick, top = i, tried[i]
        return pick

    if grid is None:
        peak = best(_COARSE)
        for span in _SPANS:
            peak = best([max(peak - span, 0), peak, min(peak + span, len(values) - 1)])
    else:
        peak = best(range(len(values)))
    return values[peak], [(values[i], a) for i, a in tried.items()]


# -- metrics -----------------------------------------------------------------------------------------------------
def probe_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """``acc1``, ``acc5``, ``mean_per_class_recall`` (percent) of test ``logits`` (n, C) against ``labels`` (n,):
    CLIP_benchmark's linear-probe metrics (``acc5`` null unless some test label is >= 5, as there; the recall
    averages the classes present in ``labels``, predictions by argmax). Among equal logits the lower class ranks
    first."""
    n = len(labels)
    if n == 0:
        return {"acc1": float("nan"), "acc5": float("nan"), "mean_per_class_recall": float("nan"), "images": 0}
    out = {"acc1": 100.0 * _hits(logits, labels, 1) / n,
           "acc5": 100.0 * _hits(logits, labels, 5) / n if int(labels.max()) >= 5 else float("nan")}
    pred = logits.argmax(dim=1)
    lab = labels.cpu().numpy()
    right = (pred == labels).cpu().numpy().astype(np.float64)
    present = np.unique(lab)
    out["mean_per_class_recall"] = 100.0 * float(np.mean(np.bincount(lab, right)[present] / np.bincount(lab)[present]))
    out["images"] = int(n)
    return out


def run_probe(task: ProbeTask, image_emb: np.ndarray, device: str = "cpu") -> dict:
    """Train ``task``'s probe on its rows of ``image_emb`` (rows, d) and score it on its test rows. Returns
    ``metrics`` (probe_metrics, with ``weight_decay``), ``search`` ([(weight decay, validation top-1 %)]), ``final``
    (what the final probe trained on) and per test image ``rank`` (classes whose logit beats the true class's;
    among equal logits the lower class wins), ``pred`` (argmax) and ``label``."""
    o = task.options
    n_classes = len(task.classnames)

    def tensors(items, labels):
        x = torch.from_numpy(np.ascontiguousarray(image_emb[items], dtype=np.float32)).to(device)
        return x, torch.from_numpy(np.asarray(labels, dtype=np.int64)).to(device)

    xt, yt = tensors(task.train_items, task.train_labels)
    train = dict(lr=o.fewshot_lr, epochs=o.fewshot_epochs, batch_size=o.probe_batch_size, seed=o.probe_seed)
    search, final = [], "train"
    if len(task.val_items):
        xv, yv = tensors(task.val_items, task.val_labels)
        wd, search = search_weight_decay(
            lambda w: _acc1(_logits(train_probe(xt, yt, n_classes, weight_decay=w, **train), xv), yv),
            o.weight_decays)
        if o.fewshot_k < 0:  # the full probe trains on train + validation; a few-shot probe on its shots alone
            xt, yt, final = torch.cat([xt, xv]), torch.cat([yt, yv]), "train+val"
    else:
        wd = 0.0
    layer = train_probe(xt, yt, n_classes, weight_decay=wd, **train)
    xq, yq = tensors(task.test_items, task.test_labels)
    logits = _logits(layer, xq)
    rank = _ranks(logits, yq)
    return {"metrics": {**probe_metrics(logits, yq), "weight_decay": float(wd)},
            "search": [(float(w), 100.0 * a) for w, a in search], "final": final,
            "rank": rank.cpu().numpy().astype(np.int64), "pred": logits.argmax(dim=1).cpu().numpy().astype(np.int64),
            "label": yq.cpu().numpy()}


def probe_outcomes(task: ProbeTask, r: dict) -> pa.Table:
    """Per test image: the true class's rank among the probe's logits, the predicted class, the true class."""
    n = len(r["rank"])
    names = task.classnames
    return pa.Table.from_pydict({
        "kind": ["linear_probe"] * n, "task": [task.name] * n, "view": ["test"] * n, "query_id": task.test_ids,
        "rank": r["rank"], "top1_id": [names[p] for p in r["pred"]], "top1_group": [None] * n,
        "subset": [names[c] for c in r["label"]], "scores": [None] * n, "correct": (r["rank"] == 0).tolist(),
        "unit": task.test_ids, "verdicts": [None] * n,  # the unit: a test image
    }, schema=outcome_schema())
