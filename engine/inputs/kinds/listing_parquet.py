"""Input kind ``parquet``: a Parquet listing of id + path (images) or id + text, embedded by a model."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.errors import DataError
from hardrank.inputs.kind import InputKind, InputOptions, Items, Source, UnknownInput
from hardrank.items import ImageRef
from hardrank.text import pre_caption

__all__ = ["KIND"]


class _ListingParquet(InputKind):
    name = "parquet"
    describe = "a .parquet listing with columns id + path (images) or id + text"
    suffixes = (".parquet",)

    def detect(self, path: str) -> bool:
        p = Path(path)
        return p.suffix == ".parquet" and p.is_file()  # after `embeddings`: any other Parquet file

    def open(self, path: str, options: InputOptions) -> Source:
        p = Path(path)
        try:
            cols = pq.read_schema(p).names
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{p}: not a readable Parquet file ({exc}); a .parquet listing needs columns id + path "
                            f"(images) or id + text") from None
        if "id" not in cols or ("path" in cols) == ("text" in cols):
            raise UnknownInput(f"{p}: listing has columns {cols}; expected 'id' and one of 'path' or 'text'")
        t = pq.read_table(p, columns=["id", "path" if "path" in cols else "text"])
        ids = [str(v) for v in t.column("id").to_pylist()]
        if "text" in cols:
            texts = t.column("text").to_pylist()
            return Source(self.name, path, {"text": Items(ids, [pre_caption(x) for x in texts], np.arange(len(ids)))})
        root = Path(options.images) if options.images is not None else p.parent
        refs = [ImageRef(os.fspath(root / x)) for x in t.column("path").to_pylist()]
        return Source(self.name, path, {"image": Items(ids, refs, np.arange(len(ids)))})


KIND = _ListingParquet()
