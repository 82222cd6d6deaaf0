"""The blind check: which choice rows a bag-of-words text-only scorer cannot separate (docs/choice.md)."""
from __future__ import annotations

import re

import numpy as np

from hardrank.tasks import ChoiceTask, Suite

__all__ = ["bag_of_words", "blind_unresolvable", "blind_summary", "mark_blind", "BLIND_DEFINITION", "FORCED_CORRECT"]

BLIND_DEFINITION = (
    "a row is unresolvable when every bag-of-words text-only scorer (one that sees only the multiset of each "
    "caption's lowercased words, not the image and not the word order) is forced to tie the candidates the "
    "rule compares, so its verdict is fixed by the tie rule: first_strict, triplet (c or c_P vs c_N), "
    "two_positives (p1 or p2 vs n): a candidate to beat has the bag of a correct one (forced wrong); "
    "first_ties_win, first_rank: every other candidate has the original's bag (forced right); grid2x2 and "
    "pair_t2i: always (choosing between images, or each image its own caption, needs the image: forced wrong); "
    "text_triplet: not applicable (a text-only task); multilabel: not applicable (no per-row verdict)")
# the verdict a bag-of-words scorer is forced to on an unresolvable row, per rule
FORCED_CORRECT = {"first_strict": False, "first_ties_win": True, "first_rank": True, "triplet": False,
                  "two_positives": False, "grid2x2": False, "pair_t2i": False}
_WORD = re.compile(r"\w+")


def bag_of_words(text: str) -> tuple[str, ...]:
    """The caption as a bag-of-words scorer sees it: its lowercased word tokens, sorted."""
    return tuple(sorted(_WORD.findall(text.lower())))


def blind_unresolvable(task: ChoiceTask, texts: list[str]) -> np.ndarray | None:
    """(n,) bool: rows whose verdict a bag-of-words text-only scorer cannot change (see ``BLIND_DEFINITION``);
    None where the check does not apply (a text-only rule, or candidates that are not texts). ``texts``: the
    run's text table (``tables.texts.entries``)."""
    return _unresolvable(task, texts, {})


def _unresolvable(task: ChoiceTask, texts: list[str], bags: dict) -> np.ndarray | None:
    n = len(task.left)
    if task.rule not in FORCED_CORRECT or task.left_modality != "image":
        return None
    if task.rule in ("grid2x2", "pair_t2i"):
        return np.ones(n, dtype=bool)
    if task.right_modality != "text":
        return None
    # bags: text row -> small int naming its bag, shared by the tasks of a suite
    ids: dict[tuple[str, ...], int] = bags.setdefault("ids", {})
    of_row: dict[int, int] = bags.setdefault("rows", {})
    for r in np.unique(task.right).tolist():
        if r not in of_row:
            of_row[r] = ids.setdefault(bag_of_words(texts[r]), len(ids))
    b = np.vectorize(of_row.__getitem__, otypes=[np.int64])(task.right) if task.right.size else task.right  # (n, B)
    same = b[:, 1:] == b[:, :1]  # (n, B-1) another candidate has the first one's bag
    real = (np.ones_like(same) if task.candidates is None  # a row's padding (past its candidates) is no candidate
            else np.arange(1, b.shape[1])[None, :] < task.candidates[:, None])
    if task.rule == "first_strict":
        return (same & real).any(1)
    if task.rule in ("first_ties_win", "first_rank"):
        return (same | ~real).all(1)
    # triplet (c, c_P, c_N) and two_positives (p1, p2, n): either positive vs the negative
    return (b[:, 0] == b[:, 2]) | (b[:, 1] == b[:, 2])


def blind_summary(rule: str, correct: np.ndarray, unresolvable: np.ndarray) -> dict:
    """Accuracy beside the blind split: how many rows are unresolvable, the model's accuracy on the rows a
    bag-of-words scorer can and cannot separate, and what every such scorer gets on the latter. An empty part's
    accuracy is None (as the JSON writes it), so results compare equal in memory and on disk."""
    correct, u = np.asarray(correct, dtype=bool), np.asarray(unresolvable, dtype=bool)
    pct = (lambda x: 100.0 * float(x.mean()) if len(x) else None)
    nu = int(u.sum())
    return {"items_unresolvable": nu, "unresolvable_share": pct(u), "accuracy_resolvable": pct(correct[~u]),
            "accuracy_unresolvable": pct(correct[u]),
            "bow_accuracy_unresolvable": (100.0 if FORCED_CORRECT[rule] else 0.0) if nu else None}


def mark_blind(suite: Suite, texts: list[str]) -> Suite:
    """Set ``blind`` on every choice task of ``suite`` and record the per-task shares in
    ``suite.meta["blind"]`` (with the definition), so every result states them beside its accuracy."""
    if not suite.choice:
        return suite
    bags: dict = {}
    per_task = {}
    for t in suite.choice:
        t.blind = _unresolvable(t, texts, bags)
        if t.blind is not None:
            nu = int(t.blind.sum())
            per_task[t.name] = {"items": len(t.blind), "unresolvable": nu,
                                "unresolvable_share": 100.0 * nu / len(t.blind) if len(t.blind) else None,
                                "forced_verdict": "correct" if FORCED_CORRECT[t.rule] else "wrong"}
    if per_task:
        suite.meta["blind"] = {"definition": BLIND_DEFINITION, "tasks": per_task}
    return suite
