"""Suite loaders: each compiles a benchmark's published files into tasks over shared tables."""
from __future__ import annotations

from ..items import Tables
from ..tasks import Suite
from ._common import SuiteFormatError, SuiteOptions
from .hard_positives import load_hard_positives
from .inpaintcoco import load_inpaintcoco
from .karpathy import load_karpathy, load_rococo
from .toy import TOY_SUITES, load_toy

__all__ = ["SUITES", "ALIASES", "SuiteOptions", "SuiteFormatError", "load_suites", "expand_suites"]

SUITES = {
    "karpathy": load_karpathy,
    "rococo": load_rococo,
    "hard_positives": load_hard_positives,
    "inpaintcoco": load_inpaintcoco,
    **{name: (lambda tables, opts, _n=name: load_toy(tables, opts, _n)) for name in TOY_SUITES},
}
ALIASES = {"toy": list(TOY_SUITES)}


def expand_suites(names: list[str]) -> list[str]:
    out = []
    for n in names:
        for m in ALIASES.get(n, [n]):
            if m not in SUITES:
                raise ValueError(f"unknown suite {m!r}; choose from {sorted(SUITES) + sorted(ALIASES)}")
            if m not in out:
                out.append(m)
    return out


def load_suites(names: list[str], tables: Tables, opts: SuiteOptions) -> list[Suite]:
    """Load every named suite (aliases such as ``toy`` expanded) into the shared ``tables``."""
    return [SUITES[n](tables, opts) for n in expand_suites(names)]
