"""Atomic file writes: write a hidden temporary beside the target, then rename it into place."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from hardrank.errors import NoSpace, UsageError
from hardrank.units import size

__all__ = ["atomic_path", "write_json_atomic", "write_text_atomic", "named_when_full", "no_space", "why_unwritable"]

_FULL = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded"}


def _free(path: Path) -> str:
    """Free space (for this user) on the filesystem of ``path`` or of its nearest existing parent."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            st = os.statvfs(p)
            return f"{size(st.f_bavail * st.f_frsize)} free there"
    return "free space unknown"


def no_space(exc: BaseException, path: str | os.PathLike | None = None, needed: int | None = None) -> NoSpace | None:
    """``exc`` as ``NoSpace`` when it is a full disk (ENOSPC) or a spent quota (EDQUOT): one line naming the
    file (``path``, else the error's own file name), the ``needed`` bytes when known and the space left;
    None for any other error."""
    if not isinstance(exc, OSError) or exc.errno not in _FULL:
        return None
    if isinstance(exc, NoSpace):
        return exc
    where = path if path is not None else exc.filename
    path = Path(os.fsdecode(where)) if where is not None else None
    need = f"it needs about {size(needed)}, " if needed else ""
    room = _free(path.parent) if path is not None else "free space unknown"
    err = NoSpace(f"{_FULL[exc.errno]} writing {path if path is not None else 'a file'} ({need}{room}); free some "
                  f"space there or write to another disk (--out / --store), then run the same command again: "
                  f"finished work is kept")
    err.errno, err.filename = exc.errno, os.fspath(path) if path is not None else None
    return err


@contextlib.contextmanager
def named_when_full(path: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Inside the block, a full disk or spent quota raises ``NoSpace`` naming ``path`` and ``needed`` (see
    ``no_space``); other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        err = no_space(exc, path, needed)
        if err is None or err is exc:
            raise
        raise err from exc


def why_unwritable(path: str | os.PathLike) -> str | None:
    """Why this process cannot write ``path``, or None when it can: a folder must take a new file (a probe
    is created and removed), a file must open for writing (left unchanged); a missing path answers for
    the nearest folder above it, where it would be created. A real write, not ``os.access``: permission
    bits, ACLs, root squash, immutable flags and read-only mounts all answer as the run's writes would."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        if p.is_dir():
            probe = p / f".hardrank-write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        else:
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        return f"{exc.strerror or exc}: {p}"
    return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without error it is renamed
    onto ``path`` (readers see the old file or the whole new one, never half), else removed.
    A full disk or spent quota raises ``NoSpace`` naming ``path`` and ``needed`` (its size, when known)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with named_when_full(path, needed):
            yield tmp
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    with atomic_path(path, len(data)) as tmp:
        tmp.write_bytes(data)


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
    with atomic_path(dst, src.stat().st_size) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
