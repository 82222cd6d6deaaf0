"""Reading a results folder: its <checkpoint>/<suite>.json files, steps parsed from names, checkpoint order."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hardrank.results import read_results

__all__ = ["Result", "parse_step", "load_results", "checkpoint_axis"]

# "step0200", "epoch_3", "iter-1000", "global_step5": the unit and the number. Checkpoint names
# without one are placed in name order instead.
_STEP = re.compile(r"(?<![a-z])(global_step|step|epoch|iteration|iter|it|ckpt|checkpoint)[_\-]?(\d+)", re.I)


def parse_step(name: str) -> tuple[str, int] | None:
    """``("step", 200)`` for ``toy-clip_step0200``, ``("epoch", 3)`` for ``epoch_3``; None if the name
    holds no step (the last match wins: ``run2_epoch_3`` is epoch 3)."""
    found = _STEP.findall(name)
    if not found:
        return None
    unit, num = found[-1]
    return unit.lower(), int(num)


def _natural(s: str):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s)]


@dataclass
class Result:
    path: Path            # the result JSON
    data: dict            # its content
    label: str            # checkpoint label shown in the report

    @property
    def suite(self) -> str:
        return self.data["suite"]

    @property
    def ranking(self) -> bool:
        return self.data["task_type"] == "ranking"


def load_results(results_dir: Path, skip: Path | None) -> list[Result]:
    """Every result below ``results_dir`` (not below ``skip``, the report's own folder). Labels are
    the checkpoint names, or the folders below ``results_dir`` when one name repeats for a suite."""
    found = [Result(r.path, r.data, str(r.data["checkpoint"])) for r in read_results(results_dir, skip=skip)]
    seen: dict[tuple[str, str], int] = {}
    for r in found:
        seen[(r.label, r.suite)] = seen.get((r.label, r.suite), 0) + 1
    if any(n > 1 for n in seen.values()):  # several runs under one folder: label by their folder
        for r in found:
            r.label = r.path.parent.relative_to(results_dir).as_posix()
    return found


def checkpoint_axis(labels: list[str]) -> tuple[list[str], dict[str, float], str]:
    """Checkpoints in step order, their x positions, and the axis name ("step", "epoch" or "order")."""
    steps = {l: parse_step(l) for l in labels}
    units = {s[0] for s in steps.values() if s is not None}
    if all(s is not None for s in steps.values()) and len(units) == 1:
        order = sorted(labels, key=lambda l: (steps[l][1], _natural(l)))
        return order, {l: float(steps[l][1]) for l in order}, units.pop()
    order = sorted(labels, key=_natural)
    return order, {l: float(i) for i, l in enumerate(order)}, "order"
