"""MMVP-VLM (Tong et al., CVPR 2024): CLIP-blind image pairs, each statement to pick its own image, by pattern."""
from __future__ import annotations

import csv
import os
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.items import ImageRef, Tables
from hardrank.scoring.choice_macro import ChoiceAggregate, attach_aggregates
from hardrank.suites._common import SuiteOptions, release_folder
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_mmvp_vlm", "MMVP_HEADER", "MMVP_IMAGES", "MMVP_PATTERNS", "MMVP_PROMPT"]

MMVP_HEADER = ["Question ID", "Type", "Statement"]  # Questions.csv of the MMVP/MMVP_VLM dataset
MMVP_IMAGES = "MLLM_VLM Images"                     # one folder per Type, images <Question ID>.jpg
MMVP_PROMPT = "a photo of "                          # scripts/evaluate_vlm.py: text = 'a photo of ' + statement
# the Type values of the release (its image folders) -> the category names scripts/evaluate_vlm.py prints
MMVP_PATTERNS = {"Orientation": "Orientation and Direction", "Presence": "Presence of Specific Features",
                 "State": "State and Condition", "Quantity": "Quantity and Count",
                 "Spatial": "Positional and Relational Context", "Color": "Color and Appearance",
                 "Structural Character": "Structural Characteristics", "Text": "Texts",
                 "Camera Perspective": "Viewpoint and Perspective"}
MMVP_PAIRS = 135


def _rows(path: Path) -> list[tuple[int, int, str, str]]:
    """(line, Question ID, Type, Statement) of every row after the header."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise SuiteFormatError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); use Questions.csv "
                               f"of the MMVP/MMVP_VLM dataset as downloaded") from None
    except csv.Error as exc:
        raise SuiteFormatError(f"{path}: not a CSV file ({exc})") from None
    if not rows or [c.strip() for c in rows[0]] != MMVP_HEADER:
        raise SuiteFormatError(f"{path}: header {rows[0] if rows else '(empty file)'}, expected {MMVP_HEADER}: a "
                               f"file of another version? hardrank reads Questions.csv of MMVP/MMVP_VLM")
    out = []
    for no, row in enumerate(rows[1:], 2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != 3:
            raise SuiteFormatError(f"{path}: line {no} has {len(row)} field(s) {row}, expected 3 ({MMVP_HEADER})")
        qid, typ, statement = row
        try:
            q = int(qid)
        except ValueError:
            raise SuiteFormatError(f"{path}: line {no}: Question ID {qid!r} is not an integer") from None
        out.append((no, q, typ, statement))
    return out


def load_mmvp_vlm(tables: Tables, opts: SuiteOptions, name: str = "mmvp_vlm") -> Suite:
    """One pair_t2i task: each pair of consecutive rows of ``Questions.csv`` (an odd Question ID, then an
    even one: the release numbers them 1..270) is two images ``MLLM_VLM Images/<Type>/<id>.jpg`` and two
    statements, fed as ``"a photo of " + statement``. Each statement picks the image it scores higher (a tie
    picks the second image, as the reference's "probability of image 1 > 0.5"); a pair counts only when both
    statements pick their own image. Subsets: the Type (visual pattern); ``pattern_mean`` = their mean."""
    if opts.data is None:
        raise UsageError(f"suite {name} needs --data DIR holding Questions.csv and '{MMVP_IMAGES}/' (the "
                         f"MMVP/MMVP_VLM dataset)")
    root = Path(opts.data)
    folder = release_folder(root, (".", "MMVP_VLM"), ("Questions.csv",))
    path, images = folder / "Questions.csv", folder / MMVP_IMAGES
    if not path.is_file():
        raise FileNotFoundError(f"{root}: no Questions.csv (looked in it and in MMVP_VLM/); --data names the "
                                f"folder of the MMVP/MMVP_VLM dataset")
    rows = _rows(path)
    if not rows:
        raise SuiteFormatError(f"{path}: holds no questions; use Questions.csv of the MMVP/MMVP_VLM dataset")
    if len(rows) % 2:
        raise SuiteFormatError(f"{path}: line {rows[-1][0]} (Question ID {rows[-1][1]}) has no pair: the "
                               f"statements come in pairs of consecutive rows")
    if not images.is_dir():
        raise FileNotFoundError(f"{folder}: no '{MMVP_IMAGES}/' folder beside Questions.csv (Question ID "
                                f"{rows[0][1]} is '{MMVP_IMAGES}/{rows[0][2]}/{rows[0][1]}.jpg')")
    refs, ids, texts, pids, patterns = [], [], [], [], []
    for (l1, q1, t1, s1), (l2, q2, t2, s2) in zip(rows[0::2], rows[1::2]):
        if q1 % 2 != 1 or q2 % 2 != 0:  # the reference's truth: an odd ID's statement is image 1's
            raise SuiteFormatError(f"{path}: lines {l1}-{l2} hold Question IDs {q1}, {q2}; a pair is an odd ID "
                                   f"then an even one (the reference takes an odd ID's statement for the pair's "
                                   f"first image)")
        if t2 != t1:
            raise SuiteFormatError(f"{path}: lines {l1}-{l2}: the pair's Types differ ({t1!r}, {t2!r})")
        for q in (q1, q2):  # both images from the first row's Type folder, as the reference reads them
            refs.append(ImageRef(os.fspath(images / t1 / f"{q}.jpg")))
            ids.append(f"{t1}/{q}.jpg")
        texts.extend((MMVP_PROMPT + s1, MMVP_PROMPT + s2))
        pids.append(f"{q1}-{q2}")
        patterns.append(t1)
    task = ChoiceTask(name="mmvp_vlm", rule="pair_t2i", left_modality="image", right_modality="text",
                      left=tables.images.add_many(refs, ids).reshape(-1, 2),
                      right=tables.texts.add_many(texts).reshape(-1, 2), ids=pids, subset=patterns)
    task.validate()
    found = list(dict.fromkeys(patterns))
    suite = Suite(name=name, choice=[task], tie_rule="pair_t2i",
                  meta={"annotations": str(path), "images": str(images), "pairs": len(pids),
                        "published_pairs": MMVP_PAIRS, "patterns": found,
                        "unknown_patterns": [p for p in found if p not in MMVP_PATTERNS],
                        "category_names": {p: MMVP_PATTERNS[p] for p in found if p in MMVP_PATTERNS},
                        "prompt": f"{MMVP_PROMPT!r} + statement",
                        "pair_rule": "statement k picks image 0 iff s(image 0, statement k) > s(image 1, "
                                     "statement k), else image 1 (a tie picks image 1); the pair counts when "
                                     "statement 0 picks image 0 and statement 1 picks image 1"})
    return attach_aggregates(suite, [ChoiceAggregate("pattern_mean", ("mmvp_vlm",), over="subsets")])
