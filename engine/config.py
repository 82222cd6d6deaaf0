"""Options defined once: the config dataclasses, parsed specs, device resolution, package paths."""
from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR"]

DATA_DIR = Path(__file__).resolve().parent / "data"  # bundled model configs, toy checkpoints, vocabularies
