"""Mined negatives exported for hard-negative training: a NegCLIP-style TSV/CSV, or one JSON line per query.

NegCLIP (Yuksekgonul et al., ICLR 2023; its open_clip fork's ``CsvDataset``) reads a table with
``filepath`` (the image), ``title`` (its caption), ``neg_caption`` (a Python list literal of hard
negative captions, one drawn per step) and ``neg_image`` (a Python list literal of row indices of
the same table: a hard negative image is another training row, whose image, caption and negative
captions join the batch). Every list must be non-empty: the loader draws from each with
``random.choice``. Each list holds at most k entries (one per mined negative): an image negative
gives one caption, its first, not all of them (with k = 50 and 5 captions an image, every row carried
250 captions: 19 MB for 1,000 captions), and the loader draws one entry a step either way.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq

from hardrank.atomic import atomic_path
from hardrank.errors import UsageError
from hardrank.mining.problem import MineProblem

__all__ = ["write_training", "shard_path", "training_format", "check_training", "check_training_inputs",
           "NEGCLIP_COLUMNS"]

NEGCLIP_COLUMNS = ("filepath", "title", "neg_caption", "neg_image")
_FORMATS = {".jsonl": "jsonl", ".tsv": "negclip", ".csv": "negclip"}


def shard_path(out: Path, block: int) -> Path:
    return out / "negatives" / f"part-{block:06d}.parquet"


def training_format(path) -> str:
    """``"negclip"`` for ``.tsv`` / ``.csv``, ``"jsonl"`` for ``.jsonl``; anything else is a usage error."""
    fmt = _FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(f"--export-training {path}: name a .tsv or .csv (NegCLIP-style table for open_clip "
                         f"hard-negative training) or a .jsonl (one line per query)")
    return fmt


_NO_PAIRS = ("a NegCLIP --export-training table needs (image, caption) pairs: give the queries or the corpus as a "
             "Karpathy-format .json with --images (its pairs are the training rows), or export a .jsonl")


def check_training_inputs(path, pairs_possible: bool) -> None:
    """Before anything is embedded: ``path``'s format, and for a NegCLIP table whether the inputs can give
    (image, caption) pairs at all (``pairs_possible``: a Karpathy-format input with its images)."""
    if training_format(path) == "negclip" and not pairs_possible:
        raise UsageError(_NO_PAIRS)


def check_training(path, problem: MineProblem) -> str:
    """The format of ``path``, once ``problem`` is known to hold what that format needs (before any work)."""
    fmt = training_format(path)
    if fmt == "negclip" and not problem.pairs:
        raise UsageError(_NO_PAIRS)
    if fmt == "negclip" and (problem.query_keys is None or problem.corpus_keys is None):
        raise UsageError("a NegCLIP --export-training table needs the items' content keys (mine from files, "
                         "not from bare arrays)")
    return fmt


def _negatives(out: Path, n_blocks: int):
    """Per block: query id -> [(negative id, negative key, score)] in rank order."""
    for b in range(n_blocks):
        t = pq.read_table(shard_path(out, b))
        cols = t.column_names
        q, n, s = (t.column(c).to_pylist() for c in ("query_id", "negative_id", "score"))
        k = t.column("negative_key").to_pylist() if "negative_key" in cols else [None] * len(q)
        negs: dict[str, list] = {}
        for qi, ni, ki, si in zip(q, n, k, s):
            negs.setdefault(qi, []).append((ni, ki, si))
        yield b, negs


def write_training(path: Path, out: Path, problem: MineProblem, n_blocks: int, B: int) -> dict:
    """Write ``path`` in the format its suffix names (``training_format``); returns what was written."""
    if check_training(path, problem) == "jsonl":
        return _write_jsonl(path, out, problem, n_blocks, B)
    return _write_negclip(path, out, problem, n_blocks)


def _write_jsonl(path: Path, out: Path, problem: MineProblem, n_blocks: int, B: int) -> dict:
    """One JSON line per query, in query order: {"query", "positives", "negatives", "scores"} (ids)."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for b, negs in _negatives(out, n_blocks):
            for r in range(b * B, min(len(problem.query_ids), (b + 1) * B)):
                qid = problem.query_ids[r]
                pos = problem.pos_ids[r] if problem.pos_ids is not None else []
                got = negs.get(qid, [])
                f.write(json.dumps({"query": qid, "positives": list(pos), "negatives": [x[0] for x in got],
                                    "scores": [round(float(x[2]), 6) for x in got]}, ensure_ascii=False) + "\n")
                n += 1
    return {"format": "jsonl", "path": str(path), "lines": n}


