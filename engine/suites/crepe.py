"""CREPE (Ma et al., CVPR 2023): a Visual Genome region's caption retrieved among its hard negatives, R@1."""
from __future__ import annotations

import ast
import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hardrank.config import opt
from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.items import ImageRef, Tables
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_crepe", "CrepeOptions", "CREPE_TRAIN_SETS", "CREPE_SYST_SPLITS", "CREPE_SYST_TYPES",
           "CREPE_PROD_TYPES", "CREPE_COMPLEXITIES", "CREPE_VG_FOLDERS"]

CREPE_TRAIN_SETS = ("cc12m", "yfcc", "laion")         # syst_vg_hard_negs_<split>_in_<set>.csv
CREPE_SYST_SPLITS = ("seen_compounds", "unseen_compounds")
CREPE_SYST_TYPES = ("atom", "comp", "combined")       # column valid_hard_negs_<type>
CREPE_PROD_TYPES = ("atom", "negate", "swap")         # <type>/prod_vg_hard_negs_<type>_complexity_<n>.csv, hard_negs
CREPE_COMPLEXITIES = tuple(range(4, 13))
CREPE_VG_FOLDERS = ("VG_100K", "VG_100K_2")           # crepe_eval_utils.get_image_by_id, in its order
_COLUMNS = ("image_id", "caption", "x", "y", "width", "height")


@dataclass(frozen=True)
class CrepeOptions:
    """The suite's own options (flags, job-file keys and keywords like every other option)."""

    crepe_train_data: tuple[str, ...] | None = opt(None, "CREPE systematicity: the pretraining sets whose "
                                                   "seen/unseen-compound files to score (cc12m yfcc laion; the set "
                                                   "only means something for a model trained on it); default: "
                                                   "every one found", choices=CREPE_TRAIN_SETS)


def _box(path: Path, line: int, row: dict) -> tuple[float, float, float, float]:
    """The region as ImageRef's (x, y, w, h), in whole pixels as Pillow rounds the crop box torchvision's
    ``TF.crop(img, y, x, height, width)`` hands it (``(x, y, x + width, y + height)``, each rounded)."""
    try:
        x, y, w, h = (float(row[k]) for k in ("x", "y", "width", "height"))
    except ValueError:
        raise SuiteFormatError(f"{path}: line {line}: region x, y, width, height "
                               f"{[row[k] for k in ('x', 'y', 'width', 'height')]} are not numbers") from None
    x0, y0, x1, y1 = round(x), round(y), round(x + w), round(y + h)
    if x1 <= x0 or y1 <= y0:
        raise SuiteFormatError(f"{path}: line {line}: empty region (width {w:g}, height {h:g})")
    return float(x0), float(y0), float(x1 - x0), float(y1 - y0)


def _negatives(path: Path, line: int, cell: str, column: str) -> list[str]:
    """The hard negatives of one row: a Python list literal of captions (the reference reads it with
    ``ast.literal_eval``, which evaluates literals only)."""
    try:
        v = ast.literal_eval(cell) if len(cell) < 1 << 20 else None
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        v = None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise SuiteFormatError(f"{path}: line {line} column {column!r} is {cell[:120]!r}, expected a list of "
                               f"captions such as ['a red car', 'a blue car']")
    return v


def _read(path: Path, column: str) -> list[tuple[int, dict, list[str]]]:
    """(line, row, hard negatives) of every row of one CREPE CSV."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            need = [*_COLUMNS, column]
            missing = [c for c in need if c not in header]
            if missing:
                raise SuiteFormatError(f"{path}: no column(s) {missing}; its header has {header}: a file of another "
                                       f"version? CREPE's hard-negative CSVs have {need}")
            out = []
            for row in reader:
                line = reader.line_num
                if None in row or any(row.get(c) is None for c in need):
                    raise SuiteFormatError(f"{path}: line {line} has {len(header) + len(row.get(None) or [])} "
                                           f"field(s) where the header has {len(header)}")
                out.append((line, row, _negatives(path, line, row[column], column)))
            return out
    except UnicodeDecodeError as exc:
        raise SuiteFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); use the CSV of the "
                               f"CREPE release as extracted") from None
    except csv.Error as exc:
        raise SuiteFormatError(f"{path}: not a CSV file ({exc})") from None


def _files(root: Path, train_sets: tuple[str, ...]) -> list[tuple[str, Path, str]]:
    """(task name, CSV, hard-negative column) of every CREPE file under ``root``, in the reference's order."""
    syst = release_folder(root, ("syst_hard_negatives", "data/syst_hard_negatives", "crepe/syst_hard_negatives",
                                 "CREPE/data/syst_hard_negatives", "."),
                          [f"syst_vg_hard_negs_{s}_in_{t}.csv" for s in CREPE_SYST_SPLITS for t in CREPE_TRAIN_SETS])
    prod = release_folder(root, ("prod_hard_negatives", "data/prod_hard_negatives", "crepe/prod_hard_negatives",
                                 "CREPE/data/prod_hard_negatives", "."), CREPE_PROD_TYPES)
    out = []
    for t in train_sets:
        for split in CREPE_SYST_SPLITS:
            f = syst / f"syst_vg_hard_negs_{split}_in_{t}.csv"
            if f.is_file():
                out += [(f"syst_{split.split('_')[0]}_{t}_{hn}", f, f"valid_hard_negs_{hn}") for hn in CREPE_SYST_TYPES]
    for hn in CREPE_PROD_TYPES:
        for c in CREPE_COMPLEXITIES:
            f = prod / hn / f"prod_vg_hard_negs_{hn}_complexity_{c}.csv"
            if f.is_file():
                out.append((f"prod_{hn}_c{c}", f, "hard_negs"))
    return out


