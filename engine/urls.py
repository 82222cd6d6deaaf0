"""Any fsspec URL where a path is read or written: open, list, expand shard patterns, read byte ranges, stage outputs.

Local paths (and ``file://`` URLs) never touch fsspec; ``s3://``, ``gs://``, ``hf://``, ``az://`` and any other
protocol fsspec knows go through the backend fsspec names for it (``s3fs``, ``gcsfs``, ``huggingface_hub``,
``adlfs``), imported only when such a URL is given. Credentials come from each backend's usual environment and
config (``AWS_ACCESS_KEY_ID`` / ``AWS_PROFILE`` / ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``HF_TOKEN``, ...); nothing here holds or guesses one.

Writes to a URL are staged: a command writes into a local folder (``stage``: ``$HARDRANK_CACHE/remote/<hash>``)
and ``RemoteDir.push`` uploads what changed, data files first and JSON (manifests, summaries, results) last. An
object store PUT is atomic (an object is visible whole or not at all), so each file is uploaded under its final
name; on filesystems with a rename (``file://``, sftp, ...) it goes to a hidden temporary first and is renamed.
A killed upload therefore leaves no half-written visible object, and the next run pushes what is missing.

A member of a tar shard is addressed as ``tar:<offset>:<size>:<shard url>#<member name>`` (``member_uri``):
self-contained, so any worker reads its bytes with one range request, without the driver.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hardrank.errors import DataError, MissingExtra, UsageError

__all__ = ["staged_dir", "is_url", "local_path", "join", "basename", "filesystem", "read_bytes", "read_many", "stat",
           "identity", "exists", "is_dir", "list_files", "expand", "brace_expand", "member_uri", "parse_member_uri",
           "is_member_uri", "fetch_input", "RemoteDir", "check_writable_url", "put_file", "remote_error"]

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
_MEMBER = "tar:"
# protocol -> (the fsspec backend package, the hardrank extra that installs it, or None)
_BACKENDS = {"s3": ("s3fs", "data"), "s3a": ("s3fs", "data"), "gs": ("gcsfs", None), "gcs": ("gcsfs", None),
             "hf": ("huggingface_hub", None), "az": ("adlfs", None), "abfs": ("adlfs", None),
             "abfss": ("adlfs", None), "adl": ("adlfs", None), "http": ("aiohttp", "data"),
             "https": ("aiohttp", "data")}
# object stores: a PUT is atomic, there is no rename (a copy + delete would be)
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "hf", "memory"}
_MERGE_GAP = 1 << 20  # tar members of one batch closer than this are read in one range request


# -- names ---------------------------------------------------------------------------------------------
def is_url(s) -> bool:
    """Whether ``s`` names a remote location (``s3://``...); ``file://`` URLs and paths are local."""
    if not isinstance(s, str):
        return False
    m = _URL.match(s)
    return bool(m) and m.group(1).lower() not in ("file", "local", "parquet")  # parquet://: a cell, hardrank.items


def local_path(s: str | os.PathLike) -> str:
    """A local path for a path or a ``file://`` URL (remote URLs are returned unchanged)."""
    s = os.fspath(s)
    m = _URL.match(s)
    if m and m.group(1).lower() in ("file", "local"):
        return s[len(m.group(0)):] if s[len(m.group(0)):].startswith("/") else "/" + s[len(m.group(0)):]
    return s


def join(root: str | os.PathLike, *parts: str) -> str:
    """``root / part ...`` for a path or a URL (``Path`` would fold ``s3://`` into ``s3:/``)."""
    root = local_path(root)
    if is_url(root):
        return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.fspath(Path(root).joinpath(*parts))


def basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _protocol(url: str) -> str:
    m = _URL.match(url)
    return m.group(1).lower() if m else "file"


# -- filesystems and errors ------------------------------------------------------------------------------
def filesystem(url: str):
    """(fsspec filesystem, path within it) for a URL; a missing backend names the package to install."""
    try:
        import fsspec.core
    except ImportError as exc:
        raise MissingExtra(f"reading {url}", "data", "fsspec") from exc
    proto = _protocol(url)
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        pkg, extra = _BACKENDS.get(proto, (None, None))
        if extra:
            raise MissingExtra(f"{proto}:// URLs ({url})", extra, pkg) from exc
        raise MissingExtra(f"{proto}:// URLs ({url})", "data", pkg or str(exc)) from exc
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise UsageError(f"{url}: unknown protocol {proto!r}; use a local path or a URL of a protocol fsspec "
                             f"knows (s3://, gs://, hf://, az://, https://, file://)") from None
        raise


_CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE; AWS_ENDPOINT_URL for an S3-compatible "
          "server such as MinIO), as for the aws command line",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`",
    "hf": "set HF_TOKEN, or run `hf auth login`",
    "az": "set AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and a key or SAS token)",
}


def remote_error(url: str, exc: BaseException, doing: str = "reading") -> Exception:
    """A backend's exception as a hardrank error naming the URL and the fix (credentials, a missing object)."""
    proto = _protocol(url)
    name = type(exc).__name__
    text = f"{name}: {exc}"
    cause = exc.__cause__ or exc.__context__  # fsspec's http backend raises FileNotFoundError from the real one
    if isinstance(exc, FileNotFoundError) and cause is not None and any(
            m in type(cause).__name__ or m in str(cause) for m in _UNREACHABLE):
        exc, name, text = cause, type(cause).__name__, f"{type(cause).__name__}: {cause}"
    if isinstance(exc, FileNotFoundError) or "NoSuchKey" in text or "NoSuchBucket" in text or "404" in text:
        return FileNotFoundError(f"{url} does not exist ({doing}; {exc})")
    if ("Credential" in name or "credential" in text.lower() or "AccessDenied" in text or "Forbidden" in text
            or "403" in text or "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text
            or isinstance(exc, PermissionError)):
        hint = _CREDENTIAL_HINTS.get("gs" if proto == "gcs" else "s3" if proto == "s3a" else proto,
                                     "configure the backend's credentials as its documentation says")
        return DataError(f"{url}: access refused or no credentials while {doing} ({text}); {hint}")
    if any(m in name or m in text for m in _UNREACHABLE):
        endpoint = (f"AWS_ENDPOINT_URL is {os.environ['AWS_ENDPOINT_URL']!r}: is that server running? "
                    if proto in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL") else "")
        return DataError(f"{url}: cannot reach the server while {doing} ({text}); {endpoint}check the URL's host "
                         f"and this machine's network (a proxy, a firewall), then run again")
    return DataError(f"{url}: {doing} failed ({text})")


# what backends raise when no server answers (botocore, aiohttp, requests, OSError)
_UNREACHABLE = ("EndpointConnectionError", "ConnectTimeout", "ConnectionError", "ClientConnectorError",
                "ConnectionRefused", "Cannot connect to host", "Name or service not known",
                "Temporary failure in name resolution", "Could not connect")


@contextlib.contextmanager
def _errors(url: str, doing: str):
    try:
        yield
    except (MissingExtra, UsageError, DataError):
        raise
    except Exception as exc:  # backends raise their own kinds (botocore, aiohttp, requests...)
        raise remote_error(url, exc, doing) from exc


# -- reading -----------------------------------------------------------------------------------------
def read_bytes(url: str, start: int | None = None, end: int | None = None) -> bytes:
    """Bytes ``[start, end)`` of a file or object (all of it by default)."""
    path = local_path(url)
    if not is_url(path):
        with open(path, "rb") as f:
            if start:
                f.seek(start)
            return f.read() if end is None else f.read(end - (start or 0))
    fs, p = filesystem(path)
    with _errors(path, "reading"):
        return fs.cat_file(p, start=start, end=end)


def stat(url: str) -> dict:
    """``{"size", "version"}`` of a file or object; the version is what changes when the content does
    (local: mtime in ns; object stores: ETag, else the modification time)."""
    path = local_path(url)
    if not is_url(path):
        st = os.stat(path)
        return {"size": st.st_size, "version": str(st.st_mtime_ns)}
    fs, p = filesystem(path)
    with _errors(path, "looking up"):
        info = fs.info(p)
    version = (info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("LastModified")
               or info.get("mtime") or info.get("last_modified") or "")
    return {"size": int(info.get("size") or 0), "version": str(version).strip('"')}


def identity(url: str) -> str:
    """What names a file's content without reading it: its location, size and version."""
    s = stat(url)
    return f"{local_path(url) if is_url(url) else os.path.abspath(local_path(url))}|{s['size']}|{s['version']}"


def exists(url: str) -> bool:
    """Whether a file or folder is there. For a URL only a missing object is False: an unreachable server
    or refused access raises, named with the fix (fsspec's ``exists`` reads those as "missing")."""
    path = local_path(url)
    if not is_url(path):
        return os.path.exists(path)
    fs, p = filesystem(path)
    try:
        with _errors(path, "looking up"):
            fs.info(p)
    except FileNotFoundError:
        return False
    return True


def is_dir(url: str) -> bool:
    return _probe(url, os.path.isdir, "isdir")


def _probe(url: str, local, method: str) -> bool:
    """``local(path)`` for a local path, else the filesystem's ``method`` (errors named with the fix)."""
    path = local_path(url)
    if not is_url(path):
        return local(path)
    fs, p = filesystem(path)
    with _errors(path, "looking up"):
        return getattr(fs, method)(p)


def list_files(url: str) -> list[str]:
    """Every file below a folder, as full URLs (paths for local folders), sorted."""
    path = local_path(url)
    if not is_url(path):
        return sorted(os.fspath(p) for p in Path(path).rglob("*") if p.is_file())
    fs, p = filesystem(path)
    proto = _protocol(path)
    with _errors(path, "listing"):
        found = fs.find(p)
    return sorted(f if _URL.match(f) else f"{proto}://{f}" for f in found)


# -- shard patterns ------------------------------------------------------------------------------------
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def brace_expand(pattern: str) -> list[str]:
    """``shards/{00000..00099}.tar`` and ``{a,b}`` expanded as the shell and WebDataset do (zero padding
    kept; ranges may be nested in lists). Unbalanced braces or a bad range raise naming the pattern."""
    depth, start = 0, None
    for i, ch in enumerate(pattern):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise UsageError(f"shard pattern {pattern!r}: '}}' at character {i} closes no '{{'; write ranges "
                                 f"as {{00000..00099}} and lists as {{a,b}}")
            if depth == 0:
                body = pattern[start + 1:i]
                head, tail = pattern[:start], pattern[i + 1:]
                return [head + x + t for x in _brace_body(pattern, body) for t in brace_expand(tail)]
    if depth:
        raise UsageError(f"shard pattern {pattern!r}: a '{{' is never closed; write ranges as {{00000..00099}} "
                         f"and lists as {{a,b}}")
    return [pattern]


def _brace_body(pattern: str, body: str) -> list[str]:
    m = _RANGE.match(body)
    if m:
        a, b = m.group(1), m.group(2)
        width = len(a) if a.startswith("0") and len(a) > 1 else 0
        lo, hi = int(a), int(b)
        step = 1 if hi >= lo else -1
        return [str(v).zfill(width) for v in range(lo, hi + step, step)]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (ch == "{") - (ch == "}")
        cur += ch
    parts.append(cur)
    if len(parts) == 1:
        raise UsageError(f"shard pattern {pattern!r}: {{{body}}} is neither a range ({{00000..00099}}, two numbers "
                         f"joined by '..') nor a list ({{a,b}}); did you mean {{{body.replace('...', '..')}}}?")
    return [x for p in parts for x in brace_expand(p)]


def expand(pattern: str, *, what: str = "shards") -> list[str]:
    """Every file a pattern names: brace expansion, then glob characters (``*?[``) matched against the
    filesystem. Names without glob characters must exist; a pattern matching nothing raises, naming
    the first missing file."""
    out: list[str] = []
    missing: list[str] = []
    for name in brace_expand(local_path(pattern)):
        if any(c in name for c in "*?["):
            if is_url(name):
                fs, p = filesystem(name)
                proto = _protocol(name)
                with _errors(name, "listing"):
                    hits = sorted(fs.glob(p))
                hits = [h if _URL.match(h) else f"{proto}://{h}" for h in hits]
            else:
                hits = sorted(os.fspath(p) for p in Path("/").glob(os.path.abspath(name).lstrip("/")))
            out.extend(hits or [])
            if not hits:
                missing.append(name)
        else:
            out.append(name)
    if missing and not out:
        raise FileNotFoundError(f"{what} pattern {pattern!r} matches no file ({missing[0]} has none)")
    absent = [n for n in out if not exists(n)]
    if absent:
        fix = ("check the range in braces (it names every shard, first..last)" if "{" in pattern
               else "check the name (`ls` the folder, or `aws s3 ls` / `gsutil ls` the bucket)")
        raise FileNotFoundError(f"{what} pattern {pattern!r}: {len(absent)} of {len(out)} files do not exist, e.g. "
                                f"{absent[:3]}; {fix}")
    return list(dict.fromkeys(out))


# -- tar members -----------------------------------------------------------------------------------------
def member_uri(shard: str, offset: int, size: int, member: str) -> str:
    """The self-contained address of a tar member's data (see the module docstring)."""
    return f"{_MEMBER}{offset}:{size}:{shard}#{member}"


def is_member_uri(uri: str) -> bool:
    return uri.startswith(_MEMBER)


def parse_member_uri(uri: str) -> tuple[str, int, int, str]:
    """(shard, offset, size, member) of a ``member_uri``."""
    try:
        _, off, size, rest = uri.split(":", 3)
        shard, _, member = rest.partition("#")
        return shard, int(off), int(size), member
    except ValueError:
        raise DataError(f"{uri!r} is not a tar member address (tar:<offset>:<size>:<shard>#<member>)") from None


def _read_member(uri: str) -> bytes:
    shard, off, size, member = parse_member_uri(uri)
    try:
        data = read_bytes(shard, off, off + size)
    except FileNotFoundError:
        raise FileNotFoundError(f"{shard}: shard not found (reading member {member})") from None
    if len(data) != size:
        raise DataError(f"{shard}#{member}: shard is truncated ({len(data)} of {size} bytes at offset {off})")
    return data


def read_source(uri: str) -> bytes:
    """Bytes of an image source that is a tar member or a URL (see ``hardrank.items.read_image_bytes``)."""
    return _read_member(uri) if is_member_uri(uri) else read_bytes(uri)


def read_many(uris: list[str], threads: int = 8) -> list:
    """Bytes of each uri (tar members, URLs, local files), or the exception reading it raised. Members of
    one shard that lie close together are read with one range request: a batch costs a few requests,
    not one per image."""
    out: list = [None] * len(uris)
    by_shard: dict[str, list[tuple[int, int, int]]] = {}
    singles: list[int] = []
    for i, u in enumerate(uris):
        if is_member_uri(u):
            try:
                shard, off, size, _ = parse_member_uri(u)
            except ValueError as exc:
                out[i] = exc
                continue
            by_shard.setdefault(shard, []).append((off, size, i))
        else:
            singles.append(i)
    jobs = []  # (shard, start, end, [(off, size, i)])
    for shard, ms in by_shard.items():
        ms.sort()
        cur = [ms[0]]
        for m in ms[1:]:
            if m[0] - (cur[-1][0] + cur[-1][1]) <= _MERGE_GAP:
                cur.append(m)
            else:
                jobs.append((shard, cur))
                cur = [m]
        jobs.append((shard, cur))

    def run_range(job):
        shard, ms = job
        start, end = ms[0][0], max(o + s for o, s, _ in ms)
        try:
            data = read_bytes(shard, start, end)
        except Exception as exc:  # recorded per member, like a missing file
            for _, _, i in ms:
                out[i] = exc
            return
        for off, size, i in ms:
            piece = data[off - start:off - start + size]
            out[i] = piece if len(piece) == size else ValueError(
                f"{uris[i]}: shard is truncated ({len(piece)} of {size} bytes at offset {off})")

    def run_single(i):
        try:
            out[i] = read_source(uris[i])
        except Exception as exc:
            out[i] = exc

    tasks = [(run_range, j) for j in jobs] + [(run_single, i) for i in singles]
    if len(tasks) <= 1:
        for fn, a in tasks:
            fn(a)
    else:
        with ThreadPoolExecutor(min(threads, len(tasks))) as pool:
            list(pool.map(lambda t: t[0](t[1]), tasks))
    return out


# -- remote inputs and outputs ---------------------------------------------------------------------------
def _cache_root() -> Path:
    return Path(os.environ.get("HARDRANK_CACHE") or Path.home() / ".cache" / "hardrank") / "remote"


def _slug(url: str) -> str:
    return hashlib.blake2b(url.rstrip("/").encode(), digest_size=8).hexdigest()


def fetch_input(url: str, *, what: str = "input") -> str:
    """A local copy of a remote file or folder (annotation files, Parquet, embeddings, store folders given
    as inputs), refreshed when the remote size or version changes; local paths are returned as they are."""
    path = local_path(url)
    if not is_url(path):
        return path
    d = RemoteDir(path, cache=_cache_root() / "inputs")
    if is_dir(path):
        d.pull()
        return os.fspath(d.local)
    if not exists(path):
        raise FileNotFoundError(f"{what} {path} does not exist")
    target = d.local.parent / f"{d.local.name}-{basename(path)}"
    d.local.parent.mkdir(parents=True, exist_ok=True)
    s = stat(path)
    stamp = target.with_name(f".{target.name}.source.json")
    if target.is_file() and stamp.is_file():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(stamp.read_text()) == s:
                return os.fspath(target)
    _download(path, target)
    stamp.write_text(json.dumps(s))
    return os.fspath(target)


def _download(url: str, target: Path) -> None:
    fs, p = filesystem(url)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with _errors(url, "downloading"):
            fs.get_file(p, os.fspath(tmp))
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def put_file(local: str | os.PathLike, url: str) -> None:
    """Upload one file so no reader ever sees half of it: object stores get one atomic PUT under the
    final name; other filesystems a hidden temporary, then a rename."""
    fs, p = filesystem(url)
    with _errors(url, "writing"):
        if _protocol(url) in _OBJECT_STORES:
            fs.put_file(os.fspath(local), p)
        else:
            parent, _, name = p.rpartition("/")
            tmp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
            fs.makedirs(parent, exist_ok=True)
            fs.put_file(os.fspath(local), tmp)
            fs.mv(tmp, p)


def check_writable_url(url: str, option: str) -> None:
    """A remote output can be written (a probe object is written and removed): credentials and
    permissions fail here, naming the option, before any work."""
    fs, p = filesystem(url)
    probe = f"{p.rstrip('/')}/.hardrank-write-test-{uuid.uuid4().hex}"
    try:
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except (MissingExtra, UsageError):
        raise
    except Exception as exc:
        err = remote_error(url, exc, "writing")
        raise UsageError(f"option {option} is {url!r}, which cannot be written: {err}") from None


class RemoteDir:
    """A remote folder mirrored in a local one: ``pull`` downloads what the remote has and the mirror
    lacks (or holds at another size), ``push`` uploads what changed locally since the last pull/push,
    data files first and ``*.json`` last (manifests, summaries and results name the data, so they
    must arrive after it). Hidden files (``.name``: temporaries, locks) never travel."""

    _STATE = ".hardrank-remote.json"

    def __init__(self, url: str, *, cache: Path | None = None):
        self.url = url.rstrip("/")
        self.local = Path(cache or _cache_root() / "mirrors") / _slug(self.url)

    def _state(self) -> dict:
        try:
            return json.loads((self.local / self._STATE).read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict) -> None:
        tmp = self.local / f".{self._STATE}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.local / self._STATE)

    def _remote_files(self, sub: str = "") -> dict[str, int]:
        fs, p = filesystem(join(self.url, sub) if sub else self.url)
        base = filesystem(self.url)[1].rstrip("/")
        with _errors(self.url, "listing"):
            if not fs.exists(p):
                return {}
            found = fs.find(p, detail=True)
        out = {}
        for name, info in found.items():
            rel = name[len(base):].lstrip("/")
            if rel and not any(part.startswith(".") for part in rel.split("/")):
                out[rel] = int(info.get("size") or 0)
        return out

    def pull(self, sub: str = "") -> list[str]:
        """Download the remote files (below ``sub``) the mirror lacks; returns their relative names."""
        self.local.mkdir(parents=True, exist_ok=True)
        state = self._state()
        got = []
        for rel, size in sorted(self._remote_files(sub).items()):
            target = self.local / rel
            if target.is_file() and target.stat().st_size == size:
                continue
            _download(join(self.url, rel), target)
            st = target.stat()
            state[rel] = [st.st_size, st.st_mtime_ns]
            got.append(rel)
        self._save(state)
        return got

    def push(self, sub: str = "") -> list[str]:
        """Upload the local files (below ``sub``) that are new or changed since they last travelled."""
        if not self.local.is_dir():
            return []
        state = self._state()
        root = self.local / sub if sub else self.local
        changed = []
        for f in sorted(root.rglob("*")):
            rel = f.relative_to(self.local).as_posix()
            if not f.is_file() or any(part.startswith(".") for part in rel.split("/")):
                continue
            st = f.stat()
            if state.get(rel) != [st.st_size, st.st_mtime_ns]:
                changed.append((rel, [st.st_size, st.st_mtime_ns]))
        changed.sort(key=lambda c: (c[0].endswith(".json"), c[0]))
        for rel, sig in changed:
            put_file(self.local / rel, join(self.url, rel))
            state[rel] = sig
            self._save(state)
        return [rel for rel, _ in changed]


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[str]:
    """``out`` itself for a local folder; for a URL, a local mirror of it (what the remote folder holds is
    downloaded first, so a rerun resumes: existing mining shards are skipped), uploaded when the block
    ends, also after an error or Ctrl-C."""
    out = local_path(out)
    if not is_url(out):
        yield out
        return
    mirror = RemoteDir(out)
    mirror.pull()
    try:
        yield str(mirror.local)
    finally:
        mirror.push()
