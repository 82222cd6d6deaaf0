"""Helpers shared by suite loaders: where a benchmark's files are, the annotation file, the caption protocol
(the file formats themselves: hardrank.formats)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hardrank.config import SuiteOptions
from hardrank.errors import UsageError
from hardrank.text import caption_normaliser

__all__ = ["SuiteOptions", "release_folder", "find_annotation", "caption_protocol"]


def release_folder(root: Path, candidates: tuple[str, ...], names) -> Path:
    """The folder holding a benchmark's files under ``--data``: the first of ``candidates`` (paths under
    ``root``, ``"."`` for ``root`` itself: the release's own folder names, a repository's ``data/``) that
    holds any of ``names``; ``root`` when none does (its errors then name ``root``). So one ``--data``
    folder can hold several benchmarks, each in its release layout under its own name."""
    names = list(names)
    for cand in (root / c for c in candidates):
        if any((cand / n).exists() for n in names):
            return cand
    return root


def find_annotation(opts: SuiteOptions, default_name: str, suite: str = "this suite") -> Path:
    """The annotation file: ``--annotations`` (a file, or a folder holding ``default_name``), else ``--data``."""
    cand = opts.annotations or opts.data
    if cand is None:
        raise UsageError(f"{suite} needs --annotations (a Karpathy-format JSON such as {default_name})")
    p = Path(cand)
    if p.is_dir():
        p = p / default_name
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist; pass --annotations FILE (e.g. {default_name})")
    return p


def caption_protocol(opts: SuiteOptions, default: str = "blip") -> tuple[str, Callable[[str], str]]:
    """(protocol name, the function it applies to each caption): ``--caption-protocol``, else the suite's
    ``default``. The name goes into the suite's meta (``caption_protocol``), which results carry on top."""
    name = opts.caption_protocol or default
    return name, caption_normaliser(name)
