"""InpaintCOCO (Roesch et al., 2024): Hugging Face Parquet shards of 2x2 image/caption rows."""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hardrank.errors import UsageError
from hardrank.formats.annotations import SuiteFormatError
from hardrank.items import ImageRef, Tables, parquet_uri
from hardrank.suites._common import SuiteOptions
from hardrank.tasks import ChoiceTask, Suite

__all__ = ["load_inpaintcoco"]

_TEXT_COLUMNS = ("concept", "coco_caption", "inpaint_caption")
_IMAGE_COLUMNS = ("coco_image", "inpaint_image")
_SHARD = re.compile(r"^(?P<split>[\w.]+)-(?P<index>\d+)-of-(?P<total>\d+)\.parquet$")  # test-00000-of-00002.parquet


def _shards(root: Path, split: str = "test") -> list[Path]:
    """The split's shards under ``root`` (also under data/), complete and in shard order; a single
    .parquet file is used as given; folders without shard-named files use every .parquet found."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist; pass --data DIR holding the InpaintCOCO "
                                f"{split}-0000x-of-0000N.parquet shards (or one .parquet file)")
    files = sorted(root.rglob("*.parquet"))
    named = [(f, _SHARD.match(f.name)) for f in files]
    shards = [(f, m) for f, m in named if m and m["split"] == split]
    if not shards:
        if not files:
            raise FileNotFoundError(f"{root}: no .parquet shards found (expected {split}-00000-of-0000N.parquet, "
                                    f"possibly under data/)")
        return files
    totals = {int(m["total"]) for _, m in shards}
    if len(totals) != 1:
        raise SuiteFormatError(f"{root}: {split} shards disagree on their count ({sorted(totals)}): "
                               f"{[str(f) for f, _ in shards]}; keep one copy of the dataset")
    total = totals.pop()
    by_index: dict[int, Path] = {}
    for f, m in shards:
        i = int(m["index"])
        if i in by_index:
            raise SuiteFormatError(f"{root}: shard {i} of {total} found twice ({by_index[i]} and {f}); "
                                   f"keep one copy of the dataset")
        by_index[i] = f
    missing = [i for i in range(total) if i not in by_index]
    if missing:
        raise FileNotFoundError(f"{root}: {split} shard(s) {missing} of {total} are missing "
                                f"(found {[str(p) for p in by_index.values()]})")
    return [by_index[i] for i in range(total)]


def _check_schema(f: Path) -> None:
    try:
        schema = pq.read_schema(f)
    except (pa.ArrowException, OSError) as exc:
        raise SuiteFormatError(f"{f}: not a readable Parquet file ({exc}); expected an InpaintCOCO test "
                               f"shard") from None
    missing = [c for c in (*_TEXT_COLUMNS, *_IMAGE_COLUMNS) if c not in schema.names]
    if missing:
        raise SuiteFormatError(f"{f}: missing column(s) {missing}; has {schema.names}. Expected the InpaintCOCO "
                               f"columns {list(_TEXT_COLUMNS + _IMAGE_COLUMNS)}")

    def first_value(col: str) -> str:  # only on the error path
        t = pq.read_table(f, columns=[col])
        return repr(t.column(0)[0].as_py())[:80] if t.num_rows else "nothing (the file has no rows)"

    for col in _IMAGE_COLUMNS:
        typ = schema.field(col).type
        is_struct = pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0 and (
            pa.types.is_binary(typ.field("bytes").type) or pa.types.is_large_binary(typ.field("bytes").type))
        if not (is_struct or pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
            raise SuiteFormatError(
                f"{f}: column {col!r} has type {typ}, expected a Hugging Face image struct "
                f"{{bytes: binary, path: string}} (or raw binary); row 0 holds {first_value(col)}. "
                f"Export the dataset with its images embedded (datasets' Image feature).")
    for col in _TEXT_COLUMNS:
        typ = schema.field(col).type
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            raise SuiteFormatError(f"{f}: column {col!r} has type {typ}, expected strings; "
                                   f"row 0 holds {first_value(col)}")


def load_inpaintcoco(tables: Tables, opts: SuiteOptions, name: str = "inpaintcoco") -> Suite:
    """One grid2x2 choice task: per row, (coco image, inpainted image) x (coco caption, inpaint
    caption); strict inequalities (ties wrong). Images stay inside the Parquet file (decoded from the
    image struct's bytes; a row without bytes is recorded as unreadable when keys are computed and
    dropped). Rows with an empty caption are skipped and counted. Metrics per concept and overall."""

    if opts.data is None:
        raise UsageError("suite inpaintcoco needs --data DIR (or a .parquet file) with the test shards")
    files = _shards(Path(opts.data))
    left, right, ids, concepts = [], [], [], []
    empty = {"inpaint_caption": 0, "coco_caption": 0}
    for f in files:
        _check_schema(f)
        table = pq.read_table(f, columns=list(_TEXT_COLUMNS))
        cols = [table.column(c).to_pylist() for c in _TEXT_COLUMNS]
        for row, (concept, cap_a, cap_b) in enumerate(zip(*cols)):
            if not cap_b or not cap_b.strip():
                empty["inpaint_caption"] += 1
                continue
            if not cap_a or not cap_a.strip():
                empty["coco_caption"] += 1
                continue
            left.append((ImageRef(parquet_uri(f, row, "coco_image")), ImageRef(parquet_uri(f, row, "inpaint_image"))))
            right.append((cap_a, cap_b))
            ids.append(f"{f.name}/{row}")
            concepts.append(concept if concept else "unknown")
    n_empty = sum(empty.values())
    task = ChoiceTask(
        name="inpaint", rule="grid2x2", left_modality="image", right_modality="text",
        left=tables.images.add_many(r for pair in left for r in pair).reshape(-1, 2),
        right=tables.texts.add_many(c for pair in right for c in pair).reshape(-1, 2),
        ids=ids, subset=concepts, skipped={"empty_caption": n_empty})
    task.validate()
    return Suite(name=name, choice=[task], tie_rule="grid2x2",
                 meta={"rows": len(ids) + n_empty, "skipped_empty_caption": n_empty, "empty_by_column": empty,
                       "shards": [str(f) for f in files]})
