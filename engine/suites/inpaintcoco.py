"""InpaintCOCO (Roesch et al., 2024): Hugging Face Parquet shards of 2x2 image/caption rows."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..items import ImageRef, Tables, parquet_uri
from ..tasks import ChoiceTask, Suite
from ._common import SuiteFormatError, SuiteOptions

__all__ = ["load_inpaintcoco"]

_COLUMNS = ("concept", "coco_caption", "coco_image", "inpaint_caption", "inpaint_image")


def load_inpaintcoco(tables: Tables, opts: SuiteOptions, name: str = "inpaintcoco") -> Suite:
    """One grid2x2 choice task: per row, (coco image, inpainted image) x (coco caption, inpaint
    caption). Images stay inside the Parquet file (decoded from their bytes); rows with an empty
    inpaint caption are skipped and counted."""
    import pyarrow.parquet as pq

    if opts.data is None:
        raise ValueError("suite inpaintcoco needs --data DIR (or a .parquet file) with the test shards")
    root = Path(opts.data)
    files = sorted(root.glob("**/*.parquet")) if root.is_dir() else [root]
    if not files:
        raise FileNotFoundError(f"{root}: no .parquet shards found")
    left, right, ids, concepts, empty = [], [], [], [], 0
    for f in files:
        meta = pq.read_schema(f)
        missing = [c for c in _COLUMNS if c not in meta.names]
        if missing:
            raise SuiteFormatError(f"{f}: missing column(s) {missing}; has {meta.names}")
        table = pq.read_table(f, columns=["concept", "coco_caption", "inpaint_caption"])
        for row, (concept, cap_a, cap_b) in enumerate(zip(*(table.column(c).to_pylist() for c in table.column_names))):
            if not cap_b or not cap_b.strip() or not cap_a:
                empty += 1
                continue
            left.append((ImageRef(parquet_uri(f, row, "coco_image")), ImageRef(parquet_uri(f, row, "inpaint_image"))))
            right.append((cap_a, cap_b))
            ids.append(f"{f.name}/{row}")
            concepts.append(str(concept))
    task = ChoiceTask(
        name="inpaint", rule="grid2x2", left_modality="image", right_modality="text",
        left=tables.images.add_many(r for pair in left for r in pair).reshape(-1, 2),
        right=tables.texts.add_many(c for pair in right for c in pair).reshape(-1, 2),
        ids=ids, subset=concepts, skipped={"empty_caption": empty})
    task.validate()
    return Suite(name=name, choice=[task], meta={"rows": len(ids) + empty, "skipped_empty_caption": empty,
                                                "shards": [str(f) for f in files]})
