"""The task model: every suite compiles into ranking, choice, mask, classification or probe tasks over shared tables."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = ["RankingTask", "ChoiceTask", "RowGroups", "MaskTask", "ClassifyTask", "ProbeTask", "Suite",
           "CHOICE_RULES"]

# Choice rules (docs/choice.md, "The choice task"): how a row's (A, B) score grid becomes a verdict.
CHOICE_RULES = (
    "first_strict",   # candidate 0 is correct; correct iff it scores strictly above every other (ties wrong)
    "first_ties_win", # candidate 0 is correct; correct iff no other scores strictly above it (ARO order, What's Up)
    "triplet",        # candidates (c, c_P, c_N): hard-positives orderings, strict
    "grid2x2",        # 2 images x 2 texts, matched on the diagonal: Winoground-style text/image/group, strict
    "pair_t2i",       # 2 images x 2 texts: each text picks an image, text j's is image j; a tie picks image 1
                      # (MMVP-VLM: image 0 only when its probability > 0.5); correct iff both texts pick theirs
    "two_positives",  # 1 anchor x (p1, p2, n): correct iff both positives score strictly above n (SugarCrepe++ ITT)
    "text_triplet",   # texts (p1, p2, n) x the same three: correct iff s(p1, p2) > s(p1, n) and > s(p2, n), strict
                      # (SugarCrepe++ TOT)
    "first_rank",     # candidate 0 is correct; rank = others strictly above it (a tie goes to candidate 0, the order
                      # of a stable descending sort); correct iff rank 0; R@K and ranks reported (CREPE)
    "multilabel",     # 1 image x C class texts with per-candidate truth (``truth``) and eligibility (``eligible``):
                      # average precision per class over the rows eligible for it, their mean (COLA single-object)
)


@dataclass(frozen=True)
class RowGroups:
    """Sets of rows that count as one unit: a set is correct only when it is complete (``size`` rows)
    and every row of it is correct; its accuracy is over ``rows / size`` sets, as What's Up's code
    divides (a set missing a row counts wrong)."""

    labels: list[str | None]   # (n,) set label per row; None: the row is in no set
    size: int                  # rows a complete set has


@dataclass
class RankingTask:
    """Queries of one modality against a gallery of the other, made of contiguous named groups.

    The gallery is ``gallery_items`` (rows of the other modality's table) ordered group by group:
    group g occupies ``[group_bounds[g], group_bounds[g+1])``; ``groups[0]`` is the clean base
    (``original``). A view is a set of groups forming one evaluated gallery; every view's metrics
    come from one kernel pass over the union.
    """

    name: str                      # "i2t" | "t2i"
    query_modality: str            # "image" | "text"
    query_items: np.ndarray        # (nq,) int64 rows of the query modality's table
    query_ids: list[str]           # (nq,) ids as the annotation file writes them
    groups: list[str]              # (G,) group names, gallery order
    group_bounds: np.ndarray       # (G+1,) int64
    gallery_items: np.ndarray      # (nb,) int64 rows of the gallery modality's table
    gallery_ids: list[str]         # (nb,)
    pos_ptr: np.ndarray            # (nq+1,) int64 CSR of positives (gallery positions)
    pos_idx: np.ndarray            # (npos,) int64
    views: dict[str, list[str]]    # view name -> groups it contains (each includes groups[0])
    skipped: dict[str, int] = field(default_factory=dict)
    # the independent units (images of a retrieval suite) each query and gallery item belongs to: indices into
    # ``unit_ids``, -1 for an item of no unit; None when the loader records none (a query's unit is then its
    # first positive for t2i, itself for i2t: ``query_unit_ids``)
    unit_ids: list[str] | None = None          # (U,)
    query_units: np.ndarray | None = None      # (nq,) int64
    gallery_units: np.ndarray | None = None    # (nb,) int64

    @property
    def gallery_modality(self) -> str:
        return "text" if self.query_modality == "image" else "image"

    @property
    def num_queries(self) -> int:
        return len(self.query_items)

    def query_unit_ids(self) -> list[str]:
        """(nq,) the unit of each query: the image of an image query, the positive image of a caption."""
        if self.unit_ids is not None and self.query_units is not None:
            return [self.unit_ids[u] for u in self.query_units]
        if self.query_modality == "image":
            return list(self.query_ids)
        return [self.gallery_ids[self.pos_idx[a]] if b > a else q
                for q, a, b in zip(self.query_ids, self.pos_ptr[:-1], self.pos_ptr[1:])]

    def view_size(self, view: str) -> int:
        gi = [self.groups.index(g) for g in self.views[view]]
        return int(sum(self.group_bounds[g + 1] - self.group_bounds[g] for g in gi))

    def validate(self) -> None:
        nb = len(self.gallery_items)
        b = self.group_bounds
        if len(b) != len(self.groups) + 1 or b[0] != 0 or b[-1] != nb or np.any(np.diff(b) < 0):
            raise ValueError(f"task {self.name}: group_bounds {b.tolist()} do not partition a gallery of {nb}")
        if len(self.gallery_ids) != nb or len(self.query_ids) != self.num_queries:
            raise ValueError(f"task {self.name}: {len(self.gallery_ids)} gallery ids for {nb} items, "
                             f"{len(self.query_ids)} query ids for {self.num_queries} queries")
        if len(self.pos_ptr) != self.num_queries + 1:
            raise ValueError(f"task {self.name}: pos_ptr has {len(self.pos_ptr)} entries for "
                             f"{self.num_queries} queries")
        for v, gs in self.views.items():
            unknown = [g for g in gs if g not in self.groups]
            if unknown:
                raise ValueError(f"task {self.name}: view {v!r} names unknown groups {unknown}")

    def drop(self, bad_queries: np.ndarray, bad_gallery: np.ndarray) -> RankingTask:
        """Remove queries and gallery entries whose item failed to load (masks over positions).
        A query left without positives is removed too. Counts land in ``skipped``."""
        if not bad_queries.any() and not bad_gallery.any():
            return self
        keep_g = ~bad_gallery
        new_pos = np.cumsum(keep_g) - 1
        ptr, idx, keep_q = [0], [], np.zeros(self.num_queries, dtype=bool)
        for q in range(self.num_queries):
            p = self.pos_idx[self.pos_ptr[q]:self.pos_ptr[q + 1]]
            p = new_pos[p[keep_g[p]]]
            if bad_queries[q] or len(p) == 0:
                continue
            keep_q[q] = True
            idx.extend(p.tolist())
            ptr.append(len(idx))
        skipped = dict(self.skipped)
        skipped["queries"] = skipped.get("queries", 0) + int((~keep_q).sum())
        skipped["gallery"] = skipped.get("gallery", 0) + int(bad_gallery.sum())
        return self._keep(keep_q, keep_g, np.array(ptr, dtype=np.int64), np.array(idx, dtype=np.int64), skipped)

    def keep_units(self, keep: np.ndarray) -> RankingTask:
        """The task restricted to the units ``keep`` (U,) bool marks (a lite subset): their queries, and the
        gallery items of those units or of none; positives renumbered. Needs ``unit_ids``."""
        if self.query_units is None or self.gallery_units is None:
            raise ValueError(f"task {self.name} records no units")
        keep_q = keep[self.query_units]
        keep_g = (self.gallery_units < 0) | keep[np.maximum(self.gallery_units, 0)]
        new_pos = np.cumsum(keep_g) - 1
        ptr, idx = [0], []
        for q in np.nonzero(keep_q)[0]:
            p = self.pos_idx[self.pos_ptr[q]:self.pos_ptr[q + 1]]
            idx.extend(new_pos[p[keep_g[p]]].tolist())
            ptr.append(len(idx))
        return self._keep(keep_q, keep_g, np.array(ptr, dtype=np.int64), np.array(idx, dtype=np.int64),
                          dict(self.skipped))

    def _keep(self, keep_q: np.ndarray, keep_g: np.ndarray, pos_ptr: np.ndarray, pos_idx: np.ndarray,
              skipped: dict) -> RankingTask:
        gid = np.repeat(np.arange(len(self.groups)), np.diff(self.group_bounds))
        bounds = np.zeros(len(self.groups) + 1, dtype=np.int64)
        np.add.at(bounds, gid[keep_g] + 1, 1)
        bounds = np.cumsum(bounds)
        return replace(self, query_items=self.query_items[keep_q],
                       query_ids=[i for i, k in zip(self.query_ids, keep_q) if k],
                       group_bounds=bounds, gallery_items=self.gallery_items[keep_g],
                       gallery_ids=[i for i, k in zip(self.gallery_ids, keep_g) if k],
                       pos_ptr=pos_ptr, pos_idx=pos_idx, skipped=skipped,
                       query_units=None if self.query_units is None else self.query_units[keep_q],
                       gallery_units=None if self.gallery_units is None else self.gallery_units[keep_g])


@dataclass
class ChoiceTask:
    """Rows of (A left items) x (B right items) scored as an (n, A, B) grid, judged by ``rule``."""

    name: str                 # e.g. "swap", "replace_att"
    rule: str                 # one of CHOICE_RULES
    left_modality: str        # "image" | "text"
    right_modality: str
    left: np.ndarray          # (n, A) int64 rows of the left table
    right: np.ndarray         # (n, B) int64 rows of the right table
    ids: list[str]            # (n,) item ids for the per-item outcomes
    subset: list[str] | None = None  # (n,) label for per-subset metrics (concept, relation, ...)
    skipped: dict[str, int] = field(default_factory=dict)
    # further breakdowns: facet -> (n,) labels per row (a row may carry several, or none: ()), reported as
    # metrics "<facet>=<label>" (Winoground's tag, secondary_tag, num_main_preds)
    facets: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    # set accuracies: name -> RowGroups, reported as "<name>_accuracy" over all rows (What's Up pair / set)
    groups: dict[str, RowGroups] = field(default_factory=dict)
    # (n,) bool: a bag-of-words text-only scorer cannot separate the candidates this rule compares, so its
    # verdict is forced (scoring/blind.py); None where the check does not apply. Set when the suite loads.
    blind: np.ndarray | None = None
    # (n,) int64: row i's real candidates are right[i, :candidates[i]], the rest padding (repeating candidate 0,
    # never scored); None: every row has all B (CREPE's retrieval sets differ in size)
    candidates: np.ndarray | None = None
    # multilabel: (n, B) bool, candidate b is a positive of row i / counts for row i (COLA's label and hard_list)
    truth: np.ndarray | None = None
    eligible: np.ndarray | None = None

    def validate(self) -> None:
        if self.rule not in CHOICE_RULES:
            raise ValueError(f"task {self.name}: rule {self.rule!r} is not one of {CHOICE_RULES}")
        if self.left.ndim != 2 or self.right.ndim != 2 or len(self.left) != len(self.right):
            raise ValueError(f"task {self.name}: left {self.left.shape} / right {self.right.shape} "
                             f"must be (n, A) / (n, B)")
        n = len(self.ids)
        labels = {"ids": self.ids, "subset": self.subset, **{f"facet {k}": v for k, v in self.facets.items()},
                  **{f"group {k}": g.labels for k, g in self.groups.items()}}
        wrong = {k: len(v) for k, v in labels.items() if v is not None and len(v) != len(self.left)}
        if wrong or (self.blind is not None and len(self.blind) != n):
            raise ValueError(f"task {self.name}: {len(self.left)} rows but per-row lists of lengths {wrong}")
        b = self.right.shape[1]
        if self.candidates is not None and (self.candidates.shape != (n,) or (n and (
                self.candidates.min() < 1 or self.candidates.max() > b))):
            raise ValueError(f"task {self.name}: candidates must be (n,) counts in 1..{b}, got "
                             f"{self.candidates.shape}")
        grids = {k: v.shape for k, v in (("truth", self.truth), ("eligible", self.eligible)) if v is not None}
        need = 2 if self.rule == "multilabel" else 0
        if len(grids) != need or any(sh != self.right.shape for sh in grids.values()):
            raise ValueError(f"task {self.name}: truth and eligible go with rule multilabel, shaped like right "
                             f"{self.right.shape}; got {grids} for rule {self.rule}")

    def drop(self, bad_left: np.ndarray, bad_right: np.ndarray) -> ChoiceTask:
        """Remove rows that touch a failed item (row-wise masks)."""
        bad = bad_left.any(1) | bad_right.any(1)
        if not bad.any():
            return self
        skipped = dict(self.skipped)
        skipped["unreadable"] = skipped.get("unreadable", 0) + int(bad.sum())
        return replace(self.keep_rows(~bad), skipped=skipped)

    def keep_rows(self, keep: np.ndarray) -> ChoiceTask:
        """The task with only the rows ``keep`` (n,) bool marks: every per-row field cut alike (a lite subset,
        rows of failed items)."""
        def rows(values):
            return None if values is None else [v for v, k in zip(values, keep) if k]

        return replace(self, left=self.left[keep], right=self.right[keep], ids=rows(self.ids),
                       subset=rows(self.subset), facets={k: rows(v) for k, v in self.facets.items()},
                       groups={k: RowGroups(rows(g.labels), g.size) for k, g in self.groups.items()},
                       blind=None if self.blind is None else self.blind[keep],
                       **{k: getattr(self, k)[keep] for k in ("candidates", "truth", "eligible")
                          if getattr(self, k) is not None})


@dataclass
class MaskTask:
    """Questions answered with masks, each scored against the union of its targets' ground-truth
    masks (visible and amodal) by gIoU and cIoU. The answers come from a ``predictions`` folder (no
    model needed), or from the clip-regions baseline: ``regions`` holds the question texts and the
    candidate region crops in the run's tables, and the candidate most similar to a question answers."""

    name: str                       # "predictions" | "clip-regions"
    data: object                    # formats.amodal.AmodalSet: images, questions, ground-truth masks
    predictions: str | None = None  # folder of predicted masks
    regions: object | None = None   # formats.amodal.RegionItems (table rows of questions and candidates)

    @property
    def needs_embeddings(self) -> bool:
        return self.regions is not None


@dataclass
class ClassifyTask:
    """Zero-shot classification: images ranked against C class embeddings, each the normalised mean of
    its prompts' normalised text embeddings (the open_clip / CLIP_benchmark classifier). Query groups:
    ``groups[0]`` is the clean images, every further group the same images from a variant folder (a
    corruption at a severity and seed), so one pass scores them all and each gets its own metrics."""

    name: str                    # "zeroshot"
    classnames: list[str]        # (C,) in label order
    prompt_ptr: np.ndarray       # (C+1,) int64 CSR: class c's prompts are prompt_rows[ptr[c]:ptr[c+1]]
    prompt_rows: np.ndarray      # (P,) int64 rows of the text table
    groups: list[str]            # (G,) "clean", then the variants
    query_items: np.ndarray      # (G, nq) int64 rows of the image table: row g = group g's copy of image i
    query_ids: list[str]         # (nq,) ids of the clean images as their source names them
    labels: np.ndarray           # (nq,) int64 class index of each image
    valid: np.ndarray | None = None  # (G, nq) bool: False where that copy failed to load (set by ``drop``)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def num_queries(self) -> int:
        return int(self.query_items.shape[1])

    def validate(self) -> None:
        c = len(self.classnames)
        if len(self.prompt_ptr) != c + 1 or np.any(np.diff(self.prompt_ptr) <= 0):
            raise ValueError(f"task {self.name}: every one of {c} classes needs at least one prompt")
        if self.query_items.shape != (len(self.groups), len(self.labels)) or len(self.query_ids) != len(self.labels):
            raise ValueError(f"task {self.name}: query_items {self.query_items.shape} for {len(self.groups)} groups "
                             f"x {len(self.labels)} labels, {len(self.query_ids)} ids")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= c):
            raise ValueError(f"task {self.name}: labels outside 0..{c - 1}")

    def drop(self, bad: np.ndarray) -> ClassifyTask:
        """Mark copies whose image failed to load (``bad`` (G, nq) bool); counts land in ``skipped``."""
        if not bad.any():
            return self
        valid = (self.valid if self.valid is not None else np.ones(bad.shape, dtype=bool)) & ~bad
        skipped = dict(self.skipped)
        for g, name in enumerate(self.groups):
            if bad[g].any():
                skipped[name] = skipped.get(name, 0) + int(bad[g].sum())
        return replace(self, valid=valid, skipped=skipped)


