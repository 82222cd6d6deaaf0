"""The one registry of input kinds, in detection order: what `mine --corpus/--queries` and `eval --embeddings` read.

Detection tries the kinds in the order of ``_KINDS``; the first whose ``detect`` says yes reads the path:

1. ``wds``             tar shards / img2dataset Parquet patterns (decided on the name alone; URLs as they are)
2. ``store``           a folder holding manifest.json or store shards
3. ``clip_retrieval``  a folder with img_emb/ or text_emb/ .npy parts
4. ``folder``          any other folder: its images (a folder URL is listed, not copied)
5. ``karpathy``        a .json file
6. ``xm3600``          a .jsonl file of Crossmodal-3600 lines (``image/key`` + captions per language)
7. ``embeddings``      a .parquet file with columns kind, id, embedding
8. ``parquet``         any other .parquet file: a listing of id + path or id + text

A URL goes to a kind that reads URLs (``remote``) as it is; another kind sees a local copy
(``urls.fetch_input``, cached), made only when the URL carries that kind's suffix or marker entries.
A new format is one module in ``hardrank.inputs.kinds`` plus its line here (or ``register`` at run time).
"""
from __future__ import annotations

import os
from pathlib import Path

from hardrank import urls
from hardrank.errors import DataError
from hardrank.inputs.kind import Embeddings, InputKind, InputOptions, Source, UnknownInput
from hardrank.inputs.kinds import (
    clip_retrieval_folder,
    embeddings_parquet,
    image_folder,
    karpathy_json,
    listing_parquet,
    store_folder,
    wds_samples,
    xm3600_jsonl,
)

__all__ = ["kinds", "register", "find", "open_input", "open_embeddings", "describe", "help_text"]

_KINDS: list[InputKind] = [
    wds_samples.KIND,
    store_folder.KIND,
    clip_retrieval_folder.KIND,
    image_folder.KIND,
    karpathy_json.KIND,
    xm3600_jsonl.KIND,
    embeddings_parquet.KIND,
    listing_parquet.KIND,
]
# eval --embeddings reads a file no kind recognises with this kind's reader, which names what is wrong with it
_READ_ANYWAY = embeddings_parquet.KIND


def kinds(yields: str | None = None) -> list[InputKind]:
    """The registered kinds in detection order (only those yielding ``items`` or ``embeddings``)."""
    return [k for k in _KINDS if yields is None or k.yields == yields]


def register(kind: InputKind, *, before: str | None = None) -> InputKind:
    """Add a kind: last, or just before the kind named ``before`` (to claim paths it would)."""
    if not kind.name or kind.yields not in ("items", "embeddings"):
        raise ValueError(f"an input kind needs a name and yields 'items' or 'embeddings'; got {kind.name!r}, "
                         f"{kind.yields!r}")
    if any(k.name == kind.name for k in _KINDS):
        raise ValueError(f"input kind {kind.name!r} is registered already")
    names = [k.name for k in _KINDS]
    if before is not None and before not in names:
        raise ValueError(f"no input kind {before!r} to register {kind.name!r} before; kinds: {names}")
    _KINDS.insert(names.index(before) if before is not None else len(_KINDS), kind)
    return kind


def find(spec: str, among: list[InputKind] | None = None) -> tuple[InputKind | None, str]:
    """(the first kind, in order, that recognises ``spec``, the path it reads: ``spec`` or a local copy
    of the URL); (None, spec) when none does."""
    spec = os.fspath(spec)
    is_url, local = urls.is_url(spec), None
    for kind in among if among is not None else _KINDS:
        if not is_url or kind.remote:
            if kind.detect(spec):
                return kind, spec
        elif kind.worth_fetching(spec):
            local = local or urls.fetch_input(spec, what="input")
            if kind.detect(local):
                return kind, local
    return None, spec


def describe(yields: str | None = None, *, by_id: bool | None = None) -> str:
    """The kinds as one phrase for messages: 'a, b, or c'."""
    ds = [k.describe for k in kinds(yields) if by_id is None or k.by_id == by_id]
    return ds[0] if len(ds) == 1 else ", ".join(ds[:-1]) + ", or " + ds[-1]


def help_text(yields: str | None = None, *, by_id: bool | None = None) -> str:
    """One line per kind, in detection order, for a command's help."""
    return "\n".join(f"  {k.name:<15} {k.describe}" for k in kinds(yields) if by_id is None or k.by_id == by_id)


def open_input(spec: str, options: InputOptions = InputOptions()) -> Source:
    """``spec`` (a path, URL or shard pattern) opened by the first kind that recognises it."""
    kind, path = find(spec)
    if kind is None:
        if not urls.exists(spec):
            raise FileNotFoundError(f"{spec} does not exist")
        raise DataError(f"{spec}: unrecognised input (suffix {Path(spec).suffix!r}). {_what_inputs_are()}")
    try:
        return kind.open(path, options)
    except UnknownInput as exc:
        raise DataError(f"{exc}. {_what_inputs_are()}") from None


def _what_inputs_are() -> str:
    return f"A corpus or query set is {describe()}"


def open_embeddings(spec: str) -> Embeddings:
    """The embeddings ``spec`` holds, for ``eval --embeddings``: the first kind yielding embeddings that
    recognises it; a file none recognises is read as an embeddings Parquet file (its reader names what is
    wrong)."""
    kind, path = find(spec, kinds("embeddings"))
    if kind is not None:
        return kind.embeddings(path)
    alternatives = describe("embeddings", by_id=True)
    if not urls.exists(spec):
        raise DataError(f"embeddings file {spec} does not exist; pass {alternatives}")
    if urls.is_dir(spec):
        raise DataError(f"embeddings file {spec} is a folder, but none of: {alternatives}")
    return _READ_ANYWAY.embeddings(spec)