def _write_negclip(path: Path, out: Path, problem: MineProblem, n_blocks: int) -> dict:
    """The NegCLIP table: one row per Karpathy (image, caption) pair whose query side (the caption for
    t2*, the image for i2*) was mined. A text negative gives its caption and, through the pairs, its
    image's row; an image negative gives its row and its first caption, so each list holds at most k.
    Rows left without a negative caption or a negative image row are dropped (the loader needs both),
    until every list is whole."""
    check_training(path, problem)
    qmod = "text" if problem.direction.startswith("t") else "image"
    key_of_query = dict(zip(problem.query_ids, problem.query_keys))
    by_qkey: dict[str, list] = {}
    for _, negs in _negatives(out, n_blocks):
        for qid, got in negs.items():
            by_qkey.setdefault(key_of_query[qid], got)
    img_caps: dict[str, list[tuple[str, str]]] = {}  # image key -> [(caption, caption key)]
    cap_imgs: dict[str, list[str]] = {}              # caption key -> [image key]
    for _, ikey, cap, ckey in problem.pairs:
        img_caps.setdefault(ikey, []).append((cap, ckey))
        cap_imgs.setdefault(ckey, []).append(ikey)
    rows = [p for p in problem.pairs if (p[3] if qmod == "text" else p[1]) in by_qkey]
    cands = []  # per row: (negative captions as (text, key), negative image keys), hardest first
    for _, ikey, _, ckey in rows:
        caps, imgs = [], []
        for nid, nkey, _ in by_qkey[ckey if qmod == "text" else ikey]:
            if problem.modality == "text":
                caps.append((nid, nkey))  # and the row of its image (the first other image listing it)
                imgs.extend(next(([i] for i in cap_imgs.get(nkey, []) if i != ikey), []))
            else:
                imgs.append(nkey)  # and one caption of it (the first that is not this row's): lists stay within k
                caps.extend(next(([c] for c in img_caps.get(nkey, []) if c[1] != ckey), []))
        caps = list(dict.fromkeys((c, k) for c, k in caps if k != ckey))
        imgs = list(dict.fromkeys(k for k in imgs if k != ikey))
        cands.append((caps, imgs))
    keep = [i for i, (caps, _) in enumerate(cands) if caps]
    while True:  # a negative image must be a kept row; dropping a row can empty another's list
        row_of: dict[str, int] = {}
        for j, i in enumerate(keep):
            row_of.setdefault(rows[i][1], j)
        still = [i for i in keep if any(k in row_of for k in cands[i][1])]
        if len(still) == len(keep):
            break
        keep = still
    sep = "\t" if Path(path).suffix.lower() == ".tsv" else ","
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(NEGCLIP_COLUMNS)
        for i in keep:
            image, _, caption, _ = rows[i]
            caps, imgs = cands[i]
            w.writerow([image, caption, repr([c for c, _ in caps]),
                        repr(list(dict.fromkeys(row_of[k] for k in imgs if k in row_of)))])
    return {"format": "negclip", "path": str(path), "rows": len(keep), "pairs": len(rows),
            "dropped_without_negatives": len(rows) - len(keep), "separator": "tab" if sep == "\t" else "comma"}