@dataclass
class ProbeTask:
    """A linear probe: a linear classifier trained on the image embeddings of a training split (its rows already
    chosen and ordered: the few-shot pick, the validation hold-out) and scored on a test split. Its work starts
    once the embeddings are there: training, the weight-decay search on ``val`` when it has rows, the test metrics."""

    name: str                  # "linear_probe"
    classnames: list[str]      # (C,) in label order
    train_items: np.ndarray    # (nt,) int64 rows of the image table, in training order
    train_labels: np.ndarray   # (nt,) int64
    val_items: np.ndarray      # (nv,) int64: the weight decay is chosen on these (none: weight decay 0)
    val_labels: np.ndarray     # (nv,) int64
    test_items: np.ndarray     # (nq,) int64
    test_labels: np.ndarray    # (nq,) int64
    test_ids: list[str]        # (nq,) ids of the test images as their source names them
    options: object            # hardrank.scoring.probe.ProbeOptions: how it trains
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def num_queries(self) -> int:
        return len(self.test_items)

    def validate(self) -> None:
        c = len(self.classnames)
        for part in ("train", "val", "test"):
            items, labels = getattr(self, f"{part}_items"), getattr(self, f"{part}_labels")
            if len(items) != len(labels) or (len(labels) and (labels.min() < 0 or labels.max() >= c)):
                raise ValueError(f"task {self.name}: {part} has {len(items)} items, {len(labels)} labels in 0..{c - 1}")
        if len(self.test_ids) != len(self.test_items):
            raise ValueError(f"task {self.name}: {len(self.test_ids)} test ids for {len(self.test_items)} images")

    def drop(self, bad: np.ndarray) -> ProbeTask:
        """Leave out images that failed to load (``bad`` (rows,) bool over the image table); counts in ``skipped``."""
        kept, skipped = {}, dict(self.skipped)
        for part in ("train", "val", "test"):
            items = getattr(self, f"{part}_items")
            keep = ~bad[items]
            if not keep.all():
                skipped[part] = skipped.get(part, 0) + int((~keep).sum())
                kept[f"{part}_items"], kept[f"{part}_labels"] = items[keep], getattr(self, f"{part}_labels")[keep]
                if part == "test":
                    kept["test_ids"] = [i for i, k in zip(self.test_ids, keep) if k]
        return replace(self, **kept, skipped=skipped) if kept else self


