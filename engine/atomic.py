"""Atomic file writes: write a hidden temporary beside the target, then rename it into place."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from hardrank.errors import UsageError

__all__ = ["atomic_path", "write_json_atomic", "write_text_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without error it is renamed
    onto ``path`` (readers see the old file or the whole new one, never half), else removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def copy_into(src: str | os.PathLike, dst: str | os.PathLike, fix: str = "use another --out") -> None:
    """``dst`` becomes a copy of ``src`` (a hard link when possible), atomically; an equal file is left
    alone, a different one is an error ending with ``fix``."""
    src, dst = Path(src), Path(dst)
    if dst.exists():
        if dst.samefile(src) or dst.read_bytes() == src.read_bytes():
            return
        raise UsageError(f"{dst} exists and differs from {src}; {fix}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
