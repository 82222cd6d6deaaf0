"""Comparing two checkpoints' results with confidence: per headline metric, the paired difference and its test.

``compare_checkpoints`` pairs the results of two checkpoints suite by suite (the same items, or it says which
differ), and for every number of the terminal table gives B - A, its 95% paired-bootstrap interval and a
p-value (exact McNemar for right/wrong metrics, a paired permutation test otherwise:
``hardrank.scoring.statistics``), Holm-adjusted over all the metrics of the comparison. ``pick`` finds the
two checkpoints in one results folder (by default the last two steps) or in two folders.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from hardrank.errors import UsageError
from hardrank.models.runs import checkpoint_step
from hardrank.scoring.results import ResultFile, headline_paths, read_results
from hardrank.scoring.statistics import RESAMPLES, Difference, compare, holm

__all__ = ["Checkpoint", "Comparison", "ComparedMetric", "pick", "compare_checkpoints", "format_comparison",
           "higher_is_better", "ALPHA"]

ALPHA = 0.05  # a difference holds when its Holm-adjusted p is below this
# metrics where lower is better (the rest: higher is better)
LOWER_IS_BETTER = ("false_rate", "mean_rank", "median_rank", "brittleness", "drop")


def higher_is_better(path: tuple[str, ...]) -> bool:
    """Whether a larger value of the metric at ``path`` is the better one."""
    return not any(k in LOWER_IS_BETTER for k in path[-2:])


@dataclass
class Checkpoint:
    """One checkpoint's results: ``name`` (its folder below the results folder) and its result files by suite."""

    name: str
    results: dict[str, ResultFile]


@dataclass(frozen=True)
class ComparedMetric:
    suite: str
    column: str          # the terminal table's column, e.g. "i2t:same_concept R@1"
    difference: Difference

    @property
    def holds(self) -> bool:
        p = self.difference.p_holm
        return p is not None and p < ALPHA and math.isfinite(self.difference.diff) and self.difference.diff != 0


@dataclass
class Comparison:
    """Checkpoint ``a`` against ``b``: every compared metric (Holm over all of them) and what was left out."""

    a: str
    b: str
    metrics: list[ComparedMetric] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    resamples: int = RESAMPLES
    seed: int = 0

    def as_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "alpha": ALPHA, "resamples": self.resamples, "seed": self.seed,
                "correction": f"Holm over the {len(self.metrics)} metrics of this comparison", "notes": self.notes,
                "metrics": [{"suite": m.suite, "metric": m.column, "path": list(m.difference.path),
                             "a": m.difference.a, "b": m.difference.b, "difference": m.difference.diff,
                             "ci95": [m.difference.low, m.difference.high], "test": m.difference.test,
                             "p": m.difference.p, "p_holm": m.difference.p_holm, "holds": m.holds,
                             **({"discordant": list(m.difference.discordant)} if m.difference.discordant else {})}
                            for m in self.metrics]}


def _checkpoints(root: Path) -> dict[str, Checkpoint]:
    """The checkpoints under ``root``: each result's folder below it (``step0700``, ``run1/epoch_3``)."""
    out: dict[str, Checkpoint] = {}
    for r in read_results(root):
        name = r.path.parent.relative_to(root).as_posix() if r.path.parent != root else str(r.data["checkpoint"])
        out.setdefault(name, Checkpoint(name, {})).results[str(r.data["suite"])] = r
    return out


def _order(names: list[str]) -> list[str]:
    def key(n: str):
        s = checkpoint_step(n)
        return (s is None, s[1] if s else 0, n)
    return sorted(names, key=key)


def _find(found: dict[str, Checkpoint], name: str, where: Path) -> Checkpoint:
    if name in found:
        return found[name]
    tail = [c for n, c in found.items() if n.rsplit("/", 1)[-1] == name]
    if len(tail) == 1:
        return tail[0]
    listed = ", ".join(_order(list(found))[:12])
    raise UsageError(f"checkpoint {name!r} is not in {where}" + (" (several folders end so; name one)" if tail else "")
                     + f"; it holds: {listed}")


def pick(results: str | Path, other: str | Path | None = None, a: str | None = None,
         b: str | None = None) -> tuple[Checkpoint, Checkpoint]:
    """The two checkpoints to compare: from one results folder ``a`` and ``b`` by name (default: the last two
    with a step in their name, A the earlier); with ``other``, A from ``results`` and B from ``other`` (each
    folder's only checkpoint unless named)."""
    root = Path(results)
    found = _checkpoints(root)
    if other is not None:
        root_b = Path(other)
        return _only(found, a, root, "--a"), _only(_checkpoints(root_b), b, root_b, "--b")
    order = _order(list(found))
    stepped = [n for n in order if checkpoint_step(n) is not None]
    if len(stepped) >= 2 and a is None and b is None:  # the last two steps (a predictions folder is no step)
        order = stepped
    if len(order) < 2:
        raise UsageError(f"{root} holds {len(order)} checkpoint ({', '.join(order)}); compare needs two: pass a "
                         f"second results folder, or evaluate another checkpoint into this one")
    cb = _find(found, b, root) if b is not None else None
    ca = _find(found, a, root) if a is not None else None
    if ca is None:  # the checkpoint before B (the first after it when B is the first)
        at = order.index(cb.name) if cb is not None else len(order) - 1
        ca = found[order[at - 1] if at > 0 else order[1]] if cb is not None else found[order[-2]]
    if cb is None:  # the last checkpoint other than A
        cb = found[[n for n in order if n != ca.name][-1]]
    if ca.name == cb.name:
        raise UsageError(f"--a and --b name the same checkpoint {ca.name!r}; name two")
    return ca, cb


