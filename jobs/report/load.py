"""Reading a results folder: its <checkpoint>/<suite>.json files, steps parsed from names, checkpoint order."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.models.runs import checkpoint_step
from hardrank.scoring.results import read_results

log = logging.getLogger("hardrank.report")
# the per-query columns every part of a report reads (older results may lack the later ones: unit, verdicts)
OUTCOME_COLUMNS = ("kind", "task", "view", "query_id", "rank", "top1_id", "top1_group")

__all__ = ["Result", "Axis", "OUTCOME_COLUMNS", "parse_step", "load_results", "checkpoint_axis"]


def parse_step(name: str) -> tuple[str, int] | None:
    """``("step", 200)`` for ``toy-clip_step0200``, ``("epoch", 3)`` for ``epoch_3``; None if the name
    holds no step (``hardrank.models.runs.checkpoint_step``: the one parser of steps in names). Checkpoint
    names without one are listed after those with one, in name order."""
    return checkpoint_step(name)


def _natural(s: str):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s)]


@dataclass
class Result:
    path: Path            # the result JSON
    data: dict            # its content
    label: str            # checkpoint label shown in the report
    run: str = ""         # the training run: the folder holding its checkpoint's folder ("" for the top)
    unreadable: str | None = field(default=None, compare=False)  # why its per-query Parquet could not be read
    _outcomes: pa.Table | None = field(default=None, repr=False, compare=False)

    def outcomes(self) -> pa.Table | None:
        """Its per-query outcomes (the ``.parquet`` beside the JSON), read once; None when there is none, or when
        it cannot be read (cut short, overwritten, another table's columns): then logged once, naming the file,
        and ``unreadable`` says why. The report's metrics come from the JSON; the parts that need the outcomes
        (worst failures, intervals) leave this result out."""
        p = self.path.with_suffix(".parquet")
        if self._outcomes is not None or self.unreadable is not None or not p.is_file():
            return self._outcomes
        try:
            t = pq.read_table(p)
            missing = [c for c in OUTCOME_COLUMNS if c not in t.column_names]
            if missing:
                raise pa.ArrowInvalid(f"columns {missing} missing")
        except (pa.ArrowException, OSError) as exc:
            self.unreadable = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("%s: not a readable per-query Parquet (%s); the worst failures leave out checkpoint %s and "
                        "the leaderboard draws no interval for it (its metrics, from %s, are reported): run its "
                        "`hardrank eval` again to rewrite it", p, self.unreadable, self.label, self.path.name)
            return None
        self._outcomes = t
        return t

    @property
    def suite(self) -> str:
        return self.data["suite"]

    @property
    def ranking(self) -> bool:
        return self.data["task_type"] == "ranking"

    @property
    def mask(self) -> bool:
        return self.data["task_type"] == "mask"


def load_results(results_dir: Path, skip: Path | None) -> list[Result]:
    """Every result below ``results_dir`` (not below ``skip``, the report's own folder). Labels are
    the checkpoint names, or the folders below ``results_dir`` when one name repeats for a suite."""
    found = [Result(r.path, r.data, str(r.data["checkpoint"]), _run(r.path, results_dir))
             for r in read_results(results_dir, skip=skip)]
    seen: dict[tuple[str, str], int] = {}
    for r in found:
        seen[(r.label, r.suite)] = seen.get((r.label, r.suite), 0) + 1
    if any(n > 1 for n in seen.values()):  # several runs under one folder: label by their folder
        for r in found:
            r.label = r.path.parent.relative_to(results_dir).as_posix()
    return found


def _run(path: Path, root: Path) -> str:
    """The run a result belongs to: the folder above its checkpoint folder, relative to the results folder
    (``run1`` for ``run1/epoch_3/suite.json``; "" for ``epoch_3/suite.json``)."""
    rel = path.parent.parent.relative_to(root).as_posix()
    return "" if rel == "." else rel


@dataclass
class Axis:
    """How checkpoints line up: ``order`` (those with a step, by step, then those without, by name),
    ``step`` per label (None without one), ``unit`` of the steps ("step", "epoch", ...; "order" when
    no checkpoint has one) and ``x``, each label's position on a plot's x axis (steps as they are,
    the checkpoints without one placed beyond the last step, in ``order``)."""

    order: list[str]
    step: dict[str, int | None]
    unit: str
    x: dict[str, float]

    @property
    def unstepped(self) -> list[str]:
        return [l for l in self.order if self.step[l] is None]


def checkpoint_axis(labels: list[str]) -> Axis:
    """The checkpoints' axis. Steps of the most common unit count; a checkpoint without one (a
    predictions folder, ``final``) or with another unit is listed beside them, never reorders them."""
    parsed = {l: parse_step(l) for l in labels}
    units = [s[0] for s in parsed.values() if s is not None]
    unit = max(sorted(set(units)), key=units.count) if units else "order"
    step = {l: (s[1] if s is not None and s[0] == unit else None) for l, s in parsed.items()}
    stepped = sorted((l for l in labels if step[l] is not None), key=lambda l: (step[l], _natural(l)))
    others = sorted((l for l in labels if step[l] is None), key=_natural)
    if not stepped:
        return Axis(others, step, "order", {l: float(i) for i, l in enumerate(others)})
    x = {l: float(step[l]) for l in stepped}
    lo, hi = x[stepped[0]], x[stepped[-1]]
    gap = max((hi - lo) * 0.12, 1.0)
    x.update({l: hi + gap * (i + 1) for i, l in enumerate(others)})
    return Axis(stepped + others, step, unit, x)
