"""Durations and byte counts as progress lines, plans and error messages print them (written once, for every room)."""
from __future__ import annotations

__all__ = ["hms", "size"]


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def size(n: float) -> str:
    """Bytes in powers of 1000: ``512 B``, ``1.5 KB`` ... ``2.0 TB``."""
    if n < 1000:
        return f"{int(n)} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