def _only(found: dict[str, Checkpoint], name: str | None, where: Path, flag: str) -> Checkpoint:
    if name is not None:
        return _find(found, name, where)
    if len(found) != 1:
        raise UsageError(f"{where} holds {len(found)} checkpoints ({', '.join(_order(list(found))[:8])}); name the "
                         f"one to compare with {flag}")
    return next(iter(found.values()))


def compare_checkpoints(a: Checkpoint, b: Checkpoint, *, suites: list[str] | None = None,
                        resamples: int = RESAMPLES, seed: int = 0) -> Comparison:
    """Every headline metric of every suite both checkpoints have (or ``suites``): B - A with its interval and
    p-value, Holm-adjusted over all of them. Raises DataError when a suite's two results cover different
    items (naming them) or lack per-item outcomes."""
    common = [s for s in a.results if s in b.results]
    if suites:
        missing = [s for s in suites if s not in common]
        if missing:
            raise UsageError(f"suite(s) {missing} are not evaluated for both {a.name} and {b.name}; both have: "
                             f"{', '.join(common) or 'none'}")
        common = [s for s in common if s in suites]
    out = Comparison(a.name, b.name, resamples=resamples, seed=seed)
    only = sorted(set(a.results) ^ set(b.results))
    if only and not suites:
        out.notes.append(f"suites evaluated for only one of them, left out: {', '.join(only)}")
    if not common:
        raise UsageError(f"{a.name} and {b.name} share no evaluated suite (A: {', '.join(a.results)}; B: "
                         f"{', '.join(b.results)})")
    for s in common:
        ra, rb = a.results[s], b.results[s]
        cols = {c: p for c, p in headline_paths(ra.data).items() if headline_paths(rb.data).get(c) == p}
        diffs = compare(ra.data, ra.outcomes(), rb.data, rb.outcomes(), paths=list(cols.values()),
                        resamples=resamples, seed=seed)
        by_path = {d.path: d for d in diffs}
        out.metrics += [ComparedMetric(s, c, by_path[p]) for c, p in cols.items() if p in by_path]
        left = [c for c, p in cols.items() if p not in by_path]
        if left:
            out.notes.append(f"{s}: no interval for {', '.join(left)}")
    adjusted = holm([m.difference.p for m in out.metrics])
    out.metrics = [ComparedMetric(m.suite, m.column, _with_holm(m.difference, p))
                   for m, p in zip(out.metrics, adjusted)]
    return out


def _with_holm(d: Difference, p: float) -> Difference:
    return Difference(d.path, d.a, d.b, d.diff, d.low, d.high, d.p, d.test, p, d.discordant)


def format_comparison(c: Comparison, width: int = 120) -> str:
    """One screen: a line per metric (A, B, B - A, its interval, p after Holm, which is better) and a summary."""
    n = len(c.metrics)
    lines = [f"compare: A = {c.a}, B = {c.b}: {n} metrics of {len({m.suite for m in c.metrics})} suite(s)",
             f"B - A in points, its 95% paired-bootstrap interval over the suite's units ({c.resamples} resamples, "
             f"seed {c.seed});",
             f"p: exact McNemar for right/wrong metrics, else a paired permutation test; Holm-adjusted over the {n} "
             f"metrics: a difference holds at p < {ALPHA:g}"]
    suite_w = max([5] + [len(m.suite) for m in c.metrics])
    col_w = max([6] + [len(m.column) for m in c.metrics])
    head = (f"{'suite'.ljust(suite_w)}  {'metric'.ljust(col_w)}  {'A':>6}  {'B':>6}  {'B-A':>6}  "
            f"{'95% interval':>15}  {'p':>7}  better")
    lines += ["", head]
    for m in c.metrics:
        d = m.difference
        better = ((c.b if (d.diff > 0) == higher_is_better(d.path) else c.a) if m.holds else "-")
        p = "<0.001" if d.p_holm is not None and d.p_holm < 0.001 else f"{d.p_holm:.3f}"
        lines.append(f"{m.suite.ljust(suite_w)}  {m.column.ljust(col_w)}  {d.a:6.1f}  {d.b:6.1f}  {d.diff:+6.1f}  "
                     f"{f'[{d.low:+.1f}, {d.high:+.1f}]':>15}  {p:>7}  {better}")
    b_wins = sum(m.holds and (m.difference.diff > 0) == higher_is_better(m.difference.path) for m in c.metrics)
    a_wins = sum(m.holds for m in c.metrics) - b_wins
    lines += ["", f"B ({c.b}) better on {b_wins}, A ({c.a}) better on {a_wins}, no difference that holds on "
                  f"{n - a_wins - b_wins} (higher is better, except FR: the false rate)"]
    lines += [f"note: {x}" for x in c.notes]
    return "\n".join(lines)

