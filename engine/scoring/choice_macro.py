"""Suite-level choice accuracy: micro over pooled rows, macro over tasks or subsets (ARO, SugarCrepe)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

from hardrank.scoring.blind import blind_summary
from hardrank.tasks import Suite

__all__ = ["ChoiceAggregate", "attach_aggregates", "aggregate_accuracy", "suite_aggregates"]

_OVER = ("items", "tasks", "subsets")


@dataclass(frozen=True)
class ChoiceAggregate:
    """One accuracy computed across the rows of several choice tasks (rules with a ``correct`` verdict)."""

    name: str                      # key under the result's metrics, e.g. "overall", "vg_relation_macro"
    tasks: tuple[str, ...]         # member task names
    over: str = "items"            # "items": micro (pooled rows); "tasks": mean of task accuracies;
                                   # "subsets": mean of per-subset accuracies (subsets pooled across tasks)
    exclude: tuple[str, ...] = ()  # subsets left out of a subset macro (ARO: symmetric relations)
    min_items: int = 1             # subsets with fewer rows are left out (VG-Attribution: 25)

    def __post_init__(self):
        if self.over not in _OVER:
            raise ValueError(f"aggregate {self.name!r}: over={self.over!r}, expected one of {_OVER}")
        if not self.tasks:
            raise ValueError(f"aggregate {self.name!r} names no tasks")
        if (self.exclude or self.min_items != 1) and self.over != "subsets":
            raise ValueError(f"aggregate {self.name!r}: exclude/min_items only apply to over='subsets'")


def attach_aggregates(suite: Suite, aggregates: list[ChoiceAggregate]) -> Suite:
    """Record the aggregates in ``suite.meta["aggregates"]`` (plain dicts, so results show the protocol)."""
    suite.meta["aggregates"] = [{**asdict(a), "tasks": list(a.tasks), "exclude": sorted(a.exclude)}
                                for a in aggregates]
    return suite


def aggregate_accuracy(agg: ChoiceAggregate, subsets: dict[str, list[str] | None],
                       correct: dict[str, np.ndarray], blind: dict[str, tuple[str, np.ndarray]] | None = None) -> dict:
    """``{"all": {"accuracy": %, "items": n, ...}, "members": [...], "over": ...}`` for one aggregate.

    subsets: task name -> (n,) subset labels (None if the task has none); correct: task -> (n,) bool;
    blind: task -> (rule, (n,) bool unresolvable rows), pooled beside a micro accuracy when every member
    has them under one rule. Members missing from ``correct`` are ignored (a file that was not found)."""
    present = [t for t in agg.tasks if t in correct]
    out = {"members": present, "over": agg.over}
    if agg.over == "items":
        pooled = np.concatenate([np.asarray(correct[t], dtype=bool) for t in present]) if present else np.zeros(0, bool)
        out["all"] = {"accuracy": _pct(pooled), "items": int(len(pooled))}
        blind = blind or {}
        rules = {blind[t][0] for t in present if t in blind}
        if present and all(t in blind for t in present) and len(rules) == 1:
            out["all"]["blind"] = blind_summary(rules.pop(), pooled, np.concatenate([blind[t][1] for t in present]))
        return out
    if agg.over == "tasks":
        accs = [_pct(np.asarray(correct[t], dtype=bool)) for t in present]
        out["all"] = {"accuracy": float(np.mean(accs)) if accs else float("nan"),
                      "items": int(sum(len(correct[t]) for t in present)), "groups": len(accs)}
        return out
    groups: dict[str, list[np.ndarray]] = defaultdict(list)
    for t in present:
        labels = subsets.get(t)
        if labels is None:
            raise ValueError(f"aggregate {agg.name!r}: task {t!r} has no subset labels to average over")
        c = np.asarray(correct[t], dtype=bool)
        lab = np.asarray(labels, dtype=object)
        for s in dict.fromkeys(labels):
            groups[s].append(c[lab == s])
    excluded = set(agg.exclude)
    used, small, skipped_named = {}, 0, 0
    for s, parts in groups.items():
        v = np.concatenate(parts)
        if s in excluded:
            skipped_named += 1
        elif len(v) < agg.min_items:
            small += 1
        else:
            used[s] = v
    accs = [_pct(v) for v in used.values()]
    out["all"] = {"accuracy": float(np.mean(accs)) if accs else float("nan"),
                  "items": int(sum(len(v) for v in used.values())), "groups": len(used),
                  "groups_excluded": skipped_named, "groups_too_small": small}
    return out


def suite_aggregates(suite: Suite, verdicts: dict[str, dict[str, np.ndarray]]) -> dict:
    """Hook for the evaluator: ``{aggregate name: metrics}`` for ``suite.meta["aggregates"]``, from the
    per-task verdicts that ``choice_metrics`` returned (``verdicts[task.name]["correct"]``)."""
    specs = suite.meta.get("aggregates") or []
    if not specs:
        return {}
    subsets = {t.name: t.subset for t in suite.choice}
    blind = {t.name: (t.rule, t.blind) for t in suite.choice if t.blind is not None}
    correct = {}
    for name, v in verdicts.items():
        if "correct" in v:
            correct[name] = v["correct"]
    out = {}
    for spec in specs:
        agg = ChoiceAggregate(**{**spec, "tasks": tuple(spec["tasks"]), "exclude": tuple(spec.get("exclude", ()))})
        wrong = [t for t in agg.tasks if t in verdicts and t not in correct]
        if wrong:
            raise ValueError(f"aggregate {agg.name!r}: task(s) {wrong} have no single 'correct' verdict "
                             f"(only rules with a 'correct' verdict can be pooled: first_strict, "
                             f"first_ties_win, pair_t2i, two_positives, text_triplet)")
        out[agg.name] = aggregate_accuracy(agg, subsets, correct, blind)
    return out


def _pct(x: np.ndarray) -> float:
    return 100.0 * float(x.mean()) if len(x) else float("nan")