def load_crepe(tables: Tables, opts: SuiteOptions, own: CrepeOptions, name: str = "crepe") -> Suite:
    """One first_rank task per CREPE file and hard-negative type found under ``--data`` (the extracted
    ``syst_hard_negatives/`` and ``prod_hard_negatives/<type>/`` of the release's data zips, or a folder holding
    them): systematicity ``syst_<seen|unseen>_<train set>_<atom|comp|combined>``, productivity
    ``prod_<atom|negate|swap>_c<complexity>``. Per row the Visual Genome image ``<image_id>.jpg`` (under
    ``--images``: its VG_100K/ or VG_100K_2/, the reference's order), converted to RGB and cropped to the region,
    against its caption and hard negatives (retrieval sets differ in size): the caption's rank is the number of
    candidates scoring strictly above it (a tie goes to the caption, as a stable descending sort orders it),
    and R@1, R@3, R@5, R@10, mean and median rank follow as ``get_one2many_metrics`` computes them. Rows whose
    image is on disk nowhere are left out and counted, when some images are there."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding CREPE's extracted syst_hard_negatives/ and/or "
                         f"prod_hard_negatives/ and --images the Visual Genome images (VG_100K/, VG_100K_2/)")
    root = Path(opts.data)
    files = _files(root, own.crepe_train_data or CREPE_TRAIN_SETS)
    if not files:
        raise FileNotFoundError(f"{root}: no CREPE hard-negative CSV found (syst_hard_negatives/"
                                f"syst_vg_hard_negs_<split>_in_<set>.csv, prod_hard_negatives/<type>/prod_vg_hard_negs_"
                                f"<type>_complexity_<n>.csv; unzip the release's data/*.zip there)")
    images = Path(opts.images) if opts.images else None
    where: dict[str, str | None] = {}  # image id -> its file (None: on disk nowhere)

    def locate(image_id: str) -> str | None:
        if image_id not in where:
            names = [images / d / f"{image_id}.jpg" for d in CREPE_VG_FOLDERS] + [images / f"{image_id}.jpg"]
            where[image_id] = next((os.fspath(p) for p in names if p.is_file()), None)
        return where[image_id]

    parsed, cache = [], {}
    for task_name, path, column in files:
        if path not in cache:
            cache[path] = {}
        if column not in cache[path]:
            cache[path][column] = _read(path, column)
        rows = cache[path][column]
        if images is not None:
            for _, row, _ in rows:
                locate(row["image_id"])
        parsed.append((task_name, path, column, rows))
    on_disk = images is not None and any(v is not None for v in where.values())
    errors = []
    if images is not None and not on_disk and where:
        first = next(iter(where))
        errors.append(FileNotFoundError(f"{images}: none of CREPE's Visual Genome images found (image {first} looked "
                                        f"for as {'/, '.join(CREPE_VG_FOLDERS)}/ and ./{first}.jpg); --images names "
                                        f"the folder holding VG_100K/ and VG_100K_2/"))
    tasks, missing_images, sizes = [], {}, {}
    for task_name, path, _, rows in parsed:
        keep = [(i, ln, r, negs) for i, (ln, r, negs) in enumerate(rows)
                if not on_disk or where.get(r["image_id"]) is not None]
        missing_images[task_name] = len(rows) - len(keep)
        if not keep:
            continue
        width = 1 + max(len(negs) for _, _, _, negs in keep)
        refs, ids, texts, cands = [], [], [], []
        for _, ln, r, negs in keep:
            iid = r["image_id"]
            uri = (where.get(iid) if on_disk else None) or os.fspath((images or Path("")) / f"{iid}.jpg")
            refs.append(ImageRef(uri, _box(path, ln, r)))
            ids.append(f"{iid}.jpg")
            row_texts = [r["caption"], *negs]
            texts.extend(row_texts + [r["caption"]] * (width - len(row_texts)))  # padding: never scored
            cands.append(len(row_texts))
        task = ChoiceTask(name=task_name, rule="first_rank", left_modality="image", right_modality="text",
                          left=tables.images.add_many(refs, ids).reshape(-1, 1),
                          right=tables.texts.add_many(texts).reshape(-1, width),
                          ids=[str(i) for i, _, _, _ in keep],  # the CSV row's index (0 = first data row)
                          candidates=np.array(cands, dtype=np.int64))
        task.validate()
        tasks.append(task)
        sizes[task_name] = [int(min(cands)), int(max(cands))]
    if not tasks:
        raise FileNotFoundError(f"{images}: no CREPE row has its Visual Genome image there (looked in "
                                f"{', '.join(CREPE_VG_FOLDERS)} and the folder itself)")
    not_found = sorted(k for k, v in where.items() if v is None)
    return Suite(name=name, choice=tasks, tie_rule="first_rank", image_errors=errors,
                 meta={"files": {t: os.fspath(p) for t, p, _, _ in parsed},
                       "items": {t.name: len(t.ids) for t in tasks},
                       "retrieval_set_sizes": sizes,
                       "rows_without_image": {t: n for t, n in missing_images.items() if n} if on_disk else {},
                       "images_not_found": not_found[:20] if on_disk else [], "images_not_found_count":
                       len(not_found) if on_disk else 0,
                       "metric": "accuracy = R@1: no hard negative scores strictly above the caption (a tie goes "
                                 "to the caption); R@K, mean_rank = mean(rank) + 1, median_rank = "
                                 "floor(median(rank)) + 1, as CREPE's get_one2many_metrics"})