@dataclass
class Suite:
    """One benchmark compiled into tasks; rows index the run's shared ``Tables``."""

    name: str
    ranking: list[RankingTask] = field(default_factory=list)
    choice: list[ChoiceTask] = field(default_factory=list)
    mask: list[MaskTask] = field(default_factory=list)
    classify: list[ClassifyTask] = field(default_factory=list)
    probe: list[ProbeTask] = field(default_factory=list)
    tie_rule: str = "index"
    meta: dict = field(default_factory=dict)        # counts, files found, protocol notes
    view_average: dict[str, list[str]] = field(default_factory=dict)  # e.g. "mix_0.9" -> seeds' views
    # what stops a run that reads the images (no --images, an altered-image folder missing): raised by
    # ``check_images`` before a model run reads any; bring-your-own embeddings read no image file
    image_errors: list[Exception] = field(default_factory=list)
    options: dict = field(default_factory=dict)     # the options it was loaded with (results' provenance)
    # fields a suite adds to each of its results from the scored output (``{"metrics", "outcomes", ...}`` of one
    # checkpoint): a collection task's main metric (``hardrank.suites.datasets``)
    annotate: Callable[[dict], dict] | None = None

    def check_images(self) -> None:
        """Raise the first reason this suite's images cannot be read (see ``image_errors``)."""
        if self.image_errors:
            raise self.image_errors[0]

    @property
    def needs_embeddings(self) -> bool:
        """Whether scoring needs a model's (or precomputed) embeddings."""
        return bool(self.ranking or self.choice or self.classify or self.probe
                    or any(t.needs_embeddings for t in self.mask))
