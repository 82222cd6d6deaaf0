"""The report's confidence marks: each (checkpoint, suite) main metric's 95% interval, and whether its gap to the
suite's best checkpoint holds (a paired test per checkpoint, Holm over the suite's checkpoints)."""
from __future__ import annotations

import logging

from hardrank.compare import ALPHA
from hardrank.errors import DataError
from hardrank.jobs.report.load import Result
from hardrank.jobs.report.tables import main_paths
from hardrank.scoring.statistics import RESAMPLES, add_mean, compare, holm, intervals, unit_stats

__all__ = ["main_marks", "MAIN"]

log = logging.getLogger("hardrank.report")
MAIN = ("__main__",)  # the path of the derived main-metric estimand


def main_marks(by_suite: dict[str, list[Result]], *, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """{(label, suite): {"ci95": (low, high), "best": label of the suite's best, "vs_best": value - best,
    "p_holm": p, "holds": bool}} for every result whose outcomes allow it (others are left out). The main
    metric is the leaderboard's (``tables.main_metric``); its gap to the best is tested like `hardrank compare`
    does (exact McNemar when it is one right/wrong metric, else a paired permutation test), Holm-adjusted over
    the suite's other checkpoints."""
    marks: dict = {}
    for suite, rs in by_suite.items():
        tables, values = {}, {}
        for r in rs:
            name, paths = main_paths(r.data)
            t = r.outcomes()  # None: none, or damaged (logged once where it is read)
            if not paths or t is None:
                continue
            try:
                st = unit_stats(r.data, t)
            except DataError as exc:
                log.warning("%s", exc)
                continue
            if not add_mean(st, MAIN, paths):
                continue
            lo, hi = _main_interval(st, resamples, seed)
            values[r.label] = st.point()[MAIN]
            tables[r.label] = (r, t, paths)
            marks[(r.label, suite)] = {"ci95": (lo, hi)}
        if not values:
            continue
        best = max(values, key=lambda label: values[label])
        rb, tb, paths = tables[best]
        tested = []
        for label, (r, t, p) in tables.items():
            marks[(label, suite)].update(best=best, vs_best=values[label] - values[best])
            if label == best or p != paths:
                continue
            try:
                (d,) = [x for x in compare(rb.data, tb, r.data, t, paths=[MAIN], means={MAIN: paths},
                                           resamples=resamples, seed=seed) if x.path == MAIN]
            except (DataError, ValueError) as exc:  # other items (another subset): no test
                log.warning("%s", exc)
                continue
            tested.append((label, d.p))
        for (label, _), p in zip(tested, holm([p for _, p in tested])):
            marks[(label, suite)].update(p_holm=p, holds=p < ALPHA and values[label] != values[best])
    return marks


def _main_interval(st, resamples: int, seed: int) -> tuple[float, float]:
    """The main metric's interval alone (not every metric's)."""
    only = type(st)(st.task_type, st.units, st.dense, st.columns, [e for e in st.estimands if e.path == MAIN],
                    st.rows, st.unit_class, st.class_dense, st.class_columns, st.n_classes)
    return intervals(only, resamples=resamples, seed=seed)[MAIN]
