"""Sample sources beyond annotation files: WebDataset tar shards and img2dataset outputs, local or remote."""
from __future__ import annotations

from .wds import (
    IMAGE_EXTS,
    Sample,
    SampleSet,
    ShardScan,
    is_sample_source,
    parse_captions,
    read_samples,
    read_shards,
    sample_captions,
    scan_shard,
    scan_with,
    write_shard,
)

__all__ = ["IMAGE_EXTS", "Sample", "SampleSet", "ShardScan", "is_sample_source", "parse_captions", "read_samples",
           "read_shards", "sample_captions", "scan_shard", "scan_with", "write_shard"]
